// The products over llama.cpp's block formats for AArch64 NEON, 16-byte registers, included by
// ggml_neon.cpp (PTLLM_GGML_NEON_DOT 0: byte products widened to 16 bits, summed in pairs),
// ggml_neon_dotprod.cpp (1: sdot, ARMv8.2 dotprod) and ggml_neon_i8mm.cpp (2: the 32-value types by
// smmla, ARMv8.6 i8mm, two weight rows against two rows of x; the K-quants by sdot). The structure of x86/ggml_kernels_impl.h: a
// weight row's blocks are read in place against NT <= 4 rows of quantized x (ggml.h, GgmlActs), the
// codes unpacked into registers once per NT rows of x, in tiles of 16 weight rows.
// - Every code fits a signed byte (Q8_0 as stored, Q4_0 nibble - 8, Q5_0 - 16, Q4_1/Q4_K 0..15,
//   Q5_1/Q5_K 0..31, Q6_K 0..63) and every x code is in [-127, 127], so one signed 8-bit dot product serves all types: sdot,
//   or vmull_s8 + vmlal_high_s8 (two products, at most 2 * 128 * 127 < 2^15) and a pairwise widening
//   add into int32 lanes.
// - 32-value types: one float FMA a block (the int32 lanes times d_w d_x); Q4_1/Q5_1 add
//   m * d_x * sum(x) per block.
// - K-quants: each 16- or 32-value sub-block's int32 lanes times its scale (vmlaq_n_s32), mins and
//   Q6_K's -32 offset from x's sums of 16, all in integers; one float FMA per 256 values.
// Products are exact integers per block; only the float accumulation differs from the scalar twin
// (lane order), by rounding. Internal linkage only: code built for dotprod is never linked for the
// plain variant.
#include "kernels/arm/arm_target.h"
#include "kernels/ggml.h"

#if defined(__aarch64__)
#include <arm_neon.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#if PTLLM_GGML_NEON_DOT == 2
#define PTLLM_GGML_TARGET PTLLM_ARM_TARGET_I8MM
#elif PTLLM_GGML_NEON_DOT
#define PTLLM_GGML_TARGET PTLLM_ARM_TARGET_DOTPROD
#else
#define PTLLM_GGML_TARGET
#endif

#if defined(__clang__)
#define PTLLM_GGML_UNROLL _Pragma("unroll")
#else
#define PTLLM_GGML_UNROLL _Pragma("GCC unroll 8")
#endif

