// The affine (MLX-layout) products of kernels/affine.h: every SIMD kernel against the scalar twin
// (the same int8 x, so the same integer sums), on awkward sizes, both paths, every bits / group /
// scale dtype; and the twin against the exact product within the activation rounding's bound.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/affine.h"
#include "kernels/affine_q8.h"
#include "kernels/cpu/features.h"
#include "kernels/simd.h"
#include "kernels/ops.h"
#include "shared_x_check.h"
#include "test_util.h"

namespace ptllm {
namespace {

// A random affine matrix as mlx writes one: codes uniform, scales of either sign, biases about
// -m * scale (weights centred on 0), stored as `dt`.
struct Affine {
  std::vector<uint32_t> codes;
  std::vector<uint8_t> scales, biases;
  WeightMatrix w;
  Affine(int rows, int cols, int bits, int gs, DType dt, unsigned seed) {
    std::mt19937 rng(seed);
    codes.resize(size_t(rows) * size_t(cols) * size_t(bits) / 32);
    for (auto& c : codes) c = uint32_t(rng());
    const size_t G = size_t(rows) * size_t(cols / gs), es = dt == DType::F32 ? 4 : 2;
    scales.resize(G * es);
    biases.resize(G * es);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    const float m = float(1 << (bits - 1));
    for (size_t g = 0; g < G; ++g) {
      const float s = 0.02f * u(rng), b = -m * s + 0.01f * u(rng);
      store_as_ref(&s, scales.data() + g * es, dt, 1);
      store_as_ref(&b, biases.data() + g * es, dt, 1);
    }
    w = affine_matrix(codes.data(), scales.data(), biases.data(), dt, bits, gs, rows, cols);
  }
};

std::vector<float> random_x(int T, int K, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.f, 1.f);
  std::vector<float> x(size_t(T) * size_t(K));
  for (size_t i = 0; i < x.size(); ++i) x[i] = n(rng) * (i % 97 == 0 ? 8.f : 1.f);  // a few outliers
  return x;
}

// sum_k |W[r][k] x[t][k]|: the scale of float32 rounding in any order of the sums.
std::vector<double> magnitude(const float* x, int T, const WeightMatrix& w) {
  std::vector<double> out(size_t(T) * size_t(w.rows));
  std::vector<float> row(size_t(w.cols));
  for (int r = 0; r < w.rows; ++r) {
    affine_dequant_row(w, r, row.data());
    for (int t = 0; t < T; ++t) {
      double s = 0;
      for (int k = 0; k < w.cols; ++k) s += std::fabs(double(row[size_t(k)]) * x[size_t(t) * size_t(w.cols) + size_t(k)]);
      out[size_t(t) * size_t(w.rows) + size_t(r)] = s;
    }
  }
  return out;
}

std::string name_of(const WeightMatrix& w, int T) {
  return w.format_name() + " " + std::to_string(w.rows) + "x" + std::to_string(w.cols) + " T=" + std::to_string(T);
}

// Every kernel, both paths, against the twin: the integer sums are exact, so only float32 rounding
// of the scaled sums differs (a few ulps of the magnitude).
TEST(AffineKernelTest, EveryKernelAndPathMatchesTheScalarTwin) {
  ThreadPool pool(3);
  const auto kernels = available_affine_kernels();
  ASSERT_FALSE(kernels.empty());
  unsigned seed = 1;
  for (int bits : {2, 3, 4, 5, 6, 8})
    for (int gs : {32, 64, 128})
      for (DType dt : {DType::BF16, DType::F16, DType::F32})
        // rows: not a multiple of any tile; cols: one group, and several groups that end part way
        // through a gemv chunk (the gemm's 512-column tiles too, for the widest).
        for (auto [rows, cols] : {std::pair{3, gs}, std::pair{37, 5 * gs}, std::pair{19, 5 * 128 + gs}}) {
          const Affine a(rows, cols, bits, gs, dt, ++seed);
          std::vector<float> bias(static_cast<size_t>(rows));
          for (size_t i = 0; i < bias.size(); ++i) bias[i] = 0.1f * float(i % 7) - 0.3f;
          // Light builds (emulation, sanitizers): every fourth T, still both sides of the gemv's limit.
          for (int T = 1; T <= 20; T += (rows == 37 ? 1 : 3) * (test::kLightTests ? 4 : 1)) {
            const auto x = random_x(T, cols, seed * 31 + unsigned(T));
            std::vector<float> want(size_t(T) * size_t(rows)), y(want.size());
            affine_matmul_q8_ref(x.data(), T, a.w, bias.data(), want.data());
            const auto mag = magnitude(x.data(), T, a.w);
            for (AffineKernel k : kernels)
              for (AffinePath p : {AffinePath::Gemv, AffinePath::Gemm}) {
                std::fill(y.begin(), y.end(), NAN);
                affine_matmul(x.data(), T, a.w, bias.data(), y.data(), pool, k, p);
                for (size_t i = 0; i < y.size(); ++i)
                  ASSERT_NEAR(y[i], want[i], 2e-6 * (mag[i] + 1.0))
                      << name_of(a.w, T) << " " << affine_kernel_name(k) << (p == AffinePath::Gemv ? " gemv" : " gemm")
                      << " at " << i;
              }
          }
        }
}

// The twin against the exact product (matmul_ref: the dequantized weights, x unrounded): within
// kernels/affine.h's bound, sum_k |s_g (c_k - m)| d_b / 2 with d_b = max_b |x| / 127; and ops.h's
// matmul takes the same path as affine_matmul.
TEST(AffineKernelTest, ErrorWithinTheActivationRoundingBound) {
  ThreadPool pool(2);
  const int rows = 29, T = 7;
  for (int bits : {2, 3, 4, 5, 6, 8})
    for (int gs : {32, 128}) {
      const int cols = 4 * gs;
      const Affine a(rows, cols, bits, gs, DType::BF16, unsigned(bits * 100 + gs));
      const auto x = random_x(T, cols, 5);
      std::vector<float> got(size_t(T) * rows), exact(got.size()), viaops(got.size());
      affine_matmul_q8_ref(x.data(), T, a.w, nullptr, got.data());
      matmul_ref(x.data(), T, a.w, nullptr, exact.data());
      matmul(x.data(), T, a.w, nullptr, viaops.data(), pool);
      std::vector<float> fast(got.size());
      affine_matmul(x.data(), T, a.w, nullptr, fast.data(), pool);
      const auto mag = magnitude(x.data(), T, a.w);
      const int G = cols / gs;
      const float m = float(1 << (bits - 1));
      double worst = 0;
      for (int t = 0; t < T; ++t)
        for (int r = 0; r < rows; ++r) {
          double bound = 0;
          for (int k = 0; k < cols; ++k) {
            const int bit = k * bits;  // within two bytes (bits 3, 5, 6 straddle one)
            const auto* row = reinterpret_cast<const uint8_t*>(a.codes.data()) + size_t(r) * a.w.row_bytes();
            const int two = row[bit / 8] | (size_t(bit / 8 + 1) < a.w.row_bytes() ? row[bit / 8 + 1] << 8 : 0);
            const int c = two >> (bit % 8) & ((1 << bits) - 1);
            const float s = affine_param(a.w.scales, DType::BF16, size_t(r) * G + size_t(k / gs));
            float amax = 0;
            for (int i = k / 32 * 32; i < k / 32 * 32 + 32; ++i) amax = std::max(amax, std::fabs(x[size_t(t) * cols + i]));
            bound += std::fabs(s * (float(c) - m)) * amax / 254.0;
          }
          const size_t i = size_t(t) * rows + size_t(r);
          bound += 1e-5 * (mag[i] + 1.0);
          EXPECT_LE(std::fabs(double(got[i]) - exact[i]), bound) << bits << " bits g" << gs << " at " << i;
          EXPECT_EQ(viaops[i], fast[i]) << "matmul forwards to affine_matmul";
          worst = std::max(worst, std::fabs(double(got[i]) - exact[i]) / bound);
        }
      EXPECT_GT(worst, 0.0) << "the int8 x rounds (a twin equal to the exact product would be suspect)";
    }
}

// x's split order: column j of a chunk of C at (j % KPB) * (C / KPB) + j / KPB; per block of 32
// the scale max |x| / 127, q = round(x / d); the group sums as affine_q8.h defines them.
TEST(AffineKernelTest, QuantizedXLayoutAndSums) {
  const int K = 96, gs = 32;  // a chunk of 64 and a half-filled one
  std::vector<float> x(K);
  for (int k = 0; k < K; ++k) x[size_t(k)] = float(k % 32) - 10.f + (k >= 64 ? 0.25f : 0.f);
  AffineXBuffers buf;
  const AffineX ax = quantize_affine_x(x.data(), 1, K, 4, gs, 64, buf, nullptr);
  EXPECT_EQ(ax.ldq, 128u);
  for (int b = 0; b < 3; ++b) EXPECT_FLOAT_EQ(ax.d[b], (b == 2 ? 21.25f : 21.f) / 127.f) << b;
  for (int k = 0; k < K; ++k) {
    const int j = k % 64, at = k / 64 * 64 + (j % 2) * 32 + j / 2;
    EXPECT_EQ(ax.q[at], int8_t(std::nearbyint(x[size_t(k)] / ax.d[k / 32]))) << k;
  }
  for (int at = 64; at < 128; ++at) {  // the second chunk holds 32 columns: positions 0-15 and 32-47
    if ((at - 64) % 32 >= 16) {
      EXPECT_EQ(ax.q[at], 0) << "padding at " << at;
    }
  }
  for (int g = 0; g < 3; ++g) {
    float xs = 0, qs = 0;
    for (int k = g * 32; k < g * 32 + 32; ++k) xs += x[size_t(k)];
    for (int k = g * 32; k < g * 32 + 32; ++k) qs += float(std::nearbyint(x[size_t(k)] / ax.d[g]));
    EXPECT_FLOAT_EQ(ax.xs[g], xs);
    EXPECT_NEAR(ax.xc[g], 8.f * (xs - ax.d[g] * qs), 1e-4f);
  }
}

// Group sizes that are not a power of two keep the generic product: exact.
TEST(AffineKernelTest, OtherGroupSizesTakeTheGenericProduct) {
  ThreadPool pool(2);
  for (auto [bits, gs] : {std::pair{3, 96}, std::pair{6, 96}, std::pair{4, 96}}) {
    const int rows = 11, cols = 192, T = 3;
    std::vector<uint32_t> codes(size_t(rows) * cols * bits / 32);
    std::mt19937 rng(3);
    for (auto& c : codes) c = uint32_t(rng());
    std::vector<uint16_t> sc(size_t(rows) * 3, f32_to_bf16(0.05f)), bi(size_t(rows) * 3, f32_to_bf16(-0.3f));
    const WeightMatrix w = affine_matrix(codes.data(), sc.data(), bi.data(), DType::BF16, bits, gs, rows, cols);
    EXPECT_FALSE(affine_fast(w));
    EXPECT_FALSE(affine_unpacked(w));
    const auto x = random_x(T, cols, 9);
    std::vector<float> y(size_t(T) * rows), want(y.size());
    matmul(x.data(), T, w, nullptr, y.data(), pool);
    matmul_ref(x.data(), T, w, nullptr, want.data());
    for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], want[i], 1e-4f * (1 + std::fabs(want[i]))) << bits << " bits g" << gs;
  }
}

