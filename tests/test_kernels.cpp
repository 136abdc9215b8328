// Every SIMD kernel against its scalar twin, for every SIMD target this CPU runs, on random inputs
// of awkward sizes and misaligned pointers; and the thread pool's contract.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <random>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/affine.h"
#include "kernels/ggml.h"
#include "kernels/ops.h"
#include "kernels/quant.h"
#include "kernels/simd.h"

namespace ptllm {
namespace {

const int kSizes[] = {1, 2, 3, 7, 15, 16, 17, 31, 33, 64, 100, 257, 1000, 1024, 1031};
const int kOffsets[] = {0, 1, 3};  // elements past a 64-byte boundary

std::vector<float> random_floats(size_t n, std::mt19937& rng, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

// A float row stored as t, at element offset `off` of a fresh buffer: [off + n] elements.
std::vector<uint8_t> stored(const std::vector<float>& v, DType t, int off) {
  std::vector<uint8_t> buf((v.size() + size_t(off)) * dtype_size(t) + 64);
  store_as_ref(v.data(), buf.data() + size_t(off) * dtype_size(t), t, int(v.size()));
  return buf;
}

// Bound on the rounding error of a float32 sum of n products: a multiple of sum |a_i b_i|.
float sum_tolerance(double abs_sum) { return float(2e-6 * abs_sum + 1e-6); }
// A product of BF16 weights by table k: where its variant splits x into two bf16 numbers ("+bf16",
// bfdot on ARMv8.6), each x carries 16 significant bits (|x - hi - lo| <= 2^-17 |x|), as on AMX.
float product_tolerance(const KernelTable& k, DType t, double abs_sum) {
  const bool split = t == DType::BF16 && std::string(k.variant) == "+bf16";
  return sum_tolerance(abs_sum) + (split ? float(std::ldexp(abs_sum, -17)) : 0.f);
}

class KernelTest : public ::testing::TestWithParam<SimdTarget> {
 protected:
  void SetUp() override {
    k_ = kernel_table(GetParam());
    ASSERT_NE(k_, nullptr);
    saved_ = active_simd_target();
    set_simd_target(GetParam());
  }
  void TearDown() override { set_simd_target(saved_); }
  const KernelTable* k_ = nullptr;
  SimdTarget saved_{};
  std::mt19937 rng_{1234};
};

TEST_P(KernelTest, DotMatchesScalarTwin) {
  for (int n : kSizes)
    for (int off : kOffsets) {
      auto a = random_floats(size_t(n + off), rng_), b = random_floats(size_t(n + off), rng_);
      const float* pa = a.data() + off;
      const float* pb = b.data() + off;
      double abs_sum = 0;
      for (int i = 0; i < n; ++i) abs_sum += std::fabs(double(pa[i]) * pb[i]);
      EXPECT_NEAR(k_->dot(pa, pb, n), dot_ref(pa, pb, n), sum_tolerance(abs_sum)) << "n=" << n << " off=" << off;
      EXPECT_NEAR(dot(pa, pb, n), dot_ref(pa, pb, n), sum_tolerance(abs_sum));
    }
}

TEST_P(KernelTest, StoredDotAndAxpyMatchScalarTwins) {
  for (DType t : {DType::F32, DType::BF16, DType::F16})
    for (int n : kSizes)
      for (int off : kOffsets) {
        auto a = random_floats(size_t(n), rng_), v = random_floats(size_t(n), rng_);
        auto buf = stored(v, t, off);
        const void* row = buf.data() + size_t(off) * dtype_size(t);
        double abs_sum = 0;
        for (int i = 0; i < n; ++i) abs_sum += std::fabs(double(a[size_t(i)]) * v[size_t(i)]);
        EXPECT_NEAR(dot_stored(a.data(), row, t, n), dot_stored_ref(a.data(), row, t, n), sum_tolerance(abs_sum))
            << dtype_name(t) << " n=" << n << " off=" << off;

        auto y = random_floats(size_t(n + off), rng_), y_ref = y;
        axpy_stored(0.37f, row, t, y.data() + off, n);
        axpy_stored_ref(0.37f, row, t, y_ref.data() + off, n);
        for (int i = 0; i < n + off; ++i)
          ASSERT_NEAR(y[size_t(i)], y_ref[size_t(i)], 1e-6f) << dtype_name(t) << " n=" << n << " i=" << i;
      }
}

TEST_P(KernelTest, AxpyMatchesScalarTwinAndWritesOnlyItsRange) {
  for (int n : kSizes)
    for (int off : kOffsets) {
      auto x = random_floats(size_t(n + off), rng_);
      auto y = random_floats(size_t(n + off + 5), rng_), y_ref = y;
      axpy(-1.25f, x.data() + off, y.data() + off, n);
      axpy_ref(-1.25f, x.data() + off, y_ref.data() + off, n);
      for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], y_ref[i], 1e-6f) << "n=" << n << " i=" << i;
    }
}

// Conversions are exact: the same bits as the scalar twin (round to nearest even, subnormals,
// overflow to infinity); NaN stays NaN.
TEST_P(KernelTest, ConversionsAreBitExact) {
  std::vector<float> special = {0.f, -0.f, 1.f, -1.f, 65504.f, 65520.f, 65519.f, 1e5f, -1e5f, 6.1e-5f, 5.9e-8f,
                                3e-8f, 1e-40f, -1e-39f, 1.00390625f, 1.01171875f, 3.3895314e38f,
                                std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                                std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min()};
  auto v = random_floats(1000, rng_, -70000.f, 70000.f);
  auto small = random_floats(1000, rng_, -1e-4f, 1e-4f);
  v.insert(v.end(), small.begin(), small.end());
  v.insert(v.end(), special.begin(), special.end());
  v.push_back(std::numeric_limits<float>::quiet_NaN());
  for (DType t : {DType::BF16, DType::F16})
    for (int n : {int(v.size()), 1, 7, 17, 33})
      for (int off : kOffsets) {
        const size_t start = v.size() - size_t(n);  // the tail: specials and NaN included
        std::vector<uint8_t> got(size_t(n + off) * 2 + 64, 0xab), want = got;
        store_as(v.data() + start, got.data() + 2 * off, t, n);
        store_as_ref(v.data() + start, want.data() + 2 * off, t, n);
        for (int i = 0; i < n; ++i) {
          uint16_t g, w;
          std::memcpy(&g, got.data() + 2 * (off + i), 2);
          std::memcpy(&w, want.data() + 2 * (off + i), 2);
          if (std::isnan(v[start + size_t(i)])) {
            EXPECT_TRUE(std::isnan(t == DType::BF16 ? bf16_to_f32(g) : f16_to_f32(g)));
          } else {
            ASSERT_EQ(g, w) << dtype_name(t) << " value " << v[start + size_t(i)];
          }
        }
        if (off > 0) {
          EXPECT_EQ(got[size_t(2 * off - 1)], 0xab);  // nothing before the row
        }
        EXPECT_EQ(got[size_t(2 * (off + n))], 0xab);  // nothing after it
        std::vector<float> back(size_t(n) + 3, -7.f), back_ref = back;
        load_from(want.data() + 2 * off, t, back.data(), n);
        load_from_ref(want.data() + 2 * off, t, back_ref.data(), n);
        EXPECT_EQ(std::memcmp(back.data(), back_ref.data(), back.size() * sizeof(float)), 0) << dtype_name(t);
      }
}

std::vector<uint16_t> f16s(const std::vector<float>& v) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = f32_to_f16(v[i]);
  return h;
}

