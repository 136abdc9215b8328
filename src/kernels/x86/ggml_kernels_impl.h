// The SIMD products over llama.cpp's block formats, written once over 256-bit integer vectors and
// compiled per target: each ggml_<target>.cpp defines PTLLM_GGML_TARGET (a target attribute),
// PTLLM_GGML_VNNI (0 or 1) and PTLLM_GGML_NAME, then includes this file. Internal linkage only, so
// code built for one instruction set is never picked by the linker for another.
//
// Each kernel reads a weight row's blocks in place against NT <= 4 rows of quantized x (ggml.h,
// GgmlActs) at once, so the codes are unpacked into registers once per NT rows of x:
// - 32-value types: the block's codes become 32 signed bytes (Q4_0: nibble - 8, Q5_0: - 16, Q8_0 as
//   stored) and meet x's codes through |w| * sign(x, w) (vpmaddubsw / vpdpbusd take unsigned x
//   signed bytes); Q4_1/Q5_1 keep unsigned codes and add m * sum(x) per block. One float FMA a
//   block: the int32 lanes times d_w d_x.
// - K-quants: unsigned codes (Q4_K 0..15, Q5_K 0..31, Q6_K 0..63) times x's bytes in pairs
//   (vpmaddubsw: at most 2 * 63 * 127, no saturation), the int16 pairs times the sub-block scales
//   into int32 (vpmaddwd, or vpdpwssd with VNNI) over the whole 256-value block; mins (Q4_K/Q5_K)
//   and Q6_K's -32 offset from x's sums of 16 times the scales, also in integers. One float FMA
//   per 256 values and row of x.
// Products are exact integers per block; only the float accumulation differs from the scalar twin
// (lane order), by rounding.
#ifndef PTLLM_GGML_TARGET
#error "define PTLLM_GGML_TARGET before including ggml_kernels_impl.h"
#endif

#ifndef PTLLM_GGML_ZMM
#define PTLLM_GGML_ZMM 0  // the 512-bit Q4_K kernel (the AVX-512 targets)
#endif

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/ggml.h"
#include "kernels/ggml_pack_layout.h"
#include "kernels/ops.h"
#include "kernels/stream.h"

namespace ptllm {
namespace {

#if defined(__clang__)
#define PTLLM_GGML_UNROLL _Pragma("unroll")
#else
#define PTLLM_GGML_UNROLL _Pragma("GCC unroll 8")
#endif

using I = __m256i;
using F = __m256;

// A block's f16 scale through F16C (exact, as f16_to_f32; one conversion per 32 weights of the
// 32-value types, where the scalar conversion's branches would cost as much as the block's product).
PTLLM_GGML_TARGET inline float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}

PTLLM_GGML_TARGET inline I load(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
PTLLM_GGML_TARGET inline __m128i load128(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }
PTLLM_GGML_TARGET inline I bytes(int v) { return _mm256_set1_epi8(char(v)); }

// acc + sum of four adjacent u8 x s8 products in each int32 lane.
PTLLM_GGML_TARGET inline I dot_u8s8(I acc, I u, I s) {
#if PTLLM_GGML_VNNI
  return _mm256_dpbusd_epi32(acc, u, s);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}
// acc + pairs of int16 products in each int32 lane.
PTLLM_GGML_TARGET inline I madd_acc(I acc, I a, I b) {
#if PTLLM_GGML_VNNI
  return _mm256_dpwssd_epi32(acc, a, b);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
#endif
}
PTLLM_GGML_TARGET inline float hsum(F v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
// A decode stream is asked for this far ahead of the block being read, every line: the hardware
// prefetchers stop at every 4 KiB page, and a decode step (one row of x) otherwise waits on misses
// at each one, as the BF16 gemv measured (Q4_K_M decode: 15% less CPU time). The packed products
// take it (with a touch a few times a page alone, kernels/stream.h, an AVX-512 Xeon streamed the
// packed Q4_0 matrices well below its read rate), and the file's Q8_0 rows under AVX2, not under
// AVX-512 (about 5% slower there). `n` bytes from p + kAheadBytes. Always inlined: GCC finds a copy
// left out of line `const` (a prefetch changes nothing it tracks) and deletes the calls to it.
constexpr size_t kAheadBytes = 4096;
template <int n>
[[gnu::always_inline]] PTLLM_GGML_TARGET inline void ask_ahead(const uint8_t* p) {
  PTLLM_GGML_UNROLL for (int o = 0; o < n; o += 64)
    _mm_prefetch(reinterpret_cast<const char*>(p + kAheadBytes + o), _MM_HINT_T0);
}

// 32 bytes, 0x10 where bit i of v is set (byte i), else 0: Q5's fifth bits.
PTLLM_GGML_TARGET inline I bits_to_0x10(uint32_t v) {
  const I rep = _mm256_shuffle_epi8(_mm256_set1_epi32(int(v)),
                                    _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2,
                                                     2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const I m = _mm256_set1_epi64x(int64_t(0x8040201008040201ull));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(rep, m), m), bytes(0x10));
}
// A block's 16 nibbles as 32 bytes: low nibbles (values 0-15) in the low half, high ones above.
PTLLM_GGML_TARGET inline I nibbles_32(const uint8_t* qs) {
  const __m128i b = load128(qs);
  const I both = _mm256_set_m128i(_mm_srli_epi16(b, 4), b);
  return _mm256_and_si256(both, bytes(0x0f));
}

// Pointers to rows t0.. of quantized x, and one product's float accumulators.
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

// The block's 32 codes as bytes: signed ones (Q8_0, Q4_0, Q5_0) or unsigned ones (Q4_1, Q5_1).
template <GgmlType T>
PTLLM_GGML_TARGET inline I codes_32(const uint8_t* b) {
  if constexpr (T == GgmlType::Q8_0) {
    return load(b + 2);
  } else if constexpr (T == GgmlType::Q4_0) {
    return _mm256_sub_epi8(nibbles_32(b + 2), bytes(8));
  } else if constexpr (T == GgmlType::Q4_1) {
    return nibbles_32(b + 4);
  } else {
    constexpr int o = T == GgmlType::Q5_0 ? 2 : 4;
    uint32_t qh;
    std::memcpy(&qh, b + o, 4);
    const I c = _mm256_or_si256(nibbles_32(b + o + 4), bits_to_0x10(qh));
    return T == GgmlType::Q5_0 ? _mm256_sub_epi8(c, bytes(16)) : c;
  }
}

template <GgmlType T, int NT>
PTLLM_GGML_TARGET void dot_32(const uint8_t* row, int nb, const GgmlActs& a, int t0, float* out) {
  constexpr int bytes_per = T == GgmlType::Q8_0 ? 34 : T == GgmlType::Q4_0 ? 18 : T == GgmlType::Q4_1 ? 20
                                                   : T == GgmlType::Q5_0 ? 22 : 24;
  constexpr bool with_min = T == GgmlType::Q4_1 || T == GgmlType::Q5_1;
  const Rows<NT> x(a, t0);
  F acc[NT];
  float off[NT];
  PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps(), off[t] = 0.f;
  for (int b = 0; b < nb; ++b) {
    const uint8_t* blk = row + size_t(b) * bytes_per;
#if !PTLLM_GGML_ZMM
    if constexpr (T == GgmlType::Q8_0 && NT == 1)  // see kAheadBytes
      if (b % 2 == 0) ask_ahead<2 * bytes_per>(blk);
#endif
    const I c = codes_32<T>(blk);
    const float dw = f16_at(blk);
    if constexpr (with_min) {
      const float m = f16_at(blk + 2);
      PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) {
        const I p = dot_u8s8(_mm256_setzero_si256(), c, load(x.q[t] + 32 * b));
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * x.d[t][b]), acc[t]);
        off[t] += m * x.d[t][b] * float(x.s[t][2 * b] + x.s[t][2 * b + 1]);
      }
    } else {
      const I ac = _mm256_sign_epi8(c, c);  // |c| (-128 -> 128 as an unsigned byte)
      PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) {
        const I p = dot_u8s8(_mm256_setzero_si256(), ac, _mm256_sign_epi8(load(x.q[t] + 32 * b), c));
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * x.d[t][b]), acc[t]);
      }
    }
  }
  PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) out[t] = hsum(acc[t]) + off[t];
}

