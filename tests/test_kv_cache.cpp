// The dense block storage: attention against a plain reference, block accounting with and without
// preallocation, no copies of stored tokens, rewind, capacity.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/session.h"
#include "kv/kv_cache.h"
#include "test_util.h"

namespace ptllm {
namespace {

std::vector<float> random_vec(std::mt19937& rng, size_t n) {
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Plain causal GQA attention over whole K/V arrays [n][kv_heads][D]: the twin of KVCache::attend.
std::vector<float> reference_attention(const std::vector<float>& q, const std::vector<float>& k,
                                       const std::vector<float>& v, int T, int n_before, int n_heads, int n_kv, int D) {
  std::vector<float> out(size_t(T) * size_t(n_heads) * size_t(D));
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < n_heads; ++h) {
      const int g = h / (n_heads / n_kv), visible = n_before + t + 1;
      std::vector<double> s(static_cast<size_t>(visible));
      double mx = -1e300;
      for (int j = 0; j < visible; ++j) {
        double d = 0;
        for (int i = 0; i < D; ++i)
          d += double(q[(size_t(t) * size_t(n_heads) + size_t(h)) * size_t(D) + size_t(i)]) *
               k[(size_t(j) * size_t(n_kv) + size_t(g)) * size_t(D) + size_t(i)];
        s[size_t(j)] = d / std::sqrt(double(D));
        mx = std::max(mx, s[size_t(j)]);
      }
      double sum = 0;
      for (auto& x : s) sum += (x = std::exp(x - mx));
      for (int i = 0; i < D; ++i) {
        double acc = 0;
        for (int j = 0; j < visible; ++j)
          acc += s[size_t(j)] * v[(size_t(j) * size_t(n_kv) + size_t(g)) * size_t(D) + size_t(i)];
        out[(size_t(t) * size_t(n_heads) + size_t(h)) * size_t(D) + size_t(i)] = float(acc / sum);
      }
    }
  return out;
}

// Awkward sizes: block of 5 tokens, head_dim 24, GQA 3:1, appends of 13 then 1 then 9 tokens.
TEST(KVCacheTest, AttentionMatchesReference) {
  std::mt19937 rng(7);
  const int n_kv = 2, n_heads = 6, D = 24;
  KVCacheConfig cfg;
  cfg.group_size = 5;
  cfg.ctx_size = 40;
  KVCache cache(KVShape{2, n_kv, D, {}}, cfg);
  ThreadPool pool(2);
  std::vector<float> all_k, all_v;
  int stored = 0;
  for (int T : {13, 1, 9}) {
    auto k = random_vec(rng, size_t(T) * size_t(n_kv) * size_t(D));
    auto v = random_vec(rng, k.size());
    auto q = random_vec(rng, size_t(T) * size_t(n_heads) * size_t(D));
    all_k.insert(all_k.end(), k.begin(), k.end());
    all_v.insert(all_v.end(), v.begin(), v.end());
    for (int layer = 0; layer < 2; ++layer) cache.append(layer, k.data(), v.data(), T);
    std::vector<float> out(q.size());
    cache.attend(1, q.data(), T, n_heads, out.data(), pool);
    for (int layer = 0; layer < 2; ++layer) cache.apply_policy(layer);
    auto want = reference_attention(q, all_k, all_v, T, stored, n_heads, n_kv, D);
    for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], want[i], 1e-5f) << "T=" << T << " i=" << i;
    stored += T;
  }
  EXPECT_EQ(cache.n_stored(), 23);
  EXPECT_EQ(cache.logical_bytes(), size_t(23) * 2 * 2 * n_kv * D * sizeof(float));
}

TEST(KVCacheTest, PreallocatedMemoryIsFlat) {
  KVCacheConfig cfg;
  cfg.group_size = 32;
  cfg.ctx_size = 100;  // 4 blocks per layer
  KVCache cache(KVShape{3, 2, 16, {}}, cfg);
  const size_t block_bytes = 2 * 32 * 2 * 16 * sizeof(float);
  EXPECT_EQ(cache.physical_bytes(), 3 * 4 * block_bytes);
  std::vector<float> kv(2 * 16 * 100, 0.5f);
  for (int l = 0; l < 3; ++l) cache.append(l, kv.data(), kv.data(), 70);
  EXPECT_EQ(cache.physical_bytes(), 3 * 4 * block_bytes);
}

