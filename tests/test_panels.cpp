// BF16 weights in panels (kernels/panels.h): the products against a double-precision reference of the
// row-major matrix, every row of x the same bits alone or in any batch and with any threads, every
// kernel target the same bits, rows read back exactly; and a model packed at load time answering
// what the row-major model answers, a sequence's logits the same bits alone and in a batch.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "core/thread_pool.h"
#include "engine/session.h"
#include "kernels/amx.h"
#include "kernels/ops.h"
#include "kernels/panels.h"
#include "kernels/simd.h"
#include "model/model.h"
#include "shared_x_check.h"
#include "test_util.h"

namespace ptllm {
namespace {

uint16_t bf16_rne(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

using test::normal;

// A random row-major BF16 matrix and its packed copy (64-byte aligned, as the model allocates it).
struct Packed {
  std::vector<uint16_t> rows;
  std::vector<uint16_t> buf;
  WeightMatrix dense, panels;
  Packed(int N, int K, uint32_t seed, ThreadPool& pool) : rows(size_t(N) * size_t(K)), buf(rows.size() + 32) {
    const auto f = normal(rows.size(), 0.05f, seed);
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = bf16_rne(f[i]);
    dense = dense_matrix(DType::BF16, rows.data(), N, K);
    auto* p = reinterpret_cast<uint16_t*>((reinterpret_cast<uintptr_t>(buf.data()) + 63) / 64 * 64);
    pack_panels(dense, p, pool);
    panels = panels_matrix(p, N, K);
  }
};

struct Shape {
  int N, K;
};
const Shape kShapes[] = {{16, 2}, {48, 6}, {80, 130}, {32, 512}, {144, 64}};
const int kRows[] = {1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 33, 70};

TEST(PanelsTest, OnlyBf16MatricesOfWholePanelsAndEvenColumnsFit) {
  std::vector<uint16_t> w(64 * 8);
  EXPECT_TRUE(panels_fit(dense_matrix(DType::BF16, w.data(), 32, 8)));
  EXPECT_FALSE(panels_fit(dense_matrix(DType::BF16, w.data(), 24, 8)));  // 24 rows: not whole panels
  EXPECT_FALSE(panels_fit(dense_matrix(DType::BF16, w.data(), 32, 7)));  // an odd column count
  EXPECT_FALSE(panels_fit(dense_matrix(DType::F16, w.data(), 32, 8)));
  EXPECT_FALSE(panels_fit(dense_matrix(DType::F32, w.data(), 16, 8)));
  const WeightMatrix p = panels_matrix(w.data(), 32, 8);
  EXPECT_EQ(p.format, WeightFormat::Panels);
  EXPECT_FALSE(panels_fit(p));  // packed once
  EXPECT_EQ(p.format_name(), "BF16");
  EXPECT_EQ(p.nbytes(), panels_bytes(dense_matrix(DType::BF16, w.data(), 32, 8)));
}

// The products' layout is in the kernels' name (and so in the prompt cache's key): a cache written
// with one layout is not read by a process computing with the other.
TEST(PanelsTest, TheLayoutIsInTheKernelsName) {
  if (!panels_wanted()) GTEST_SKIP() << "this CPU's kernels keep the row-major layout (no AVX-512 or AVX2)";
  EXPECT_NE(active_kernels_name().find("+panels"), std::string::npos) << active_kernels_name();
  set_panels_enabled(false);
  EXPECT_EQ(active_kernels_name().find("panels"), std::string::npos) << active_kernels_name();
  set_panels_enabled(true);
}

TEST(PanelsTest, RowsReadBackExactly) {
  ThreadPool pool(2);
  const Packed m(48, 130, 3, pool);
  std::vector<float> got(130), want(130);
  for (int r : {0, 1, 15, 16, 31, 47}) {
    weight_row(m.panels, r, got.data());
    weight_row(m.dense, r, want.data());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << "row " << r;
  }
}

TEST(PanelsTest, ProductsMatchTheReference) {
  ThreadPool pool(2);
  uint32_t seed = 10;
  for (const Shape& s : kShapes) {
    const Packed m(s.N, s.K, seed++, pool);
    const auto bias = normal(size_t(s.N), 0.1f, seed++);
    for (int T : kRows) {
      const auto x = normal(size_t(T) * size_t(s.K), 1.f, seed++);
      std::vector<float> got(size_t(T) * size_t(s.N)), want(got.size());
      for (const float* b : {static_cast<const float*>(nullptr), bias.data()}) {
        panels_matmul(x.data(), T, m.panels, b, got.data(), pool);  // not AMX's, from 8 rows
        matmul_ref(x.data(), T, m.dense, b, want.data());
        for (size_t i = 0; i < got.size(); ++i)
          ASSERT_NEAR(got[i], want[i], 1e-5 * std::sqrt(double(s.K)) + 1e-6 * std::fabs(want[i]))
              << s.N << "x" << s.K << " T=" << T << " at " << i << (b ? " with bias" : "");
      }
    }
  }
}

// A row's sums are taken in one order whatever the tile, the batch or the threads: every row of a
// T-row product is the bits of that row alone, with one thread or two.
TEST(PanelsTest, EachRowGetsTheSameBitsAloneInABatchAndWithAnyThreads) {
  ThreadPool one(1), two(2);
  const Packed m(80, 130, 21, two);
  const int T = 33;
  const auto x = normal(size_t(T) * 130, 1.f, 22);
  std::vector<float> batch(size_t(T) * 80), single(batch.size()), alone(80);
  panels_matmul(x.data(), T, m.panels, nullptr, batch.data(), two);  // matmul takes AMX from 8 rows
  panels_matmul(x.data(), T, m.panels, nullptr, single.data(), one);
  EXPECT_EQ(std::memcmp(batch.data(), single.data(), batch.size() * sizeof(float)), 0);
  for (int t = 0; t < T; ++t) {
    matmul(x.data() + size_t(t) * 130, 1, m.panels, nullptr, alone.data(), two);
    ASSERT_EQ(std::memcmp(alone.data(), batch.data() + size_t(t) * 80, alone.size() * sizeof(float)), 0) << "row " << t;
  }
}

// Several matrices in one call (q, k and v: ops.h matmul_shared_x): each the bits of its own product,
// on every kernel target, whichever matrices a thread's part crosses (9 panels, parts of 4); with a
// row-major matrix among them each is its own call.
TEST(PanelsTest, SeveralMatricesInOneCallGetTheirOwnBits) {
  ThreadPool pool(2);
  const Packed q(80, 64, 41, pool), k(16, 64, 42, pool), v(48, 64, 43, pool);
  const WeightMatrix panels[] = {q.panels, k.panels, v.panels}, mixed[] = {q.panels, k.dense, v.panels};
  const SimdTarget before = active_simd_target();
  for (SimdTarget target : available_simd_targets()) {
    set_simd_target(target);
    for (int T : {1, 3, 7}) {  // the panels' own product (AMX from 8 rows: test_amx.cpp)
      test::expect_shared_x_equals_separate_calls(panels, T, pool, std::string(simd_target_name(target)).c_str());
      test::expect_shared_x_equals_separate_calls(mixed, T, pool, std::string(simd_target_name(target)).c_str());
    }
  }
  set_simd_target(before);
}

// A model packed under one target still runs after a switch: every target computes the same bits
// from the panels (AVX2 by halves of 8 rows, the others a row at a time, with fused multiply-adds as
// AVX-512's).
TEST(PanelsTest, EveryKernelTargetGivesTheSameBits) {
  ThreadPool pool(2);
  const Packed m(48, 70, 31, pool);
  const int T = 5;
  const auto x = normal(size_t(T) * 70, 1.f, 32);
  const auto bias = normal(48, 0.1f, 33);
  const SimdTarget before = active_simd_target();
  std::vector<float> first;
  for (SimdTarget t : available_simd_targets()) {
    set_simd_target(t);
    std::vector<float> y(size_t(T) * 48);
    matmul(x.data(), T, m.panels, bias.data(), y.data(), pool);
    if (first.empty()) first = y;
    EXPECT_EQ(std::memcmp(y.data(), first.data(), y.size() * sizeof(float)), 0) << simd_target_name(t);
  }
  set_simd_target(before);
}

// x rounded to bf16 (PTLLM_PANELS_BF16_X): the products are exact sums of bf16 products, so against
// the double-precision reference of x rounded the same way they keep the exact-x tolerance; each
// row is the bits it gets alone, with any threads, and on every target (the vdpbf16ps kernel against
// its twin of fused multiply-adds, odd column first).
struct Bf16X {
  Bf16X() { set_panels_bf16_x(true); }
  ~Bf16X() { set_panels_bf16_x(false); }
};

std::vector<float> rounded_to_bf16(const std::vector<float>& x) {
  std::vector<float> r(x.size());
  for (size_t i = 0; i < x.size(); ++i) r[i] = bf16_to_f32(bf16_rne(x[i]));
  return r;
}

TEST(PanelsBf16XTest, ProductsMatchTheReferenceOfRoundedX) {
  const Bf16X on;
  ThreadPool pool(2);
  uint32_t seed = 50;
  for (const Shape& s : kShapes) {
    const Packed m(s.N, s.K, seed++, pool);
    const auto bias = normal(size_t(s.N), 0.1f, seed++);
    for (int T : kRows) {
      const auto x = normal(size_t(T) * size_t(s.K), 1.f, seed++);
      const auto xr = rounded_to_bf16(x);
      std::vector<float> got(size_t(T) * size_t(s.N)), want(got.size()), exact(got.size());
      panels_matmul(x.data(), T, m.panels, bias.data(), got.data(), pool);
      matmul_ref(xr.data(), T, m.dense, bias.data(), want.data());
      matmul_ref(x.data(), T, m.dense, bias.data(), exact.data());
      double moved = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_NEAR(got[i], want[i], 1e-5 * std::sqrt(double(s.K)) + 1e-6 * std::fabs(want[i]))
            << s.N << "x" << s.K << " T=" << T << " at " << i;
        moved = std::max(moved, double(std::fabs(got[i] - exact[i])));
      }
      if (s.K >= 64) {
        EXPECT_GT(moved, 1e-5) << s.N << "x" << s.K << " T=" << T << ": x was not rounded";
      }
    }
  }
}

TEST(PanelsBf16XTest, EachRowGetsTheSameBitsAloneInABatchOnEveryTarget) {
  const Bf16X on;
  ThreadPool one(1), two(2);
  const Packed m(80, 130, 61, two);
  const int T = 33;
  const auto x = normal(size_t(T) * 130, 1.f, 62);
  const auto bias = normal(80, 0.1f, 63);
  std::vector<float> batch(size_t(T) * 80), single(batch.size()), alone(80);
  panels_matmul(x.data(), T, m.panels, bias.data(), batch.data(), two);
  panels_matmul(x.data(), T, m.panels, bias.data(), single.data(), one);
  EXPECT_EQ(std::memcmp(batch.data(), single.data(), batch.size() * sizeof(float)), 0);
  const SimdTarget before = active_simd_target();
  for (SimdTarget target : available_simd_targets()) {
    for (bool dp : {true, false}) {  // vdpbf16ps, or fused multiply-adds as without AVX512_BF16
      set_simd_target(target);
      detail::set_panels_bf16_dp(dp);
      for (int t = 0; t < T; ++t) {
        panels_matmul(x.data() + size_t(t) * 130, 1, m.panels, bias.data(), alone.data(), two);
        ASSERT_EQ(std::memcmp(alone.data(), batch.data() + size_t(t) * 80, alone.size() * sizeof(float)), 0)
            << "row " << t << " on " << simd_target_name(target) << (dp ? "" : " without vdpbf16ps");
      }
    }
  }
  detail::set_panels_bf16_dp(true);
  set_simd_target(before);
}

TEST(PanelsBf16XTest, TheModeIsInTheKernelsName) {
  if (!panels_wanted()) GTEST_SKIP() << "this CPU's kernels keep the row-major layout (no AVX-512 or AVX2)";
  EXPECT_EQ(active_kernels_name().find("bf16x"), std::string::npos) << active_kernels_name();
  const Bf16X on;
  EXPECT_NE(active_kernels_name().find("+panels-bf16x"), std::string::npos) << active_kernels_name();
}

// Prefill takes rows of more than 2048 columns (float32 x; 4096 for bf16 x) in slices, the
// accumulators kept between them: each row still gets the bits it gets alone, and the products match
// the reference. 4160 columns: two whole slices and a short one with float32 x, one and a short one
// with bf16 x; 70 rows: a chunk of 64 and one of 6, through tiles of 8, 4, 2 and 1 rows; 3 panels:
// a pair and one alone.
TEST(PanelsSlicesTest, LongRowsKeepEachRowsBitsAndMatchTheReference) {
  ThreadPool one(1), two(2);
  const int N = 48, K = 4160, T = 70;
  const Packed m(N, K, 71, two);
  const auto x = normal(size_t(T) * size_t(K), 1.f, 72);
  const auto bias = normal(size_t(N), 0.1f, 73);
  for (bool bf16x : {false, true}) {
    set_panels_bf16_x(bf16x);
    const char* mode = bf16x ? "bf16 x" : "float32 x";
    std::vector<float> batch(size_t(T) * N), single(batch.size()), alone(N), want(batch.size());
    panels_matmul(x.data(), T, m.panels, bias.data(), batch.data(), two);
    panels_matmul(x.data(), T, m.panels, bias.data(), single.data(), one);
    EXPECT_EQ(std::memcmp(batch.data(), single.data(), batch.size() * sizeof(float)), 0) << mode;
    for (int t = 0; t < T; ++t) {
      panels_matmul(x.data() + size_t(t) * K, 1, m.panels, bias.data(), alone.data(), two);
      ASSERT_EQ(std::memcmp(alone.data(), batch.data() + size_t(t) * N, alone.size() * sizeof(float)), 0)
          << mode << ", row " << t;
    }
    matmul_ref((bf16x ? rounded_to_bf16(x) : x).data(), T, m.dense, bias.data(), want.data());
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(batch[i], want[i], 1e-5 * std::sqrt(double(K)) + 1e-6 * std::fabs(want[i])) << mode << " at " << i;
  }
  set_panels_bf16_x(false);
}

// A checkpoint of BF16 weights (make-model's tiny shape) loaded with and without panels: the same
// greedy ids and logits within float noise; with panels a sequence's logits in a batch of six are
// the bits it gets alone (the products add a row in one order whatever the batch; the row-major
// products take 4 x 4 tiles from 5 rows, which add in another order than one row).
class PanelsModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!panels_wanted()) GTEST_SKIP() << "this CPU's kernels keep the row-major layout (no AVX-512 or AVX2)";
    auto r = test::run_command(test::binary() + " make-model --shape tiny --dtype bf16 --threads 1 " +
                               dir_.path.string());
    ASSERT_EQ(r.code, 0) << r.err;
  }
  static SessionOptions options() {
    SessionOptions o;
    o.kv.ctx_size = 256;
    return o;
  }
  test::TempDir dir_;
};