// ---- K-quants ----------------------------------------------------------------------------------

// Q4_K / Q5_K: per 64 values 32 bytes of nibbles (sub-block 2i low, 2i + 1 high), Q5_K's fifth
// bits at bits 2i, 2i + 1 of qh[l].
template <bool FIVE, int NT>
PTLLM_GGML_TARGET void dot_k45(const uint8_t* row, int nb, const GgmlActs& a, int t0, float* out) {
  constexpr int bytes_per = FIVE ? 176 : 144;
  const Rows<NT> x(a, t0);
  F acc[NT];
  PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
  const I lo4 = bytes(0x0f);
  for (int b = 0; b < nb; ++b) {
    const uint8_t* blk = row + size_t(b) * bytes_per;
    ask_ahead<bytes_per>(blk);
    const uint8_t* qs = blk + (FIVE ? 48 : 16);
    // The 12 scale bytes (ggml.h, GgmlScaleMin) as 8 scales then 8 mins, in registers.
    uint32_t u[3];
    std::memcpy(u, blk + 4, 12);
    const __m128i sm = _mm_setr_epi32(int(u[0] & 0x3f3f3f3fu),
                                      int((u[2] & 0x0f0f0f0fu) | ((u[0] >> 6) & 0x03030303u) << 4),
                                      int(u[1] & 0x3f3f3f3fu),
                                      int(((u[2] >> 4) & 0x0f0f0f0fu) | ((u[1] >> 6) & 0x03030303u) << 4));
    const I scales = _mm256_permute4x64_epi64(_mm256_cvtepu8_epi16(sm), 0x44);  // scales 0-7, both halves
    const I mins = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(sm, sm));           // m0 m0 m1 m1 .. m7 m7
    [[maybe_unused]] I qh;
    if constexpr (FIVE) qh = load(blk + 16);
    I isum[NT];
    PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) isum[t] = _mm256_setzero_si256();
    PTLLM_GGML_UNROLL for (int i = 0; i < 4; ++i) {
      const I v = load(qs + 32 * i);
      I c0 = _mm256_and_si256(v, lo4), c1 = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4);
      if constexpr (FIVE) {
        c0 = _mm256_or_si256(c0, _mm256_and_si256(_mm256_slli_epi16(_mm256_srli_epi16(qh, 2 * i), 4), bytes(0x10)));
        c1 = _mm256_or_si256(c1, _mm256_and_si256(_mm256_slli_epi16(_mm256_srli_epi16(qh, 2 * i + 1), 4), bytes(0x10)));
      }
      const I s0 = _mm256_shuffle_epi8(scales, _mm256_set1_epi16(int16_t(0x0100 + 0x0202 * (2 * i))));
      const I s1 = _mm256_shuffle_epi8(scales, _mm256_set1_epi16(int16_t(0x0100 + 0x0202 * (2 * i + 1))));
      PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) {
        const int8_t* q = x.q[t] + 256 * b + 64 * i;
        isum[t] = madd_acc(isum[t], _mm256_maddubs_epi16(c0, load(q)), s0);
        isum[t] = madd_acc(isum[t], _mm256_maddubs_epi16(c1, load(q + 32)), s1);
      }
    }
    const float d = f16_at(blk), dmin = f16_at(blk + 2);
    PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) {
      const float d8 = x.d[t][b];
      const I msum = _mm256_madd_epi16(load(x.s[t] + 16 * b), mins);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_set1_ps(d * d8), acc[t]);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_set1_ps(-dmin * d8), acc[t]);
    }
  }
  PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) out[t] = hsum(acc[t]);
}

// Q6_K: per 128 values 64 bytes of ql and 32 of qh; chunk s (32 values) takes ql[32 (s % 2) + l]'s
// low (s < 2) or high nibble and bits 2s, 2s + 1 of qh[l]; its two 16-value groups have their own
// scale (the low and high 128-bit halves of the vpmaddubsw result).
template <int NT>
PTLLM_GGML_TARGET void dot_q6k(const uint8_t* row, int nb, const GgmlActs& a, int t0, float* out) {
  const Rows<NT> x(a, t0);
  F acc[NT];
  PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
  const I lo4 = bytes(0x0f), hi2 = bytes(0x30);
  for (int b = 0; b < nb; ++b) {
    const uint8_t* blk = row + size_t(b) * 210u;
    ask_ahead<210>(blk);
    const I sc16 = _mm256_cvtepi8_epi16(load128(blk + 192));
    I isum[NT];
    PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t)  // - 32 sum_g sc_g sum_g(x)
        isum[t] = _mm256_sub_epi32(_mm256_setzero_si256(),
                                   _mm256_slli_epi32(_mm256_madd_epi16(load(x.s[t] + 16 * b), sc16), 5));
    PTLLM_GGML_UNROLL for (int h = 0; h < 2; ++h) {
      const I l0 = load(blk + 64 * h), l1 = load(blk + 64 * h + 32), qh = load(blk + 128 + 32 * h);
      const I c[4] = {
          _mm256_or_si256(_mm256_and_si256(l0, lo4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), hi2)),
          _mm256_or_si256(_mm256_and_si256(l1, lo4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), hi2)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), lo4), _mm256_and_si256(qh, hi2)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), lo4),
                          _mm256_and_si256(_mm256_srli_epi16(qh, 2), hi2)),
      };
      // Scales 8h .. 8h + 7 in both halves; chunk s takes scale 2s in its low half, 2s + 1 above.
      const I half = h == 0 ? _mm256_permute4x64_epi64(sc16, 0x44) : _mm256_permute4x64_epi64(sc16, 0xee);
      PTLLM_GGML_UNROLL for (int s = 0; s < 4; ++s) {
        const I scv = _mm256_shuffle_epi8(half, _mm256_set_m128i(_mm_set1_epi16(int16_t(0x0100 + 0x0202 * (2 * s + 1))),
                                                                 _mm_set1_epi16(int16_t(0x0100 + 0x0202 * (2 * s)))));
        PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) {
          const I p = _mm256_maddubs_epi16(c[s], load(x.q[t] + 256 * b + 128 * h + 32 * s));
          isum[t] = madd_acc(isum[t], p, scv);
        }
      }
    }
    const float d = f16_at(blk + 208);
    PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t)
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_set1_ps(d * x.d[t][b]), acc[t]);
  }
  PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) out[t] = hsum(acc[t]);
}

