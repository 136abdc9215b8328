// KIVI quantization kernels: ranges from one table, round-trip error bounds, packing, and the seed's
// failure modes (constant channels, float16 scale underflow, codes never reaching attention unscaled).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "kernels/quant.h"

namespace ptllm {
namespace {

TEST(QuantTest, RangesComeFromOneTable) {
  EXPECT_EQ(quant_range(8).qmin, -128);
  EXPECT_EQ(quant_range(8).qmax, 127);
  EXPECT_EQ(quant_range(4).qmin, -8);
  EXPECT_EQ(quant_range(4).qmax, 7);
  EXPECT_EQ(quant_range(2).qmin, -2);
  EXPECT_EQ(quant_range(2).qmax, 1);
  for (int bits : {8, 4, 2}) EXPECT_EQ(quant_range(bits).levels(), (1 << bits) - 1);
}

// The stored K layout (k_code_offset) puts every byte of a group's G rows in its own place inside
// the G * pk bytes the block has for them, whatever G and pk (narrower last tiles and columns), and
// a whole tile's 4-byte column c is the 16 keys' words one after another (what the VNNI kernel
// loads at once). k_rows_from_group reads back what was placed.
TEST(QuantTest, StoredKCodesFillTheGroupOnce) {
  for (int G : {1, 5, 16, 17, 32, 40})
    for (size_t pk : {1u, 2u, 3u, 4u, 5u, 8u, 9u, 16u, 33u}) {
      SCOPED_TRACE(::testing::Message() << "G=" << G << " pk=" << pk);
      std::vector<int> hits(size_t(G) * pk, 0);
      std::vector<uint8_t> group(hits.size());
      for (int j = 0; j < G; ++j)
        for (size_t b = 0; b < pk; ++b) {
          const size_t at = k_code_offset(j, b, pk, G);
          ASSERT_LT(at, hits.size());
          ++hits[at];
          group[at] = uint8_t(j * 31 + int(b));
          if (j / 16 * 16 + 16 <= G && b / 4 * 4 + 4 <= pk) {  // a whole tile, a whole column
            EXPECT_EQ(at, size_t(j / 16 * 16) * pk + b / 4 * 64 + size_t(j % 16) * 4 + b % 4);
          }
        }
      for (int h : hits) ASSERT_EQ(h, 1);
      for (int j0 : {0, G / 2}) {
        std::vector<uint8_t> rows(size_t(G - j0) * pk);
        k_rows_from_group(KRows{group.data(), G, j0}, G - j0, pk, rows.data());
        for (int j = j0; j < G; ++j)
          for (size_t b = 0; b < pk; ++b) ASSERT_EQ(rows[size_t(j - j0) * pk + b], uint8_t(j * 31 + int(b)));
      }
    }
}

// Every code in [0, 2^bits - 1] is reachable, the extremes included (no off-by-one clamp).
TEST(QuantTest, CodesSpanTheFullRange) {
  for (int bits : {8, 4, 2}) {
    const int D = 37;  // not a multiple of the codes per byte
    std::vector<float> x(D);
    for (int d = 0; d < D; ++d) x[size_t(d)] = -3.f + 6.f * float(d) / float(D - 1);
    std::vector<uint8_t> codes(packed_bytes(D, bits));
    uint16_t s, z;
    quantize_v_token(x.data(), D, bits, codes.data(), &s, &z);
    int lo = 1 << 30, hi = -1;
    for (int d = 0; d < D; ++d) {
      lo = std::min(lo, code_at(codes.data(), d, bits));
      hi = std::max(hi, code_at(codes.data(), d, bits));
    }
    EXPECT_EQ(lo, 0) << bits;
    EXPECT_EQ(hi, quant_range(bits).levels()) << bits;
  }
}

TEST(QuantTest, RoundTripErrorIsBoundedByHalfAStep) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 2.f);
  for (int bits : {8, 4, 2}) {
    const int G = 32, D = 24;
    std::vector<float> x(size_t(G) * D);
    for (auto& v : x) v = nd(rng);
    std::vector<uint8_t> codes(size_t(G) * packed_bytes(D, bits));
    std::vector<uint16_t> s(D), z(D);
    quantize_k_group(x.data(), D, G, D, bits, codes.data(), s.data(), z.data());
    std::vector<float> y(x.size());
    dequantize_k_group(codes.data(), s.data(), z.data(), G, D, bits, y.data());
    for (int d = 0; d < D; ++d) {
      const float step = f16_to_f32(s[size_t(d)]);
      for (int t = 0; t < G; ++t) {
        const size_t i = size_t(t) * D + size_t(d);
        // half a step, plus the f16 rounding of the zero point
        EXPECT_LE(std::fabs(x[i] - y[i]), 0.5f * step + 2e-3f * std::fabs(f16_to_f32(z[size_t(d)])) + 1e-6f)
            << "bits " << bits << " t " << t << " d " << d;
      }
    }
  }
}

