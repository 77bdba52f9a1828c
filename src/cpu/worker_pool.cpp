#include "cpu/worker_pool.hpp"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <new>
#include <system_error>

namespace jfa::detail {
namespace {

inline void spin_pause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// The pool and the process that made it; a pool found from another process (a forked child) is
// left alone, its threads not being there, and a new one takes its place. Pools are never freed:
// at exit their threads may still wait on them.
struct OwnedPool {
  WorkerPool* pool;
  pid_t owner;
};
std::atomic<OwnedPool*> current{nullptr};

}  // namespace

WorkerPool& WorkerPool::instance() {
  const pid_t self = getpid();
  OwnedPool* seen = current.load(std::memory_order_acquire);
  while (seen == nullptr || seen->owner != self) {
    auto* fresh = new OwnedPool{new WorkerPool, self};
    if (current.compare_exchange_strong(seen, fresh, std::memory_order_acq_rel))
      return *fresh->pool;
    delete fresh->pool;  // another thread of this process made one first
    delete fresh;
  }
  return *seen->pool;
}

void WorkerPool::grow(int threads) {
  while (!cannot_grow_ && static_cast<int>(threads_.size()) < threads) {
    try {
      threads_.emplace_back([this] { serve(); });
    } catch (const std::system_error&) {  // no more threads (limits, memory): a smaller pool
      cannot_grow_ = true;
    } catch (const std::bad_alloc&) {
      cannot_grow_ = true;
    }
  }
}

void WorkerPool::run(int workers, void (*task)(void*, int), void* context) {
  std::lock_guard<std::mutex> turn(turn_);
  if (workers > 1) grow(workers - 1);
  const int helpers = std::min<int>(workers - 1, static_cast<int>(threads_.size()));
  if (helpers > 0) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      task_ = task;
      context_ = context;
      wanted_ = helpers;
      taken_ = 0;
      ++generation_;
      posted_.store(generation_, std::memory_order_release);
    }
    work_ready_.notify_all();
  }
  task(context, 0);
  if (helpers > 0) {
    std::unique_lock<std::mutex> lock(mutex_);
    wanted_ = taken_;  // threads that have not started this task will not
    work_done_.wait(lock, [&] { return running_ == 0; });
    task_ = nullptr;
  }
}

void WorkerPool::serve() {
  // How long a thread that has finished a task watches for the next one before it sleeps.
  constexpr auto kSpin = std::chrono::microseconds(200);
  uint64_t served = 0;
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    if (generation_ == served) {
      lock.unlock();
      const auto until = std::chrono::steady_clock::now() + kSpin;
      while (posted_.load(std::memory_order_acquire) == served &&
             std::chrono::steady_clock::now() < until) {
        for (int i = 0; i < 32; ++i) spin_pause();
      }
      lock.lock();
    }
    work_ready_.wait(lock, [&] { return generation_ != served && taken_ < wanted_; });
    served = generation_;
    const int worker = ++taken_;
    ++running_;
    void (*task)(void*, int) = task_;
    void* context = context_;
    lock.unlock();
    task(context, worker);
    lock.lock();
    if (--running_ == 0) work_done_.notify_all();
  }
}

}  // namespace jfa::detail