// Scores out [nq][ld] of a block kernel against its twin's: the columns past nk untouched (7, as
// both were filled), the others within tol(h, j).
template <class Tol>
void expect_scores_near(const std::vector<float>& out, const std::vector<float>& out_ref, int nq, int ld, int nk,
                        Tol tol) {
  for (int h = 0; h < nq; ++h)
    for (int j = 0; j < ld; ++j) {
      const size_t o = size_t(h) * size_t(ld) + size_t(j);
      if (j >= nk)
        ASSERT_EQ(out[o], 7.f);
      else
        ASSERT_NEAR(out[o], out_ref[o], tol(h, j)) << "head " << h << " key " << j;
    }
}

// The KIVI block kernels (one block of code rows for the query heads sharing a KV head,
// kv/kv_cache.cpp) against their twins: head counts around the kernels' passes of 4, odd key
// counts, K keys from the start of a group or part way into one (whose last tile of 16 keys may
// be narrower), codes at odd addresses, strided outputs whose gaps must stay untouched.
TEST_P(KernelTest, KiviBlockKernelsMatchScalarTwins) {
  std::uniform_int_distribution<int> byte(0, 255);
  for (int bits : {8, 4, 2})
    for (int D : {1, 3, 4, 15, 16, 17, 32, 33, 64, 65, 128, 130})
      for (int nq : {1, 2, 3, 4, 5, 8, 11})
        for (int nk : {1, 5, 32})
          for (int j0 : {0, 13}) {
            SCOPED_TRACE(::testing::Message() << "bits=" << bits << " D=" << D << " nq=" << nq << " nk=" << nk
                                              << " j0=" << j0);
            const size_t pk = packed_bytes(D, bits);
            const int G = j0 + nk + (j0 ? 2 : 0);  // keys after those read, too
            std::vector<uint8_t> codes(pk * size_t(G) + 1);
            for (auto& c : codes) c = uint8_t(byte(rng_));
            const uint8_t* pc = codes.data() + 1;
            const KRows kr{pc, G, j0};
            std::vector<uint8_t> rows_buf(pk * size_t(nk) + 1);  // the K rows read, plain: also V's rows
            uint8_t* rows = rows_buf.data() + 1;
            k_rows_from_group(kr, nk, pk, rows);
            auto code = [&](int j, int i) { return float(code_at(rows + size_t(j) * pk, i, bits)); };
            const int ld = nk + 3;

            auto q = random_floats(size_t(nq) * size_t(D) + 1, rng_);
            const float* pq = q.data() + 1;
            // f16 scales and zeros; one scale below the floor (a constant channel) and one zero scale.
            auto ks = f16s(random_floats(size_t(D), rng_, 0.01f, 0.2f)), kz = f16s(random_floats(size_t(D), rng_, -2.f, 2.f));
            ks[0] = f32_to_f16(1e-6f);
            if (D > 2) ks[2] = 0;
            const float qscale = 0.125f;
            std::vector<float> out(size_t(nq) * size_t(ld), 7.f), out_ref = out;
            kivi_k_block(pq, nq, kr, ks.data(), kz.data(), qscale, nk, D, bits, out.data(), ld);
            kivi_k_block_ref(pq, nq, kr, ks.data(), kz.data(), qscale, nk, D, bits, out_ref.data(), ld);
            ASSERT_NO_FATAL_FAILURE(expect_scores_near(out, out_ref, nq, ld, nk, [&](int h, int j) {
              double abs_sum = 0;
              for (int i = 0; i < D; ++i)
                abs_sum += std::fabs(pq[size_t(h) * size_t(D) + size_t(i)]) * qscale *
                           (f16_to_f32(ks[size_t(i)]) * code(j, i) + std::fabs(f16_to_f32(kz[size_t(i)])));
              return sum_tolerance(abs_sum);
            }));

            auto p = random_floats(size_t(nq) * size_t(ld), rng_, 0.f, 1.f);
            auto vs = f16s(random_floats(size_t(nk), rng_, 0.01f, 0.2f)), vz = f16s(random_floats(size_t(nk), rng_, -2.f, 2.f));
            vs[0] = 0;
            auto acc = random_floats(size_t(nq) * size_t(D), rng_), acc_ref = acc;
            auto zacc = random_floats(size_t(nq), rng_), zacc_ref = zacc;
            kivi_v_block(p.data(), ld, nq, rows, vs.data(), vz.data(), nk, D, bits, acc.data(), zacc.data());
            kivi_v_block_ref(p.data(), ld, nq, rows, vs.data(), vz.data(), nk, D, bits, acc_ref.data(), zacc_ref.data());
            for (int h = 0; h < nq; ++h) {
              double zsum = 1;
              for (int j = 0; j < nk; ++j) zsum += p[size_t(h) * size_t(ld) + size_t(j)] * std::fabs(f16_to_f32(vz[size_t(j)]));
              ASSERT_NEAR(zacc[size_t(h)], zacc_ref[size_t(h)], sum_tolerance(zsum));
              // The weights w may be rounded (quant.h): to bf16, at most 2^-8 of each term, the float
              // sums of that kernel (codes entered as 128 + c) rounding at the scale of 128 sum_j w_j;
              // or to 16-bit integers, at most max_j w_j / 65534 a weight.
              double w_sum = 0, w_max = 0;
              for (int j = 0; j < nk; ++j) {
                const double w = p[size_t(h) * size_t(ld) + size_t(j)] * std::max(kMinScale, f16_to_f32(vs[size_t(j)]));
                w_sum += w;
                w_max = std::max(w_max, w);
              }
              for (int i = 0; i < D; ++i) {
                double abs_sum = 0, codes = 0;
                for (int j = 0; j < nk; ++j) {
                  abs_sum += p[size_t(h) * size_t(ld) + size_t(j)] * std::max(kMinScale, f16_to_f32(vs[size_t(j)])) * code(j, i);
                  codes += code(j, i);
                }
                const size_t o = size_t(h) * size_t(D) + size_t(i);
                ASSERT_NEAR(acc[o], acc_ref[o],
                            sum_tolerance(abs_sum + 1) + 0x1p-8 * abs_sum + 0x1p-14 * w_sum + w_max / 65534 * codes);
              }
            }
          }
}