// Seed bug class 1: a constant channel has max == min; the scale floor keeps it finite and exact.
TEST(QuantTest, ConstantChannelsStayFiniteAndExact) {
  const int G = 8, D = 4;
  std::vector<float> x(size_t(G) * D, 0.f);
  for (int t = 0; t < G; ++t) x[size_t(t) * D + 1] = 0.75f;  // constant non-zero channel
  for (int bits : {8, 4, 2}) {
    std::vector<uint8_t> codes(size_t(G) * packed_bytes(D, bits));
    std::vector<uint16_t> s(D), z(D);
    quantize_k_group(x.data(), D, G, D, bits, codes.data(), s.data(), z.data());
    std::vector<float> y(x.size());
    dequantize_k_group(codes.data(), s.data(), z.data(), G, D, bits, y.data());
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_TRUE(std::isfinite(y[i]));
      EXPECT_EQ(y[i], x[i]);
    }
    for (int d = 0; d < D; ++d) EXPECT_GE(f16_to_f32(s[size_t(d)]), kMinScale);
  }
}

// Seed bug class 2: a tiny range would give a scale that underflows in float16 (1e-9 -> 0).
TEST(QuantTest, TinyScalesDoNotUnderflowInFloat16) {
  const int D = 8;
  std::vector<float> x(D);
  for (int d = 0; d < D; ++d) x[size_t(d)] = 1.0f + 1e-9f * float(d);
  std::vector<uint8_t> codes(D);
  uint16_t s, z;
  quantize_v_token(x.data(), D, 8, codes.data(), &s, &z);
  EXPECT_GT(f16_to_f32(s), 0.f);
  EXPECT_EQ(f16_to_f32(s), kMinScale);
  std::vector<float> y(D);
  dequantize_v_token(codes.data(), s, z, D, 8, y.data());
  for (int d = 0; d < D; ++d) EXPECT_NEAR(y[size_t(d)], x[size_t(d)], 1e-3f);
}

// The fused block kernels attention uses equal the dequantize-then-compute twin (bug class 4: codes
// never reach attention unscaled). K: the scores of a group against its dequantized keys, within the
// int8 query's rounding (quant.h: at most max|q*s| / 254 * |c - m| a channel); V: the weights within
// bf16 rounding (quant.h).
TEST(QuantTest, FusedBlocksMatchDequantized) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  constexpr int G = 4;
  for (int bits : {8, 4, 2}) {
    for (int D : {64, 37}) {
      const size_t pk = packed_bytes(D, bits);
      std::vector<float> k(size_t(G) * size_t(D)), q(D);
      for (auto& x : k) x = nd(rng);
      for (auto& x : q) x = nd(rng);
      std::vector<uint8_t> kc(size_t(G) * pk);
      std::vector<uint16_t> ks(D), kz(D);
      quantize_k_group(k.data(), size_t(D), G, D, bits, kc.data(), ks.data(), kz.data());
      std::vector<float> kd(size_t(G) * size_t(D)), scores(G);
      dequantize_k_group(kc.data(), ks.data(), kz.data(), G, D, bits, kd.data());
      kivi_k_block(q.data(), 1, KRows{kc.data(), G, 0}, ks.data(), kz.data(), 1.f, G, D, bits, scores.data(), G);
      float qs_max = 0;
      for (int i = 0; i < D; ++i)
        qs_max = std::max(qs_max, std::fabs(q[size_t(i)] * std::max(kMinScale, f16_to_f32(ks[size_t(i)]))));
      const float mid = float((1 << bits) - 1) / 2;
      for (int j = 0; j < G; ++j) {
        double want = 0, spread = 0;
        for (int i = 0; i < D; ++i) {
          want += double(q[size_t(i)]) * kd[size_t(j) * size_t(D) + size_t(i)];
          spread += std::fabs(float(code_at(kc.data() + size_t(j) * pk, i, bits)) - mid);
        }
        EXPECT_NEAR(scores[size_t(j)], want, qs_max / 254 * spread + 1e-3 * (1 + std::fabs(want)))
            << "bits=" << bits << " D=" << D << " key " << j;
      }

      std::vector<float> v(D);
      for (auto& x : v) x = nd(rng);
      std::vector<uint8_t> vc(pk);
      uint16_t s, z;
      quantize_v_token(v.data(), D, bits, vc.data(), &s, &z);
      std::vector<float> vd(D);
      dequantize_v_token(vc.data(), s, z, D, bits, vd.data());
      const float p = 0.5f;
      std::vector<float> acc(D, 1.f);
      float zacc = 0.f;
      kivi_v_block(&p, 1, 1, vc.data(), &s, &z, 1, D, bits, acc.data(), &zacc);
      // The weight w = p s may be rounded (quant.h): to bf16 (2^-8 of each term, 2^-14 of w for the
      // sums) or to 16 bits on its own scale (w / 65534).
      const double w = p * std::max(kMinScale, f16_to_f32(s));
      for (int d = 0; d < D; ++d)
        EXPECT_NEAR(acc[size_t(d)] + zacc, 1.f + p * vd[size_t(d)],
                    1e-5 + (0x1p-8 + 1.0 / 65534) * w * code_at(vc.data(), d, bits) + 0x1p-14 * w)
            << "bits=" << bits;
    }
  }
}

TEST(QuantTest, PackedSizesAreHonest) {
  EXPECT_EQ(packed_bytes(64, 8), 64u);
  EXPECT_EQ(packed_bytes(64, 4), 32u);
  EXPECT_EQ(packed_bytes(64, 2), 16u);
  EXPECT_EQ(packed_bytes(37, 4), 19u);
  EXPECT_EQ(packed_bytes(37, 2), 10u);
}

}  // namespace
}  // namespace ptllm
