// BF16 weights times float32 x with bfdot and bfmmla (FEAT_BF16: ARMv8.6, Apple M2 and later,
// Graviton 3/4): the matrix-vector product (decode: up to kMatmulSmallRows rows of x, ops.h) and the
// packed product (prefill), picked at run time where cpu/features.h found BF16 (the NEON table's
// "+bf16" variant, kernels_neon.cpp).
//
// As on AMX (kernels/amx.h): rounding x to bf16 would move each product by about 2^-9, so each x is
// split into hi = bf16(x) and lo = bf16(x - hi), which carry 16 significant bits (|x - hi - lo| <=
// 2^-17 |x|), and y = hi W + lo W. bfdot adds two products of bf16 numbers, exact in float32, to
// each float32 lane. A weight row is loaded once for up to four rows of x, and each y[t][r] is the
// same sequence of operations whatever T and however rows are split over threads.
#include "kernels/arm/arm_target.h"
#include "kernels/simd.h"

#if defined(__aarch64__)
#include <arm_neon.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace ptllm {
namespace {

// x [T][K] as rows of 2 * Kp bf16 (Kp: K rounded up to 8, zeros after K): hi, then lo.
PTLLM_ARM_TARGET_BF16 void split_x(const float* x, int T, int K, int Kp, bfloat16_t* out) {
  for (int t = 0; t < T; ++t) {
    const float* xt = x + size_t(t) * size_t(K);
    bfloat16_t* hi = out + size_t(t) * 2 * size_t(Kp);
    bfloat16_t* lo = hi + Kp;
    for (int k = 0; k < Kp; k += 8) {
      float v[8] = {};
      std::memcpy(v, xt + k, size_t(std::min(8, K - k)) * sizeof(float));
      const float32x4_t a = vld1q_f32(v), b = vld1q_f32(v + 4);
      const bfloat16x8_t h = vcvtq_high_bf16_f32(vcvtq_low_bf16_f32(a), b);  // round to nearest even
      const float32x4_t ha = vcvtq_low_f32_bf16(h), hb = vcvtq_high_f32_bf16(h);
      vst1q_bf16(hi + k, h);
      vst1q_bf16(lo + k, vcvtq_high_bf16_f32(vcvtq_low_bf16_f32(vsubq_f32(a, ha)), vsubq_f32(b, hb)));
    }
  }
}

// acc[t] += hi[t] . w and lo[t] . w over 8 values from k, for t < TT.
template <int TT>
PTLLM_ARM_TARGET_BF16 inline void step8(float32x4_t (*acc)[2], const bfloat16_t* xs, int Kp, int k, bfloat16x8_t w) {
  for (int t = 0; t < TT; ++t) {
    const bfloat16_t* hi = xs + size_t(t) * 2 * size_t(Kp);
    acc[t][0] = vbfdotq_f32(acc[t][0], vld1q_bf16(hi + k), w);
    acc[t][1] = vbfdotq_f32(acc[t][1], vld1q_bf16(hi + Kp + k), w);
  }
}

// out[t] = x[t] . W[r] for t < TT: one weight row against TT rows of split x.
template <int TT>
PTLLM_ARM_TARGET_BF16 void row_dot(const bfloat16_t* xs, int Kp, const uint16_t* w, int K, float* out) {
  float32x4_t acc[TT][2];
  for (int t = 0; t < TT; ++t) acc[t][0] = acc[t][1] = vdupq_n_f32(0.f);
  const int full = K / 8 * 8;
  for (int k = 0; k < full; k += 8) step8<TT>(acc, xs, Kp, k, vreinterpretq_bf16_u16(vld1q_u16(w + k)));
  if (full < K) {  // the last K % 8 weights, zeros after them (x is zero there too)
    uint16_t tail[8] = {};
    std::memcpy(tail, w + full, size_t(K - full) * 2);
    step8<TT>(acc, xs, Kp, full, vreinterpretq_bf16_u16(vld1q_u16(tail)));
  }
  for (int t = 0; t < TT; ++t) out[t] = vaddvq_f32(vaddq_f32(acc[t][0], acc[t][1]));
}

PTLLM_ARM_TARGET_BF16 void gemv_bf16dot(const float* x, int T, const WeightMatrix& w, const float* bias, float* y,
                                        int r0, int r1) {
  const int K = w.cols, Kp = (K + 7) / 8 * 8;
  thread_local std::vector<bfloat16_t> xs;
  if (xs.size() < size_t(T) * 2 * size_t(Kp)) xs.resize(size_t(T) * 2 * size_t(Kp));
  split_x(x, T, K, Kp, xs.data());
  const auto* data = static_cast<const uint16_t*>(w.data);
  float out[4];
  for (int r = r0; r < r1; ++r) {
    const uint16_t* row = data + size_t(r) * size_t(K);
    int t = 0;
    auto put = [&](int n) {
      for (int i = 0; i < n; ++i) y[size_t(t + i) * size_t(w.rows) + size_t(r)] = out[i] + (bias ? bias[r] : 0.f);
      t += n;
    };
    for (; t + 4 <= T;) row_dot<4>(xs.data() + size_t(t) * 2 * size_t(Kp), Kp, row, K, out), put(4);
    for (; t + 2 <= T;) row_dot<2>(xs.data() + size_t(t) * 2 * size_t(Kp), Kp, row, K, out), put(2);
    if (t < T) row_dot<1>(xs.data() + size_t(t) * 2 * size_t(Kp), Kp, row, K, out), put(1);
  }
}

// ---- prefill: bfmmla ---------------------------------------------------------------------------
// bfmmla multiplies a 2 x 4 matrix of bf16 by the transpose of another, adding the 2 x 2 float32
// result to a register: two rows of x against two weight rows, four columns deep, 8 products an
// instruction against bfdot's 4 (Arm ARM, BFMMLA). A tile of 8 rows of x (4 pairs, hi and lo
// apart) times 8 weight rows (4 pairs) holds 16 accumulators, 8 x and 4 weight registers. The weight
// tile is copied once, interleaved by pairs of rows, and reused by every row of x; x is split and
// interleaved once per block of KC columns and MC rows. Each y[t][r] is the same sequence of
// operations (hi then lo for each 4 columns, in column order, blocks of KC added to y in turn)
// whatever T, the tile a row falls in and the threads' shares.
constexpr int kMmRows = 8, kMmCols = 8;  // rows of x, weight rows
constexpr int kMmMC = 64;                // rows of x split at a time

// Rows [i0, i0 + mc) of x, columns [k0, k0 + kc), read from pack_a's panels (MR rows each, [kc][MR]
// per block of KC columns; kernels_impl.h) into pairs of rows: for pair p and 4 columns q, 8 bf16 of
// hi (row 2p's 4, then row 2p + 1's), then 8 of lo. Rows past T and columns past kc are zeros.
PTLLM_ARM_TARGET_BF16 void split_pairs(const float* ap, int T, int MR, size_t Tp, int k0, int kc, int i0, int mc,
                                       bfloat16_t* xs) {
  const int kq = (kc + 3) / 4, pairs = (mc + 1) / 2;
  const float* block = ap + size_t(k0) * Tp;
  for (int p = 0; p < pairs; ++p) {
    const float* rows[2] = {nullptr, nullptr};
    int at[2] = {0, 0};
    for (int h = 0; h < 2; ++h) {
      const int t = i0 + 2 * p + h;
      if (t >= T) continue;
      rows[h] = block + size_t(t / MR) * size_t(MR) * size_t(kc);
      at[h] = t % MR;
    }
    bfloat16_t* out = xs + size_t(p) * size_t(kq) * 16;
    for (int q = 0; q < kq; ++q) {
      float v[8] = {};
      for (int h = 0; h < 2; ++h)
        if (rows[h])
          for (int c = 0; c < 4 && 4 * q + c < kc; ++c) v[4 * h + c] = rows[h][size_t(4 * q + c) * size_t(MR) + size_t(at[h])];
      const float32x4_t a = vld1q_f32(v), b = vld1q_f32(v + 4);
      const bfloat16x8_t hi = vcvtq_high_bf16_f32(vcvtq_low_bf16_f32(a), b);
      const bfloat16x8_t lo = vcvtq_high_bf16_f32(vcvtq_low_bf16_f32(vsubq_f32(a, vcvtq_low_f32_bf16(hi))),
                                                  vsubq_f32(b, vcvtq_high_f32_bf16(hi)));
      vst1q_bf16(out + size_t(q) * 16, hi);
      vst1q_bf16(out + size_t(q) * 16 + 8, lo);
    }
  }
}

// Weight rows [r, r + nr) (nr <= kMmCols), columns [k0, k0 + kc), as pairs of rows: for 4 columns q
// and pair j, 8 bf16 (row 2j's 4, then row 2j + 1's) at bp[(q * 4 + j) * 8]. Rows past nr and
// columns past kc are zeros (a weight past K may be anything, and 0 * inf is no zero).
PTLLM_ARM_TARGET_BF16 void pack_pairs(const uint16_t* w, int K, int r, int nr, int k0, int kc, uint16_t* bp) {
  const int kq = (kc + 3) / 4, full = kc / 8 * 8;
  for (int j = 0; j < kMmCols / 2; ++j) {
    const uint16_t* a = 2 * j < nr ? w + size_t(r + 2 * j) * size_t(K) + size_t(k0) : nullptr;
    const uint16_t* b = 2 * j + 1 < nr ? w + size_t(r + 2 * j + 1) * size_t(K) + size_t(k0) : nullptr;
    int k = 0;
    if (a && b)
      for (; k < full; k += 8) {  // 8 columns of both rows: two groups of 4 columns
        const uint64x2_t va = vreinterpretq_u64_u16(vld1q_u16(a + k)), vb = vreinterpretq_u64_u16(vld1q_u16(b + k));
        vst1q_u16(bp + (size_t(k / 4) * 4 + size_t(j)) * 8, vreinterpretq_u16_u64(vzip1q_u64(va, vb)));
        vst1q_u16(bp + (size_t(k / 4 + 1) * 4 + size_t(j)) * 8, vreinterpretq_u16_u64(vzip2q_u64(va, vb)));
      }
    for (int q = k / 4; q < kq; ++q) {
      uint16_t* d = bp + (size_t(q) * 4 + size_t(j)) * 8;
      for (int c = 0; c < 4; ++c) {
        const bool in = 4 * q + c < kc;
        d[c] = a && in ? a[4 * q + c] : 0;
        d[4 + c] = b && in ? b[4 * q + c] : 0;
      }
    }
  }
}

// y rows [t, t + m) (m <= kMmRows), columns [r, r + n) (n <= kMmCols), from kq groups of 4 columns
// of split x (pairs from xs) and packed weights: written with the bias on the first block of
// columns, added to y on the next.
PTLLM_ARM_TARGET_BF16 void micro_mm(const bfloat16_t* xs, int kq, const uint16_t* bp, float* y, size_t ldy, int m,
                                    int n, bool accumulate, const float* bias) {
  float32x4_t acc[kMmRows / 2][kMmCols / 2];
  for (auto& row : acc)
    for (auto& a : row) a = vdupq_n_f32(0.f);
  const size_t pair_stride = size_t(kq) * 16;
  for (int q = 0; q < kq; ++q) {
    bfloat16x8_t wv[kMmCols / 2];
    for (int j = 0; j < kMmCols / 2; ++j) wv[j] = vreinterpretq_bf16_u16(vld1q_u16(bp + (size_t(q) * 4 + size_t(j)) * 8));
    for (int p = 0; p < kMmRows / 2; ++p) {
      const bfloat16_t* xp = xs + size_t(p) * pair_stride + size_t(q) * 16;
      const bfloat16x8_t hi = vld1q_bf16(xp), lo = vld1q_bf16(xp + 8);
      for (int j = 0; j < kMmCols / 2; ++j) acc[p][j] = vbfmmlaq_f32(vbfmmlaq_f32(acc[p][j], hi, wv[j]), lo, wv[j]);
    }
  }
  // acc[p][j] = (y[2p][2j], y[2p][2j + 1], y[2p + 1][2j], y[2p + 1][2j + 1]).
  for (int p = 0; p < kMmRows / 2; ++p)
    for (int j = 0; j < kMmCols / 2; ++j) {
      float v[4];
      vst1q_f32(v, acc[p][j]);
      for (int h = 0; h < 2; ++h) {
        const int i = 2 * p + h;
        if (i >= m) continue;
        for (int c = 0; c < 2; ++c) {
          const int col = 2 * j + c;
          if (col >= n) continue;
          float& out = y[size_t(i) * ldy + size_t(col)];
          const float add = accumulate ? out : bias ? bias[col] : 0.f;
          out = v[2 * h + c] + add;
        }
      }
    }
}

PTLLM_ARM_TARGET_BF16 void gemm_bfmmla(const float* ap, int MR, int KC, int T, const WeightMatrix& w,
                                       const float* bias, float* y, int r0, int r1) {
  const int K = w.cols;
  const size_t Tp = size_t((T + MR - 1) / MR * MR);
  thread_local std::vector<bfloat16_t> xs;
  thread_local std::vector<uint16_t> bp;
  const size_t kq_max = size_t((std::min(KC, K) + 3) / 4);
  if (xs.size() < size_t(kMmMC / 2) * kq_max * 16) xs.resize(size_t(kMmMC / 2) * kq_max * 16);
  if (bp.size() < kq_max * 4 * 8) bp.resize(kq_max * 4 * 8);
  const auto* data = static_cast<const uint16_t*>(w.data);
  for (int k0 = 0; k0 < K; k0 += KC) {
    const int kc = std::min(KC, K - k0), kq = (kc + 3) / 4;
    const bool accumulate = k0 > 0;
    for (int i0 = 0; i0 < T; i0 += kMmMC) {
      const int mc = std::min(kMmMC, T - i0);
      split_pairs(ap, T, MR, Tp, k0, kc, i0, mc, xs.data());
      for (int jr = r0; jr < r1; jr += kMmCols) {
        const int nr = std::min(kMmCols, r1 - jr);
        pack_pairs(data, K, jr, nr, k0, kc, bp.data());
        for (int ir = 0; ir < mc; ir += kMmRows)
          micro_mm(xs.data() + size_t(ir / 2) * size_t(kq) * 16, kq, bp.data(),
                   y + size_t(i0 + ir) * size_t(w.rows) + size_t(jr), size_t(w.rows), std::min(kMmRows, mc - ir), nr,
                   accumulate, bias && !accumulate ? bias + jr : nullptr);
      }
    }
  }
}

}  // namespace

void neon_bf16_gemm(const float* ap, int MR, int KC, int T, const WeightMatrix& w, const float* bias, float* y, int r0,
                    int r1) {
  gemm_bfmmla(ap, MR, KC, T, w, bias, y, r0, r1);
}

void neon_bf16_gemv(const float* x, int T, const WeightMatrix& w, const float* bias, float* y, int r0, int r1) {
  gemv_bf16dot(x, T, w, bias, y, r0, r1);
}

}  // namespace ptllm
#endif