// The dense block kernels (rows stored as F32/BF16/F16, kv/kv_cache.cpp) against their twins: head
// counts around the passes of 4, odd key counts, rows at odd addresses, strided outputs.
TEST_P(KernelTest, DenseBlockKernelsMatchScalarTwins) {
  for (DType t : {DType::F32, DType::BF16, DType::F16})
    for (int D : {1, 3, 4, 15, 16, 17, 32, 33, 64, 65, 128, 130})
      for (int nq : {1, 2, 3, 4, 5, 8, 11})
        for (int nk : {1, 5, 32}) {
          SCOPED_TRACE(::testing::Message() << dtype_name(t) << " D=" << D << " nq=" << nq << " nk=" << nk);
          auto rows = random_floats(size_t(nk) * size_t(D), rng_, -2.f, 2.f);
          auto buf = stored(rows, t, 1);
          const void* pr = buf.data() + dtype_size(t);
          std::vector<float> rv(rows.size());  // the rows as stored, back in float32
          load_from_ref(pr, t, rv.data(), int(rv.size()));
          const int ld = nk + 3;

          auto q = random_floats(size_t(nq) * size_t(D) + 1, rng_);
          const float* pq = q.data() + 1;
          const float qscale = 0.125f;
          std::vector<float> out(size_t(nq) * size_t(ld), 7.f), out_ref = out;
          dense_k_block(pq, nq, pr, t, qscale, nk, D, out.data(), ld);
          dense_k_block_ref(pq, nq, pr, t, qscale, nk, D, out_ref.data(), ld);
          ASSERT_NO_FATAL_FAILURE(expect_scores_near(out, out_ref, nq, ld, nk, [&](int h, int j) {
            double abs_sum = 0;
            for (int i = 0; i < D; ++i)
              abs_sum += std::fabs(pq[size_t(h) * size_t(D) + size_t(i)] * rv[size_t(j) * size_t(D) + size_t(i)]) * qscale;
            return sum_tolerance(abs_sum);
          }));

          auto p = random_floats(size_t(nq) * size_t(ld), rng_, 0.f, 1.f);
          auto acc = random_floats(size_t(nq) * size_t(D) + 5, rng_), acc_ref = acc;
          dense_v_block(p.data(), ld, nq, pr, t, nk, D, acc.data());
          dense_v_block_ref(p.data(), ld, nq, pr, t, nk, D, acc_ref.data());
          for (int h = 0; h < nq; ++h)
            for (int i = 0; i < D; ++i) {
              double abs_sum = 1;
              for (int j = 0; j < nk; ++j)
                abs_sum += p[size_t(h) * size_t(ld) + size_t(j)] * std::fabs(rv[size_t(j) * size_t(D) + size_t(i)]);
              const size_t o = size_t(h) * size_t(D) + size_t(i);
              ASSERT_NEAR(acc[o], acc_ref[o], sum_tolerance(abs_sum));
            }
          for (size_t o = size_t(nq) * size_t(D); o < acc.size(); ++o) ASSERT_EQ(acc[o], acc_ref[o]);  // untouched
        }
}