// The 32-value panel products' per-block terms of x, block-major ([nb][T]: a tile's values side by
// side): corr = -o sum x over the block (o: the codes' offset, 8 for Q4_0's nibbles, 128 for Q8_0's
// codes + 128) and x's scale. Buffers of this thread, reused across calls.
// With `min` (Q4_1, Q5_1) also xm: x's block scale times the sum of its codes, which a block's m
// multiplies.
struct BlockTerms {
  const int32_t* corr;
  const float* xs;
  const float* xm;
};
PTLLM_GGML_TARGET inline BlockTerms block_terms(const GgmlActs& a, int nb, int32_t o, bool min = false) {
  thread_local std::vector<int32_t> corr;
  thread_local std::vector<float> xs, xm;
  if (corr.size() < size_t(a.T) * size_t(nb))
    corr.resize(size_t(a.T) * size_t(nb)), xs.resize(corr.size()), xm.resize(corr.size());
  for (int t = 0; t < a.T; ++t) {
    const int16_t* s = a.sums + size_t(t) * size_t(a.K / 16);
    const float* d = a.d + size_t(t) * size_t(nb);
    for (int b = 0; b < nb; ++b) {
      const int32_t sum = int32_t(s[2 * b]) + int32_t(s[2 * b + 1]);
      const size_t i = size_t(b) * size_t(a.T) + size_t(t);
      corr[i] = -o * sum;
      xs[i] = d[b];
      if (min) xm[i] = d[b] * float(sum);
    }
  }
  return {corr.data(), xs.data(), xm.data()};
}

#if PTLLM_GGML_ZMM
// ---- Q4_K on 512-bit vectors, four weight rows at once -----------------------------------------
// A zmm of a row's codes holds 128 values (two 32-byte groups of nibbles: sub-blocks 4j, 4j + 2 in
// the low nibbles, 4j + 1, 4j + 3 in the high ones), against x's matching 32-byte runs joined into
// one vector. The four rows' 12 scale bytes are unpacked at once (one 128-bit lane a row), so the
// per-block work that dominated 256-value rows is shared, and each load of x serves four rows.
using Z = __m512i;
using FZ = __m512;

PTLLM_GGML_TARGET inline Z zmadd_acc(Z acc, Z a, Z b) {
#if PTLLM_GGML_VNNI
  return _mm512_dpwssd_epi32(acc, a, b);
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(a, b));
#endif
}
// 32 bytes at p and 32 at p + 64, as one vector.
PTLLM_GGML_TARGET inline Z pair256(const int8_t* p) {
  return _mm512_inserti64x4(_mm512_zextsi256_si512(load(p)), load(p + 64), 1);
}
// vpshufb indices: int16 lanes of scale byte `lo` in the low 256 bits and `hi` in the high ones.
PTLLM_GGML_TARGET inline Z scale_pick(int lo, int hi) {
  const __m128i l = _mm_set1_epi16(int16_t(0x8000 | lo)), h = _mm_set1_epi16(int16_t(0x8000 | hi));
  return _mm512_inserti64x4(_mm512_zextsi256_si512(_mm256_set_m128i(l, l)), _mm256_set_m128i(h, h), 1);
}

PTLLM_GGML_TARGET inline F fold(FZ v) {  // the two halves' sum
  return _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}
// The sums of a, b, c, d.
PTLLM_GGML_TARGET inline __m128 reduce_add4(FZ a, FZ b, FZ c, FZ d) {
  const F a8 = fold(a), b8 = fold(b), c8 = fold(c), d8 = fold(d);
  const F ab = _mm256_hadd_ps(a8, b8), cd = _mm256_hadd_ps(c8, d8);  // a01 a23 b01 b23 | a45 a67 b45 b67 (and c, d)
  const F abcd = _mm256_hadd_ps(ab, cd);                              // a b c d (low lanes) | a b c d (high)
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

template <int NT>
PTLLM_GGML_TARGET void dot_q4k_x4(const uint8_t* row0, size_t rb, int nb, const GgmlActs& a, int t0, float* out) {
  constexpr int NR = 4;
  const Rows<NT> x(a, t0);
  FZ acc[NT][NR], accm[NT];
  PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) {
    accm[t] = _mm512_setzero_ps();
    PTLLM_GGML_UNROLL for (int r = 0; r < NR; ++r) acc[t][r] = _mm512_setzero_ps();
  }
  const Z lo4 = _mm512_set1_epi8(0x0f);
  const Z lane4 = _mm512_setr_epi32(0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3);
  // The scale unpacking of dot_k45, per 128-bit lane [d|dmin, u0, u1, u2] -> [sc0-3, sc4-7, m0-3, m4-7].
  const Z shv = _mm512_set4_epi32(4, 0, 0, 0);
  const Z m1 = _mm512_set4_epi32(0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f);
  const Z m2 = _mm512_set4_epi32(0x30303030, 0, 0x30303030, 0);
  const Z mins_idx = _mm512_broadcast_i32x4(_mm_setr_epi8(8, -128, 9, -128, 10, -128, 11, -128, 12, -128, 13, -128,
                                                          14, -128, 15, -128));
  const Z pick[2][2] = {{scale_pick(0, 2), scale_pick(1, 3)}, {scale_pick(4, 6), scale_pick(5, 7)}};
  for (int b = 0; b < nb; ++b) {
    const uint8_t* blk = row0 + size_t(b) * 144u;
    PTLLM_GGML_UNROLL for (int r = 0; r < NR; ++r) ask_ahead<144>(blk + size_t(r) * rb);
    Z h = _mm512_zextsi128_si512(load128(blk));
    h = _mm512_inserti32x4(h, load128(blk + rb), 1);
    h = _mm512_inserti32x4(h, load128(blk + 2 * rb), 2);
    h = _mm512_inserti32x4(h, load128(blk + 3 * rb), 3);
    const Z A = _mm512_shuffle_epi32(h, _MM_PERM_ENUM(0xED)), B = _mm512_shuffle_epi32(h, _MM_PERM_ENUM(0xA5));
    const Z sm = _mm512_or_si512(_mm512_and_si512(_mm512_srlv_epi32(A, shv), m1),
                                 _mm512_and_si512(_mm512_srli_epi32(B, 2), m2));
    const Z mins16 = _mm512_shuffle_epi8(sm, mins_idx);  // lane r: row r's 8 mins as int16
    // d and dmin of the four rows as floats, lane r = row r's four times.
    const Z hd = _mm512_shuffle_epi32(h, _MM_PERM_ENUM(0));
    const FZ dz = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(hd));
    const FZ dminz = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(hd, 16)));
    Z isum[NT][NR];
    PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) {
      PTLLM_GGML_UNROLL for (int r = 0; r < NR; ++r) isum[t][r] = _mm512_setzero_si512();
      // x's sub-block sums (pairs of its sums of 16) beside each row's mins.
      const I s32 = _mm256_madd_epi16(load(x.s[t] + 16 * b), _mm256_set1_epi16(1));
      const Z xs = _mm512_broadcast_i32x4(_mm256_cvtepi32_epi16(s32));
      const FZ m = _mm512_cvtepi32_ps(_mm512_madd_epi16(mins16, xs));
      accm[t] = _mm512_fmadd_ps(m, _mm512_mul_ps(dminz, _mm512_set1_ps(-x.d[t][b])), accm[t]);
    }
    PTLLM_GGML_UNROLL for (int j = 0; j < 2; ++j) {
      Z x0[NT], x1[NT];
      PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) {
        x0[t] = pair256(x.q[t] + 256 * b + 128 * j);
        x1[t] = pair256(x.q[t] + 256 * b + 128 * j + 32);
      }
      PTLLM_GGML_UNROLL for (int r = 0; r < NR; ++r) {
        // Row r's scales in every lane.
        const Z rs = _mm512_permutexvar_epi32(_mm512_add_epi32(lane4, _mm512_set1_epi32(4 * r)), sm);
        const Z w = _mm512_loadu_si512(blk + size_t(r) * rb + 16 + 64 * j);
        const Z c0 = _mm512_and_si512(w, lo4), c1 = _mm512_and_si512(_mm512_srli_epi16(w, 4), lo4);
        const Z s0 = _mm512_shuffle_epi8(rs, pick[j][0]), s1 = _mm512_shuffle_epi8(rs, pick[j][1]);
        PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) {
          isum[t][r] = zmadd_acc(isum[t][r], _mm512_maddubs_epi16(c0, x0[t]), s0);
          isum[t][r] = zmadd_acc(isum[t][r], _mm512_maddubs_epi16(c1, x1[t]), s1);
        }
      }
    }
    PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) {
      const FZ dd = _mm512_mul_ps(dz, _mm512_set1_ps(x.d[t][b]));
      PTLLM_GGML_UNROLL for (int r = 0; r < NR; ++r)
        acc[t][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t][r]), _mm512_permutexvar_ps(_mm512_set1_epi32(4 * r), dd),
                                    acc[t][r]);
    }
  }
  PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) {
    PTLLM_GGML_UNROLL for (int r = 0; r < NR; ++r)  // row r's min terms: lane r of accm
        acc[t][r] = _mm512_mask_add_ps(acc[t][r], __mmask16(0xf << (4 * r)), acc[t][r], accm[t]);
    _mm_storeu_ps(out + t * NR, reduce_add4(acc[t][0], acc[t][1], acc[t][2], acc[t][3]));
  }
}