namespace ptllm {
namespace {

// A block's f16 scale (an exact conversion, fcvt).
PTLLM_GGML_TARGET inline float f16_at(const uint8_t* p) {
  __fp16 h;
  std::memcpy(&h, p, 2);
  return float(h);
}

// acc + the products of a and b's signed bytes, summed four (sdot) or two-then-two (widening) a lane:
// which lane holds which product differs, the lanes' total does not.
PTLLM_GGML_TARGET inline int32x4_t dot16(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if PTLLM_GGML_NEON_DOT
  return vdotq_s32(acc, a, b);
#else
  const int16x8_t p = vmlal_high_s8(vmull_s8(vget_low_s8(a), vget_low_s8(b)), a, b);
  return vpadalq_s16(acc, p);
#endif
}
// The 32-value dot of (a0, a1) against x's 32 bytes at q, as int32 lanes.
PTLLM_GGML_TARGET inline int32x4_t dot32(int8x16_t a0, int8x16_t a1, const int8_t* q) {
  return dot16(dot16(vdupq_n_s32(0), a0, vld1q_s8(q)), a1, vld1q_s8(q + 16));
}

// Pointers to rows t0.. of quantized x.
template <int NT>
struct Rows {
  const int8_t* q[NT];
  const float* d[NT];
  const int16_t* s[NT];
  PTLLM_GGML_TARGET Rows(const GgmlActs& a, int t0) {
    PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) {
      q[t] = a.q + size_t(t0 + t) * size_t(a.K);
      d[t] = a.d + size_t(t0 + t) * size_t(a.K / a.block);
      s[t] = a.sums + size_t(t0 + t) * size_t(a.K / 16);
    }
  }
};

// ---- 32-value blocks ---------------------------------------------------------------------------

// 16 bytes, 0x10 where bit i of v is set (byte i), else 0: Q5's fifth bits.
PTLLM_GGML_TARGET inline uint8x16_t bits_to_0x10(uint32_t v) {
  const uint8x16_t rep = vcombine_u8(vdup_n_u8(uint8_t(v)), vdup_n_u8(uint8_t(v >> 8)));
  const uint8x16_t bit = vreinterpretq_u8_u64(vdupq_n_u64(0x8040201008040201ull));
  return vandq_u8(vtstq_u8(rep, bit), vdupq_n_u8(0x10));
}

// The block's 32 codes as two vectors of signed bytes (values 0-15, 16-31): Q8_0 as stored, Q4_0
// nibble - 8, Q5_0 - 16; Q4_1 and Q5_1 without their offset (at most 31, a signed byte too).
template <GgmlType T>
PTLLM_GGML_TARGET inline void codes_32(const uint8_t* b, int8x16_t& c0, int8x16_t& c1) {
  if constexpr (T == GgmlType::Q8_0) {
    c0 = vld1q_s8(reinterpret_cast<const int8_t*>(b + 2));
    c1 = vld1q_s8(reinterpret_cast<const int8_t*>(b + 18));
  } else {
    constexpr bool five = T == GgmlType::Q5_0 || T == GgmlType::Q5_1;
    constexpr int o = T == GgmlType::Q4_0 || T == GgmlType::Q5_0 ? 2 : 4;  // after d (and m)
    const uint8x16_t v = vld1q_u8(b + o + (five ? 4 : 0));
    uint8x16_t u0 = vandq_u8(v, vdupq_n_u8(0x0f)), u1 = vshrq_n_u8(v, 4);
    if constexpr (five) {
      uint32_t qh;
      std::memcpy(&qh, b + o, 4);
      u0 = vorrq_u8(u0, bits_to_0x10(qh));
      u1 = vorrq_u8(u1, bits_to_0x10(qh >> 16));
    }
    c0 = vreinterpretq_s8_u8(u0), c1 = vreinterpretq_s8_u8(u1);
    constexpr int off = T == GgmlType::Q4_0 ? 8 : T == GgmlType::Q5_0 ? 16 : 0;
    if constexpr (off != 0) c0 = vsubq_s8(c0, vdupq_n_s8(off)), c1 = vsubq_s8(c1, vdupq_n_s8(off));
  }
}

// Q8_0, Q4_0, Q5_0: sum_b d_b d8_b dot(c, q); Q4_1, Q5_1 add m_b d8_b sum(q).
template <GgmlType T, int NT>
PTLLM_GGML_TARGET void dot_32(const uint8_t* row, int nb, const GgmlActs& a, int t0, float* out) {
  constexpr int bytes_per = T == GgmlType::Q8_0 ? 34 : T == GgmlType::Q4_0 ? 18 : T == GgmlType::Q4_1 ? 20
                                                   : T == GgmlType::Q5_0 ? 22 : 24;
  constexpr bool with_min = T == GgmlType::Q4_1 || T == GgmlType::Q5_1;
  const Rows<NT> x(a, t0);
  float32x4_t acc[NT];
  float off[NT];
  PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) acc[t] = vdupq_n_f32(0.f), off[t] = 0.f;
  for (int b = 0; b < nb; ++b) {
    const uint8_t* blk = row + size_t(b) * bytes_per;
    int8x16_t c0, c1;
    codes_32<T>(blk, c0, c1);
    const float dw = f16_at(blk);
    PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) {
      const int32x4_t p = dot32(c0, c1, x.q[t] + 32 * b);
      acc[t] = vfmaq_n_f32(acc[t], vcvtq_f32_s32(p), dw * x.d[t][b]);
      if constexpr (with_min) off[t] += f16_at(blk + 2) * x.d[t][b] * float(x.s[t][2 * b] + x.s[t][2 * b + 1]);
    }
  }
  PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) out[t] = vaddvq_f32(acc[t]) + off[t];
}

