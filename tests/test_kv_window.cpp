// Per-layer sliding windows in the KV cache, transformers' convention (query i sees keys j with
// i - W < j <= i): attention equals a by-hand softmax over exactly those keys, computed from the K/V
// the test appended, alone and composed with KIVI and StreamingLLM; blocks are given back as they
// leave the window and memory stays flat over a 20,000-token run; states of other windows are refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/ops.h"
#include "kv/kv_cache.h"
#include "test_util.h"

namespace ptllm {
namespace {

struct WindowHarness {
  KVCacheConfig cfg;
  std::vector<int> windows;  // [n_layers] the model's windows, 0 = full
  int n_kv = 2, n_heads = 4, D = 16;
  std::vector<float> inv_freq;
  std::mt19937 rng{7};
  // What the test appended to each layer: K, V [token][n_kv][D].
  std::vector<std::vector<float>> ks, vs;

  int n_layers() const { return int(windows.size()); }
  KVShape shape() {
    inv_freq.resize(size_t(D / 2));
    for (int i = 0; i < D / 2; ++i) inv_freq[size_t(i)] = float(1.0 / std::pow(10000.0, 2.0 * i / D));
    ks.assign(windows.size(), {});
    vs.assign(windows.size(), {});
    return KVShape{n_layers(), n_kv, D, inv_freq, windows};
  }
  std::vector<float> random(size_t n) {
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> v(n);
    for (auto& x : v) x = nd(rng);
    return v;
  }
  std::vector<float> rotated(const float* x, int64_t pos) const {
    std::vector<float> c(size_t(D / 2)), s(size_t(D / 2)), out(static_cast<size_t>(D));
    rope_cos_sin(inv_freq.data(), D / 2, pos, c.data(), s.data());
    rope_rotate_one(x, D, c.data(), s.data(), out.data());
    return out;
  }

  // The keys query i of `layer` sees: the window (i - W, i], intersected with StreamingLLM's sinks
  // [0, N) and window (i - M, i] when it is on.
  std::vector<int64_t> visible(int layer, int64_t i) const {
    const int W = windows[size_t(layer)];
    std::vector<int64_t> keys;
    for (int64_t j = 0; j <= i; ++j) {
      const bool in_native = W == 0 || j > i - W;
      const bool in_stream = !cfg.streaming() || j < cfg.sink || j > i - cfg.window;
      if (in_native && in_stream) keys.push_back(j);
    }
    return keys;
  }

  // Attention of query i by hand. Keys: as appended (fp32) or as the cache converts or dequantizes them.
  // Cache positions: a full layer under StreamingLLM rotates by cache slot (the query's capped at
  // N + M - 1, a key's its place in the list); a sliding layer by the true distance.
  std::vector<float> by_hand(const KVCache& cache, int layer, const float* q, int64_t i) const {
    const std::vector<int64_t> keys = visible(layer, i);
    const int group = n_heads / n_kv, N = cfg.sink, M = cfg.window;
    const bool slides = windows[size_t(layer)] > 0, rotate = cfg.positions == PositionMode::Cache;
    const int64_t q_slot = cfg.streaming() && !slides ? std::min<int64_t>(i, N + M - 1) : i;
    std::vector<float> out(size_t(n_heads) * size_t(D)), k(static_cast<size_t>(D)), v(static_cast<size_t>(D));
    for (int h = 0; h < n_heads; ++h) {
      const int g = h / group;
      const float* qh = q + size_t(h) * size_t(D);
      const std::vector<float> qv = rotate ? rotated(qh, q_slot) : std::vector<float>(qh, qh + D);
      std::vector<double> w;
      std::vector<std::vector<float>> vals;
      for (size_t n = 0; n < keys.size(); ++n) {
        const size_t at = (size_t(keys[n]) * size_t(n_kv) + size_t(g)) * size_t(D);
        if (cfg.precision != KVPrecision::F32) {
          cache.read_key(layer, keys[n], g, k.data());
          cache.read_value(layer, keys[n], g, v.data());
        } else {
          k.assign(ks[size_t(layer)].begin() + std::ptrdiff_t(at), ks[size_t(layer)].begin() + std::ptrdiff_t(at + size_t(D)));
          v.assign(vs[size_t(layer)].begin() + std::ptrdiff_t(at), vs[size_t(layer)].begin() + std::ptrdiff_t(at + size_t(D)));
        }
        const int64_t k_slot = slides ? keys[n] : int64_t(n);
        const std::vector<float> kk = rotate ? rotated(k.data(), k_slot) : k;
        double s = 0;
        for (int d = 0; d < D; ++d) s += double(qv[size_t(d)]) * kk[size_t(d)];
        w.push_back(s / std::sqrt(double(D)));
        vals.push_back(v);
      }
      const double mx = *std::max_element(w.begin(), w.end());
      double sum = 0;
      for (auto& x : w) sum += (x = std::exp(x - mx));
      for (int d = 0; d < D; ++d) {
        double acc = 0;
        for (size_t n = 0; n < w.size(); ++n) acc += w[n] * vals[n][size_t(d)];
        out[size_t(h) * size_t(D) + size_t(d)] = float(acc / sum);
      }
    }
    return out;
  }