// Q6_K on 512-bit vectors, one row against NT rows of x: per 128 values one zmm of ql (chunks 0, 1
// of dot_q6k in its halves, then 2, 3 from the high nibbles) and qh in both halves, shifted per half
// (vpsllvw / vpsrlvw); x's 64 matching bytes are consecutive. Scales per 16 values: one a 128-bit
// lane.
template <int NT>
PTLLM_GGML_TARGET void dot_q6k_zmm(const uint8_t* row, int nb, const GgmlActs& a, int t0, float* out) {
  const Rows<NT> x(a, t0);
  FZ acc[NT];
  PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  const Z lo4 = _mm512_set1_epi8(0x0f), hi2 = _mm512_set1_epi8(0x30);
  const Z shl = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);  // qh << 4 | qh << 2
  const Z shr = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);  // qh | qh >> 2
  // Scale word of each 128-bit lane: 0-3 (first zmm of a half), 4-7 (second), plus 8 for the second half.
  const Z lane = _mm512_setr_epi32(0, 0, 0, 0, 0x00010001, 0x00010001, 0x00010001, 0x00010001, 0x00020002,
                                   0x00020002, 0x00020002, 0x00020002, 0x00030003, 0x00030003, 0x00030003, 0x00030003);
  for (int b = 0; b < nb; ++b) {
    const uint8_t* blk = row + size_t(b) * 210u;
    ask_ahead<210>(blk);
    const Z sc16 = _mm512_zextsi256_si512(_mm256_cvtepi8_epi16(load128(blk + 192)));
    Z isum[NT];
    PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) {  // - 32 sum_g sc_g sum_g(x)
      const I m = _mm256_madd_epi16(load(x.s[t] + 16 * b), _mm512_castsi512_si256(sc16));
      isum[t] = _mm512_zextsi256_si512(_mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(m, 5)));
    }
    PTLLM_GGML_UNROLL for (int h = 0; h < 2; ++h) {
      const Z L = _mm512_loadu_si512(blk + 64 * h);
      const Z QH = _mm512_broadcast_i64x4(load(blk + 128 + 32 * h));
      const Z ca = _mm512_or_si512(_mm512_and_si512(L, lo4), _mm512_and_si512(_mm512_sllv_epi16(QH, shl), hi2));
      const Z cb = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(L, 4), lo4),
                                   _mm512_and_si512(_mm512_srlv_epi16(QH, shr), hi2));
      const Z sa = _mm512_permutexvar_epi16(_mm512_add_epi16(lane, _mm512_set1_epi16(int16_t(8 * h))), sc16);
      const Z sb = _mm512_permutexvar_epi16(_mm512_add_epi16(lane, _mm512_set1_epi16(int16_t(8 * h + 4))), sc16);
      PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) {
        const int8_t* q = x.q[t] + 256 * b + 128 * h;
        isum[t] = zmadd_acc(isum[t], _mm512_maddubs_epi16(ca, _mm512_loadu_si512(q)), sa);
        isum[t] = zmadd_acc(isum[t], _mm512_maddubs_epi16(cb, _mm512_loadu_si512(q + 64)), sb);
      }
    }
    const float d = f16_at(blk + 208);
    PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t)
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_set1_ps(d * x.d[t][b]), acc[t]);
  }
  PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) out[t] = _mm512_reduce_add_ps(acc[t]);
}

#endif  // PTLLM_GGML_ZMM

// The packed layouts' sizes and offsets (kernels/ggml_pack_layout.h).
using namespace ggml_layout;
constexpr int kQ4KPacked = k_block_bytes(GgmlType::Q4_K), kQ5KPacked = k_block_bytes(GgmlType::Q5_K),
              kQ6KPacked = k_block_bytes(GgmlType::Q6_K);

#if PTLLM_GGML_ZMM
#include "kernels/x86/ggml_tiled_impl.h"  // Q4_0 / Q8_0 against many rows of x
#else
#include "kernels/x86/ggml_tiled_avx2_impl.h"  // Q4_0 against many rows of x; the packed products
#endif