TEST(KVCacheTest, OnDemandGrowsByWholeBlocksWithoutMovingData) {
  KVCacheConfig cfg;
  cfg.group_size = 8;
  cfg.ctx_size = 64;
  cfg.preallocate = false;
  KVCache cache(KVShape{2, 1, 4, {}}, cfg);
  const size_t block_bytes = 2 * 8 * 1 * 4 * sizeof(float);
  EXPECT_EQ(cache.physical_bytes(), 0u);
  std::vector<float> k(4), v(4);
  for (int t = 0; t < 20; ++t) {
    k.assign(4, float(t));
    v.assign(4, float(-t));
    for (int l = 0; l < 2; ++l) cache.append(l, k.data(), v.data(), 1);
    EXPECT_EQ(cache.physical_bytes(), 2 * size_t(t / 8 + 1) * block_bytes) << t;
  }
  // Growth never disturbed what was stored before.
  float out[4];
  for (int t = 0; t < 20; ++t) {
    cache.read_key(1, t, 0, out);
    EXPECT_EQ(out[3], float(t));
    cache.read_value(1, t, 0, out);
    EXPECT_EQ(out[0], float(-t));
  }
}

TEST(KVCacheTest, TruncateReturnsBlocksAndAppendReusesThem) {
  KVCacheConfig cfg;
  cfg.group_size = 4;
  cfg.ctx_size = 16;
  cfg.preallocate = false;
  KVCache cache(KVShape{1, 1, 2, {}}, cfg);
  std::vector<float> kv(2 * 10);
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = float(i);
  cache.append(0, kv.data(), kv.data(), 10);
  const size_t physical = cache.physical_bytes();
  cache.truncate(3);
  EXPECT_EQ(cache.n_stored(), 3);
  float out[2];
  cache.read_key(0, 2, 0, out);
  EXPECT_EQ(out[1], 5.f);
  std::vector<float> more(2 * 13, 1.f);
  cache.append(0, more.data(), more.data(), 13);  // 16 = full capacity, reusing the freed blocks
  EXPECT_EQ(cache.n_stored(), 16);
  EXPECT_EQ(cache.physical_bytes(), physical + 1 * 2 * 4 * 2 * sizeof(float));
  EXPECT_FALSE(cache.fits(1));
  EXPECT_TRUE(cache.fits(0));
}

TEST(KVCacheTest, ContextLongerThanCtxSizeIsAnError) {
  auto model = Model::load(test::repo_model("kjv-tiny"));
  ThreadPool pool(1);
  SessionOptions o;
  o.kv.ctx_size = 10;
  Session s(*model, o, pool);
  std::vector<int32_t> ids(8, 5);
  s.feed(ids);
  try {
    s.feed(std::vector<int32_t>(3, 5));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "context full: 11 tokens would exceed --ctx-size 10");
  }
  EXPECT_EQ(s.position(), 8);  // nothing was lost: the session continues
  int32_t one = 5;
  s.feed({&one, 1});
  s.feed({&one, 1});
  EXPECT_EQ(s.cache().n_stored(), 10);
}

TEST(KVCacheTest, PreallocatedAndOnDemandGiveIdenticalLogits) {
  auto model = Model::load(test::repo_model("kjv-tiny"));
  ThreadPool pool(2);
  SessionOptions a, b;
  a.kv.ctx_size = b.kv.ctx_size = 128;
  b.kv.preallocate = false;
  Session sa(*model, a, pool), sb(*model, b, pool);
  std::vector<int32_t> ids;
  for (int i = 0; i < 70; ++i) ids.push_back((i * 37) % 8000 + 3);
  auto la = sa.feed(ids);
  auto lb = sb.feed(ids);
  for (size_t i = 0; i < la.size(); ++i) ASSERT_EQ(la[i], lb[i]);
  EXPECT_LT(sb.cache().physical_bytes(), sa.cache().physical_bytes());
}

}  // namespace
}  // namespace ptllm