// Asking for the next block's lines (kv/kv_cache.cpp passes its rows as `next`) is only a hint: every
// block kernel gives bit for bit what it gives without it.
TEST_P(KernelTest, BlockKernelsGiveTheSameWithNextBlockPrefetch) {
  std::uniform_int_distribution<int> byte(0, 255);
  for (int D : {17, 64, 130})
    for (int nq : {4, 11})
      for (int nk : {5, 32}) {
        SCOPED_TRACE(::testing::Message() << "D=" << D << " nq=" << nq << " nk=" << nk);
        const int ld = nk + 3;
        auto q = random_floats(size_t(nq) * size_t(D), rng_);
        auto p = random_floats(size_t(nq) * size_t(ld), rng_, 0.f, 1.f);
        for (int bits : {8, 4, 2}) {
          const size_t pk = packed_bytes(D, bits);
          std::vector<uint8_t> codes(pk * size_t(nk)), next(codes.size());
          for (auto& c : codes) c = uint8_t(byte(rng_));
          auto ks = f16s(random_floats(size_t(D), rng_, 0.01f, 0.2f)), kz = f16s(random_floats(size_t(D), rng_));
          auto vs = f16s(random_floats(size_t(nk), rng_, 0.01f, 0.2f)), vz = f16s(random_floats(size_t(nk), rng_));
          std::vector<float> out(size_t(nq) * size_t(ld)), out_pf = out;
          kivi_k_block(q.data(), nq, KRows{codes.data(), nk, 0}, ks.data(), kz.data(), 0.125f, nk, D, bits, out.data(),
                       ld);
          kivi_k_block(q.data(), nq, KRows{codes.data(), nk, 0}, ks.data(), kz.data(), 0.125f, nk, D, bits, out_pf.data(), ld,
                       next.data());
          ASSERT_EQ(out, out_pf) << "bits=" << bits;
          auto acc = random_floats(size_t(nq) * size_t(D), rng_), acc_pf = acc;
          std::vector<float> zacc(size_t(nq), 0.f), zacc_pf = zacc;
          kivi_v_block(p.data(), ld, nq, codes.data(), vs.data(), vz.data(), nk, D, bits, acc.data(), zacc.data());
          kivi_v_block(p.data(), ld, nq, codes.data(), vs.data(), vz.data(), nk, D, bits, acc_pf.data(),
                       zacc_pf.data(), next.data());
          ASSERT_EQ(acc, acc_pf) << "bits=" << bits;
          ASSERT_EQ(zacc, zacc_pf) << "bits=" << bits;
        }
        for (DType t : {DType::F32, DType::BF16, DType::F16}) {
          auto buf = stored(random_floats(size_t(nk) * size_t(D), rng_, -2.f, 2.f), t, 0);
          auto next = buf;
          std::vector<float> out(size_t(nq) * size_t(ld)), out_pf = out;
          dense_k_block(q.data(), nq, buf.data(), t, 0.125f, nk, D, out.data(), ld);
          dense_k_block(q.data(), nq, buf.data(), t, 0.125f, nk, D, out_pf.data(), ld, next.data());
          ASSERT_EQ(out, out_pf) << dtype_name(t);
          auto acc = random_floats(size_t(nq) * size_t(D), rng_), acc_pf = acc;
          dense_v_block(p.data(), ld, nq, buf.data(), t, nk, D, acc.data());
          dense_v_block(p.data(), ld, nq, buf.data(), t, nk, D, acc_pf.data(), next.data());
          ASSERT_EQ(acc, acc_pf) << dtype_name(t);
        }
      }
}

// Several blocks in one call (attention's quantized blocks of a part) give bit for bit what the
// block kernels give one block at a time, in order: scores in each span's columns, nothing else
// written, the same V sums. More spans than a V batch takes at once (8), and groups longer than
// the V kernels' chunks of 64 keys.
TEST_P(KernelTest, SpanKernelsGiveWhatTheBlockKernelsGiveInTurn) {
  std::uniform_int_distribution<int> byte(0, 255);
  for (int kGroup : {32, 128})
    for (int D : {17, 64, 128})
      for (int nq : {1, 4, 6})
        for (int bits : {8, 4, 2}) {
          SCOPED_TRACE(::testing::Message() << "G=" << kGroup << " D=" << D << " nq=" << nq << " bits=" << bits);
          const size_t pk = packed_bytes(D, bits);
          // The last `count` keys of a group of kGroup (0: all): whole groups, and the ends of groups
          // (a window's lower edge).
          std::vector<int> counts{0, 0, 7, 0, 19, 1, 0, 0, 5, 0, 0}, firsts;
          for (int& n : counts) {
            if (n == 0) n = kGroup;
            firsts.push_back(kGroup - n);
          }
          const int ns = int(counts.size());
          int cols = 0;
          for (int n : counts) cols += n + 2;  // a gap between spans' columns
          const int ld = cols + 1;
          std::vector<std::vector<uint8_t>> kc(ns), vc(ns);
          std::vector<std::vector<uint16_t>> ks(ns), kz(ns), vs(ns), vz(ns);
          std::vector<KiviSpan> spans(static_cast<size_t>(ns));
          for (int i = 0, col = 1; i < ns; ++i) {
            const int n = counts[size_t(i)];
            kc[i].resize(pk * size_t(kGroup)), vc[i].resize(pk * size_t(n));
            for (auto& c : kc[i]) c = uint8_t(byte(rng_));
            for (auto& c : vc[i]) c = uint8_t(byte(rng_));
            ks[i] = f16s(random_floats(size_t(D), rng_, 0.01f, 0.2f)), kz[i] = f16s(random_floats(size_t(D), rng_));
            vs[i] = f16s(random_floats(size_t(n), rng_, 0.01f, 0.2f)), vz[i] = f16s(random_floats(size_t(n), rng_));
            const void* next = i + 2 < ns ? kc[size_t(i + 2)].data() : nullptr;
            spans[size_t(i)] = KiviSpan{kc[i].data(),  firsts[size_t(i)], vc[i].data(), ks[i].data(),
                                        kz[i].data(),  vs[i].data(),      vz[i].data(), n,
                                        col,           next,              i + 2 < ns ? vc[size_t(i + 2)].data() : nullptr};
            col += n + 2;
          }
          auto q = random_floats(size_t(nq) * size_t(D), rng_);
          std::vector<float> out(size_t(nq) * size_t(ld), 7.f), out_ref = out;
          kivi_k_spans(q.data(), nq, spans.data(), ns, kGroup, 0.125f, D, bits, out.data(), ld);
          for (const KiviSpan& s : spans)
            kivi_k_block(q.data(), nq, KRows{s.k, kGroup, s.k0}, s.ks, s.kz, 0.125f, s.n, D, bits,
                         out_ref.data() + s.col, ld);
          ASSERT_EQ(out, out_ref);
          auto p = random_floats(size_t(nq) * size_t(ld), rng_, 0.f, 1.f);
          auto acc = random_floats(size_t(nq) * size_t(D) + 5, rng_), acc_ref = acc;
          auto zacc = random_floats(size_t(nq) + 1, rng_), zacc_ref = zacc;
          kivi_v_spans(p.data(), ld, nq, spans.data(), ns, D, bits, acc.data(), zacc.data());
          for (const KiviSpan& s : spans)
            kivi_v_block(p.data() + s.col, ld, nq, s.v, s.vs, s.vz, s.n, D, bits, acc_ref.data(), zacc_ref.data());
          ASSERT_EQ(acc, acc_ref);
          ASSERT_EQ(zacc, zacc_ref);
        }
}