#if PTLLM_GGML_NEON_DOT == 2
// Weight rows r (at row) and r' (at row2) against rows t and u of x (u may be t, r' may be r: a
// lone row is paired with itself, so a row's bits never depend on its neighbours), by smmla: the
// 2 x 8 matrix of the two weight rows' bytes times the transpose of x's, into (r t, r u, r' t, r' u).
// Per block: four smmla over the 32 values (exact int32), then one float FMA by d_w d_x per lane.
template <GgmlType T>
PTLLM_GGML_TARGET void dot_32_mm(const uint8_t* row, const uint8_t* row2, int nb, const GgmlActs& a, int t, int u,
                                 float* out) {
  constexpr int bytes_per = T == GgmlType::Q8_0 ? 34 : T == GgmlType::Q4_0 ? 18 : T == GgmlType::Q4_1 ? 20
                                                   : T == GgmlType::Q5_0 ? 22 : 24;
  constexpr bool with_min = T == GgmlType::Q4_1 || T == GgmlType::Q5_1;
  const int8_t* qt = a.q + size_t(t) * size_t(a.K);
  const int8_t* qu = a.q + size_t(u) * size_t(a.K);
  const float* dt = a.d + size_t(t) * size_t(a.K / 32);
  const float* du = a.d + size_t(u) * size_t(a.K / 32);
  const int16_t* st = a.sums + size_t(t) * size_t(a.K / 16);
  const int16_t* su = a.sums + size_t(u) * size_t(a.K / 16);
  float32x4_t acc = vdupq_n_f32(0.f), off = vdupq_n_f32(0.f);
  for (int b = 0; b < nb; ++b) {
    const uint8_t* blk = row + size_t(b) * bytes_per;
    const uint8_t* blk2 = row2 + size_t(b) * bytes_per;
    int8x16_t c0, c1, e0, e1;
    codes_32<T>(blk, c0, c1);
    codes_32<T>(blk2, e0, e1);
    const int64x2_t xt0 = vreinterpretq_s64_s8(vld1q_s8(qt + 32 * b)), xt1 = vreinterpretq_s64_s8(vld1q_s8(qt + 32 * b + 16));
    const int64x2_t xu0 = vreinterpretq_s64_s8(vld1q_s8(qu + 32 * b)), xu1 = vreinterpretq_s64_s8(vld1q_s8(qu + 32 * b + 16));
    const int64x2_t w0 = vreinterpretq_s64_s8(c0), w1 = vreinterpretq_s64_s8(c1);
    const int64x2_t v0 = vreinterpretq_s64_s8(e0), v1 = vreinterpretq_s64_s8(e1);
    int32x4_t p = vdupq_n_s32(0);
    p = vmmlaq_s32(p, vreinterpretq_s8_s64(vzip1q_s64(w0, v0)), vreinterpretq_s8_s64(vzip1q_s64(xt0, xu0)));
    p = vmmlaq_s32(p, vreinterpretq_s8_s64(vzip2q_s64(w0, v0)), vreinterpretq_s8_s64(vzip2q_s64(xt0, xu0)));
    p = vmmlaq_s32(p, vreinterpretq_s8_s64(vzip1q_s64(w1, v1)), vreinterpretq_s8_s64(vzip1q_s64(xt1, xu1)));
    p = vmmlaq_s32(p, vreinterpretq_s8_s64(vzip2q_s64(w1, v1)), vreinterpretq_s8_s64(vzip2q_s64(xt1, xu1)));
    const float dw = f16_at(blk), dw2 = f16_at(blk2);
    const float scale[4] = {dw * dt[b], dw * du[b], dw2 * dt[b], dw2 * du[b]};
    acc = vfmaq_f32(acc, vcvtq_f32_s32(p), vld1q_f32(scale));
    if constexpr (with_min) {
      const float m = f16_at(blk + 2), m2 = f16_at(blk2 + 2);
      const float xs_t = dt[b] * float(st[2 * b] + st[2 * b + 1]), xs_u = du[b] * float(su[2 * b] + su[2 * b + 1]);
      const float mins[4] = {m * xs_t, m * xs_u, m2 * xs_t, m2 * xs_u};
      off = vaddq_f32(off, vld1q_f32(mins));
    }
  }
  vst1q_f32(out, vaddq_f32(acc, off));
}