// ---- the 32-value types, Q4_K, Q5_K and Q6_K packed (ggml.h, kGgmlPackRows) -----------------------------

// The first pass over a group (the only one in decode) asks for its stream ask_ahead's 4 KiB ahead,
// a block's bytes spread over its steps: with the hardware prefetchers alone a thread streamed Q4_K
// at about 2/3 of Q4_0's bytes a second (Llama-3.2-1B Q4_K_M, 2 threads: 1.2x decode with it). Each
// block also touches the page past those (kernels/stream.h): 1.02-1.15x decode again.

#if PTLLM_GGML_ZMM && PTLLM_GGML_VNNI
// 4 bytes of x in every lane, broadcast from memory: a load, where a value taken through a general
// register costs a vector shuffle beside the vpdpbusd it feeds.
PTLLM_GGML_TARGET inline Z bcast4(const int8_t* p) { return _mm512_broadcastd_epi32(_mm_loadu_si32(p)); }

// One 16-row group against NT rows of x: out[t] holds the group's 16 products in its lanes. Per
// sub-block j, each row's 32 codes meet x in integers (vpdpbusd: unsigned codes x signed x, four a
// lane), two chains (low and high nibbles) that the sub-block's scales then multiply (vpmulld);
// mins against x's sums of 32 by vpdpwssd; one float FMA per block for each. Q5_K: each line's
// fifth bits (the 64 bytes before the sub-block's lines) ORed in at bit 4.
template <bool kFive, int NT>
PTLLM_GGML_TARGET void k45_packed_group(const uint8_t* grp, int nb, const GgmlActs& a, int t0, FZ* out) {
  constexpr int kBytes = kFive ? kQ5KPacked : kQ4KPacked;
  const Rows<NT> x(a, t0);
  FZ acc[NT];
  PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  const Z lo4 = _mm512_set1_epi8(0x0f), b4 = _mm512_set1_epi8(0x10);
  for (int b = 0; b < nb; ++b) {
    const uint8_t* blk = grp + size_t(b) * size_t(kBytes);
    if (t0 == 0) touch_ahead(blk + kAheadBytes);
    const FZ dv = _mm512_cvtph_ps(load(blk)), dmv = _mm512_cvtph_ps(load(blk + 32));
    Z mp[4];
    PTLLM_GGML_UNROLL for (int p = 0; p < 4; ++p) mp[p] = _mm512_cvtepu8_epi16(load(blk + 192 + 32 * p));
    PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) {  // - dmin d8 sum_j m_j sum_j(x)
      const I s32 = _mm256_madd_epi16(load(x.s[t] + 16 * b), _mm256_set1_epi16(1));
      const Z s16 = _mm512_zextsi128_si512(_mm256_cvtepi32_epi16(s32));  // sums of 32, as int16 pairs
      Z m = _mm512_setzero_si512();
      PTLLM_GGML_UNROLL for (int p = 0; p < 4; ++p)
        m = _mm512_dpwssd_epi32(m, mp[p], _mm512_permutexvar_epi32(_mm512_set1_epi32(p), s16));
      const FZ d8 = _mm512_set1_ps(x.d[t][b]);
      acc[t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(m), _mm512_mul_ps(dmv, d8), acc[t]);
    }
    Z isum[NT];
    PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) isum[t] = _mm512_setzero_si512();
    PTLLM_GGML_UNROLL for (int j = 0; j < 8; ++j) {
      if (t0 == 0) ask_ahead<kBytes / 8>(blk + kBytes / 8 * j);
      const uint8_t* lines = blk + k45_lines(kFive, j);
      Z lo[NT], hi[NT];
      PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) lo[t] = hi[t] = _mm512_setzero_si512();
      PTLLM_GGML_UNROLL for (int c = 0; c < 4; ++c) {
        const Z w = _mm512_loadu_si512(lines + 64 * c);
        Z c0 = _mm512_and_si512(w, lo4), c1 = _mm512_and_si512(_mm512_srli_epi16(w, 4), lo4);
        if constexpr (kFive) {
          const Z f = _mm512_loadu_si512(lines - 64);
          c0 = _mm512_or_si512(c0, _mm512_and_si512(_mm512_slli_epi16(f, 4 - c), b4));
          c1 = _mm512_or_si512(c1, _mm512_and_si512(_mm512_srli_epi16(f, c), b4));
        }
        PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) {
          const int8_t* q = x.q[t] + 256 * b + 32 * j + 8 * c;
          int32_t q0, q1;
          std::memcpy(&q0, q, 4);
          std::memcpy(&q1, q + 4, 4);
          lo[t] = _mm512_dpbusd_epi32(lo[t], c0, _mm512_set1_epi32(q0));
          hi[t] = _mm512_dpbusd_epi32(hi[t], c1, _mm512_set1_epi32(q1));
        }
      }
      const Z sc = _mm512_cvtepu8_epi32(load128(blk + 64 + 16 * j));
      PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t)
        isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(_mm512_add_epi32(lo[t], hi[t]), sc));
    }
    PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t)
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_mul_ps(dv, _mm512_set1_ps(x.d[t][b])), acc[t]);
  }
  PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) out[t] = acc[t];
}

// Q6_K's twin: per 16-value group g, the four 4-value chunks' codes (low nibbles, top two bits from
// the third 64-byte line) against x, minus 32 sum_g(x), times scale g (signed).
template <int NT>
PTLLM_GGML_TARGET void q6k_packed_group(const uint8_t* grp, int nb, const GgmlActs& a, int t0, FZ* out) {
  const Rows<NT> x(a, t0);
  FZ acc[NT];
  PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  const Z lo4 = _mm512_set1_epi8(0x0f), hi2 = _mm512_set1_epi8(0x30);
  for (int b = 0; b < nb; ++b) {
    const uint8_t* blk = grp + size_t(b) * size_t(kQ6KPacked);
    if (t0 == 0) touch_ahead(blk + kAheadBytes);
    Z off[NT], isum[NT];  // 32 x x's sums of 16, one a lane
    PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) {
      off[t] = _mm512_slli_epi32(_mm512_cvtepi16_epi32(load(x.s[t] + 16 * b)), 5);
      isum[t] = _mm512_setzero_si512();
    }
    PTLLM_GGML_UNROLL for (int g = 0; g < 16; ++g) {
      if (t0 == 0) ask_ahead<kQ6KPacked / 16>(blk + kQ6KPacked / 16 * g);
      const uint8_t* c = blk + 288 + 192 * g;
      const Z A = _mm512_loadu_si512(c), B = _mm512_loadu_si512(c + 64), H = _mm512_loadu_si512(c + 128);
      const Z w[4] = {
          _mm512_or_si512(_mm512_and_si512(A, lo4), _mm512_and_si512(_mm512_slli_epi16(H, 4), hi2)),
          _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(A, 4), lo4), _mm512_and_si512(_mm512_slli_epi16(H, 2), hi2)),
          _mm512_or_si512(_mm512_and_si512(B, lo4), _mm512_and_si512(H, hi2)),
          _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(B, 4), lo4), _mm512_and_si512(_mm512_srli_epi16(H, 2), hi2)),
      };
      const Z sc = _mm512_cvtepi8_epi32(load128(blk + 32 + 16 * g));
      PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) {
        const int8_t* q = x.q[t] + 256 * b + 16 * g;
        Z p0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], bcast4(q));
        Z p1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[1], bcast4(q + 4));
        p0 = _mm512_dpbusd_epi32(p0, w[2], bcast4(q + 8));
        p1 = _mm512_dpbusd_epi32(p1, w[3], bcast4(q + 12));
        const Z o = _mm512_permutexvar_epi32(_mm512_set1_epi32(g), off[t]);
        isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(_mm512_sub_epi32(_mm512_add_epi32(p0, p1), o), sc));
      }
    }
    const FZ dv = _mm512_cvtph_ps(load(blk));
    PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t)
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_mul_ps(dv, _mm512_set1_ps(x.d[t][b])), acc[t]);
  }
  PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) out[t] = acc[t];
}