// The unpacking products: bits 3, 5, 6 with power-of-two groups; 6-bit codes unpacked by VBMI
// wherever the CPU has it (the twin test above then runs that kernel as avx512-vnni), else by AVX2
// (the x86 kernels).
TEST(AffineKernelTest, StraddlingBitsTakeTheIntegerProducts) {
  std::vector<uint32_t> codes(size_t(4) * 64 * 6 / 32);
  std::vector<uint16_t> sc(8), bi(8);
  for (int bits : {3, 5, 6}) {
    const WeightMatrix w = affine_matrix(codes.data(), sc.data(), bi.data(), DType::BF16, bits, 32, 4, 64);
    EXPECT_TRUE(affine_unpacked(w)) << bits;
    EXPECT_FALSE(affine_fast(w)) << bits;
  }
  const auto& f = cpu_features();
  EXPECT_EQ(affine_unpacked_rows_avx512vbmi() != nullptr,
            f.avx512vnni && f.avx512vbmi && kernel_table(SimdTarget::AVX512) != nullptr);
  EXPECT_EQ(affine_unpacked_rows_avx2() != nullptr, kernel_table(SimdTarget::AVX2) != nullptr);
}

// ---- matrices repacked in 16-row groups (affine.h, affine_pack) -----------------------------------

