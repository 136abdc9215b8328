// The weight formats of kernels/weights.h: values known by construction dequantize to those values,
// and the products over each format agree with the scalar twin.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/affine.h"
#include "kernels/ggml.h"
#include "kernels/ops.h"

namespace ptllm {
namespace {

// A 4-bit MLX row of 16 codes 0..15 in one group: words pack eight codes each, the first code in
// the lowest nibble (mlx's layout: code j of word w at bits 4 * j).
TEST(WeightFormatTest, AffineFourBitCodesUnpackLowNibbleFirst) {
  const uint32_t words[2] = {0x76543210u, 0xfedcba98u};
  const uint16_t scale = f32_to_bf16(0.5f), bias = f32_to_bf16(-2.0f);
  const WeightMatrix w = affine_matrix(words, &scale, &bias, DType::BF16, 4, 16, 1, 16);
  EXPECT_EQ(w.row_bytes(), 8u);
  EXPECT_EQ(w.nbytes(), 8u + 4u);
  std::vector<float> row(16);
  weight_row(w, 0, row.data());
  for (int k = 0; k < 16; ++k) EXPECT_FLOAT_EQ(row[size_t(k)], 0.5f * float(k) - 2.0f) << k;
}

// 8 bits: code j of a word in byte j; two groups of 4 with their own scale and bias.
TEST(WeightFormatTest, AffineEightBitGroupsUseTheirOwnScaleAndBias) {
  const uint32_t words[2] = {0x03020100u, 0xff800201u};
  const uint16_t scales[2] = {f32_to_f16(1.0f), f32_to_f16(0.25f)};
  const uint16_t biases[2] = {f32_to_f16(0.0f), f32_to_f16(1.0f)};
  const WeightMatrix w = affine_matrix(words, scales, biases, DType::F16, 8, 4, 1, 8);
  std::vector<float> row(8);
  weight_row(w, 0, row.data());
  const float want[8] = {0, 1, 2, 3, 1 + 0.25f, 1 + 0.5f, 1 + 32.f, 1 + 63.75f};
  for (int k = 0; k < 8; ++k) EXPECT_FLOAT_EQ(row[size_t(k)], want[k]) << k;
}

// Q4_0 (ggml): value i of a block from the low nibble of byte i, value i + 16 from its high one,
// both minus 8, times the block's f16 d.
TEST(WeightFormatTest, GgmlQ4_0AndQ8_0DequantizeAsGgmlDefinesThem) {
  std::vector<uint8_t> q4(18), q8(34);
  const uint16_t d = f32_to_f16(0.5f);
  std::memcpy(q4.data(), &d, 2);
  std::memcpy(q8.data(), &d, 2);
  for (int i = 0; i < 16; ++i) q4[2 + size_t(i)] = uint8_t(i | (15 - i) << 4);
  for (int i = 0; i < 32; ++i) q8[2 + size_t(i)] = uint8_t(int8_t(i - 16));
  std::vector<float> row(32);
  weight_row(ggml_matrix(GgmlType::Q4_0, q4.data(), 1, 32), 0, row.data());
  for (int i = 0; i < 16; ++i) {
    EXPECT_FLOAT_EQ(row[size_t(i)], 0.5f * float(i - 8)) << i;
    EXPECT_FLOAT_EQ(row[size_t(i) + 16], 0.5f * float(7 - i)) << i;
  }
  weight_row(ggml_matrix(GgmlType::Q8_0, q8.data(), 1, 32), 0, row.data());
  for (int i = 0; i < 32; ++i) EXPECT_FLOAT_EQ(row[size_t(i)], 0.5f * float(i - 16)) << i;
}

TEST(WeightFormatTest, ProductsOverEveryFormatMatchTheScalarTwin) {
  const int rows = 37, cols = 128, T = 5;
  std::mt19937 rng(7);
  std::vector<uint32_t> codes(size_t(rows) * cols * 4 / 32);
  for (auto& c : codes) c = rng();
  std::vector<uint16_t> sc(size_t(rows) * 2), bi(size_t(rows) * 2);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (auto& s : sc) s = f32_to_bf16(0.1f * u(rng));
  for (auto& b : bi) b = f32_to_bf16(u(rng));
  std::vector<uint8_t> q8(size_t(rows) * 4 * 34);
  for (size_t b = 0; b < q8.size() / 34; ++b) {
    const uint16_t d = f32_to_f16(0.01f * (1 + float(b % 5)));
    std::memcpy(q8.data() + b * 34, &d, 2);
    for (int i = 0; i < 32; ++i) q8[b * 34 + 2 + size_t(i)] = uint8_t(rng());
  }
  std::vector<float> x(size_t(T) * cols), bias(rows), y(size_t(T) * rows), want(y.size());
  for (auto& v : x) v = u(rng);
  for (auto& v : bias) v = u(rng);
  ThreadPool pool(3);
  for (const WeightMatrix& w : {affine_matrix(codes.data(), sc.data(), bi.data(), DType::BF16, 4, 64, rows, cols),
                                ggml_matrix(GgmlType::Q8_0, q8.data(), rows, cols)}) {
    matmul(x.data(), T, w, bias.data(), y.data(), pool);
    // Affine products round x to int8 (kernels/affine.h): their twin rounds it the same way. GGML
    // products round x to int8 per 32 values too (kernels/ggml.h): |x| <= 1 moves each by at most
    // 1 / 254, so a product by at most sum_k |w_k| / 254 from the float one.
    std::vector<float> row(cols), wsum(rows, 0.f);
    if (w.format == WeightFormat::Affine) {
      affine_matmul_q8_ref(x.data(), T, w, bias.data(), want.data());
    } else {
      matmul_ref(x.data(), T, w, bias.data(), want.data());
      for (int r = 0; r < rows; ++r) {
        weight_row(w, r, row.data());
        for (float v : row) wsum[size_t(r)] += std::abs(v) / 254.f;
      }
    }
    for (size_t i = 0; i < y.size(); ++i)
      ASSERT_NEAR(y[i], want[i], 1e-4f * (1 + std::abs(want[i])) + wsum[i % size_t(rows)]) << w.format_name();
  }
}

TEST(WeightFormatTest, NamesAndByteCounts) {
  EXPECT_EQ(ggml_type_info(GgmlType::Q4_K).block_bytes, 144);
  EXPECT_EQ(ggml_type_info(GgmlType::Q6_K).block_bytes, 210);
  EXPECT_EQ(ggml_type_info(GgmlType::Q8_0).block_bytes, 34);
  EXPECT_TRUE(ggml_type_info(GgmlType(99)).name.empty());
  const WeightMatrix q = ggml_matrix(GgmlType::Q4_K, nullptr, 2, 512);
  EXPECT_EQ(q.nbytes(), 2u * 2u * 144u);
  EXPECT_EQ(q.format_name(), "Q4_K");
  EXPECT_EQ(dense_matrix(DType::BF16, nullptr, 3, 4).nbytes(), 24u);
}

}  // namespace
}  // namespace ptllm