TEST_F(PanelsModelTest, APackedModelAnswersAsTheRowMajorOne) {
  ThreadPool pool(2);
  const auto packed = Model::load(dir_.path);
  set_panels_enabled(false);
  const auto plain = Model::load(dir_.path);
  set_panels_enabled(true);
  // Every layer's 7 matrices and the tied LM head.
  EXPECT_EQ(packed->panel_matrices(), size_t(7 * packed->config().n_layers + 1));
  EXPECT_EQ(plain->panel_matrices(), 0u);
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> id(3, packed->config().vocab_size - 1);
  std::vector<int32_t> prompt(40);
  for (auto& t : prompt) t = id(rng);
  Session a(*packed, options(), pool), b(*plain, options(), pool);
  std::vector<float> la, lb;
  for (int step = 0; step < 12; ++step) {
    const auto sa = a.feed(prompt), sb = b.feed(prompt);
    la.assign(sa.begin(), sa.end());
    lb.assign(sb.begin(), sb.end());
    double worst = 0;
    for (size_t v = 0; v < la.size(); ++v) worst = std::max(worst, double(std::fabs(la[v] - lb[v])));
    ASSERT_LT(worst, 1e-4) << "step " << step;
    const int32_t na = int32_t(std::max_element(la.begin(), la.end()) - la.begin());
    ASSERT_EQ(na, int32_t(std::max_element(lb.begin(), lb.end()) - lb.begin())) << "step " << step;
    prompt.assign(1, na);
  }
}

