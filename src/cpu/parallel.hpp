// A minimal parallel-for over [0, n) for the CPU backend, on the process's worker pool: workers
// pull indices from an atomic counter, so uneven items balance themselves, and any number of
// workers (one at least: the calling thread) finishes the work. JFA_NUM_THREADS caps the thread
// count.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <type_traits>
#include <vector>

#include "cpu/worker_pool.hpp"

namespace jfa::detail {

// The thread cap JFA_NUM_THREADS asks for, given its text (nullptr: unset) and the hardware
// threads: a whole decimal number n >= 1 gives min(n, hardware); anything else gives `hardware`
// and a warning naming the value.
int parse_thread_cap(const char* text, int hardware, std::string* warning);

// Threads the CPU backend uses at most: the hardware threads, capped by JFA_NUM_THREADS. The
// variable is read once; an unusable value is reported once on stderr.
int cpu_thread_count();

// Threads worth using for `flops` of work: about one per 4 MFLOP, so that a small problem does not
// pay for waking (and giving scratch tiles to) threads it cannot keep busy; at most
// cpu_thread_count(), at least 1.
int workers_for_flops(double flops);

// Calls body(item, worker) for every item in [0, n); worker is in [0, workers). The calling thread
// and up to workers - 1 threads of the process's worker pool share the items; a pool smaller than
// asked for (threads that could not be started) leaves the work to the others, and the call still
// completes. An exception of body stops the remaining items and is rethrown to the caller. Not for
// use from inside a body (the pool runs one call at a time).
template <typename Body>
void parallel_for(int64_t n, int workers, Body&& body) {
  using BodyType = std::remove_reference_t<Body>;
  struct Shared {
    std::atomic<int64_t> next{0};
    int64_t n;
    BodyType* body;
    std::exception_ptr error;
    std::mutex error_mutex;
  } shared;
  shared.n = n;
  shared.body = &body;
  workers = static_cast<int>(std::min<int64_t>(workers, std::max<int64_t>(n, 1)));
  auto task = [](void* context, int worker) {
    Shared& s = *static_cast<Shared*>(context);
    try {
      for (int64_t i = s.next.fetch_add(1); i < s.n; i = s.next.fetch_add(1)) (*s.body)(i, worker);
    } catch (...) {
      std::lock_guard<std::mutex> lock(s.error_mutex);
      if (!s.error) s.error = std::current_exception();
      s.next.store(s.n);
    }
  };
  WorkerPool::instance().run(std::max(workers, 1), task, &shared);
  if (shared.error) std::rethrow_exception(shared.error);
}

}  // namespace jfa::detail