struct Packed {
  std::vector<uint8_t> bytes;
  WeightMatrix w;
  explicit Packed(const WeightMatrix& src) : bytes(src.nbytes()) {
    const int groups = src.rows / kAffinePackRows;
    affine_pack(src, bytes.data(), 0, groups / 2);  // in two calls, as the load's threads split it
    affine_pack(src, bytes.data(), groups / 2, groups);
    w = affine_packed_matrix(src, bytes.data());
  }
};

// The copy holds the same values: every row dequantizes to the file's bits, and takes no more bytes.
TEST(AffinePack, RowsDequantizeAsTheFilesLayout) {
  unsigned seed = 100;
  for (int bits : {2, 4, 6, 8})
    for (int gs : {32, 64, 128})
      for (DType dt : {DType::BF16, DType::F16, DType::F32}) {
        const Affine a(32, 3 * gs, bits, gs, dt, ++seed);
        ASSERT_TRUE(affine_pack_fit(a.w));
        const Packed p(a.w);
        EXPECT_EQ(p.w.nbytes(), a.w.nbytes());
        EXPECT_EQ(p.w.affine_pack, kAffinePackRows);
        EXPECT_FALSE(affine_pack_fit(p.w)) << "packed twice";
        std::vector<float> want(size_t(a.w.cols)), got(want.size());
        for (int r = 0; r < a.w.rows; ++r) {
          affine_dequant_row(a.w, r, want.data());
          affine_dequant_row(p.w, r, got.data());
          ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * 4)) << name_of(a.w, 1) << " row " << r;
        }
      }
}

