// A minimal parallel-for over [0, n) for the CPU backend: workers pull indices from an atomic
// counter, so uneven items balance themselves, and any number of workers (one at least: the
// calling thread) finishes the work. JFA_NUM_THREADS caps the thread count.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

namespace jfa::detail {

// The thread cap JFA_NUM_THREADS asks for, given its text (nullptr: unset) and the hardware
// threads: a whole decimal number n >= 1 gives min(n, hardware); anything else gives `hardware`
// and a warning naming the value.
int parse_thread_cap(const char* text, int hardware, std::string* warning);

// Threads the CPU backend uses at most: the hardware threads, capped by JFA_NUM_THREADS. The
// variable is read once; an unusable value is reported once on stderr.
int cpu_thread_count();

// Calls body(item, worker) for every item in [0, n); worker is in [0, workers). A thread that
// cannot be started leaves its share to the others (the call still completes); an exception of
// body stops the remaining items and is rethrown to the caller.
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
  try {
    threads.reserve(static_cast<size_t>(workers - 1));
    for (int w = 1; w < workers; ++w) threads.emplace_back(run, w);
  } catch (const std::system_error&) {  // no more threads (limits, memory): fewer workers
  } catch (const std::bad_alloc&) {
  }
  run(0);
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace jfa::detail
