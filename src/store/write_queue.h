#pragma once
// The queue between a block store's put() and its writer thread (the directory and Redis stores):
// bounded in bytes, never blocking the caller, drained in batches, flushable; and QueuedStore, what
// both stores share around it (put, flush, the counters, the writer thread).
#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "persist/kv_store.h"

namespace ptllm::store {

class WriteQueue {
 public:
  struct Item {
    std::string key;
    StoreValue value;
    KVStore::Finish finish = nullptr;  // still to run on value (QueuedStore::take runs it)
    size_t bytes() const { return key.size() + value.size(); }
  };
  explicit WriteQueue(size_t max_bytes) : max_bytes_(max_bytes) {}

  // Queues a write; false (nothing queued, the item dropped) when it would pass max_bytes or the
  // queue is stopped.
  bool push(Item item) {
    {
      std::lock_guard lk(mu_);
      const size_t n = item.bytes();
      if (stopping_ || queued_bytes_ + n > max_bytes_) return false;
      queued_bytes_ += n;
      queue_.push_back(std::move(item));
    }
    wake_.notify_one();
    return true;
  }
  // The writer's side: the previous batch is done (and dropped, its pins with it, before the wait);
  // waits for writes and moves up to `max` into `batch`. False once stopped and everything queued was
  // handed out.
  bool take(std::vector<Item>& batch, size_t max) {
    batch.clear();
    std::unique_lock lk(mu_);
    writing_ = false;
    if (queue_.empty()) idle_.notify_all();
    wake_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
    while (!queue_.empty() && batch.size() < max) {
      queued_bytes_ -= queue_.front().bytes();
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

// A KVStore whose writes go through a WriteQueue to a writer thread of its own: put() queues (a full
// queue drops and counts), flush() waits for the queue, stats() reads the counters the store keeps
// with count(). The store starts the writer in its constructor and stops it first thing in its
// destructor (stop_writer), before its own members go.
class QueuedStore : public KVStore {
 public:
  using KVStore::put;
  void put(std::string key, StoreValue value, Finish finish) override {
    if (!queue_.push({std::move(key), std::move(value), finish}))
      count([](KVStoreStats& s) { ++s.dropped_writes; });
  }
  bool flush(std::chrono::milliseconds limit) override { return queue_.flush(limit); }
  KVStoreStats stats() const override {
    std::lock_guard lk(stats_mu_);
    return stats_;
  }

 protected:
  explicit QueuedStore(size_t queue_bytes) : queue_(queue_bytes) {}
  ~QueuedStore() override { stop_writer(); }

  // The writer thread, named `name` (at most 15 characters: its CPU time in top -H and /proc is the
  // store's) and at nice 10 (Linux: setpriority on its thread id), so that it takes a core only when
  // the scheduler's threads leave one: woken while every core decodes, it would preempt one of them
  // and stall the step's other threads at their next join. It runs write_loop().
  void start_writer(const char* name) {
    writer_ = std::thread([this, name] {
#if defined(__linux__)
      pthread_setname_np(pthread_self(), name);
      ::setpriority(PRIO_PROCESS, id_t(::syscall(SYS_gettid)), 10);
#elif defined(__APPLE__)
      pthread_setname_np(name);  // the calling thread only; no per-thread nice
#endif
      write_loop();
    });
  }
  // No more puts; returns once every queued write was attempted.
  void stop_writer() {
    queue_.stop();
    if (writer_.joinable()) writer_.join();
  }
  // The writer's loop: take() batches until it returns false.
  virtual void write_loop() = 0;
  // queue_.take(), then each value's finish run, on the writer's thread (at nice 10): a put's
  // checksum is computed here, not on the scheduler's thread that put it.
  bool take(std::vector<WriteQueue::Item>& batch, size_t max) {
    if (!queue_.take(batch, max)) return false;
    for (WriteQueue::Item& it : batch)
      if (it.finish) std::exchange(it.finish, nullptr)(it.value);
    return true;
  }

  // f(stats) under the counters' lock.
  template <class F>
  void count(F&& f) {
    std::lock_guard lk(stats_mu_);
    f(stats_);
  }
  // One lookup: `keys` asked for in `seconds`, `bytes` of values received.
  void count_lookup(size_t keys, double seconds, uint64_t bytes) {
    count([&](KVStoreStats& s) {
      ++s.lookups;
      s.keys_looked_up += keys;
      s.lookup_seconds += seconds;
      s.bytes_in += bytes;
    });
  }

  WriteQueue queue_;

 private:
  mutable std::mutex stats_mu_;
  KVStoreStats stats_;
  std::thread writer_;
};

}  // namespace ptllm::store
