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

#include "engine/kv_store.h"

namespace ptllm::store {

class WriteQueue {
 public:
  struct Item {
    std::string key, value;
    KVStore::Finish finish = nullptr;  // still to run on value (QueuedStore::take runs it)
  };
  explicit WriteQueue(size_t max_bytes) : max_bytes_(max_bytes) {}

  // Queues a write; false (nothing queued) when it would pass max_bytes or the queue is stopped.
  bool push(Item item) {
    {
      std::lock_guard lk(mu_);
      const size_t n = item.key.size() + item.value.size();
      if (stopping_ || queued_bytes_ + n > max_bytes_) return false;
      queued_bytes_ += n;
      queue_.push_back(std::move(item));
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
      queued_bytes_ -= queue_.front().key.size() + queue_.front().value.size();
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
  void put(std::string key, std::string value, Finish finish) override {
    if (!queue_.push({std::move(key), std::move(value), finish}))
      count([](KVStoreStats& s) { ++s.dropped_writes; });
  }
  bool flush(std::chrono::milliseconds limit) override { return queue_.flush(limit); }
  std::string spare_buffer() override {
    std::lock_guard lk(spare_mu_);
    if (spares_.empty()) return {};
    std::string s = std::move(spares_.back());
    spares_.pop_back();
    spare_bytes_ -= s.capacity();
    s.clear();
    return s;
  }
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
      pthread_setname_np(pthread_self(), name);
      ::setpriority(PRIO_PROCESS, id_t(::syscall(SYS_gettid)), 10);
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
  // The previous batch's values kept as spare buffers (as many as fit kSpareBytes), queue_.take(),
  // then each value's finish run, on the writer's thread (at nice 10): a put's checksum is computed
  // here, not on the scheduler's thread that put it.
  bool take(std::vector<WriteQueue::Item>& batch, size_t max) {
    keep_spares(batch);
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
  // Spare buffers: values of at least kSpareMin bytes, kSpareBytes of them at most (63 of kjv-small's
  // block values, 262,440 bytes each; 536 of a no-reuse round's 544 values were built in spares).
  static constexpr size_t kSpareMin = size_t(64) << 10, kSpareBytes = size_t(16) << 20;
  void keep_spares(std::vector<WriteQueue::Item>& batch) {
    std::lock_guard lk(spare_mu_);
    for (WriteQueue::Item& it : batch) {
      const size_t cap = it.value.capacity();
      if (cap < kSpareMin || spare_bytes_ + cap > kSpareBytes) continue;
      spare_bytes_ += cap;
      spares_.push_back(std::move(it.value));
    }
  }
  std::mutex spare_mu_;
  std::vector<std::string> spares_;  // under spare_mu_
  size_t spare_bytes_ = 0;           // their capacity, under spare_mu_

  mutable std::mutex stats_mu_;
  KVStoreStats stats_;
  std::thread writer_;
};

}  // namespace ptllm::store
