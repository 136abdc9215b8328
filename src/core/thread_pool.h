#pragma once
// A fixed pool of worker threads, created once. parallel_for cuts [0, n) into a few contiguous parts
// per thread. Each thread owns a run of neighbouring parts and takes them front to back, so it
// streams one contiguous range (a memory-bound decode keeps the hardware prefetcher on one stream
// and its claims on its own cache line); a thread done with its own run takes parts from the back
// of the others'. The caller starts at once and never waits for a worker that has not started (a
// descheduled worker on a busy machine costs its parts, not a stall). A call neither allocates nor
// creates threads: the job is a pointer to the caller's callable, and idle workers spin briefly
// (decode issues ~10 calls per layer, microseconds apart) before sleeping on a futex.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace ptllm {

class ThreadPool {
 public:
  // n_threads >= 1 (the caller counts as one); throws ptllm::Error when the system cannot start them.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }
  // fn(begin, end) over disjoint ranges covering [0, n); ranges start at multiples of `grain` and
  // end at one (or at n). Which thread runs a range is not fixed, so fn's result for a range must
  // not depend on it. Runs inline when n <= grain, with one thread, or when called from inside a
  // job. An exception thrown by fn is rethrown here once every range has finished.
  template <class F>
  void parallel_for(size_t n, F&& fn, size_t grain = 1) {
    using Fn = std::remove_reference_t<F>;
    run(n, grain,
        Job{const_cast<void*>(static_cast<const void*>(std::addressof(fn))),
            [](void* f, size_t b, size_t e) { (*static_cast<Fn*>(f))(b, e); }});
  }

  static int default_threads();

 private:
  struct Job {
    void* fn;
    void (*call)(void*, size_t, size_t);
  };
  // One cache line each: the flags workers poll must not share a line with what they write.
  struct alignas(64) Counter {
    std::atomic<uint32_t> value{0};
  };

  void run(size_t n, size_t grain, Job job);
  void stop_workers();
  void worker(int self);
  // Runs parts of job `gen` (its own run first, then others') until none is left or a newer job
  // replaced it.
  void work_on(uint32_t gen, int self);
  // Claims the front (own run) or back (another's) part of run `r` of job `gen`; -1 when none.
  int claim(int r, uint32_t gen, bool front);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex call_mu_;  // one parallel_for at a time from outside the pool
  // The current job; written only while no part of the previous one can still be claimed.
  Job job_{};
  size_t job_n_ = 0, job_grain_ = 1;
  uint32_t job_parts_ = 0;
  Counter generation_;  // bumped to start a job (and to stop); workers sleep on it
  // Thread i's run of parts, one cache line each: generation << 32 | front << 16 | back, the
  // unclaimed parts being [front, back).
  struct alignas(64) Run {
    std::atomic<uint64_t> word{0};
  };
  std::unique_ptr<Run[]> runs_;
  Counter done_;        // parts of the current job finished
  Counter sleepers_;    // workers blocked in generation_.wait
  std::atomic<bool> stop_{false};
  std::mutex error_mu_;
  std::exception_ptr error_;
};

}  // namespace ptllm
