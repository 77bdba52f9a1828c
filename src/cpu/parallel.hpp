// A minimal parallel-for over [0, n) for the CPU backend: workers pull indices from an atomic
// counter, so uneven items balance themselves. JFA_NUM_THREADS overrides the thread count.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace jfa::detail {

inline int cpu_thread_count() {
  if (const char* env = std::getenv("JFA_NUM_THREADS")) {
    const int n = std::atoi(env);
    if (n > 0) return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

// Calls body(item, worker) for every item in [0, n); worker is in [0, workers).
template <typename Body>
void parallel_for(int64_t n, int workers, Body&& body) {
  workers = static_cast<int>(std::min<int64_t>(workers, std::max<int64_t>(n, 1)));
  std::atomic<int64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto run = [&](int worker) {
    try {
      for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) body(i, worker);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      next.store(n);
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(workers - 1));
  for (int w = 1; w < workers; ++w) threads.emplace_back(run, w);
  run(0);
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace jfa::detail
