#pragma once
// The queue between a block store's put() and its writer thread (the directory and Redis stores):
// bounded in bytes, never blocking the caller, drained in batches, flushable.
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace ptllm::store {

// Nice 10 for the calling thread (Linux: setpriority on its thread id), so that a store's writer
// takes a core only when the scheduler's threads leave one: woken while every core decodes, it
// would preempt one of them and stall the step's other threads at their next join.
inline void lower_thread_priority() { ::setpriority(PRIO_PROCESS, id_t(::syscall(SYS_gettid)), 10); }

class WriteQueue {
 public:
  using Item = std::pair<std::string, std::string>;  // key, value
  explicit WriteQueue(size_t max_bytes) : max_bytes_(max_bytes) {}

  // Queues a write; false (nothing queued) when it would pass max_bytes or the queue is stopped.
  bool push(std::string key, std::string value) {
    {
      std::lock_guard lk(mu_);
      const size_t n = key.size() + value.size();
      if (stopping_ || queued_bytes_ + n > max_bytes_) return false;
      queued_bytes_ += n;
      queue_.emplace_back(std::move(key), std::move(value));
    }
    wake_.notify_one();
    return true;
  }
  // The writer's side: the previous batch is done; waits for writes and moves up to `max` into
  // `batch`. False once stopped and everything queued was handed out.
  bool take(std::vector<Item>& batch, size_t max) {
    std::unique_lock lk(mu_);
    writing_ = false;
    if (queue_.empty()) idle_.notify_all();
    wake_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
    batch.clear();
    while (!queue_.empty() && batch.size() < max) {
      queued_bytes_ -= queue_.front().first.size() + queue_.front().second.size();
      batch.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    writing_ = !batch.empty();
    return writing_;
  }
  // Waits until every queued write was taken and its batch done, at most `limit`.
  bool flush(std::chrono::milliseconds limit) {
    std::unique_lock lk(mu_);
    return idle_.wait_for(lk, limit, [&] { return queue_.empty() && !writing_; });
  }
  // No more pushes; take() hands out what is left, then returns false.
  void stop() {
    {
      std::lock_guard lk(mu_);
      stopping_ = true;
    }
    wake_.notify_all();
  }

 private:
  const size_t max_bytes_;
  std::mutex mu_;
  std::condition_variable wake_, idle_;
  std::deque<Item> queue_;     // under mu_
  size_t queued_bytes_ = 0;    // under mu_
  bool writing_ = false, stopping_ = false;  // under mu_
};

}  // namespace ptllm::store
