#include "common/thread_pool.h"

#include <pthread.h>

#include "loongforge/logging.h"

namespace loongforge {

ThreadPool::ThreadPool(int num_threads, std::string name, size_t queue_capacity)
    : name_(std::move(name)),
      tasks_(queue_capacity ? queue_capacity : 4 * static_cast<size_t>(std::max(1, num_threads)),
             name_ + ".tasks") {
  LF_CHECK(num_threads >= 1) << "thread pool '" << name_ << "' needs at least one thread";
  threads_.reserve(num_threads);
  try {
    for (int i = 0; i < num_threads; ++i) {
      threads_.emplace_back([this] { WorkerLoop(); });
      // Linux limits thread names to 15 characters.
      std::string tname = (name_ + std::to_string(i)).substr(0, 15);
      pthread_setname_np(threads_.back().native_handle(), tname.c_str());
    }
  } catch (...) {
    // Out of threads (std::system_error): join the started ones, so the caller gets the error
    // instead of std::terminate from a joinable std::thread being destroyed.
    tasks_.Close();
    for (auto& t : threads_) t.join();
    throw;
  }
}

ThreadPool::~ThreadPool() { Shutdown(); }

Status ThreadPool::Submit(std::function<void()> fn) { return tasks_.Push(std::move(fn)); }

void ThreadPool::Shutdown() {
  std::call_once(shutdown_once_, [this] {
    tasks_.Close();  // workers drain what is queued, then see Cancelled and exit
    for (auto& t : threads_) t.join();
  });
}

void ThreadPool::WorkerLoop() {
  std::function<void()> fn;
  while (tasks_.Pop(&fn).ok()) {
    fn();
    fn = nullptr;
  }
}

}  // namespace loongforge