// The 32-value types through dot_32_mm; false for the K-quants (sdot, dot_rows).
PTLLM_GGML_TARGET bool dot_pair(GgmlType type, const uint8_t* row, const uint8_t* row2, int nb, const GgmlActs& a,
                                int t, int u, float* out) {
  switch (type) {
    case GgmlType::Q8_0: return dot_32_mm<GgmlType::Q8_0>(row, row2, nb, a, t, u, out), true;
    case GgmlType::Q4_0: return dot_32_mm<GgmlType::Q4_0>(row, row2, nb, a, t, u, out), true;
    case GgmlType::Q4_1: return dot_32_mm<GgmlType::Q4_1>(row, row2, nb, a, t, u, out), true;
    case GgmlType::Q5_0: return dot_32_mm<GgmlType::Q5_0>(row, row2, nb, a, t, u, out), true;
    case GgmlType::Q5_1: return dot_32_mm<GgmlType::Q5_1>(row, row2, nb, a, t, u, out), true;
    default: return false;
  }
}
#endif

// ---- K-quants ----------------------------------------------------------------------------------

// sum_j m_j (s_2j + s_2j+1), j < 8: x's sums of 16 (16 int16 at s) in pairs against 8 unsigned mins.
PTLLM_GGML_TARGET inline int32x4_t mins_dot(const int16_t* s, uint8x8_t mins) {
  const int16x8_t pairs = vpaddq_s16(vld1q_s16(s), vld1q_s16(s + 8));  // at most 32 * 127
  const int16x8_t m = vreinterpretq_s16_u16(vmovl_u8(mins));
  return vmlal_high_s16(vmull_s16(vget_low_s16(pairs), vget_low_s16(m)), pairs, m);
}

