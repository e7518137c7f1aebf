// ThreadPool: a fixed set of named worker threads with a bounded task queue.
//
// Submit() blocks while the queue is full (back-pressure instead of unbounded growth). Shutdown()
// — also run by the destructor — stops accepting work, runs every task already queued, and joins
// every thread: no detached threads, no work lost on exit.
#pragma once

#include <functional>
#include <future>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "common/queue.h"

namespace loongforge {

class ThreadPool {
 public:
  // `num_threads` >= 1; `queue_capacity` bounds pending tasks (0 = 4 * num_threads).
  ThreadPool(int num_threads, std::string name, size_t queue_capacity = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Queues `fn`. Returns Cancelled after Shutdown().
  Status Submit(std::function<void()> fn);

  // Queues `fn` and returns a future for its result (an invalid future if the pool is shut down).
  template <typename F>
  auto Async(F fn) -> std::future<std::invoke_result_t<F>> {
    using R = std::invoke_result_t<F>;
    auto task = std::make_shared<std::packaged_task<R()>>(std::move(fn));
    std::future<R> fut = task->get_future();
    if (!Submit([task] { (*task)(); }).ok()) return std::future<R>();
    return fut;
  }

  void Shutdown();
  int size() const { return static_cast<int>(threads_.size()); }
  const std::string& name() const { return name_; }

 private:
  void WorkerLoop();
  std::string name_;
  BoundedQueue<std::function<void()>> tasks_;
  std::vector<std::thread> threads_;
  std::once_flag shutdown_once_;
};

}  // namespace loongforge
