// The CPU backend's threads, started once and kept: a call hands its work to threads that wait
// for it instead of starting threads of its own. Threads are started on demand up to the cap a
// call asks for; one that cannot be started (limits, memory) leaves the pool smaller and the work
// to the others. After fork() the child process gets a pool of its own (the parent's threads do
// not exist there). A thread that has finished a task spins for a short while before it sleeps, so
// that calls in quick succession do not wait for sleeping threads to be woken.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace jfa::detail {

class WorkerPool {
 public:
  // The pool of this process.
  static WorkerPool& instance();

  // Runs task(context, worker) on the calling thread (worker 0) and on up to `workers - 1` pool
  // threads (workers 1, 2, ...), and returns when every one of them has returned. The task must
  // not throw. Calls from several threads take turns.
  void run(int workers, void (*task)(void* context, int worker), void* context);

  WorkerPool() = default;
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

 private:
  void serve();  // the loop of a pool thread
  void grow(int threads);

  std::mutex turn_;  // one run at a time
  std::mutex mutex_;
  std::condition_variable work_ready_, work_done_;
  std::vector<std::thread> threads_;
  bool cannot_grow_ = false;
  // The current task, offered to `wanted` pool threads; `generation` tells a new task from the
  // one a thread has already served.
  void (*task_)(void*, int) = nullptr;
  void* context_ = nullptr;
  uint64_t generation_ = 0;
  std::atomic<uint64_t> posted_{0};  // generation_, readable without the lock by spinning threads
  int wanted_ = 0;
  int taken_ = 0;
  int running_ = 0;
};

}  // namespace jfa::detail