// The 32-value types packed: NP consecutive groups (gb bytes apart) against NT rows of x, the
// unpacked panels' operations in their order (panel_tile: -o sum x, then the 8 four-value products
// of each block into int32 lanes, one FMA a block), so a row's result is the same bits as from the
// panels. The codes come straight from the unit (Q4_0: from its nibbles in registers; Q5_0: those
// and the bit of each (ggml.h) at bit 4; Q8_0: stored + 128): no panel to build. With few rows of x
// (decode) each lane's sum is split between two chains of integer adds instead of one (exact, so the
// same sums).
template <GgmlType Ty, int NP, int NT>
PTLLM_GGML_TARGET void packed32_tile(const uint8_t* grp, size_t gb, int nb, const GgmlActs& a, const BlockTerms& bt,
                                     int t0, const float* bias, float* y, int ldy, int r, const __mmask16* keep) {
  constexpr bool kSplit = NP * NT <= 2, kQ8 = Ty == GgmlType::Q8_0, kQ5 = with_fifth(Ty), kMin = with_min(Ty);
  constexpr size_t kUnit = unit32_bytes(Ty), kBlockBytes = block32_bytes(Ty);
  const int8_t* xq[NT];
  FZ acc[NP][NT];
  PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) {
    xq[t] = a.q + size_t(t0 + t) * size_t(a.K);
    PTLLM_GGML_UNROLL for (int p = 0; p < NP; ++p) acc[p][t] = _mm512_setzero_ps();
  }
  const Z lo4 = _mm512_set1_epi8(0x0f), b4 = _mm512_set1_epi8(0x10);
  const size_t T = size_t(a.T);
  // One group at a time (decode): one stream a thread, each line asked for ahead (see kAheadBytes)
  // and the page past those touched (kernels/stream.h), as the packed K-quants'.
  constexpr int kTouch = touch_every(kUnit / 2);
  for (int b = 0; b < nb; ++b) {
    const uint8_t* unit = grp + size_t(b / 2) * kUnit;
    const uint8_t* fifth = unit + head32_bytes(Ty) + kBlockBytes * size_t(b % 2);  // Q5's fifth bits
    const uint8_t* codes = kQ5 ? fifth + 64 : fifth;
    if (NP == 1) {
      ask_ahead<kUnit / 2>(unit + kUnit / 2 * size_t(b % 2));
      if (b % kTouch == 0) touch_ahead(unit + kAheadBytes);
    }
    const int32_t* cb = bt.corr + size_t(b) * T + size_t(t0);
    const float* db = bt.xs + size_t(b) * T + size_t(t0);
    const float* mb = bt.xm + size_t(b) * T + size_t(t0);
    Z is[NP][NT], hs[NP][NT];
    PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) {
      const Z c = _mm512_set1_epi32(cb[t]);
      PTLLM_GGML_UNROLL for (int p = 0; p < NP; ++p) is[p][t] = c, hs[p][t] = _mm512_setzero_si512();
    }
    // Line k of 8 (Q8_0) or half h of line c (Q4_0, Q5_0): values 4k .. 4k + 3 or 16h + 4c .., two chains.
    PTLLM_GGML_UNROLL for (int k = 0; k < 8; ++k) {
      const int c = kQ8 ? k : k / 2, h = k % 2, xo = kQ8 ? 4 * k : 16 * h + 4 * c;
      Z wk[NP];
      PTLLM_GGML_UNROLL for (int p = 0; p < NP; ++p) {
        const Z v = _mm512_loadu_si512(codes + size_t(p) * gb + 64 * c);
        wk[p] = kQ8 ? v : _mm512_and_si512(h ? _mm512_srli_epi16(v, 4) : v, lo4);
        if constexpr (kQ5) {
          const Z f = _mm512_loadu_si512(fifth + size_t(p) * gb);
          wk[p] = _mm512_or_si512(wk[p], _mm512_and_si512(h ? _mm512_srli_epi16(f, c) : _mm512_slli_epi16(f, 4 - c), b4));
        }
      }
      PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) {
        int32_t x4;
        std::memcpy(&x4, xq[t] + 32 * b + xo, 4);
        const Z xb = _mm512_set1_epi32(x4);
        PTLLM_GGML_UNROLL for (int p = 0; p < NP; ++p) {
          if (kSplit && h)
            hs[p][t] = _mm512_dpbusd_epi32(hs[p][t], wk[p], xb);
          else
            is[p][t] = _mm512_dpbusd_epi32(is[p][t], wk[p], xb);
        }
      }
    }
    PTLLM_GGML_UNROLL for (int p = 0; p < NP; ++p) {
      const FZ s = _mm512_cvtph_ps(load(unit + size_t(p) * gb + 32 * (b % 2)));
      PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) {
        const Z sum = kSplit ? _mm512_add_epi32(is[p][t], hs[p][t]) : is[p][t];
        acc[p][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(s, _mm512_set1_ps(db[t])), acc[p][t]);
      }
      if constexpr (kMin) {
        const FZ m = _mm512_cvtph_ps(load(unit + size_t(p) * gb + 64 + 32 * (b % 2)));
        PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t) acc[p][t] = _mm512_fmadd_ps(m, _mm512_set1_ps(mb[t]), acc[p][t]);
      }
    }
  }
  PTLLM_GGML_UNROLL for (int p = 0; p < NP; ++p) {
    const int rp = r + kGgmlPackRows * p;
    const FZ bv = bias ? _mm512_maskz_loadu_ps(keep[p], bias + rp) : _mm512_setzero_ps();
    PTLLM_GGML_UNROLL for (int t = 0; t < NT; ++t)
      _mm512_mask_storeu_ps(y + size_t(t0 + t) * size_t(ldy) + size_t(rp), keep[p], _mm512_add_ps(acc[p][t], bv));
  }
}