TEST_F(PanelsModelTest, ASequenceGetsTheSameBitsAloneAndInABatch) {
  ThreadPool pool(2);
  const auto model = Model::load(dir_.path);
  ASSERT_GT(model->panel_matrices(), 0u);
  constexpr size_t kSeqs = 6;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> id(3, model->config().vocab_size - 1);
  std::vector<std::vector<int32_t>> prompts(kSeqs);
  for (size_t i = 0; i < kSeqs; ++i) {
    prompts[i].resize(9 + 13 * i);
    for (auto& t : prompts[i]) t = id(rng);
  }
  std::vector<std::unique_ptr<Session>> batch;
  std::vector<Session*> ptrs;
  std::vector<int32_t> next(kSeqs);
  for (size_t i = 0; i < kSeqs; ++i) {
    batch.push_back(std::make_unique<Session>(*model, options(), pool));
    ptrs.push_back(batch.back().get());
    batch.back()->feed(prompts[i]);
    next[i] = 3 + int32_t(i);
  }
  std::vector<std::span<const int32_t>> feeds;
  for (size_t i = 0; i < kSeqs; ++i) feeds.emplace_back(&next[i], 1);
  ForwardState st;
  Session::feed_batch(ptrs, feeds, st);
  for (size_t i = 0; i < kSeqs; ++i) {
    Session alone(*model, options(), pool);
    alone.feed(prompts[i]);
    const auto want = alone.feed({&next[i], 1});
    const auto got = batch[i]->last_logits();
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << "sequence " << i;
  }
}

