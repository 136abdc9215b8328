#pragma once
// A fixed pool of worker threads, created once; parallel_for splits [0, n) into contiguous ranges,
// one per thread (the caller runs the first). No allocation or thread creation per call.
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ptllm {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);  // n_threads >= 1 (the caller counts as one)
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }
  // fn(begin, end) over disjoint ranges covering [0, n); ranges are multiples of `grain` except the last.
  void parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn, size_t grain = 1);

  static int default_threads();

 private:
  void worker(int index);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  const std::function<void(size_t, size_t)>* job_ = nullptr;
  size_t job_n_ = 0, job_grain_ = 1;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

}  // namespace ptllm