// The last n < N rows of x from t0 on (n >= 1).
template <GgmlType Ty, int NP, int N>
PTLLM_GGML_TARGET void packed32_tail(int n, const uint8_t* grp, size_t gb, int nb, const GgmlActs& a,
                                     const BlockTerms& bt, int t0, const float* bias, float* y, int ldy, int r,
                                     const __mmask16* keep) {
  if constexpr (N > 1) {
    if (n == N - 1) return packed32_tile<Ty, NP, N - 1>(grp, gb, nb, a, bt, t0, bias, y, ldy, r, keep);
    return packed32_tail<Ty, NP, N - 1>(n, grp, gb, nb, a, bt, t0, bias, y, ldy, r, keep);
  }
}

// Rows [r0, r1) of a packed matrix of a 32-value type: groups two at a time against tiles of x's rows (as
// tiled_rows_t's panels), a group's bytes read once from memory and reused from L1/L2 by the tiles.
// Up to kPacked32OneGroupMaxT rows of x (decode) a group at a time: one sequential stream a thread,
// which the hardware prefetchers follow better than two 18-73 KiB apart (Llama-3.2-1B shapes, Q4_0,
// 2 threads: 1.2-1.6x the bytes a second at 1 to 4 rows of x, less from 6 rows on).
constexpr int kPacked32OneGroupMaxT = 4;
template <GgmlType Ty>
PTLLM_GGML_TARGET void packed32_rows(const WeightMatrix& w, const GgmlActs& a, const float* bias, float* y, int r0,
                                     int r1) {
  const int nb = w.cols / 32;
  const size_t gb = size_t(nb / 2) * unit32_bytes(Ty);
  const BlockTerms bt = block_terms(a, nb, code_offset(Ty), with_min(Ty));
  const int g1 = (r1 + kGgmlPackRows - 1) / kGgmlPackRows;
  for (int g = r0 / kGgmlPackRows, np = 1; g < g1; g += np) {
    np = g + 1 < g1 && a.T > kPacked32OneGroupMaxT ? 2 : 1;
    __mmask16 keep[2];
    for (int q = 0; q < np; ++q) {
      const int base = (g + q) * kGgmlPackRows;
      const int lo = std::max(r0, base) - base, hi = std::min(r1, base + kGgmlPackRows) - base;
      keep[q] = __mmask16(((1u << hi) - 1) & ~((1u << lo) - 1));
    }
    const uint8_t* grp = static_cast<const uint8_t*>(w.data) + size_t(g) * gb;
    const int r = g * kGgmlPackRows;
    auto run = [&](auto np_tag) {
      constexpr int NP = decltype(np_tag)::value, NT = kTileX[NP - 1];
      int t0 = 0;
      for (; t0 + NT <= a.T; t0 += NT)
        packed32_tile<Ty, NP, NT>(grp, gb, nb, a, bt, t0, bias, y, w.rows, r, keep);
      if (t0 < a.T)
        packed32_tail<Ty, NP, NT>(a.T - t0, grp, gb, nb, a, bt, t0, bias, y, w.rows, r, keep);
    };
    if (np == 2)
      run(std::integral_constant<int, 2>{});
    else
      run(std::integral_constant<int, 1>{});
  }
}

template <int NT>
PTLLM_GGML_TARGET void packed_group(GgmlType type, const uint8_t* grp, int nb, const GgmlActs& a, int t0, FZ* out) {
  if (type == GgmlType::Q6_K) return q6k_packed_group<NT>(grp, nb, a, t0, out);
  if (type == GgmlType::Q5_K) return k45_packed_group<true, NT>(grp, nb, a, t0, out);
  return k45_packed_group<false, NT>(grp, nb, a, t0, out);
}

// Rows [r0, r1) of a packed matrix: whole groups, each against every row of x four at a time (a
// group's blocks, 16 x 148 bytes a block, stay in L2 while x passes).
PTLLM_GGML_TARGET void packed_rows(const WeightMatrix& w, const GgmlActs& a, const float* bias, float* y, int r0,
                                   int r1) {
  if (w.ggml == GgmlType::Q4_0) return packed32_rows<GgmlType::Q4_0>(w, a, bias, y, r0, r1);
  if (w.ggml == GgmlType::Q5_0) return packed32_rows<GgmlType::Q5_0>(w, a, bias, y, r0, r1);
  if (w.ggml == GgmlType::Q8_0) return packed32_rows<GgmlType::Q8_0>(w, a, bias, y, r0, r1);
  if (w.ggml == GgmlType::Q4_1) return packed32_rows<GgmlType::Q4_1>(w, a, bias, y, r0, r1);
  if (w.ggml == GgmlType::Q5_1) return packed32_rows<GgmlType::Q5_1>(w, a, bias, y, r0, r1);
  const int nb = w.cols / 256;
  const size_t gb = size_t(nb) * size_t(k_block_bytes(w.ggml));
  FZ out[4];
  for (int g = r0 / kGgmlPackRows; g * kGgmlPackRows < r1; ++g) {
    const int base = g * kGgmlPackRows;
    const int lo = std::max(r0, base) - base, hi = std::min(r1, base + kGgmlPackRows) - base;
    const __mmask16 m = __mmask16(((1u << hi) - 1) & ~((1u << lo) - 1));
    const FZ bv = bias ? _mm512_maskz_loadu_ps(m, bias + base) : _mm512_setzero_ps();
    const uint8_t* grp = static_cast<const uint8_t*>(w.data) + size_t(g) * gb;
    for (int t0 = 0; t0 < a.T; t0 += 4) {
      const int nt = std::min(4, a.T - t0);
      switch (nt) {
        case 4: packed_group<4>(w.ggml, grp, nb, a, t0, out); break;
        case 3: packed_group<3>(w.ggml, grp, nb, a, t0, out); break;
        case 2: packed_group<2>(w.ggml, grp, nb, a, t0, out); break;
        default: packed_group<1>(w.ggml, grp, nb, a, t0, out); break;
      }
      for (int t = 0; t < nt; ++t)
        _mm512_mask_storeu_ps(y + size_t(t0 + t) * size_t(w.rows) + size_t(base), m, _mm512_add_ps(out[t], bv));
    }
  }
}
#else
template <int NT>
PTLLM_GGML_TARGET void dot_rows(GgmlType type, const uint8_t* row, int nb, const GgmlActs& a, int t0, float* out);
#include "kernels/ggml_packed_fallback_impl.h"
#endif

// ---- rows ---------------------------------------------------------------------------------------

template <int NT>
PTLLM_GGML_TARGET void dot_rows(GgmlType type, const uint8_t* row, int nb, const GgmlActs& a, int t0, float* out) {
  switch (type) {
    case GgmlType::Q4_K: return dot_k45<false, NT>(row, nb, a, t0, out);
    case GgmlType::Q5_K: return dot_k45<true, NT>(row, nb, a, t0, out);
#if PTLLM_GGML_ZMM
    case GgmlType::Q6_K: return dot_q6k_zmm<NT>(row, nb, a, t0, out);
#else
    case GgmlType::Q6_K: return dot_q6k<NT>(row, nb, a, t0, out);
#endif
    case GgmlType::Q8_0: return dot_32<GgmlType::Q8_0, NT>(row, nb, a, t0, out);
    case GgmlType::Q4_0: return dot_32<GgmlType::Q4_0, NT>(row, nb, a, t0, out);
    case GgmlType::Q4_1: return dot_32<GgmlType::Q4_1, NT>(row, nb, a, t0, out);
    case GgmlType::Q5_0: return dot_32<GgmlType::Q5_0, NT>(row, nb, a, t0, out);
    default: return dot_32<GgmlType::Q5_1, NT>(row, nb, a, t0, out);
  }
}

