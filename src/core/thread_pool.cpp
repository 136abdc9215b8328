#include "core/thread_pool.h"

#include <algorithm>

namespace ptllm {

namespace {
// The i-th of `parts` ranges of [0, n), aligned to `grain`.
std::pair<size_t, size_t> split_range(size_t n, size_t grain, int parts, int i) {
  size_t chunks = (n + grain - 1) / grain;
  size_t per = chunks / size_t(parts), extra = chunks % size_t(parts);
  size_t first = size_t(i) * per + std::min<size_t>(size_t(i), extra);
  size_t count = per + (size_t(i) < extra ? 1 : 0);
  return {std::min(n, first * grain), std::min(n, (first + count) * grain)};
}
}  // namespace

int ThreadPool::default_threads() {
  unsigned hc = std::thread::hardware_concurrency();
  return hc == 0 ? 1 : int(hc);
}

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(size_t, size_t)>* job;
    size_t n, grain;
    {
      std::unique_lock<std::mutex> lk(mu_);
      start_cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
      n = job_n_;
      grain = job_grain_;
    }
    auto [b, e] = split_range(n, grain, n_threads_, index);
    if (b < e) (*job)(b, e);
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn, size_t grain) {
  if (n == 0) return;
  grain = std::max<size_t>(1, grain);
  if (n_threads_ == 1 || n <= grain) {
    fn(0, n);
    return;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    job_ = &fn;
    job_n_ = n;
    job_grain_ = grain;
    pending_ = n_threads_ - 1;
    ++generation_;
  }
  start_cv_.notify_all();
  auto [b, e] = split_range(n, grain, n_threads_, 0);
  if (b < e) fn(b, e);
  std::unique_lock<std::mutex> lk(mu_);
  done_cv_.wait(lk, [&] { return pending_ == 0; });
}

}  // namespace ptllm