  // Appends T random tokens to every layer and attends; compares with by_hand when `check`.
  void step(KVCache& cache, int T, ThreadPool& pool, float tol, bool check = true) {
    ASSERT_LE(T, cache.max_append());
    const int64_t n_before = cache.n_tokens();
    for (int layer = 0; layer < n_layers(); ++layer) {
      auto k = random(size_t(T) * size_t(n_kv) * size_t(D));
      auto v = random(k.size());
      auto q = random(size_t(T) * size_t(n_heads) * size_t(D));
      ks[size_t(layer)].insert(ks[size_t(layer)].end(), k.begin(), k.end());
      vs[size_t(layer)].insert(vs[size_t(layer)].end(), v.begin(), v.end());
      cache.append(layer, k.data(), v.data(), T);
      std::vector<std::vector<float>> want;
      for (int t = 0; t < T && check; ++t)
        want.push_back(by_hand(cache, layer, q.data() + size_t(t) * size_t(n_heads) * size_t(D), n_before + t));
      std::vector<float> out(q.size());
      cache.attend(layer, q.data(), T, n_heads, out.data(), pool);
      cache.apply_policy(layer);  // what a step does after attention
      for (int t = 0; t < T && check; ++t)
        for (size_t x = 0; x < want[size_t(t)].size(); ++x)
          ASSERT_NEAR(out[size_t(t) * size_t(n_heads) * size_t(D) + x], want[size_t(t)][x], tol)
              << cfg.describe() << " token " << n_before + t << " layer " << layer;
    }
  }
};

struct WindowCase {
  std::string name;
  KVPrecision precision;
  int sink, window;  // StreamingLLM
  PositionMode positions;
};

class KVWindowTest : public ::testing::TestWithParam<WindowCase> {};

// Windows off the block grid (13, 40 with blocks of 8) next to a full layer, fed in uneven chunks
// then token by token, past several windows.
TEST_P(KVWindowTest, AttentionSeesExactlyTheWindow) {
  const WindowCase& c = GetParam();
  WindowHarness h;
  h.windows = {0, 13, 40};
  h.cfg.precision = c.precision;
  h.cfg.group_size = 8;
  h.cfg.residual = 16;
  h.cfg.sink = c.sink;
  h.cfg.window = c.window;
  h.cfg.positions = c.positions;
  h.cfg.ctx_size = 512;
  KVCache cache(h.shape(), h.cfg);
  const float tol = is_kivi(c.precision) ? 0.03f : 2e-4f;
  for (int threads : {1, 2}) {
    ThreadPool pool(threads);
    for (int T : {1, 5, 17, 64, 3, 30}) h.step(cache, std::min(T, cache.max_append()), pool, tol);
    for (int i = 0; i < 60; ++i) h.step(cache, 1, pool, tol);
  }
  // A sliding layer holds its window and less than a block more; the full layer everything (under
  // StreamingLLM, its sinks and window).
  if (c.window == 0)
    EXPECT_EQ(cache.held_tokens(0), cache.n_tokens());
  else
    EXPECT_LT(cache.held_tokens(0), c.sink + c.window + 8);
  EXPECT_LT(cache.held_tokens(1), c.sink + std::min(13, c.window > 0 ? c.window : 13) + 8);
  EXPECT_LT(cache.held_tokens(2), c.sink + std::min(40, c.window > 0 ? c.window : 40) + 8);
}

INSTANTIATE_TEST_SUITE_P(
    Configs, KVWindowTest,
    ::testing::Values(WindowCase{"fp32", KVPrecision::F32, 0, 0, PositionMode::Absolute},
                      WindowCase{"bf16_cache_positions", KVPrecision::BF16, 0, 0, PositionMode::Cache},
                      WindowCase{"int4", KVPrecision::Int4, 0, 0, PositionMode::Absolute},
                      WindowCase{"fp32_sink4_w24_cache", KVPrecision::F32, 4, 24, PositionMode::Cache},
                      WindowCase{"fp32_sink3_w60_absolute", KVPrecision::F32, 3, 60, PositionMode::Absolute},
                      WindowCase{"int4_sink4_w24_cache", KVPrecision::Int4, 4, 24, PositionMode::Cache},
                      WindowCase{"int4_sink2_w30_absolute", KVPrecision::Int4, 2, 30, PositionMode::Absolute}),
    [](const auto& info) { return info.param.name; });

// Every layer slides: no context limit (ctx_size 128 here), blocks given back as they leave the
// window, the same memory after 20,000 tokens as after 200, and still the right attention at the end
// (4,000 tokens in the light sanitized build: the windows still turn over a hundred times).
TEST(KVWindowMemoryTest, TwentyThousandTokensHoldMemoryFlat) {
  const int n_tokens = test::light_or(20000);
  for (KVPrecision p : {KVPrecision::F32, KVPrecision::Int4}) {
    for (bool prealloc : {true, false}) {
      WindowHarness h;
      h.windows = {40, 24};
      h.cfg.precision = p;
      h.cfg.group_size = 8;
      h.cfg.residual = 8;
      h.cfg.ctx_size = 128;
      h.cfg.preallocate = prealloc;
      KVCache cache(h.shape(), h.cfg);
      ThreadPool pool(1);
      size_t physical_at_200 = 0;
      for (int i = 0; i < n_tokens; ++i) {
        ASSERT_TRUE(cache.fits(1)) << i;
        h.step(cache, 1, pool, 0, false);
        if (i == 199) physical_at_200 = cache.physical_bytes();
        ASSERT_LT(cache.held_tokens(0), 40 + 8) << i;
        ASSERT_LT(cache.held_tokens(1), 24 + 8) << i;
      }
      EXPECT_EQ(cache.physical_bytes(), physical_at_200) << kv_precision_name(p) << " preallocate " << prealloc;
      EXPECT_EQ(cache.n_tokens(), n_tokens);
      EXPECT_EQ(cache.n_stored(), 40);
      h.step(cache, 1, pool, is_kivi(p) ? 0.03f : 2e-4f);  // the last query sees the last 40 keys
      // The pools were sized for the windows, not for ctx_size or the run.
      WindowHarness full;
      full.windows = {0, 0};
      full.cfg = h.cfg;
      full.cfg.ctx_size = 4096;
      h.cfg.ctx_size = 4096;
      if (prealloc) {
        EXPECT_LT(KVCache(h.shape(), h.cfg).physical_bytes() * 5, KVCache(full.shape(), full.cfg).physical_bytes());
      }
    }
  }
}

// One full layer keeps ctx_size as the limit.
TEST(KVWindowMemoryTest, AFullLayerKeepsTheContextLimit) {
  WindowHarness h;
  h.windows = {16, 0};
  h.cfg.group_size = 8;
  h.cfg.ctx_size = 100;
  KVCache cache(h.shape(), h.cfg);
  ThreadPool pool(1);
  for (int i = 0; i < 100; ++i) h.step(cache, 1, pool, 2e-4f, i % 10 == 0);
  EXPECT_FALSE(cache.fits(1));
  EXPECT_EQ(cache.n_stored(), 100);
  EXPECT_LT(cache.held_tokens(0), 16 + 8);
  // A window wider than the context never slides within it: the limit stays too.
  WindowHarness wide;
  wide.windows = {200, 300};
  wide.cfg.ctx_size = 100;
  EXPECT_FALSE(KVCache(wide.shape(), wide.cfg).fits(101));
}

TEST(KVWindowStateTest, RewindAndRestoreWithinTheWindow) {
  WindowHarness h;
  h.windows = {0, 20};
  h.cfg.group_size = 8;
  h.cfg.ctx_size = 256;
  KVCache cache(h.shape(), h.cfg);
  ThreadPool pool(1);
  for (int i = 0; i < 80; ++i) h.step(cache, 1, pool, 2e-4f, false);
  const int64_t floor = cache.rewind_floor();
  EXPECT_GT(floor, 40);  // layer 1 gave back blocks, and the next query needs its window
  EXPECT_LE(floor, 80);
  EXPECT_THROW(cache.truncate(floor - 1), Error);
  cache.truncate(floor);
  for (auto* rec : {&h.ks, &h.vs})
    for (auto& layer : *rec) layer.resize(size_t(floor) * size_t(h.n_kv) * size_t(h.D));
  for (int i = 0; i < 30; ++i) h.step(cache, 1, pool, 2e-4f);

  // serialize -> deserialize continues; a cache of other windows refuses the state.
  std::string state;
  cache.serialize(state);
  KVCache same(h.shape(), h.cfg);
  same.deserialize(state);
  EXPECT_EQ(same.n_tokens(), cache.n_tokens());
  std::string again;
  same.serialize(again);
  EXPECT_EQ(again, state);
  for (std::vector<int> other : {std::vector<int>{0, 0}, std::vector<int>{0, 24}, std::vector<int>{20, 20}}) {
    WindowHarness o;
    o.windows = other;
    o.cfg = h.cfg;
    KVCache c(o.shape(), o.cfg);
    try {
      c.deserialize(state);
      ADD_FAILURE() << "a state of windows {0, 20} loaded into windows {" << other[0] << ", " << other[1] << "}";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("other sliding windows"), std::string::npos) << e.what();
      EXPECT_EQ(c.n_tokens(), 0);
    }
  }
}

}  // namespace
}  // namespace ptllm