TEST(AffinePack, FitsOnlyWholeGroupsOfThePackedFormats) {
  EXPECT_TRUE(affine_pack_fit(Affine(48, 64, 4, 32, DType::BF16, 1).w));
  EXPECT_FALSE(affine_pack_fit(Affine(40, 64, 4, 32, DType::BF16, 1).w)) << "rows not a multiple of 16";
  EXPECT_TRUE(affine_pack_fit(Affine(32, 96, 6, 32, DType::BF16, 1).w)) << "6 bits: planes of 4 and 2 bits";
  EXPECT_FALSE(affine_pack_fit(Affine(40, 96, 6, 32, DType::BF16, 1).w)) << "rows not a multiple of 16";
  EXPECT_FALSE(affine_pack_fit(Affine(32, 96, 3, 32, DType::BF16, 1).w));
  EXPECT_FALSE(affine_pack_fit(Affine(32, 96, 5, 32, DType::BF16, 1).w));
  std::vector<uint32_t> codes(16 * 96 / 8);
  std::vector<uint16_t> sc(16), bi(16);
  EXPECT_FALSE(affine_pack_fit(affine_matrix(codes.data(), sc.data(), bi.data(), DType::BF16, 4, 96, 16, 96)))
      << "groups of 96 take the generic product";
  const bool was = affine_pack_wanted();
  set_affine_pack_enabled(false);
  EXPECT_FALSE(affine_pack_wanted());
  set_affine_pack_enabled(true);
  const AffineKernel k = affine_active_kernel();
  EXPECT_EQ(affine_pack_wanted(),
            k == AffineKernel::AVX512Vnni || k == AffineKernel::AVX2 || k == AffineKernel::AVX2Vnni);
  EXPECT_EQ(affine_packed_centred8(k), k == AffineKernel::AVX2) << "centred where bytes multiply by vpmaddubsw";
  EXPECT_EQ(was, affine_pack_wanted());
}

