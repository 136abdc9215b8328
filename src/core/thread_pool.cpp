#include "core/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <system_error>
#include <utility>

#include "core/error.h"

#if defined(__linux__)
#include <sched.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace ptllm {

namespace {

// True on pool workers, and on a caller while it runs a job: a nested parallel_for runs inline.
thread_local bool t_in_job = false;

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// An idle worker spins alone for kSpinAlone (the gaps between the kernels of a decode step are
// shorter), then yields its core at each check (on a machine with more runnable threads than
// cores the caller may be waiting for it), and after kSpin sleeps until the next job.
constexpr std::chrono::microseconds kSpinAlone{50};
constexpr std::chrono::microseconds kSpin{1000};
// Parts per thread: enough for the caller to take over a late worker's share, few enough that
// claiming them costs nothing next to the work.
constexpr size_t kPartsPerThread = 8;

// The i-th of `parts` ranges of [0, n), aligned to `grain`.
std::pair<size_t, size_t> split_range(size_t n, size_t grain, size_t parts, size_t i) {
  size_t chunks = (n + grain - 1) / grain;
  size_t per = chunks / parts, extra = chunks % parts;
  size_t first = i * per + std::min(i, extra);
  size_t count = per + (i < extra ? 1 : 0);
  return {std::min(n, first * grain), std::min(n, (first + count) * grain)};
}

}  // namespace

int ThreadPool::default_threads() {
#if defined(__linux__)
  // The CPUs this process may run on (taskset, cgroup cpusets), not every CPU of the host.
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
#endif
  unsigned hc = std::thread::hardware_concurrency();
  return hc == 0 ? 1 : int(hc);
}

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)), runs_(new Run[size_t(n_threads_)]) {
  try {
    for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker(i); });
  } catch (const std::system_error& e) {
    // The destructor does not run for a constructor that throws: the started workers are joined
    // here (a joinable std::thread destroyed would end the process).
    const size_t started = workers_.size() + 1;
    stop_workers();
    throw Error("cannot start " + std::to_string(n_threads_) + " threads (" + std::to_string(started) +
                " started): " + e.code().message() + "; give fewer with --threads");
  }
}

ThreadPool::~ThreadPool() { stop_workers(); }

void ThreadPool::stop_workers() {
  stop_.store(true, std::memory_order_release);
  generation_.value.fetch_add(1, std::memory_order_seq_cst);
  generation_.value.notify_all();
  for (auto& t : workers_) t.join();
}

int ThreadPool::claim(int r, uint32_t gen, bool front) {
  std::atomic<uint64_t>& word = runs_[size_t(r)].word;
  uint64_t c = word.load(std::memory_order_relaxed);
  for (;;) {
    const uint32_t f = uint32_t(c >> 16) & 0xffff, b = uint32_t(c) & 0xffff;
    // A part is claimed only while one is left: until then the job cannot finish, nor job_ change.
    if (uint32_t(c >> 32) != gen || f >= b) return -1;
    const uint64_t next = front ? c + (uint64_t(1) << 16) : c - 1;
    if (word.compare_exchange_weak(c, next, std::memory_order_acquire, std::memory_order_relaxed))
      return int(front ? f : b - 1);
  }
}

void ThreadPool::work_on(uint32_t gen, int self) {
  uint32_t done = 0;
  auto run_part = [&](int part) {
    auto [b, e] = split_range(job_n_, job_grain_, job_parts_, size_t(part));
    if (b < e) {
      try {
        job_.call(job_.fn, b, e);
      } catch (...) {
        std::lock_guard<std::mutex> lk(error_mu_);
        if (!error_) error_ = std::current_exception();
      }
    }
    ++done;
  };
  for (int part; (part = claim(self, gen, true)) >= 0;) run_part(part);
  for (int k = 1; k < n_threads_; ++k) {
    const int r = (self + k) % n_threads_;
    for (int part; (part = claim(r, gen, false)) >= 0;) run_part(part);
  }
  if (done > 0) done_.value.fetch_add(done, std::memory_order_release);
}

void ThreadPool::worker(int self) {
  t_in_job = true;
  uint32_t seen = 0;
  for (;;) {
    uint32_t g = generation_.value.load(std::memory_order_acquire);
    if (g == seen) {
      const auto t0 = std::chrono::steady_clock::now();
      for (unsigned i = 1; (g = generation_.value.load(std::memory_order_acquire)) == seen; ++i) {
        if (i % 64 != 0) {
          cpu_relax();
          continue;
        }
        const auto waited = std::chrono::steady_clock::now() - t0;
        if (waited < kSpinAlone) continue;
        if (waited < kSpin) {
          std::this_thread::yield();
          continue;
        }
        // Announce before waiting; the caller bumps generation_ before it reads sleepers_ (both
        // seq_cst), so either it sees this sleeper and notifies, or wait() sees the new generation.
        sleepers_.value.fetch_add(1, std::memory_order_seq_cst);
        generation_.value.wait(seen, std::memory_order_seq_cst);
        sleepers_.value.fetch_sub(1, std::memory_order_relaxed);
      }
    }
    seen = g;
    if (stop_.load(std::memory_order_acquire)) return;
    work_on(g, self);
  }
}

void ThreadPool::run(size_t n, size_t grain, Job job) {
  if (n == 0) return;
  grain = std::max<size_t>(1, grain);
  if (n_threads_ == 1 || n <= grain || t_in_job) {
    job.call(job.fn, 0, n);
    return;
  }
  std::lock_guard<std::mutex> lk(call_mu_);
  job_ = job;
  job_n_ = n;
  job_grain_ = grain;
  job_parts_ = uint32_t(std::min({(n + grain - 1) / grain, kPartsPerThread * size_t(n_threads_), size_t(0xffff)}));
  error_ = nullptr;
  done_.value.store(0, std::memory_order_relaxed);
  const uint32_t gen = generation_.value.load(std::memory_order_relaxed) + 1;
  for (int i = 0; i < n_threads_; ++i) {
    const uint64_t front = uint64_t(job_parts_) * uint64_t(i) / uint64_t(n_threads_);
    const uint64_t back = uint64_t(job_parts_) * uint64_t(i + 1) / uint64_t(n_threads_);
    runs_[size_t(i)].word.store(uint64_t(gen) << 32 | front << 16 | back, std::memory_order_release);
  }
  generation_.value.store(gen, std::memory_order_seq_cst);
  if (sleepers_.value.load(std::memory_order_seq_cst) > 0) generation_.value.notify_all();
  t_in_job = true;
  work_on(gen, 0);
  t_in_job = false;
  // Every part is claimed; wait for the ones workers are still running (yielding the core soon:
  // such a worker may be waiting for it).
  for (unsigned i = 0; done_.value.load(std::memory_order_acquire) != job_parts_; ++i) {
    if (i < 1024)
      cpu_relax();
    else
      std::this_thread::yield();
  }
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

}  // namespace ptllm
