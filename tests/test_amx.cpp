// The AMX products (kernels/amx.h): against the scalar reference, every row independent of the batch
// and of the threads, the hi/lo split of x, and the formats that go through bf16 copies of their rows.
// Every test skips where the CPU or the OS gives no AMX.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/amx.h"
#include "kernels/ggml.h"
#include "kernels/ops.h"
#include "kernels/panels.h"
#include "kernels/simd.h"
#include "shared_x_check.h"
#include "test_util.h"

namespace ptllm {
namespace {

#define SKIP_WITHOUT_AMX() \
  if (!amx_available()) GTEST_SKIP() << "no AMX on this CPU or OS"

using test::expect_shared_x_equals_separate_calls;
using test::normal;

uint16_t bf16_rne(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
float from_bf16(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// A BF16 matrix in panels (kernels/panels.h), the layout AMX reads.
struct Bf16Matrix {
  std::vector<uint16_t> data, packed;
  WeightMatrix w;
  Bf16Matrix(int rows, int cols, uint32_t seed) : data(size_t(rows) * size_t(cols)), packed(data.size()) {
    const auto f = normal(data.size(), 0.05f, seed);
    for (size_t i = 0; i < f.size(); ++i) data[i] = bf16_rne(f[i]);
    ThreadPool pool(1);
    pack_panels(dense_matrix(DType::BF16, data.data(), rows, cols), packed.data(), pool);
    w = panels_matrix(packed.data(), rows, cols);
  }
};

// |y - ref| within what splitting x into hi + lo (16 significant bits) and float32 sums allow.
void expect_close_to_reference(const float* x, int T, const WeightMatrix& w, const float* bias, const float* y,
                               const char* what) {
  std::vector<float> ref(size_t(T) * size_t(w.rows)), row(size_t(w.cols));
  matmul_ref(x, T, w, bias, ref.data());
  for (int r = 0; r < w.rows; ++r) {
    weight_row(w, r, row.data());
    for (int t = 0; t < T; ++t) {
      double mag = 0;
      const float* xt = x + size_t(t) * size_t(w.cols);
      for (int k = 0; k < w.cols; ++k) mag += std::fabs(double(row[size_t(k)]) * xt[k]);
      const size_t i = size_t(t) * size_t(w.rows) + size_t(r);
      ASSERT_NEAR(y[i], ref[i], 4e-5 * mag + 1e-6) << what << " row " << r << " of x " << t << " (T " << T << ", "
                                                   << w.rows << " x " << w.cols << ")";
    }
  }
}

TEST(AmxTest, SplitCarriesSixteenBits) {
  SKIP_WITHOUT_AMX();
  const auto xs = normal(2000, 3.f, 1);
  for (float x : xs) {
    uint16_t hi, lo;
    amx_split(x, hi, lo);
    EXPECT_EQ(hi, bf16_rne(x)) << x;  // round to nearest even
    const float sum = from_bf16(hi) + from_bf16(lo);
    EXPECT_LE(std::fabs(sum - x), std::fabs(x) * 0x1p-16f) << x;
  }
}

TEST(AmxTest, PackedLayoutIsSlabsOfTilesOfRows) {
  SKIP_WITHOUT_AMX();
  const int T = 11, K = 64;
  const auto x = normal(size_t(T) * K, 1.f, 2);
  std::vector<uint16_t> packed(amx_packed_values(T, K), 0xbeefu);
  ASSERT_EQ(packed.size(), size_t(2 * 2 * 512));  // 2 slabs of 8 rows, 2 tiles of 32 columns
  amx_pack_x(x.data(), T, K, packed.data());
  for (int s = 0; s < 2; ++s)
    for (int kc = 0; kc < 2; ++kc)
      for (int r = 0; r < 16; ++r)
        for (int j = 0; j < 32; ++j) {
          const int t = s * 8 + (r % 8);
          const uint16_t v = packed[size_t((s * 2 + kc) * 512 + r * 32 + j)];
          if (t >= T) {
            EXPECT_EQ(v, 0u) << "rows past T are zeros";
            continue;
          }
          uint16_t hi, lo;
          amx_split(x[size_t(t) * K + size_t(kc * 32 + j)], hi, lo);
          EXPECT_EQ(v, r < 8 ? hi : lo) << s << " " << kc << " " << r << " " << j;
        }
}

TEST(AmxTest, MatchesTheReferenceOnEveryShape) {
  SKIP_WITHOUT_AMX();
  ThreadPool pool(2);
  for (int rows : {16, 48, 64, 208})
    for (int cols : {32, 96, 512}) {
      Bf16Matrix m(rows, cols, uint32_t(rows * 7 + cols));
      const auto bias = normal(size_t(rows), 1.f, 3);
      for (int T : {1, 7, 8, 9, 16, 17, 40}) {
        const auto x = normal(size_t(T) * size_t(cols), 1.f, uint32_t(T));
        std::vector<float> y(size_t(T) * size_t(rows), NAN);
        amx_matmul(x.data(), T, m.w, nullptr, y.data(), pool);
        expect_close_to_reference(x.data(), T, m.w, nullptr, y.data(), "no bias");
        amx_matmul(x.data(), T, m.w, bias.data(), y.data(), pool);
        expect_close_to_reference(x.data(), T, m.w, bias.data(), y.data(), "bias");
      }
    }
}

TEST(AmxTest, ARowDoesNotDependOnTheBatchOrTheThreads) {
  SKIP_WITHOUT_AMX();
  const int rows = 208, cols = 512, T = 40;
  Bf16Matrix m(rows, cols, 5);
  const auto x = normal(size_t(T) * cols, 1.f, 6);
  ThreadPool one(1), two(2);
  std::vector<float> all(size_t(T) * rows);
  amx_matmul(x.data(), T, m.w, nullptr, all.data(), two);
  for (int t0 : {0, 3, 21})
    for (int n : {1, 8, 9, 16, 17}) {
      if (t0 + n > T) continue;
      std::vector<float> part(size_t(n) * rows);
      amx_matmul(x.data() + size_t(t0) * cols, n, m.w, nullptr, part.data(), (n % 2) ? one : two);
      for (int t = 0; t < n; ++t)
        for (int r = 0; r < rows; ++r)
          ASSERT_EQ(part[size_t(t) * rows + r], all[size_t(t0 + t) * rows + r])
              << "row " << t0 + t << " in a batch of " << n << " from " << t0;
    }
}

TEST(AmxTest, MatmulTakesAmxFromEightRowsForBf16) {
  SKIP_WITHOUT_AMX();
  ThreadPool pool(2);
  Bf16Matrix m(64, 128, 7);
  ASSERT_TRUE(amx_takes(m.w));
  for (int T : {4, 8, 24}) {
    const auto x = normal(size_t(T) * 128, 1.f, 8);
    std::vector<float> a(size_t(T) * 64), b(size_t(T) * 64);
    matmul(x.data(), T, m.w, nullptr, a.data(), pool);
    amx_matmul(x.data(), T, m.w, nullptr, b.data(), pool);
    if (T >= 8) EXPECT_EQ(a, b) << T;
    else EXPECT_NE(a, b) << T << ": the panels' own product, which is exact in x";
  }
  set_amx_enabled(false);
  EXPECT_FALSE(amx_active());
  EXPECT_FALSE(amx_takes(m.w));
  EXPECT_EQ(active_kernels_name().find("amx"), std::string::npos);
  set_amx_enabled(true);
  EXPECT_TRUE(amx_active());
  EXPECT_NE(active_kernels_name().find("+amx"), std::string::npos);
}

TEST(AmxTest, OtherTargetsAndShapesKeepTheirOwnKernels) {
  SKIP_WITHOUT_AMX();
  Bf16Matrix odd(32, 48, 9);  // 48 columns: not a multiple of 32
  EXPECT_FALSE(amx_takes(odd.w));
  std::vector<float> f(32 * 64);
  EXPECT_FALSE(amx_takes(dense_matrix(DType::F32, f.data(), 32, 64)));
  EXPECT_FALSE(amx_takes_dequantized(dense_matrix(DType::F32, f.data(), 32, 64)));
  Bf16Matrix m(32, 64, 10);
  const SimdTarget before = active_simd_target();
  set_simd_target(SimdTarget::Portable);
  EXPECT_FALSE(amx_takes(m.w));
  set_simd_target(SimdTarget::AVX512);
  EXPECT_TRUE(amx_takes(m.w));
  set_simd_target(before);
}

// Several matrices against one x in one call (q, k and v; gate and up): each output the bits of its
// own call, however the threads' parts fall across the matrices.
TEST(AmxTest, SharedXGivesEachMatrixItsOwnBits) {
  SKIP_WITHOUT_AMX();
  ThreadPool one(1), two(2);
  // 13 + 3 + 1 panels: parts of 4 panels (two threads) cross from the first matrix into the others
  Bf16Matrix q(208, 96, 13), k(48, 96, 14), v(16, 96, 15);
  const WeightMatrix ws[] = {q.w, k.w, v.w};
  for (int T : {1, 8, 9, 16, 17, 40}) {
    expect_shared_x_equals_separate_calls(ws, T, one, "bf16 panels");
    expect_shared_x_equals_separate_calls(ws, T, two, "bf16 panels");
  }
  const int rows = 40, cols = 96;
  const auto wf = normal(size_t(rows) * cols, 0.05f, 16);
  const GgmlTypeInfo info = ggml_type_info(GgmlType::Q8_0);
  const size_t row_bytes = size_t(cols / info.block_elems) * size_t(info.block_bytes);
  std::vector<uint8_t> blocks(size_t(rows) * row_bytes);
  for (int r = 0; r < rows; ++r)
    ggml_quantize_row(GgmlType::Q8_0, wf.data() + size_t(r) * cols, cols, blocks.data() + size_t(r) * row_bytes);
  const WeightMatrix q8 = ggml_matrix(GgmlType::Q8_0, blocks.data(), rows, cols);
  ASSERT_TRUE(amx_takes_dequantized(q8));
  const WeightMatrix mixed[] = {q8, k.w, q8};  // AMX for all above kMatmulSmallRows rows, not below
  for (int T : {8, 17, 33}) expect_shared_x_equals_separate_calls(mixed, T, two, "q8_0 and bf16 panels");
}

// Block formats and affine codes go through bf16 copies of their rows, each weight split into hi and
// lo: as close to the product with the exact rows as bf16 weights are, and a row of y the same in
// any batch that takes AMX (more than kMatmulSmallRows rows).
void expect_rows_independent_of_the_batch(const WeightMatrix& q, const float* x, int T, const float* y,
                                          ThreadPool& pool, const char* what) {
  for (int n : {kMatmulSmallRows + 1, 24}) {
    std::vector<float> part(size_t(n) * size_t(q.rows));
    matmul(x + size_t(T - n) * size_t(q.cols), n, q, nullptr, part.data(), pool);
    for (size_t i = 0; i < part.size(); ++i)
      ASSERT_EQ(part[i], y[size_t(T - n) * size_t(q.rows) + i]) << what << ": the last " << n << " rows alone";
  }
}

TEST(AmxTest, BlockFormatsMatchTheirExactRows) {
  SKIP_WITHOUT_AMX();
  ThreadPool pool(2);
  for (GgmlType type : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0,
                        GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
    const int rows = 40, cols = 512;
    const auto wf = normal(size_t(rows) * cols, 0.05f, 11);
    const GgmlTypeInfo info = ggml_type_info(type);
    std::vector<uint8_t> blocks(size_t(rows) * size_t(cols / info.block_elems) * size_t(info.block_bytes));
    const size_t row_bytes = blocks.size() / rows;
    for (int r = 0; r < rows; ++r)
      ggml_quantize_row(type, wf.data() + size_t(r) * cols, cols, blocks.data() + size_t(r) * row_bytes);
    const WeightMatrix q = ggml_matrix(type, blocks.data(), rows, cols);
    ASSERT_TRUE(amx_takes_dequantized(q));
    const int T = 33;
    const auto x = normal(size_t(T) * cols, 1.f, 12);
    std::vector<float> y(size_t(T) * rows);
    matmul(x.data(), T, q, nullptr, y.data(), pool);  // T > kMatmulSmallRows: AMX
    expect_close_to_reference(x.data(), T, q, nullptr, y.data(), info.name.data());
    expect_rows_independent_of_the_batch(q, x.data(), T, y.data(), pool, info.name.data());
  }
}

// MLX's affine codes keep their own products at every T: they quantize x to int8 in decode as in
// prefill, and a model's teacher-forced NLL must stay within 1e-3 of one token at a time
// (test_quantized_model.cpp), which float-x prefill beside int8-x decode did not (0.009 on kjv-tiny q4).
TEST(AmxTest, AffineCodesKeepTheirOwnProducts) {
  SKIP_WITHOUT_AMX();
  std::vector<uint32_t> codes(64 * 256 * 4 / 32);
  std::vector<uint16_t> scales(64 * 4), biases(64 * 4);
  const WeightMatrix q = affine_matrix(codes.data(), scales.data(), biases.data(), DType::BF16, 4, 64, 64, 256);
  EXPECT_FALSE(amx_takes_dequantized(q));
  EXPECT_FALSE(amx_takes(q));
}

}  // namespace
}  // namespace ptllm