// Every kernel on a packed matrix (the 16-lane SIMD product where the kernel has one, else the
// scalar twin) equals the scalar twin bit for bit, for every T and both paths (one product for
// both); a row's result is the same whatever T; and against the row-major twin only the float
// order of adding the exact integer sums differs.
TEST(AffinePack, EveryKernelEqualsTheScalarTwinBitForBit) {
  ThreadPool pool(3);
  unsigned seed = 200;
  for (int bits : {2, 4, 6, 8})
    for (int gs : {32, 64, 128})
      for (DType dt : {DType::BF16, DType::F16, DType::F32})
        for (auto [rows, cols] : {std::pair{16, gs}, std::pair{48, 5 * gs}, std::pair{32, 5 * 128 + gs}}) {
          const Affine a(rows, cols, bits, gs, dt, ++seed);
          const Packed p(a.w);
          std::vector<float> bias(static_cast<size_t>(rows));
          for (size_t i = 0; i < bias.size(); ++i) bias[i] = 0.1f * float(i % 7) - 0.3f;
          const int maxT = 11;
          const auto x = random_x(maxT, cols, seed);
          // Each row of x alone (T = 1): what every batch must give, bit for bit (centred: 8-bit codes
          // summed as c - 128, as AVX2's product without VNNI does).
          std::vector<float> alone(size_t(maxT) * size_t(rows)), centred(alone.size());
          for (int t = 0; t < maxT; ++t) {
            AffineXBuffers buf;
            const AffineX ax = quantize_affine_x(x.data() + size_t(t) * cols, 1, cols, bits, gs, kQ8Block, buf, nullptr);
            affine_packed_rows_scalar(ax, p.w, bias.data(), alone.data() + size_t(t) * rows, 0, rows);
            affine_packed_rows_scalar(ax, p.w, bias.data(), centred.data() + size_t(t) * rows, 0, rows, true);
          }
          for (int T : {1, 2, 5, 9, 11}) {
            std::vector<float> want(size_t(T) * size_t(rows)), y(want.size());
            affine_matmul_q8_ref(x.data(), T, a.w, bias.data(), want.data());
            const auto mag = magnitude(x.data(), T, a.w);
            for (size_t i = 0; i < want.size(); ++i) {
              ASSERT_NEAR(alone[i], want[i], 2e-6 * (mag[i] + 1.0)) << name_of(a.w, T) << " against the row-major twin";
              ASSERT_NEAR(centred[i], want[i], 2e-6 * (mag[i] + 1.0)) << name_of(a.w, T) << " centred";
            }
            for (AffineKernel k : available_affine_kernels())
              for (AffinePath path : {AffinePath::Gemv, AffinePath::Gemm}) {
                std::fill(y.begin(), y.end(), NAN);
                affine_matmul(x.data(), T, p.w, bias.data(), y.data(), pool, k, path);
                const auto& twin = affine_packed_centred8(k) && bits == 8 ? centred : alone;
                ASSERT_EQ(0, std::memcmp(y.data(), twin.data(), y.size() * 4))
                    << name_of(a.w, T) << " packed, " << affine_kernel_name(k);
              }
          }
        }
}