// A KIVI K group back to float32 (attention at cache positions) against dequantize_k_group.
TEST_P(KernelTest, KiviKDequantMatchesScalarTwin) {
  std::uniform_int_distribution<int> byte(0, 255);
  for (int bits : {8, 4, 2})
    for (int D : {1, 3, 15, 16, 17, 33, 64, 65, 130})
      for (int nk : {1, 5, 32}) {
        SCOPED_TRACE(::testing::Message() << "bits=" << bits << " D=" << D << " nk=" << nk);
        const size_t pk = packed_bytes(D, bits);
        const int G = nk + 7;  // keys [0, nk) and [7, 7 + nk) of a group of G
        std::vector<uint8_t> codes(pk * size_t(G) + 1);
        for (auto& c : codes) c = uint8_t(byte(rng_));
        auto ks = f16s(random_floats(size_t(D), rng_, 0.01f, 0.2f)), kz = f16s(random_floats(size_t(D), rng_, -2.f, 2.f));
        ks[0] = f32_to_f16(1e-6f);
        if (D > 2) ks[2] = 0;
        std::vector<float> all(size_t(G) * size_t(D));
        dequantize_k_group(codes.data() + 1, ks.data(), kz.data(), G, D, bits, all.data());
        for (int j0 : {0, 7}) {
          std::vector<float> out(size_t(nk) * size_t(D) + 3, 7.f), out_ref = out;
          kivi_k_dequant(KRows{codes.data() + 1, G, j0}, ks.data(), kz.data(), nk, D, bits, out.data());
          std::copy_n(all.begin() + ptrdiff_t(j0) * D, size_t(nk) * size_t(D), out_ref.begin());
          for (size_t i = 0; i < out.size(); ++i)
            ASSERT_NEAR(out[i], out_ref[i], 1e-6f * (1.f + std::fabs(out_ref[i]))) << "i=" << i << " j0=" << j0;
        }
      }
}

TEST_P(KernelTest, MaxAndExpSumMatchScalarTwins) {
  for (int n : kSizes)
    for (int off : kOffsets) {
      auto x = random_floats(size_t(n + off) + 1, rng_, -30.f, 30.f);
      if (n > 2) x[size_t(off + n - 1)] = -200.f;  // far below the max: underflows to 0
      x[size_t(off + n)] = 100.f;                   // past the end: must not count
      const float m = max_of(x.data() + off, n);
      ASSERT_EQ(m, max_of_ref(x.data() + off, n)) << n;
      ASSERT_EQ(m, *std::max_element(x.begin() + off, x.begin() + off + n)) << n;
      auto x_ref = x;
      const float sum = exp_sum(x.data() + off, n, m), sum_ref = exp_sum_ref(x_ref.data() + off, n, m);
      for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(x[i], x_ref[i], 2e-6f * (1e-3f + std::fabs(x_ref[i]))) << n;
      EXPECT_NEAR(sum, sum_ref, 2e-6f * sum_ref) << n;
    }
}

TEST_P(KernelTest, RmsNormSiluSoftmaxMatchScalarTwins) {
  for (int n : kSizes)
    for (int off : kOffsets) {
      auto x = random_floats(size_t(n + off), rng_, -3.f, 3.f), w = random_floats(size_t(n + off), rng_);
      std::vector<float> out(size_t(n + off) + 1, 9.f), out_ref = out;
      rmsnorm(x.data() + off, w.data() + off, out.data() + off, n, 1e-5f);
      rmsnorm_ref(x.data() + off, w.data() + off, out_ref.data() + off, n, 1e-5f);
      for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], out_ref[i], 1e-5f * (1 + std::fabs(out_ref[i])));

      auto g = random_floats(size_t(n + off), rng_, -20.f, 20.f), u = random_floats(size_t(n + off), rng_);
      auto g_ref = g;
      silu_mul(g.data() + off, u.data() + off, n);
      silu_mul_ref(g_ref.data() + off, u.data() + off, n);
      for (size_t i = 0; i < g.size(); ++i) ASSERT_NEAR(g[i], g_ref[i], 1e-6f * (1 + std::fabs(g_ref[i]))) << n;

      auto s = random_floats(size_t(n + off), rng_, -30.f, 30.f);
      if (n > 2) {
        s[size_t(off)] = -std::numeric_limits<float>::infinity();  // a masked score
        s[size_t(off + n - 1)] = -200.f;                           // far below the max: exp underflows
      }
      auto s_ref = s;
      softmax(s.data() + off, n);
      softmax_ref(s_ref.data() + off, n);
      for (size_t i = 0; i < s.size(); ++i) ASSERT_NEAR(s[i], s_ref[i], 2e-6f * (1e-3f + std::fabs(s_ref[i]))) << n;
    }
}

TEST_P(KernelTest, RopeMatchesScalarTwin) {
  for (int head_dim : {2, 6, 16, 32, 34, 64, 128, 256})
    for (int off : kOffsets) {
      const int half = head_dim / 2, heads = 3;
      auto cs = random_floats(size_t(half), rng_), sn = random_floats(size_t(half), rng_);
      auto x = random_floats(size_t(heads * head_dim + off), rng_), x_ref = x;
      rope_rotate(x.data() + off, heads, head_dim, cs.data(), sn.data());
      rope_rotate_ref(x_ref.data() + off, heads, head_dim, cs.data(), sn.data());
      for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(x[i], x_ref[i], 1e-6f) << head_dim;
      std::vector<float> o(size_t(head_dim + off), 5.f), o_ref = o;
      rope_rotate_one(x.data() + off, head_dim, cs.data(), sn.data(), o.data() + off);
      rope_rotate_one_ref(x.data() + off, head_dim, cs.data(), sn.data(), o_ref.data() + off);
      for (size_t i = 0; i < o.size(); ++i) ASSERT_NEAR(o[i], o_ref[i], 1e-6f) << head_dim;
    }
}

