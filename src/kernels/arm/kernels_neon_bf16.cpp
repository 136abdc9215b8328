// BF16 weights times float32 x with bfdot (FEAT_BF16: ARMv8.6, Apple M2 and later, Graviton 3/4):
// the matrix-vector product (decode: up to kMatmulSmallRows rows of x, ops.h), picked at run time
// where cpu/features.h found BF16 (the NEON table's "+bf16" variant, kernels_neon.cpp).
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

}  // namespace

void neon_bf16_gemv(const float* x, int T, const WeightMatrix& w, const float* bias, float* y, int r0, int r1) {
  gemv_bf16dot(x, T, w, bias, y, r0, r1);
}

}  // namespace ptllm
#endif