// Rows [r0, r1) in tiles of kRowTile: a tile's blocks (16 rows of 5632 Q4_K values: 50 KB) stay in
// L2 while every group of four rows of x passes over them, so a prefill reads the weights from
// memory once.
constexpr int kRowTile = 16;

// y[t0 + t][r + i] = out[t * nr + i] + bias[r + i], for t < nt, i < nr.
PTLLM_GGML_TARGET inline void store_rows(float* y, int ldy, const float* bias, int t0, int nt, int r, int nr,
                                         const float* out) {
  for (int t = 0; t < nt; ++t)
    for (int i = 0; i < nr; ++i)
      y[size_t(t0 + t) * size_t(ldy) + size_t(r + i)] = out[t * nr + i] + (bias ? bias[r + i] : 0.f);
}

PTLLM_GGML_TARGET void ggml_rows(const WeightMatrix& w, const GgmlActs& a, const float* bias, float* y, int r0,
                                 int r1) {
#if !PTLLM_GGML_ZMM
  if (w.ggml_pack && w.ggml == GgmlType::Q4_0) return packed_nibble_rows<GgmlType::Q4_0>(w, a, bias, y, r0, r1);
  if (w.ggml_pack && w.ggml == GgmlType::Q5_0) return packed_nibble_rows<GgmlType::Q5_0>(w, a, bias, y, r0, r1);
  if (w.ggml_pack && w.ggml == GgmlType::Q4_1) return packed_nibble_rows<GgmlType::Q4_1>(w, a, bias, y, r0, r1);
  if (w.ggml_pack && w.ggml == GgmlType::Q5_1) return packed_nibble_rows<GgmlType::Q5_1>(w, a, bias, y, r0, r1);
  if (w.ggml_pack && w.ggml == GgmlType::Q8_0) return packed_q8_0_rows(w, a, bias, y, r0, r1);
  if (w.ggml_pack && w.ggml == GgmlType::Q4_K) return packed_k_rows<GgmlType::Q4_K>(w, a, bias, y, r0, r1);
  if (w.ggml_pack && w.ggml == GgmlType::Q5_K) return packed_k_rows<GgmlType::Q5_K>(w, a, bias, y, r0, r1);
  if (w.ggml_pack && w.ggml == GgmlType::Q6_K) return packed_k_rows<GgmlType::Q6_K>(w, a, bias, y, r0, r1);
#endif
  if (w.ggml_pack) return packed_rows(w, a, bias, y, r0, r1);
  if (tiled_takes(w.ggml, a.T)) return tiled_rows(w, a, bias, y, r0, r1);
  const int nb = w.cols / ggml_type_info(w.ggml).block_elems;
  const size_t rb = w.row_bytes();
  const auto* data = static_cast<const uint8_t*>(w.data);
  float out[8];
  for (int rt = r0; rt < r1; rt += kRowTile) {
    const int re = std::min(r1, rt + kRowTile);
    int rg = rt;  // the tile's rows from rg on take the one-row kernels
#if PTLLM_GGML_ZMM
    if (w.ggml == GgmlType::Q4_K) {  // four rows at a time against two rows of x at a time
      rg = rt + (re - rt) / 4 * 4;
      for (int t0 = 0; t0 < a.T; t0 += 2) {
        const int nt = std::min(2, a.T - t0);
        for (int r = rt; r < rg; r += 4) {
          if (nt == 2)
            dot_q4k_x4<2>(data + size_t(r) * rb, rb, nb, a, t0, out);
          else
            dot_q4k_x4<1>(data + size_t(r) * rb, rb, nb, a, t0, out);
          store_rows(y, w.rows, bias, t0, nt, r, 4, out);
        }
      }
    }
#endif
    for (int t0 = 0; t0 < a.T; t0 += 4) {
      const int nt = std::min(4, a.T - t0);
      for (int r = rg; r < re; ++r) {
        const uint8_t* row = data + size_t(r) * rb;
        switch (nt) {
          case 4: dot_rows<4>(w.ggml, row, nb, a, t0, out); break;
          case 3: dot_rows<3>(w.ggml, row, nb, a, t0, out); break;
          case 2: dot_rows<2>(w.ggml, row, nb, a, t0, out); break;
          default: dot_rows<1>(w.ggml, row, nb, a, t0, out); break;
        }
        store_rows(y, w.rows, bias, t0, nt, r, 1, out);
      }
    }
  }
}

// ggml_quantize_acts, bit for bit: the same max, the same products x * (127 / max), rounded to
// nearest even by vcvtps2dq as lrint does (|x * id| <= 127 after rounding, so no clamp is needed).
PTLLM_GGML_TARGET inline int hsum_i32(I v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}
PTLLM_GGML_TARGET void quantize_acts(const float* x, int K, int block, int t0, int t1, int8_t* q, float* d,
                                     int16_t* sums) {
  const int nd = K / block;
  const F abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const I order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // undoes the packs' lane interleave
  for (int t = t0; t < t1; ++t) {
    const float* xt = x + size_t(t) * size_t(K);
    int8_t* qt = q + size_t(t) * size_t(K);
    int16_t* st = sums + size_t(t) * size_t(K / 16);
    for (int b = 0; b < nd; ++b) {
      const float* xb = xt + size_t(b) * size_t(block);
      F m = _mm256_setzero_ps();
      for (int i = 0; i < block; i += 8) m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(xb + i), abs_mask));
      __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
      h = _mm_max_ps(h, _mm_movehl_ps(h, h));
      h = _mm_max_ss(h, _mm_movehdup_ps(h));
      const float amax = _mm_cvtss_f32(h);
      d[size_t(t) * size_t(nd) + size_t(b)] = amax / 127.f;
      const F id = _mm256_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
      for (int i = 0; i < block; i += 32) {
        const I v0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + i), id));
        const I v1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + i + 8), id));
        const I v2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + i + 16), id));
        const I v3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + i + 24), id));
        const int g = (b * block + i) / 16;
        st[g] = int16_t(hsum_i32(_mm256_add_epi32(v0, v1)));
        st[g + 1] = int16_t(hsum_i32(_mm256_add_epi32(v2, v3)));
        const I packed = _mm256_packs_epi16(_mm256_packs_epi32(v0, v1), _mm256_packs_epi32(v2, v3));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(qt + b * block + i), _mm256_permutevar8x32_epi32(packed, order));
      }
    }
  }
}

constexpr GgmlKernel kKernel{PTLLM_GGML_NAME, ggml_rows, quantize_acts};

}  // namespace
}  // namespace ptllm