// A weight matrix in dtype t filled with random values, and the float values it holds.
struct TestMatrix {
  std::vector<uint8_t> bytes;
  WeightMatrix w;
  std::vector<float> values;  // [rows][cols] as stored (rounded to t)
  TestMatrix(DType t, int rows, int cols, std::mt19937& rng) {
    auto v = random_floats(size_t(rows) * size_t(cols), rng);
    bytes.resize(v.size() * dtype_size(t) + 64);
    store_as_ref(v.data(), bytes.data(), t, int(v.size()));
    w = WeightMatrix{t, bytes.data(), rows, cols};
    values.resize(v.size());
    load_from_ref(bytes.data(), t, values.data(), int(v.size()));
  }
  // sum_k |x[t][k] W[r][k]| + |bias[r]|: the scale of y[t][r]'s rounding error.
  double abs_sum(const std::vector<float>& x, int t, int r, const float* bias) const {
    double s = bias ? std::fabs(bias[r]) : 0.0;
    for (int k = 0; k < w.cols; ++k)
      s += std::fabs(double(x[size_t(t) * size_t(w.cols) + size_t(k)]) * values[size_t(r) * size_t(w.cols) + size_t(k)]);
    return s;
  }
};

// Both product kernels (streamed and packed) on every dtype, shapes that are not multiples of any
// tile, with and without bias, over pools of 1 and 3 threads.
TEST_P(KernelTest, MatmulMatchesScalarTwin) {
  const int shapes[][2] = {{1, 1}, {5, 3}, {33, 17}, {67, 300}, {130, 257}, {41, 1000}};
  ThreadPool pool1(1), pool3(3);
  for (DType t : {DType::F32, DType::BF16, DType::F16})
    for (const auto& s : shapes)
      for (int T : {1, 2, 3, 4, 5, 7, 13, 16, 40}) {
        TestMatrix m(t, s[0], s[1], rng_);
        auto x = random_floats(size_t(T) * size_t(s[1]), rng_);
        auto bias = random_floats(size_t(s[0]), rng_);
        for (bool with_bias : {false, true})
          for (ThreadPool* pool : {&pool1, &pool3}) {
            const float* b = with_bias ? bias.data() : nullptr;
            std::vector<float> y(size_t(T) * size_t(s[0]), 1e9f), y_ref(y.size());
            matmul(x.data(), T, m.w, b, y.data(), *pool);
            matmul_ref(x.data(), T, m.w, b, y_ref.data());
            for (int tt = 0; tt < T; ++tt)
              for (int r = 0; r < s[0]; ++r) {
                const size_t i = size_t(tt) * size_t(s[0]) + size_t(r);
                ASSERT_NEAR(y[i], y_ref[i], product_tolerance(*k_, t, m.abs_sum(x, tt, r, b)))
                    << dtype_name(t) << " " << s[0] << "x" << s[1] << " T=" << T << " threads=" << pool->size();
              }
          }
      }
}

// BF16 weights through the matrix-vector product alone (bfdot on ARMv8.6, else the float kernels):
// K not a multiple of 8 (a tail of weights), every row count of x it takes in groups, a bias.
TEST_P(KernelTest, Bf16GemvMatchesScalarTwin) {
  const int shapes[][2] = {{1, 1}, {5, 3}, {9, 17}, {7, 300}};
  for (const auto& s : shapes)
    for (int T : {1, 2, 3, 5, 16}) {
      TestMatrix m(DType::BF16, s[0], s[1], rng_);
      auto x = random_floats(size_t(T) * size_t(s[1]), rng_);
      auto bias = random_floats(size_t(s[0]), rng_);
      std::vector<float> y(size_t(T) * size_t(s[0]), 1e9f), y_ref(y.size());
      k_->gemv(x.data(), nullptr, T, m.w, bias.data(), y.data(), 0, s[0]);
      matmul_ref(x.data(), T, m.w, bias.data(), y_ref.data());
      for (int tt = 0; tt < T; ++tt)
        for (int r = 0; r < s[0]; ++r) {
          const size_t i = size_t(tt) * size_t(s[0]) + size_t(r);
          ASSERT_NEAR(y[i], y_ref[i], product_tolerance(*k_, DType::BF16, m.abs_sum(x, tt, r, bias.data())))
              << s[0] << "x" << s[1] << " T=" << T << " " << active_kernels_name();
        }
    }
}

// One thread's share: the columns [r0, r1) and nothing else, for both product kernels.
TEST_P(KernelTest, ProductKernelsWriteOnlyTheirColumns) {
  TestMatrix m(DType::BF16, 75, 90, rng_);
  for (int T : {1, 3, 9, 14}) {  // 9, 14: tiles of 4 weight rows for bf16
    auto x = random_floats(size_t(T) * 90, rng_);
    std::vector<float> y_ref(size_t(T) * 75);
    matmul_ref(x.data(), T, m.w, nullptr, y_ref.data());
    const int r0 = k_->gemm_nr, r1 = 2 * k_->gemm_nr + 3 > 75 ? 75 : 2 * k_->gemm_nr + 3;
    const int panels = (T + k_->gemm_mr - 1) / k_->gemm_mr;
    std::vector<float> ap(size_t(panels * k_->gemm_mr) * 90);
    k_->pack_a(x.data(), T, 90, 0, panels, ap.data());
    std::vector<float> xd(x.size());  // the deinterleaved copy matmul makes once for its threads
    k_->deinterleave_bf16(x.data(), T, 90, xd.data());
    std::vector<float> y_own;  // gemv deinterleaving x itself
    for (int path : {0, 1, 2}) {  // gemv making its own copy of x, gemv given matmul's, gemm
      std::vector<float> y(size_t(T) * 75, -5.f);
      if (path == 2)
        k_->gemm(ap.data(), T, m.w, nullptr, y.data(), r0, r1);
      else
        k_->gemv(x.data(), path == 0 ? nullptr : xd.data(), T, m.w, nullptr, y.data(), r0, r1);
      if (path == 0) y_own = y;
      if (path == 1) {
        ASSERT_EQ(y, y_own) << "T=" << T << ": the caller's deinterleaved x gives other bits";
      }
      for (int tt = 0; tt < T; ++tt)
        for (int r = 0; r < 75; ++r) {
          const size_t i = size_t(tt) * 75 + size_t(r);
          if (r >= r0 && r < r1)
            ASSERT_NEAR(y[i], y_ref[i], product_tolerance(*k_, DType::BF16, m.abs_sum(x, tt, r, nullptr)));
          else
            ASSERT_EQ(y[i], -5.f) << "column " << r << " is outside [" << r0 << ", " << r1 << ")";
        }
    }
  }
}