// Q4_K / Q5_K: per 64 values 32 bytes of nibbles (sub-block 2i low, 2i + 1 high), Q5_K's fifth
// bits at bits 2i, 2i + 1 of qh[l].
template <bool FIVE, int NT>
PTLLM_GGML_TARGET void dot_k45(const uint8_t* row, int nb, const GgmlActs& a, int t0, float* out) {
  constexpr int bytes_per = FIVE ? 176 : 144;
  const Rows<NT> x(a, t0);
  float32x4_t acc[NT];
  PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) acc[t] = vdupq_n_f32(0.f);
  const uint8x16_t lo4 = vdupq_n_u8(0x0f);
  for (int b = 0; b < nb; ++b) {
    const uint8_t* blk = row + size_t(b) * bytes_per;
    const uint8_t* qs = blk + (FIVE ? 48 : 16);
    // The 12 scale bytes (ggml.h, GgmlScaleMin) as 8 scales then 8 mins.
    uint32_t u[3];
    std::memcpy(u, blk + 4, 12);
    const uint32_t w[4] = {u[0] & 0x3f3f3f3fu, (u[2] & 0x0f0f0f0fu) | ((u[0] >> 6) & 0x03030303u) << 4,
                           u[1] & 0x3f3f3f3fu, ((u[2] >> 4) & 0x0f0f0f0fu) | ((u[1] >> 6) & 0x03030303u) << 4};
    uint8_t sc[16];
    std::memcpy(sc, w, 16);
    const uint8x8_t mins = vld1_u8(sc + 8);
    [[maybe_unused]] uint8x16_t qh0, qh1;
    if constexpr (FIVE) qh0 = vld1q_u8(blk + 16), qh1 = vld1q_u8(blk + 32);
    int32x4_t isum[NT];
    PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) isum[t] = vdupq_n_s32(0);
    PTLLM_GGML_UNROLL for (int j = 0; j < 8; ++j) {
      const uint8x16_t v0 = vld1q_u8(qs + 32 * (j / 2)), v1 = vld1q_u8(qs + 32 * (j / 2) + 16);
      uint8x16_t c0 = j % 2 == 0 ? vandq_u8(v0, lo4) : vshrq_n_u8(v0, 4);
      uint8x16_t c1 = j % 2 == 0 ? vandq_u8(v1, lo4) : vshrq_n_u8(v1, 4);
      if constexpr (FIVE) {  // bit j of qh[l] to bit 4
        const int8x16_t sh = vdupq_n_s8(int8_t(4 - j));
        c0 = vorrq_u8(c0, vandq_u8(vshlq_u8(qh0, sh), vdupq_n_u8(0x10)));
        c1 = vorrq_u8(c1, vandq_u8(vshlq_u8(qh1, sh), vdupq_n_u8(0x10)));
      }
      const int8x16_t s0 = vreinterpretq_s8_u8(c0), s1 = vreinterpretq_s8_u8(c1);
      PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t)
          isum[t] = vmlaq_n_s32(isum[t], dot32(s0, s1, x.q[t] + 256 * b + 32 * j), int32_t(sc[j]));
    }
    const float d = f16_at(blk), dmin = f16_at(blk + 2);
    PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) {
      const float d8 = x.d[t][b];
      acc[t] = vfmaq_n_f32(acc[t], vcvtq_f32_s32(isum[t]), d * d8);
      acc[t] = vfmaq_n_f32(acc[t], vcvtq_f32_s32(mins_dot(x.s[t] + 16 * b, mins)), -dmin * d8);
    }
  }
  PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) out[t] = vaddvq_f32(acc[t]);
}