// Several packed matrices of one x (q, k and v; gate and up: ops.h matmul_shared_x) in one call: each
// gets the bits of its own product, whichever matrices a thread's part crosses, for every T; matrices
// of other bits or group sizes take separate calls.
TEST(AffinePack, SeveralMatricesInOneCallGetTheirOwnBits) {
  const int cols = 256;
  std::vector<std::unique_ptr<Affine>> files;
  std::vector<std::unique_ptr<Packed>> packed;
  const auto make = [&](int rows, int bits, int gs, DType dt) {
    files.push_back(std::make_unique<Affine>(rows, cols, bits, gs, dt, unsigned(300 + files.size())));
    packed.push_back(std::make_unique<Packed>(files.back()->w));
    return packed.back()->w;
  };
  const std::vector<test::SharedXSet> sets = {
      {"4 bits, g64", {make(80, 4, 64, DType::BF16), make(16, 4, 64, DType::BF16), make(48, 4, 64, DType::F16)}, true},
      {"8 bits, g32", {make(32, 8, 32, DType::BF16), make(16, 8, 32, DType::F32)}, true},
      {"6 bits, g64", {make(48, 6, 64, DType::BF16), make(16, 6, 64, DType::BF16)}, true},
      {"4 and 6 bits", {make(32, 4, 64, DType::BF16), make(16, 6, 64, DType::BF16)}, false},
      {"group sizes 64 and 128", {make(32, 4, 64, DType::BF16), make(16, 4, 128, DType::BF16)}, false},
  };
  test::expect_sets_share_x(sets, [](std::span<const MatmulOutput> outs) { return affine_matmul_shares(outs); });
}

// 6 bits: byte k of the block's register n (x's bytes 4 n + k) holds column 2 (4 n + k) for n < 4,
// 2 (4 n + k - 16) + 1 after; with j = n % 4, dword j holds its code c as c & 15 at bit 0 (n < 4) or
// c >> 2 at bit 4 (n >= 4), dword 4 + j / 2 the other two bits at bit 4, 2 (j even) or 0, 6 (j odd)
// (affine.h). Checked on one row of known codes, byte for byte.
TEST(AffinePack, SixBitPlanesHoldTheDocumentedBits) {
  const int rows = 16, cols = 32;
  std::vector<uint8_t> want(cols);
  for (int k = 0; k < cols; ++k) want[size_t(k)] = uint8_t((k * 37 + 11) % 64);
  std::vector<uint32_t> codes(size_t(rows) * cols * 6 / 32, 0);
  auto* bytes = reinterpret_cast<uint8_t*>(codes.data());
  for (int k = 0; k < cols; ++k)  // row 3's code k at bits [6 k, 6 k + 6) of its bit stream
    for (int b = 0; b < 6; ++b)
      if (want[size_t(k)] >> b & 1) bytes[3 * 24 + (6 * k + b) / 8] |= uint8_t(1u << ((6 * k + b) % 8));
  std::vector<uint16_t> sc(rows, f32_to_bf16(1.f)), bi(rows, 0);
  const WeightMatrix w = affine_matrix(codes.data(), sc.data(), bi.data(), DType::BF16, 6, 32, rows, cols);
  const Packed p(w);
  const uint8_t* g = p.bytes.data() + 2 * rows * 2;  // past the 16 scales and 16 biases (bf16)
  for (int n = 0; n < 8; ++n)
    for (int k = 0; k < 4; ++k) {
      const int pos = 4 * n + k, col = pos < 16 ? 2 * pos : 2 * (pos - 16) + 1;
      const int j = n % 4, at[2][2] = {{4, 0}, {2, 6}};
      const unsigned nib = g[64 * j + 4 * 3 + k] >> (n < 4 ? 0 : 4) & 15u;
      const unsigned two = g[64 * (4 + j / 2) + 4 * 3 + k] >> at[n / 4][j % 2] & 3u;
      EXPECT_EQ(n < 4 ? nib | two << 4 : nib << 2 | two, want[size_t(col)]) << "register " << n << " byte " << k;
    }
  std::vector<float> row(cols);
  affine_dequant_row(p.w, 3, row.data());
  for (int k = 0; k < cols; ++k) EXPECT_EQ(row[size_t(k)], float(want[size_t(k)])) << k;
}

}  // namespace
}  // namespace ptllm