// The packed product (prefill) gives a row of x the same bits whatever the batch around it and the
// tile it falls in (bfmmla on ARMv8.6 multiplies two rows of x at once): rows 9.. of a 40-row batch
// fed alone as a batch of 31, and its first 17 rows as a batch of 17, over K past one depth block.
TEST_P(KernelTest, PackedProductRowsDoNotDependOnTheBatch) {
  for (DType t : {DType::F32, DType::BF16, DType::F16})
    for (int cols : {301, 1031}) {
      TestMatrix m(t, 37, cols, rng_);
      auto x = random_floats(size_t(40) * size_t(cols), rng_);
      auto bias = random_floats(37, rng_);
      auto product = [&](int t0, int T) {
        const int panels = (T + k_->gemm_mr - 1) / k_->gemm_mr;
        std::vector<float> ap(size_t(panels * k_->gemm_mr) * size_t(cols));
        k_->pack_a(x.data() + size_t(t0) * size_t(cols), T, cols, 0, panels, ap.data());
        std::vector<float> y(size_t(T) * 37);
        k_->gemm(ap.data(), T, m.w, bias.data(), y.data(), 0, 37);
        return y;
      };
      const auto all = product(0, 40), head = product(0, 17), tail = product(9, 31);
      ASSERT_EQ(std::memcmp(head.data(), all.data(), head.size() * sizeof(float)), 0)
          << dtype_name(t) << " K=" << cols << " " << active_kernels_name();
      ASSERT_EQ(std::memcmp(tail.data(), all.data() + 9 * 37, tail.size() * sizeof(float)), 0)
          << dtype_name(t) << " K=" << cols << " " << active_kernels_name();
    }
}

// The same weights at any address give the same bits: sums run in an order fixed by element index,
// whatever loads the kernel uses to stay cache-line aligned.
TEST_P(KernelTest, ProductsDoNotDependOnWhereTheWeightsSit) {
  ThreadPool pool(1);
  for (DType t : {DType::F32, DType::BF16, DType::F16}) {
    const int rows = 37, cols = 300;
    auto v = random_floats(size_t(rows) * cols, rng_);
    for (int T : {1, 2, 3, 5, 8, 16, 20}) {  // streamed (bf16: tiles from 5) and packed products
      auto x = random_floats(size_t(T) * cols, rng_);
      std::vector<float> first;
      const std::vector<size_t> offsets = t == DType::F32 ? std::vector<size_t>{0, 4, 8, 36}
                                                          : std::vector<size_t>{0, 2, 8, 30, 1};
      for (size_t off : offsets) {
        std::vector<uint8_t> buf(v.size() * dtype_size(t) + 128);
        uint8_t* base = buf.data() + (64 - reinterpret_cast<uintptr_t>(buf.data()) % 64) % 64 + off;
        store_as_ref(v.data(), base, t, int(v.size()));
        std::vector<float> y(size_t(T) * rows);
        matmul(x.data(), T, WeightMatrix{t, base, rows, cols}, nullptr, y.data(), pool);
        if (first.empty())
          first = y;
        else
          ASSERT_EQ(std::memcmp(first.data(), y.data(), y.size() * sizeof(float)), 0)
              << dtype_name(t) << " T=" << T << " offset " << off;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Targets, KernelTest, ::testing::ValuesIn(available_simd_targets()),
                         [](const ::testing::TestParamInfo<SimdTarget>& i) {
                           return std::string(simd_target_name(i.param));
                         });

TEST(SimdDispatchTest, BestTargetIsActiveAndEveryTargetCanBeChosen) {
  const auto targets = available_simd_targets();
  ASSERT_FALSE(targets.empty());
  EXPECT_EQ(targets.front(), SimdTarget::Portable);
  EXPECT_EQ(active_simd_target(), targets.back());
  for (SimdTarget t : targets) {
    set_simd_target(t);
    EXPECT_EQ(active_simd_target(), t);
    EXPECT_EQ(&active_kernels(), kernel_table(t));
  }
  set_simd_target(targets.back());
#if defined(__x86_64__)
  // The CPU's own report (the compiler's cpuid reader) agrees with the dispatcher's.
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    EXPECT_NE(kernel_table(SimdTarget::AVX2), nullptr);
  }
  if (__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl")) {
    EXPECT_NE(kernel_table(SimdTarget::AVX512), nullptr);
  }
#endif
#if defined(__aarch64__)
  // Advanced SIMD is part of AArch64: the NEON kernels, never the portable loops, are chosen.
  EXPECT_EQ(active_simd_target(), SimdTarget::NEON);
  EXPECT_NE(active_kernels_name().find("neon"), std::string::npos);
  // The affine products take the best of what the kernel reports (Linux's HWCAP bits, read here
  // apart from the dispatcher's reader).
  AffineKernel want = AffineKernel::NEON;
#if defined(__linux__)
  if (getauxval(AT_HWCAP) & (1ul << 20)) want = AffineKernel::NEONDotprod;  // HWCAP_ASIMDDP
  if (getauxval(AT_HWCAP2) & (1ul << 13)) want = AffineKernel::NEONI8mm;    // HWCAP2_I8MM
#endif
  EXPECT_EQ(affine_active_kernel(), want) << affine_kernel_name(affine_active_kernel());
  // The GGUF block products: smmla where the kernel reports i8mm (and dotprod, for the K-quants),
  // sdot where it reports dotprod, else the plain NEON variant.
  std::string want_gguf = "neon";
#if defined(__linux__)
  if (getauxval(AT_HWCAP) & (1ul << 20)) want_gguf = "neon-dotprod";  // HWCAP_ASIMDDP
  if ((getauxval(AT_HWCAP) & (1ul << 20)) && (getauxval(AT_HWCAP2) & (1ul << 13))) want_gguf = "neon-i8mm";
#endif
  EXPECT_EQ(std::string(ggml_active_kernel().name), want_gguf);
  int nk = 0;
  const GgmlKernel* const* ks = ggml_kernels(&nk);
  EXPECT_EQ(std::string(ks[nk - 1]->name), want_gguf);  // the best variant is also tested against the twin
  // BF16 weights through bfdot (gemv) and bfmmla (gemm) where the kernel reports BF16.
  std::string want_name = "neon";
#if defined(__linux__)
  if (getauxval(AT_HWCAP2) & (1ul << 14)) want_name = "neon+bf16";  // HWCAP2_BF16
#endif
  EXPECT_EQ(active_kernels_name(), want_name);
  // What --version and bench print names the same choices.
  const std::string described = kernels_description();
  const std::string head = want_name + " (affine " + std::string(affine_kernel_name(want)) + ", gguf " + want_gguf;
  EXPECT_EQ(described.rfind(head + ";", 0), 0u) << described;
#endif
}

// ---- thread pool ---------------------------------------------------------------------------------

TEST(ThreadPoolTest, RangesCoverEveryIndexOnceAlignedToGrain) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    for (size_t n : {size_t(1), size_t(2), size_t(7), size_t(64), size_t(1000), size_t(4097)})
      for (size_t grain : {size_t(1), size_t(4), size_t(32)}) {
        std::vector<std::atomic<int>> hits(n);
        std::atomic<int> misaligned{0};
        pool.parallel_for(
            n,
            [&](size_t b, size_t e) {
              if (b % grain != 0 || (e % grain != 0 && e != n)) ++misaligned;
              for (size_t i = b; i < e; ++i) ++hits[i];
            },
            grain);
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << threads << " threads, n=" << n << " i=" << i;
        EXPECT_EQ(misaligned.load(), 0);
      }
  }
}