// Q6_K: per 128 values 64 bytes of ql and 32 of qh; chunk s (32 values) takes ql[32 (s % 2) + l]'s
// low (s < 2) or high nibble and bits 2s, 2s + 1 of qh[l]; each 16 values have their own int8 scale.
template <int NT>
PTLLM_GGML_TARGET void dot_q6k(const uint8_t* row, int nb, const GgmlActs& a, int t0, float* out) {
  const Rows<NT> x(a, t0);
  float32x4_t acc[NT];
  PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) acc[t] = vdupq_n_f32(0.f);
  const uint8x16_t lo4 = vdupq_n_u8(0x0f), hi2 = vdupq_n_u8(0x30);
  for (int b = 0; b < nb; ++b) {
    const uint8_t* blk = row + size_t(b) * 210u;
    const auto* sc = reinterpret_cast<const int8_t*>(blk + 192);
    const int8x16_t sc8 = vld1q_s8(sc);
    const int16x8_t sc_lo = vmovl_s8(vget_low_s8(sc8)), sc_hi = vmovl_high_s8(sc8);
    int32x4_t isum[NT];
    PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) {  // - 32 sum_g sc_g sum_g(x)
      const int16x8_t s0 = vld1q_s16(x.s[t] + 16 * b), s1 = vld1q_s16(x.s[t] + 16 * b + 8);
      int32x4_t m = vmull_s16(vget_low_s16(s0), vget_low_s16(sc_lo));
      m = vmlal_high_s16(m, s0, sc_lo);
      m = vmlal_s16(m, vget_low_s16(s1), vget_low_s16(sc_hi));
      m = vmlal_high_s16(m, s1, sc_hi);
      isum[t] = vnegq_s32(vshlq_n_s32(m, 5));
    }
    PTLLM_GGML_UNROLL for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = blk + 64 * h;
      const uint8_t* qhp = blk + 128 + 32 * h;
      PTLLM_GGML_UNROLL for (int part = 0; part < 2; ++part) {  // values l in [16 part, 16 part + 16)
        const uint8x16_t l0 = vld1q_u8(ql + 16 * part), l1 = vld1q_u8(ql + 32 + 16 * part);
        const uint8x16_t qh = vld1q_u8(qhp + 16 * part);
        const uint8x16_t c[4] = {
            vorrq_u8(vandq_u8(l0, lo4), vandq_u8(vshlq_n_u8(qh, 4), hi2)),
            vorrq_u8(vandq_u8(l1, lo4), vandq_u8(vshlq_n_u8(qh, 2), hi2)),
            vorrq_u8(vshrq_n_u8(l0, 4), vandq_u8(qh, hi2)),
            vorrq_u8(vshrq_n_u8(l1, 4), vandq_u8(vshrq_n_u8(qh, 2), hi2)),
        };
        PTLLM_GGML_UNROLL for (int s = 0; s < 4; ++s) {
          const int32_t g = sc[8 * h + 2 * s + part];
          const int8x16_t cs = vreinterpretq_s8_u8(c[s]);
          PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) {
            const int8_t* q = x.q[t] + 256 * b + 128 * h + 32 * s + 16 * part;
            isum[t] = vmlaq_n_s32(isum[t], dot16(vdupq_n_s32(0), cs, vld1q_s8(q)), g);
          }
        }
      }
    }
    const float d = f16_at(blk + 208);
    PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) acc[t] = vfmaq_n_f32(acc[t], vcvtq_f32_s32(isum[t]), d * x.d[t][b]);
  }
  PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) out[t] = vaddvq_f32(acc[t]);
}

// ---- rows ---------------------------------------------------------------------------------------

template <int NT>
PTLLM_GGML_TARGET void dot_rows(GgmlType type, const uint8_t* row, int nb, const GgmlActs& a, int t0, float* out) {
  switch (type) {
    case GgmlType::Q4_K: return dot_k45<false, NT>(row, nb, a, t0, out);
    case GgmlType::Q5_K: return dot_k45<true, NT>(row, nb, a, t0, out);
    case GgmlType::Q6_K: return dot_q6k<NT>(row, nb, a, t0, out);
    case GgmlType::Q8_0: return dot_32<GgmlType::Q8_0, NT>(row, nb, a, t0, out);
    case GgmlType::Q4_0: return dot_32<GgmlType::Q4_0, NT>(row, nb, a, t0, out);
    case GgmlType::Q4_1: return dot_32<GgmlType::Q4_1, NT>(row, nb, a, t0, out);
    case GgmlType::Q5_0: return dot_32<GgmlType::Q5_0, NT>(row, nb, a, t0, out);
    default: return dot_32<GgmlType::Q5_1, NT>(row, nb, a, t0, out);
  }
}

// Rows in tiles of 16, as the x86 kernels: a tile's blocks stay in L2 while every group of four
// rows of x passes over them, so a prefill reads the weights from memory once.
constexpr int kRowTile = 16;

#include "kernels/ggml_packed_fallback_impl.h"