// The same with x rounded to bf16: the batch contract holds, and the logits stay near the exact ones.
TEST_F(PanelsModelTest, WithBf16XASequenceGetsTheSameBitsAloneAndInABatch) {
  ThreadPool pool(2);
  const auto model = Model::load(dir_.path);
  ASSERT_GT(model->panel_matrices(), 0u);
  std::mt19937 rng(8);
  std::uniform_int_distribution<int32_t> id(3, model->config().vocab_size - 1);
  constexpr size_t kSeqs = 5;
  std::vector<std::vector<int32_t>> prompts(kSeqs);
  for (size_t i = 0; i < kSeqs; ++i) {
    prompts[i].resize(7 + 11 * i);
    for (auto& t : prompts[i]) t = id(rng);
  }
  std::vector<std::vector<float>> exact(kSeqs);
  for (size_t i = 0; i < kSeqs; ++i) {
    Session s(*model, options(), pool);
    const auto l = s.feed(prompts[i]);
    exact[i].assign(l.begin(), l.end());
  }
  const Bf16X on;
  std::vector<std::unique_ptr<Session>> batch;
  std::vector<Session*> ptrs;
  std::vector<int32_t> next(kSeqs);
  for (size_t i = 0; i < kSeqs; ++i) {
    batch.push_back(std::make_unique<Session>(*model, options(), pool));
    ptrs.push_back(batch.back().get());
    const auto l = batch.back()->feed(prompts[i]);
    double worst = 0, scale = 0;
    for (size_t v = 0; v < l.size(); ++v) {
      worst = std::max(worst, double(std::fabs(l[v] - exact[i][v])));
      scale = std::max(scale, double(std::fabs(exact[i][v])));
    }
    EXPECT_GT(worst, 0.0) << "sequence " << i << ": x was not rounded";
    EXPECT_LT(worst, 2e-2 * scale) << "sequence " << i;
    next[i] = 3 + int32_t(i);
  }
  std::vector<std::span<const int32_t>> feeds;
  for (size_t i = 0; i < kSeqs; ++i) feeds.emplace_back(&next[i], 1);
  ForwardState st;
  Session::feed_batch(ptrs, feeds, st);
  for (size_t i = 0; i < kSeqs; ++i) {
    Session alone(*model, options(), pool);
    alone.feed(prompts[i]);
    const auto want = alone.feed({&next[i], 1});
    const auto got = batch[i]->last_logits();
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << "sequence " << i;
  }
}

}  // namespace
}  // namespace ptllm
