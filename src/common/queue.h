// BoundedQueue<T>: a blocking multi-producer multi-consumer queue with a fixed capacity.
//
// Every wait takes a timeout and returns a Status that says why it stopped: DeadlineExceeded on a
// timeout, Cancelled once the queue is closed (Pop drains what is left first). Close() wakes every
// waiter; it is how a pipeline shuts down in order.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <string>

#include "loongforge/status.h"

namespace loongforge {

template <typename T>
class BoundedQueue {
 public:
  BoundedQueue(size_t capacity, std::string name)
      : capacity_(capacity ? capacity : 1), name_(std::move(name)) {}
  BoundedQueue(const BoundedQueue&) = delete;
  BoundedQueue& operator=(const BoundedQueue&) = delete;

  // Blocks while full. Returns Cancelled if closed, DeadlineExceeded after `timeout`.
  Status Push(T item, std::chrono::milliseconds timeout = std::chrono::hours(24)) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!not_full_.wait_for(lock, timeout, [&] { return closed_ || q_.size() < capacity_; }))
      return DeadlineExceededError("queue '" + name_ + "': push timed out after " +
                                   std::to_string(timeout.count()) + " ms");
    if (closed_) return CancelledError("queue '" + name_ + "' is closed");
    q_.push_back(std::move(item));
    not_empty_.notify_one();
    return Status::Ok();
  }

  // Blocks while empty. Returns the item, Cancelled once closed and drained, or DeadlineExceeded.
  Status Pop(T* out, std::chrono::milliseconds timeout = std::chrono::hours(24)) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!not_empty_.wait_for(lock, timeout, [&] { return closed_ || !q_.empty(); }))
      return DeadlineExceededError("queue '" + name_ + "': pop timed out after " +
                                   std::to_string(timeout.count()) + " ms");
    if (q_.empty()) return CancelledError("queue '" + name_ + "' is closed");
    *out = std::move(q_.front());
    q_.pop_front();
    not_full_.notify_one();
    return Status::Ok();
  }

  // Non-blocking pop; false if empty.
  bool TryPop(T* out) {
    std::lock_guard<std::mutex> lock(mu_);
    if (q_.empty()) return false;
    *out = std::move(q_.front());
    q_.pop_front();
    not_full_.notify_one();
    return true;
  }

  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    not_empty_.notify_all();
    not_full_.notify_all();
  }

  bool closed() const {
    std::lock_guard<std::mutex> lock(mu_);
    return closed_;
  }
  size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return q_.size();
  }
  size_t capacity() const { return capacity_; }
  const std::string& name() const { return name_; }

 private:
  const size_t capacity_;
  const std::string name_;
  mutable std::mutex mu_;
  std::condition_variable not_empty_, not_full_;
  std::deque<T> q_;
  bool closed_ = false;
};

}  // namespace loongforge