TEST(ThreadPoolTest, SplitsWorkOverEveryThread) {
  ThreadPool pool(3);
  std::atomic<int> calls{0};
  pool.parallel_for(3, [&](size_t b, size_t e) {
    EXPECT_EQ(e, b + 1);
    ++calls;
  });
  EXPECT_EQ(calls.load(), 3);
}

// The caller owns the first run of parts and only it takes them from the front, so whatever parts
// of that run it gets start at 0 and follow in order (one contiguous stream), whatever the workers
// steal from the run's back; then come the parts it steals, from the back of each worker's run.
TEST(ThreadPoolTest, TheCallerRunsItsOwnPartsFrontToBack) {
  int ran_part_zero = 0;
  for (int threads : {2, 3}) {
    ThreadPool pool(threads);
    // 16 parts of 100 (kPartsPerThread 8 a thread, at most one part a grain): the caller's run is
    // the first 16 / threads of them.
    const size_t own_end = size_t(16 / threads) * 100;
    for (int call = 0; call < 50; ++call) {
      std::mutex mu;
      std::vector<std::pair<size_t, size_t>> mine;
      const auto caller = std::this_thread::get_id();
      pool.parallel_for(
          1600,
          [&](size_t b, size_t e) {
            if (std::this_thread::get_id() != caller) return;
            std::lock_guard<std::mutex> lk(mu);
            mine.emplace_back(b, e);
          },
          100);
      size_t own = 0;
      while (own < mine.size() && mine[own].first < own_end) {
        EXPECT_EQ(mine[own].first, 100 * own) << threads << " threads, call " << call;
        ++own;
      }
      ran_part_zero += own > 0;
      // Parts in descending order within each worker's run: at most one rise for each further run.
      int rises = 0;
      for (size_t i = own; i < mine.size(); ++i) {
        EXPECT_GE(mine[i].first, own_end) << threads << " threads, call " << call;
        if (i > own && mine[i].first > mine[i - 1].first) ++rises;
      }
      EXPECT_LE(rises, threads - 2);
    }
  }
  EXPECT_GT(ran_part_zero, 0);  // the caller is never slower than every worker 100 times over
}

TEST(ThreadPoolTest, ManyCallsAndSleepingWorkersWakeUp) {
  ThreadPool pool(2);
  std::atomic<long> sum{0};
  for (int call = 0; call < 20000; ++call)
    pool.parallel_for(10, [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) sum += long(i);
    });
  EXPECT_EQ(sum.load(), 20000L * 45);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // workers stop spinning and sleep
  pool.parallel_for(10, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) sum += long(i);
  });
  EXPECT_EQ(sum.load(), 20001L * 45);
}

// Back-to-back calls of random sizes: a worker still finishing one call must never take a part of
// the next (each index runs exactly once per call, and no call waits forever).
TEST(ThreadPoolTest, BackToBackCallsOfRandomSizes) {
  ThreadPool pool(3);
  std::mt19937 rng(3);
  long want = 0;
  std::atomic<long> got{0};
  for (int call = 0; call < 200000; ++call) {
    const size_t n = rng() % 100 + 1, grain = rng() % 20 + 1;
    want += long(n);
    pool.parallel_for(n, [&](size_t b, size_t e) { got += long(e - b); }, grain);
  }
  EXPECT_EQ(got.load(), want);
}

TEST(ThreadPoolTest, NestedCallsRunInline) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> hits(12 * 12);
  pool.parallel_for(12, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i)
      pool.parallel_for(12, [&](size_t b2, size_t e2) {
        for (size_t j = b2; j < e2; ++j) ++hits[i * 12 + j];
      });
  });
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
}

TEST(ThreadPoolTest, ExceptionsReachTheCallerAndThePoolStaysUsable) {
  ThreadPool pool(3);
  EXPECT_THROW(pool.parallel_for(9,
                                 [&](size_t b, size_t) {
                                   if (b >= 3) throw std::runtime_error("worker failed");
                                 }),
               std::runtime_error);
  std::atomic<int> n{0};
  pool.parallel_for(9, [&](size_t b, size_t e) { n += int(e - b); });
  EXPECT_EQ(n.load(), 9);
}

}  // namespace
}  // namespace ptllm
