// Attention over the stored KV of one kjv-small layer (8 query heads, 2 KV heads, head_dim 64) at
// every precision, and the cost of appending one token at growing context (KIVI: O(1)).
// Run: build/bench/bench_attention --benchmark_filter=... (one thread: the kernel, not the pool).
#include <benchmark/benchmark.h>

#include <random>

#include "core/thread_pool.h"
#include "kv/kv_cache.h"

namespace {

using ptllm::KVCache;
using ptllm::KVCacheConfig;
using ptllm::KVPrecision;

constexpr int kHeads = 8, kKV = 2, kDim = 64;

std::vector<float> random_vec(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

// A cache of `layers` layers each holding n tokens of random K/V, preallocated as a session's is.
std::unique_ptr<KVCache> filled(KVPrecision p, int n, int room, int layers = 1) {
  KVCacheConfig cfg;
  cfg.precision = p;
  cfg.ctx_size = n + room;
  cfg.preallocate = true;
  auto cache = std::make_unique<KVCache>(ptllm::KVShape{layers, kKV, kDim, {}}, cfg);
  const int chunk = 64;
  auto k = random_vec(size_t(chunk) * kKV * kDim, 1), v = random_vec(k.size(), 2);
  for (int done = 0; done < n; done += chunk) {
    const int t = std::min(chunk, n - done);
    for (int l = 0; l < layers; ++l) {
      cache->append(l, k.data(), v.data(), t);
      cache->apply_policy(l);  // what a step does after attention: quantize full groups
    }
  }
  return cache;
}

void BM_Attention(benchmark::State& state) {
  const auto p = KVPrecision(state.range(0));
  const int n = int(state.range(1));
  ptllm::ThreadPool pool(1);
  auto cache = filled(p, n, 64);
  // Measure one decode step's attention: append one token, attend, then rewind it.
  auto k = random_vec(kKV * kDim, 4), v = random_vec(kKV * kDim, 5), q = random_vec(kHeads * kDim, 6);
  std::vector<float> out(q.size());
  for (auto _ : state) {
    cache->append(0, k.data(), v.data(), 1);
    cache->attend(0, q.data(), 1, kHeads, out.data(), pool);
    cache->apply_policy(0);  // what a decode step does after attention
    cache->truncate(n);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetLabel(std::string(ptllm::kv_precision_name(p)));
  state.counters["kv_MB"] = double(cache->logical_bytes()) / 1e6;
}

// The same over the 8 layers of kjv-small in turn, as a decode step reads them: 8x the bytes, more
// than the last-level cache holds at 16K tokens of fp16 (67 MB), so this one streams from memory.
void BM_AttentionLayers(benchmark::State& state) {
  const auto p = KVPrecision(state.range(0));
  const int n = int(state.range(1)), layers = 8;
  ptllm::ThreadPool pool(1);
  auto cache = filled(p, n, 64, layers);
  auto k = random_vec(kKV * kDim, 4), v = random_vec(kKV * kDim, 5), q = random_vec(kHeads * kDim, 6);
  std::vector<float> out(q.size());
  for (auto _ : state) {
    for (int l = 0; l < layers; ++l) {
      cache->append(l, k.data(), v.data(), 1);
      cache->attend(l, q.data(), 1, kHeads, out.data(), pool);
      cache->apply_policy(l);
      cache->truncate(n);
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetLabel(std::string(ptllm::kv_precision_name(p)));
  state.counters["kv_MB"] = double(cache->logical_bytes()) / 1e6;
}

// Appending one token plus the policy (KIVI quantizes a group once per G tokens) at 1K and 16K
// stored tokens: the cost must be flat (the seed re-quantized all of K every step, O(T)).
constexpr int kAppends = 50000;
void BM_Append(benchmark::State& state) {
  const auto p = KVPrecision(state.range(0));
  const int n = int(state.range(1));
  auto cache = filled(p, n, kAppends + 64);
  auto k = random_vec(kKV * kDim, 4), v = random_vec(kKV * kDim, 5);
  for (auto _ : state) {
    cache->append(0, k.data(), v.data(), 1);
    cache->apply_policy(0);
  }
  state.SetLabel(std::string(ptllm::kv_precision_name(p)));
}

void Args(benchmark::internal::Benchmark* b) {
  for (auto p : {KVPrecision::F32, KVPrecision::F16, KVPrecision::BF16, KVPrecision::Int8, KVPrecision::Int4,
                 KVPrecision::Int2})
    b->Args({int64_t(p), 16384});
}

void LayersArgs(benchmark::internal::Benchmark* b) {
  for (int n : {4096, 16384})
    for (auto p : {KVPrecision::F32, KVPrecision::F16, KVPrecision::BF16, KVPrecision::Int8, KVPrecision::Int4,
                   KVPrecision::Int2})
      b->Args({int64_t(p), n});
}

BENCHMARK(BM_Attention)->Apply(Args)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_AttentionLayers)->Apply(LayersArgs)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Append)
    ->Args({int64_t(KVPrecision::Int4), 1024})
    ->Args({int64_t(KVPrecision::Int4), 16384})
    ->Args({int64_t(KVPrecision::F32), 1024})
    ->Args({int64_t(KVPrecision::F32), 16384})
    ->Iterations(kAppends)
    ->Unit(benchmark::kNanosecond);

}  // namespace

BENCHMARK_MAIN();
