// A decode step allocates nothing and creates no thread: the pool, the forward state, the KV blocks
// (preallocated) and the kernels' scratch are all set up before it. Counted by replacing the global
// operator new for this test binary (the count is only read around the measured steps). With one
// thread every allocation counts; with two, the caller's: a pool worker sizes its thread-local kernel
// scratch the first time it runs a part of a kernel, and which parts a worker takes is up to timing.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <dirent.h>
#include <new>
#include <thread>
#include <vector>

#include "core/thread_pool.h"
#include "engine/session.h"
#include "kernels/ops.h"
#include "kernels/weights.h"
#include "sample/sampler.h"
#include "test_util.h"

namespace {
std::atomic<long> g_news{0};
thread_local bool t_not_counted = false;  // set on pool workers in the two-thread cases
}  // namespace

// Every form of new and delete is replaced, so that each pair matches (malloc / aligned_alloc with
// free); gcc cannot see through that pairing.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
void* operator new(std::size_t n) {
  if (!t_not_counted) g_news.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, std::align_val_t a) {
  if (!t_not_counted) g_news.fetch_add(1, std::memory_order_relaxed);
  const size_t al = std::max(sizeof(void*), size_t(a));
  if (void* p = std::aligned_alloc(al, (std::max<size_t>(n, 1) + al - 1) / al * al)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void* operator new[](std::size_t n, std::align_val_t a) { return operator new(n, a); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return operator new(n);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return operator new(n, std::nothrow); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace ptllm {
namespace {

int thread_count() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') ++n;
    closedir(d);
  }
  return n;
}

struct Case {
  const char* name;
  KVPrecision precision;
  int sink, window;
  int threads;
  const char* model = "kjv-tiny";
  bool shared = false;  // read from ../shared/models (skipped without it)
};

class DecodeAllocTest : public ::testing::TestWithParam<Case> {};

TEST_P(DecodeAllocTest, DecodeStepsAllocateNothing) {
  const Case& c = GetParam();
  const std::filesystem::path dir = c.shared ? test::shared_model(c.model) : test::repo_model(c.model);
  if (!std::filesystem::exists(dir / "model.safetensors")) GTEST_SKIP() << dir << " not found";
  auto model = Model::load(dir);
  ThreadPool pool(c.threads);
  if (c.threads > 1) {
    // Mark the workers: a job of many one-index parts, each of which the caller skips.
    const auto caller = std::this_thread::get_id();
    std::atomic<int> marked{0};
    while (marked.load() < c.threads - 1)
      pool.parallel_for(size_t(64) * size_t(c.threads), [&](size_t, size_t) {
        if (std::this_thread::get_id() != caller && !t_not_counted) {
          t_not_counted = true;
          ++marked;
        }
      });
  }
  SessionOptions o;
  o.kv.precision = c.precision;
  o.kv.group_size = 8;
  o.kv.residual = 8;
  o.kv.sink = c.sink;
  o.kv.window = c.window;
  o.kv.ctx_size = 256;
  o.kv.positions = default_positions(o.kv);
  Session s(*model, o, pool);
  SamplingConfig sc;
  sc.temperature = 0;
  Sampler sampler(sc);
  std::vector<int32_t> prompt = {5, 17, 99, 3, 250, 41, 7, 8, 9, 10};
  std::span<float> logits = s.feed(prompt);
  // Warm-up: every kernel's thread-local scratch reaches its size (and a KIVI group is quantized).
  for (int i = 0; i < 40; ++i) {
    const int32_t next = sampler.sample(logits, s.history());
    logits = s.feed({&next, 1});
  }
  const int threads = thread_count();
  const long before = g_news.load();
  for (int i = 0; i < 100; ++i) {
    const int32_t next = sampler.sample(logits, s.history());
    logits = s.feed({&next, 1});
  }
  EXPECT_EQ(g_news.load() - before, 0) << "allocations in 100 decode steps";
  EXPECT_EQ(thread_count(), threads);
  EXPECT_EQ(s.position(), 150);
}

INSTANTIATE_TEST_SUITE_P(Caches, DecodeAllocTest,
                         ::testing::Values(Case{"fp32", KVPrecision::F32, 0, 0, 1},
                                           Case{"int4", KVPrecision::Int4, 0, 0, 1},
                                           Case{"int4_streaming", KVPrecision::Int4, 4, 40, 1},
                                           Case{"fp32_2threads", KVPrecision::F32, 0, 0, 2},
                                           Case{"int4_streaming_2threads", KVPrecision::Int4, 4, 40, 2},
                                           // every layer slides over 64 tokens: blocks given back in the measured steps
                                           Case{"sliding_fp32", KVPrecision::F32, 0, 0, 1, "mistral-swa-tiny", true},
                                           Case{"sliding_int4_2threads", KVPrecision::Int4, 0, 0, 2, "mistral-swa-tiny", true}),
                         [](const auto& info) { return std::string(info.param.name); });

// The MLX-layout affine products (kernels/affine.h) size their int8 x and tiles once: after a first
// call of each shape, decode-sized (gemv) and prefill-sized (gemm) calls allocate nothing.
TEST(AffineAllocTest, ProductsAllocateNothingAfterTheFirstCall) {
  const int rows = 96, cols = 256, T = 24;
  std::vector<uint32_t> codes(size_t(rows) * cols * 4 / 32, 0x76543210u);
  std::vector<uint16_t> sc(size_t(rows) * cols / 64, 0x3c00), bi(sc.size(), 0);  // f16 1.0, 0.0
  const WeightMatrix w = affine_matrix(codes.data(), sc.data(), bi.data(), DType::F16, 4, 64, rows, cols);
  std::vector<float> x(size_t(T) * cols, 0.5f), y(size_t(T) * rows);
  ThreadPool pool(1);
  for (int t : {1, 4, T}) matmul(x.data(), t, w, nullptr, y.data(), pool);
  const long before = g_news.load();
  for (int i = 0; i < 20; ++i)
    for (int t : {1, 4, T}) matmul(x.data(), t, w, nullptr, y.data(), pool);
  EXPECT_EQ(g_news.load() - before, 0) << "allocations in 60 affine products";
  EXPECT_NEAR(y[0], 0.5f * 32 * (0 + 1 + 2 + 3 + 4 + 5 + 6 + 7), 1e-3f) << "the product ran";
}

}  // namespace
}  // namespace ptllm