PTLLM_GGML_TARGET void ggml_rows(const WeightMatrix& w, const GgmlActs& a, const float* bias, float* y, int r0,
                                 int r1) {
  if (w.ggml_pack) return packed_rows(w, a, bias, y, r0, r1);
  const int nb = w.cols / ggml_type_info(w.ggml).block_elems;
  const size_t rb = w.row_bytes();
  const auto* data = static_cast<const uint8_t*>(w.data);
  float out[4];
  for (int rt = r0; rt < r1; rt += kRowTile) {
    const int re = std::min(r1, rt + kRowTile);
#if PTLLM_GGML_NEON_DOT == 2
    if (ggml_type_info(w.ggml).block_elems == 32) {  // pairs of weight rows against pairs of rows of x
      for (int t = 0; t < a.T; t += 2) {
        const int u = std::min(t + 1, a.T - 1);
        for (int r = rt; r < re; r += 2) {
          const int r2 = std::min(r + 1, re - 1);
          dot_pair(w.ggml, data + size_t(r) * rb, data + size_t(r2) * rb, nb, a, t, u, out);
          for (int i = 0; i < 2 && r + i < re; ++i)
            for (int h = 0; h < 2 && t + h < a.T; ++h)
              y[size_t(t + h) * size_t(w.rows) + size_t(r + i)] = out[2 * i + h] + (bias ? bias[r + i] : 0.f);
        }
      }
      continue;
    }
#endif
    for (int t0 = 0; t0 < a.T; t0 += 4) {
      const int nt = std::min(4, a.T - t0);
      for (int r = rt; r < re; ++r) {
        const uint8_t* row = data + size_t(r) * rb;
        switch (nt) {
          case 4: dot_rows<4>(w.ggml, row, nb, a, t0, out); break;
          case 3: dot_rows<3>(w.ggml, row, nb, a, t0, out); break;
          case 2: dot_rows<2>(w.ggml, row, nb, a, t0, out); break;
          default: dot_rows<1>(w.ggml, row, nb, a, t0, out); break;
        }
        for (int t = 0; t < nt; ++t)
          y[size_t(t0 + t) * size_t(w.rows) + size_t(r)] = out[t] + (bias ? bias[r] : 0.f);
      }
    }
  }
}

// ggml_quantize_acts, bit for bit: the same max, the same products x * (127 / max), rounded to
// nearest even by fcvtns as lrint does (|x * id| <= 127 after rounding, so no clamp is needed).
PTLLM_GGML_TARGET void quantize_acts(const float* x, int K, int block, int t0, int t1, int8_t* q, float* d,
                                     int16_t* sums) {
  const int nd = K / block;
  for (int t = t0; t < t1; ++t) {
    const float* xt = x + size_t(t) * size_t(K);
    int8_t* qt = q + size_t(t) * size_t(K);
    int16_t* st = sums + size_t(t) * size_t(K / 16);
    for (int b = 0; b < nd; ++b) {
      const float* xb = xt + size_t(b) * size_t(block);
      float32x4_t m = vdupq_n_f32(0.f);
      for (int i = 0; i < block; i += 4) m = vmaxq_f32(m, vabsq_f32(vld1q_f32(xb + i)));
      const float amax = vmaxvq_f32(m);
      d[size_t(t) * size_t(nd) + size_t(b)] = amax / 127.f;
      const float id = amax > 0.f ? 127.f / amax : 0.f;
      for (int i = 0; i < block; i += 16) {
        const int32x4_t v0 = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(xb + i), id));
        const int32x4_t v1 = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(xb + i + 4), id));
        const int32x4_t v2 = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(xb + i + 8), id));
        const int32x4_t v3 = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(xb + i + 12), id));
        st[(b * block + i) / 16] = int16_t(vaddvq_s32(vaddq_s32(vaddq_s32(v0, v1), vaddq_s32(v2, v3))));
        const int16x8_t h0 = vcombine_s16(vqmovn_s32(v0), vqmovn_s32(v1));
        const int16x8_t h1 = vcombine_s16(vqmovn_s32(v2), vqmovn_s32(v3));
        vst1q_s8(qt + b * block + i, vcombine_s8(vqmovn_s16(h0), vqmovn_s16(h1)));
      }
    }
  }
}

constexpr GgmlKernel kKernel{PTLLM_GGML_NAME, ggml_rows, quantize_acts};

}  // namespace
}  // namespace ptllm
#endif  // __aarch64__
