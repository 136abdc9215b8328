// The kernels for AVX-512 (F, BW, VL, DQ: Skylake-X, Ice Lake, Zen 4 and later), 16 floats a register.
#include "kernels/simd.h"
#include "kernels/cpu/features.h"
#include "kernels/x86/transpose_avx512.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstring>
#include <limits>

// GCC 12 reports the _mm512_undefined_* placeholders inside its own intrinsics as uninitialized
// (GCC PR 105593), once per use.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#define PTLLM_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define PTLLM_WHOLE_LINES __attribute__((no_sanitize_address))

namespace ptllm {
namespace {

struct Avx512 {
  using F = __m512;
  static constexpr int N = 16;
  static constexpr int MR = 12, NRV = 2;  // 24 accumulators of the 32 registers
  static constexpr int GT = 4;

  PTLLM_TARGET static __mmask16 mask(int n) { return __mmask16((1u << n) - 1u); }
  PTLLM_TARGET static F zero() { return _mm512_setzero_ps(); }
  PTLLM_TARGET static F set1(float v) { return _mm512_set1_ps(v); }
  PTLLM_TARGET static F load(const float* p) { return _mm512_loadu_ps(p); }
  PTLLM_TARGET static F load_n(const float* p, int n) { return _mm512_maskz_loadu_ps(mask(n), p); }
  PTLLM_TARGET static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  PTLLM_TARGET static void store_n(float* p, F v, int n) { _mm512_mask_storeu_ps(p, mask(n), v); }

  PTLLM_TARGET static F add(F a, F b) { return _mm512_add_ps(a, b); }
  PTLLM_TARGET static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  PTLLM_TARGET static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  PTLLM_TARGET static F div(F a, F b) { return _mm512_div_ps(a, b); }
  PTLLM_TARGET static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  PTLLM_TARGET static F fnma(F a, F b, F c) { return _mm512_fnmadd_ps(a, b, c); }
  PTLLM_TARGET static F min(F a, F b) { return _mm512_min_ps(a, b); }
  PTLLM_TARGET static F max(F a, F b) { return _mm512_max_ps(a, b); }
  PTLLM_TARGET static float reduce_add(F v) {
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  PTLLM_TARGET static float reduce_max(F v) { return _mm512_reduce_max_ps(v); }
  // The sums of a, b, c and d at once: interleaved pairwise sums within 128-bit lanes leave each
  // lane holding (a, b, c, d) partial sums, then the four lanes are folded.
  PTLLM_TARGET static void reduce_add4(F a, F b, F c, F d, float* out) {
    const __m512d ab = _mm512_castps_pd(_mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b)));
    const __m512d cd = _mm512_castps_pd(_mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d)));
    const F s = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(ab, cd)), _mm512_castpd_ps(_mm512_unpackhi_pd(ab, cd)));
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(s), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1)));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
  }

  // bf16 -> f32 is a 16-bit shift; f32 -> bf16 rounds to nearest even with quiet NaNs, as torch.
  PTLLM_TARGET static F from_bf16(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  PTLLM_TARGET static __m256i to_bf16(F v) {
    const __m512i b = _mm512_castps_si512(v);
    const __m512i hi = _mm512_srli_epi32(b, 16);
    const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(b, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
    r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
    return _mm512_cvtepi32_epi16(r);
  }
  PTLLM_TARGET static F load_bf16(const void* p) { return from_bf16(_mm256_loadu_si256(static_cast<const __m256i*>(p))); }
  PTLLM_TARGET static F load_bf16_n(const void* p, int n) { return from_bf16(_mm256_maskz_loadu_epi16(mask(n), p)); }
  PTLLM_TARGET static F load_f16(const void* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(static_cast<const __m256i*>(p))); }
  PTLLM_TARGET static F load_f16_n(const void* p, int n) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask(n), p)); }
  PTLLM_TARGET static void store_bf16(void* p, F v) { _mm256_storeu_si256(static_cast<__m256i*>(p), to_bf16(v)); }
  PTLLM_TARGET static void store_bf16_n(void* p, F v, int n) { _mm256_mask_storeu_epi16(p, mask(n), to_bf16(v)); }
  PTLLM_TARGET static __m256i to_f16(F v) { return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  PTLLM_TARGET static void store_f16(void* p, F v) { _mm256_storeu_si256(static_cast<__m256i*>(p), to_f16(v)); }
  PTLLM_TARGET static void store_f16_n(void* p, F v, int n) { _mm256_mask_storeu_epi16(p, mask(n), to_f16(v)); }

  // 16 codes: int8 from 16 bytes, int4 from 8 (low nibble first), int2 from 4 (low bits first).
  PTLLM_TARGET static F load_u8(const uint8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  PTLLM_TARGET static F load_u4(const uint8_t* p) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    const __m128i m = _mm_set1_epi8(0x0f);
    const __m128i c = _mm_unpacklo_epi8(_mm_and_si128(b, m), _mm_and_si128(_mm_srli_epi16(b, 4), m));
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(c));
  }
  PTLLM_TARGET static F load_u2(const uint8_t* p) {
    uint32_t u;
    std::memcpy(&u, p, 4);
    const __m512i shifts = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i c = _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32(int(u)), shifts), _mm512_set1_epi32(3));
    return _mm512_cvtepi32_ps(c);
  }

  // 16 bytes of codes split by position in the byte (kernels_impl.h, "KIVI blocks"): int4 gives
  // the low nibbles (even channels) and the high ones (odd channels); int2 r[s] = bits 2s, 2s + 1.
  PTLLM_TARGET static __m512i bytes_u32(const uint8_t* p) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  PTLLM_TARGET static void load_u4_split(const uint8_t* p, F& even, F& odd) {
    const __m512i x = bytes_u32(p);
    even = _mm512_cvtepi32_ps(_mm512_and_si512(x, _mm512_set1_epi32(0xf)));
    odd = _mm512_cvtepi32_ps(_mm512_srli_epi32(x, 4));
  }
  PTLLM_TARGET static void load_u2_split(const uint8_t* p, F* r) {
    const __m512i x = bytes_u32(p), m = _mm512_set1_epi32(3);
    r[0] = _mm512_cvtepi32_ps(_mm512_and_si512(x, m));
    r[1] = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(x, 2), m));
    r[2] = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(x, 4), m));
    r[3] = _mm512_cvtepi32_ps(_mm512_srli_epi32(x, 6));
  }
  // (a, b) as 32 lanes -> its even lanes and its odd lanes; interleave is the inverse.
  PTLLM_TARGET static void deinterleave(F a, F b, F& even, F& odd) {
    even = _mm512_permutex2var_ps(a, _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30), b);
    odd = _mm512_permutex2var_ps(a, _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31), b);
  }
  PTLLM_TARGET static void interleave(F even, F odd, F& a, F& b) {
    a = _mm512_permutex2var_ps(even, _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23), odd);
    b = _mm512_permutex2var_ps(even, _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31), odd);
  }

  // Consecutive chunks of 32 bf16 of a row, as (even elements, odd elements) in float32. Reads
  // whole aligned cache lines and shifts them into place (vpermt2w), so no load straddles two
  // lines. Only lines holding chunk elements are read, so never a page that holds none; the
  // sanitizer is told, as the bytes of such a line outside the row may be outside its allocation.
  struct Bf16Rows {
    const __m512i* line;
    __m512i cur, idx;
    int mode;  // 0: aligned, 1: shifted by an even byte count, 2: odd address (unaligned loads)
    PTLLM_TARGET PTLLM_WHOLE_LINES explicit Bf16Rows(const char* row) {
      const uintptr_t a = reinterpret_cast<uintptr_t>(row);
      const unsigned s = unsigned(a % 64);
      mode = s == 0 ? 0 : s % 2 == 0 ? 1 : 2;
      line = reinterpret_cast<const __m512i*>(mode == 2 ? a : a - s);
      idx = _mm512_add_epi16(_mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14,
                                              13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                             _mm512_set1_epi16(short(s / 2)));
      cur = mode == 1 ? _mm512_load_si512(line) : _mm512_setzero_si512();
    }
    PTLLM_TARGET PTLLM_WHOLE_LINES void next(F& even, F& odd) {
      __m512i v;
      if (mode == 0) {
        v = _mm512_load_si512(line);
      } else if (mode == 1) {
        const __m512i nx = _mm512_load_si512(line + 1);
        v = _mm512_permutex2var_epi16(cur, idx, nx);
        cur = nx;
      } else {
        v = _mm512_loadu_si512(line);
      }
      ++line;
      even = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
      odd = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(int(0xffff0000u))));
    }
  };

  // 32 bf16 from any address as (even elements, odd elements) in float32.
  PTLLM_TARGET static void bf16_pairs(const char* p, F& even, F& odd) {
    const __m512i v = _mm512_loadu_si512(p);
    even = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    odd = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(int(0xffff0000u))));
  }

  PTLLM_TARGET static F round(F x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  // One vscalefps (y 2^n, rounded once as y times the power would be), zeroing where x < lo.
  PTLLM_TARGET static F ldexp_ge(F y, F n, F x, F lo) {
    return _mm512_maskz_scalef_ps(_mm512_cmp_ps_mask(x, lo, _CMP_NLT_UQ), y, n);
  }

  // 16 x 16 transpose: r[i][j] -> r[j][i] (transpose_avx512.h).
  PTLLM_TARGET static void transpose(F* r) { transpose16_ps(r); }
};

}  // namespace
}  // namespace ptllm

#include "kernels/cpu/kernels_impl.h"

// kivi_k_block with AVX-512 VNNI (Ice Lake, Zen 4 and later; picked at run time): the int8 query
// (quant.h) times the u8 codes, 4 products a 32-bit lane (vpdpbusd). 16 keys at a time, one key
// a lane: the codes are stored so that 64 consecutive bytes hold one dword of each of 16 keys
// (k_code_offset); a dword of codes is split by position in the byte (a shift and a mask, no
// shuffle) into 4 bytes of codes, and multiplied by the 4 query bytes of those channels,
// broadcast. The query bytes are put in that order once per block (one in-lane byte shuffle per
// 64 channels). The sums come out one key a lane, so no horizontal reduction. Other head sizes
// (D % 64 != 0 or D > kVnniMaxD) take the float kernel of kernels_impl.h, which computes the
// same sums in float32 (exactly).
#if defined(__clang__)
#define PTLLM_UNROLL_VNNI _Pragma("unroll")
#else
#define PTLLM_UNROLL_VNNI _Pragma("GCC unroll 16")
#endif
#define PTLLM_TARGET_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))

namespace ptllm {
namespace {
using KA = Kernels<Avx512>;

// vnni_k_pass for NT tiles of 16 keys from t0 (the first maybe entered part way, the last maybe narrower): each
// query dword broadcast once for the NT tiles.
template <int BITS, int R, int NT, int DK>
PTLLM_TARGET_VNNI inline void vnni_k_tiles(const int32_t* qd, const float* a, const float* b, const float* qz, KRows k,
                                           int end, int t0, size_t pk, size_t nq4, float* out, int ld_out,
                                           uint8_t* tail, const void* next) {
  constexpr int KPB = 8 / BITS;
  const __m512i mask = _mm512_set1_epi8(char((1 << BITS) - 1));
  const uint8_t* tile[NT];
  int w[NT];
  for (int u = 0; u < NT; ++u) {
    const int tu = t0 + 16 * u;
    w[u] = std::min(16, k.G - tu);
    KA::prefetch_lines(next, size_t(tu) * pk, size_t(tu + w[u]) * pk);
    tile[u] = k.group + size_t(tu) * pk;
    if (w[u] < 16) {  // a narrower last tile: its columns spread to 16 keys, zeros after
      std::memset(tail, 0, 16 * pk);
      for (size_t c = 0; c < pk; c += 4) std::memcpy(tail + 16 * c, tile[u] + size_t(w[u]) * c, 4 * size_t(w[u]));
      tile[u] = tail;
    }
  }
  __m512i acc[NT][R];
  for (int u = 0; u < NT; ++u)
    for (int h = 0; h < R; ++h) acc[u][h] = _mm512_setzero_si512();
  for (size_t off = 0; off < pk; off += 16) {
    __m512i y[NT][4];
    for (int u = 0; u < NT; ++u)
      for (int m = 0; m < 4; ++m) y[u][m] = _mm512_loadu_si512(tile[u] + 16 * (off + 4 * size_t(m)));
    const int32_t* qk = qd + off / 4 * KPB;
    PTLLM_UNROLL_VNNI for (int m = 0; m < 4; ++m) PTLLM_UNROLL_VNNI for (int s = 0; s < KPB; ++s) {
      __m512i c[NT];
      for (int u = 0; u < NT; ++u) {
        if constexpr (BITS == 8)
          c[u] = y[u][m];
        else
          c[u] = _mm512_and_si512(s == 0 ? y[u][m] : _mm512_srli_epi32(y[u][m], BITS * s), mask);
      }
      PTLLM_UNROLL_VNNI for (int h = 0; h < R; ++h) {
        const __m512i qv = _mm512_set1_epi32(qk[size_t(h) * nq4 + size_t(m * KPB + s)]);
        for (int u = 0; u < NT; ++u) acc[u][h] = _mm512_dpbusd_epi32(acc[u][h], c[u], qv);
      }
    }
  }
  for (int u = 0; u < NT; ++u) {
    // Keys tu + [lo, hi) are asked for, at columns from tu + lo - j0.
    const int tu = t0 + 16 * u, lo = std::max(0, k.j0 - tu), hi = std::min(w[u], end - tu);
    PTLLM_UNROLL_VNNI for (int h = 0; h < R; ++h) {
      const __m512 v = _mm512_fmadd_ps(_mm512_sub_ps(_mm512_cvtepi32_ps(acc[u][h]), _mm512_set1_ps(b[h])),
                                       _mm512_set1_ps(a[h]), _mm512_set1_ps(qz[h]));
      float* oh = out + size_t(h) * size_t(ld_out);
      if (lo == 0) {
        _mm512_mask_storeu_ps(oh + (tu - k.j0), Avx512::mask(hi), v);
      } else {  // the first tile, entered part way
        alignas(64) float t[16];
        _mm512_store_ps(t, v);
        std::copy(t + lo, t + hi, oh + (tu + lo - k.j0));
      }
    }
  }
}

// One pass of R <= 4 heads; qd [R][D / 4]: the int8 query in dword order (quad k = dword k / KPB of
// the row, bit position s = k % KPB of its bytes). The codes are stored in tiles of 16 keys whose
// 4-byte columns hold the 16 keys' dwords in turn (k_code_offset, quant.h): a load of 64 bytes is
// one dword of every key, one key a lane. Tiles two at a time (a group of 32: one call).
template <int BITS, int R, int DK = 0>  // DK as vnni_k_heads
PTLLM_TARGET_VNNI void vnni_k_pass(const int32_t* qd, const float* a, const float* b, const float* qz, KRows k, int nk,
                                   int D_, float* out, int ld_out, uint8_t* tail, const void* next) {
  const int D = DK ? DK : D_;
  const size_t pk = size_t(D) * BITS / 8, nq4 = size_t(D) / 4;
  const int end = k.j0 + nk;
  int t0 = k.j0 / 16 * 16;
  for (; t0 + 16 < end && t0 + 32 <= k.G; t0 += 32)  // two tiles, the second a full one
    vnni_k_tiles<BITS, R, 2, DK>(qd, a, b, qz, k, end, t0, pk, nq4, out, ld_out, tail, next);
  for (; t0 < end; t0 += 16) vnni_k_tiles<BITS, R, 1, DK>(qd, a, b, qz, k, end, t0, pk, nq4, out, ld_out, tail, next);
}

// The maxima of a, b, c, d (as reduce_add4 sums them).
PTLLM_TARGET_VNNI inline __m128 max4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512d ab = _mm512_castps_pd(_mm512_max_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b)));
  const __m512d cd = _mm512_castps_pd(_mm512_max_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d)));
  const __m512 s = _mm512_max_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(ab, cd)), _mm512_castpd_ps(_mm512_unpackhi_pd(ab, cd)));
  const __m256 h = _mm256_max_ps(_mm512_castps512_ps256(s), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1)));
  return _mm_max_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}
// The sums of the 32-bit lanes of a, b, c, d.
PTLLM_TARGET_VNNI inline __m128i sum4_epi32(__m512i a, __m512i b, __m512i c, __m512i d) {
  const __m512i ab = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
  const __m512i cd = _mm512_add_epi32(_mm512_unpacklo_epi32(c, d), _mm512_unpackhi_epi32(c, d));
  const __m512i s = _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
  const __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
  return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

// x [64] times inv rounded to int8 (|x inv| <= 127), channel c at byte c: three saturating packs
// (exact in range) leave channel 16 v + 4 L + e at byte 4 v + e of 128-bit lane L, and a transpose of
// the 4 x 4 dwords puts them in order.
PTLLM_TARGET_VNNI inline __m512i vnni_q8x64(const float* x, __m512 inv) {
  __m512i y[4];
  for (int v = 0; v < 4; ++v) y[v] = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_load_ps(x + 16 * v), inv));
  const __m512i p = _mm512_packs_epi16(_mm512_packs_epi32(y[0], y[1]), _mm512_packs_epi32(y[2], y[3]));
  return _mm512_permutexvar_epi32(_mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0), p);
}

constexpr int kVnniMaxD = 256;  // longer rows: the float kernel

// One pass of R heads: the query quantized as kivi_k_factors and kivi_k_quantize (kernels_impl.h)
// do it (the same q8, a and qsum; qz summed in another order), R heads at once, then the scores.
template <int BITS, int R, int DK = 0>  // DK: D known at compile time (64: the query stays in registers), else 0
PTLLM_TARGET_VNNI void vnni_k_heads(const float* q, KRows codes, const uint16_t* scale, const uint16_t* zero,
                                    float qscale, int nk, int D_, float* out, int ld_out, const void* next) {
  const int D = DK ? DK : D_;
  alignas(64) float qf[R][kVnniMaxD];             // q * sd
  alignas(64) int32_t qd[R * kVnniMaxD / 4];      // q8 in dword order
  alignas(64) uint8_t tail[16 * kVnniMaxD / 8 * BITS];  // a narrower last tile, spread
  alignas(16) float qz[4], a[4], b[4], inv[4];
  const __m512 qsv = _mm512_set1_ps(qscale), mv = _mm512_set1_ps(KA::kMid<BITS>), floor = _mm512_set1_ps(kMinScale);
  __m512 m[4], z[4];
  PTLLM_UNROLL_VNNI for (int h = 0; h < 4; ++h) m[h] = z[h] = _mm512_setzero_ps();
  for (int i = 0; i < D; i += 16) {
    const __m512 s = _mm512_max_ps(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scale + i))), floor);
    const __m512 sd = _mm512_mul_ps(s, qsv);
    const __m512 zd = _mm512_mul_ps(
        _mm512_add_ps(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(zero + i))), _mm512_mul_ps(mv, s)),
        qsv);
    PTLLM_UNROLL_VNNI for (int h = 0; h < R; ++h) {
      const __m512 qv = _mm512_loadu_ps(q + size_t(h) * size_t(D) + size_t(i)), x = _mm512_mul_ps(qv, sd);
      _mm512_store_ps(qf[h] + i, x);
      m[h] = _mm512_range_ps(m[h], x, 0x0B);  // max(m, |x|): the larger magnitude, sign cleared
      z[h] = _mm512_fmadd_ps(qv, zd, z[h]);
    }
  }
  Avx512::reduce_add4(z[0], z[1], z[2], z[3], qz);
  const __m128 amax = max4(m[0], m[1], m[2], m[3]);
  const __mmask8 some = _mm_cmp_ps_mask(amax, _mm_set1_ps(kMinQueryMax), _CMP_GE_OQ);
  _mm_store_ps(a, _mm_maskz_div_ps(some, amax, _mm_set1_ps(127.f)));
  _mm_store_ps(inv, _mm_maskz_div_ps(some, _mm_set1_ps(127.f), amax));
  // The bytes of 4 KPB channels in dword order: byte 4 s + b <- channel KPB b + s.
  const __m512i order = BITS == 8   ? _mm512_set_epi64(0x0f0e0d0c0b0a0908, 0x0706050403020100, 0x0f0e0d0c0b0a0908,
                                                       0x0706050403020100, 0x0f0e0d0c0b0a0908, 0x0706050403020100,
                                                       0x0f0e0d0c0b0a0908, 0x0706050403020100)
                        : BITS == 4 ? _mm512_set_epi64(0x0f0d0b090e0c0a08, 0x0705030106040200, 0x0f0d0b090e0c0a08,
                                                       0x0705030106040200, 0x0f0d0b090e0c0a08, 0x0705030106040200,
                                                       0x0f0d0b090e0c0a08, 0x0705030106040200)
                                    : _mm512_set_epi64(0x0f0b07030e0a0602, 0x0d0905010c080400, 0x0f0b07030e0a0602,
                                                       0x0d0905010c080400, 0x0f0b07030e0a0602, 0x0d0905010c080400,
                                                       0x0f0b07030e0a0602, 0x0d0905010c080400);
  const __m512i ones = _mm512_set1_epi8(1);
  __m512i qsum[4], iv[R];
  PTLLM_UNROLL_VNNI for (int h = 0; h < 4; ++h) qsum[h] = _mm512_setzero_si512();
  PTLLM_UNROLL_VNNI for (int h = 0; h < R; ++h) iv[h] = _mm512_castps_si512(_mm512_set1_ps(inv[h]));
  for (int i = 0; i < D; i += 64) {
    PTLLM_UNROLL_VNNI for (int h = 0; h < R; ++h) {
      const __m512i v = vnni_q8x64(qf[h] + i, _mm512_castsi512_ps(iv[h]));
      qsum[h] = _mm512_dpbusd_epi32(qsum[h], ones, v);
      _mm512_store_si512(qd + size_t(h) * size_t(D) / 4 + size_t(i) / 4, BITS == 8 ? v : _mm512_shuffle_epi8(v, order));
    }
  }
  _mm_store_ps(b, _mm_mul_ps(_mm_cvtepi32_ps(sum4_epi32(qsum[0], qsum[1], qsum[2], qsum[3])),
                             _mm_set1_ps(KA::kMid<BITS>)));
  vnni_k_pass<BITS, R, DK>(qd, a, b, qz, codes, nk, D, out, ld_out, tail, next);
}

// kivi_v_block for int4 with AVX-512 BF16 (Zen 4, Sapphire Rapids and later; picked at run time):
// two keys a 32-bit lane, multiplied and summed in one instruction (vdpbf16ps) instead of a float
// FMA per key. Each weight p[h][j] s_j is rounded to bf16 (relative error at most 2^-8, as
// kivi_v_block in quant.h allows); a code c of 0..15 enters as the bf16 number 128 + c (high byte
// 0x43, low byte c: exact, and made by interleaving code bytes with 0x43, no conversion), so the sums
// are sum_j w_j (128 + c_j) and 128 sum_j w_j is taken off at the end, computed from the same
// rounded weights (the float32 sums of products exact in bf16 lose about 2^-24 of 128 sum w).
// Codes of keys j and j+1 are put side by side by bytes (x_j | x_{j+1} << 8 on 16-bit lanes), split
// into low and high nibbles (channels 2i and 2i+1) and spread over 32-bit lanes by an in-lane byte
// interleave; the resulting channel order is undone once per call. Other widths and head sizes take
// the float kernel.
#define PTLLM_TARGET_BF16 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512bf16,avx2,fma,f16c")))
constexpr int kVKeys = 64;  // keys whose weights the two-keys-a-lane V kernels round at once

// The rounded 16-bit weights of keys j and j + 1 of head h (rows of kVKeys) in every 32-bit lane.
PTLLM_TARGET_VNNI inline __m512i weight_pair(const void* w, int h, int j) {
  uint32_t pair;
  std::memcpy(&pair, static_cast<const uint16_t*>(w) + size_t(h) * kVKeys + size_t(j), sizeof pair);
  return _mm512_set1_epi32(int(pair));
}

// A head's 64 channels between bf16_v_pass's internal order (a[0] lane 4L + m holds channel
// 16L + 2m, a[1] 16L + 8 + 2m, a[2] 16L + 2m + 1, a[3] 16L + 9 + 2m) and channel order (o[k]: channels
// 16k .. 16k + 15): an in-lane interleave and a 4 x 4 transpose of 128-bit lanes; from channel order
// the transpose (its own inverse) and the in-lane de-interleave.
PTLLM_TARGET_BF16 inline void lane_transpose(const __m512* t, __m512* o) {  // o[k] lane L = t[L] lane k
  const __m512 u0 = _mm512_shuffle_f32x4(t[0], t[1], 0x44), u1 = _mm512_shuffle_f32x4(t[0], t[1], 0xEE);
  const __m512 u2 = _mm512_shuffle_f32x4(t[2], t[3], 0x44), u3 = _mm512_shuffle_f32x4(t[2], t[3], 0xEE);
  o[0] = _mm512_shuffle_f32x4(u0, u2, 0x88);
  o[1] = _mm512_shuffle_f32x4(u0, u2, 0xDD);
  o[2] = _mm512_shuffle_f32x4(u1, u3, 0x88);
  o[3] = _mm512_shuffle_f32x4(u1, u3, 0xDD);
}
PTLLM_TARGET_BF16 inline void bf16_v_store(const __m512* a, float* acc) {
  const __m512 t[4] = {_mm512_unpacklo_ps(a[0], a[2]), _mm512_unpackhi_ps(a[0], a[2]),  // 16L + 0..3, 4..7
                       _mm512_unpacklo_ps(a[1], a[3]), _mm512_unpackhi_ps(a[1], a[3])};  // 16L + 8..11, 12..15
  __m512 o[4];
  lane_transpose(t, o);
  for (int k = 0; k < 4; ++k) _mm512_storeu_ps(acc + 16 * k, o[k]);
}
PTLLM_TARGET_BF16 inline void bf16_v_load(const float* acc, __m512* a) {
  const __m512 o[4] = {_mm512_loadu_ps(acc), _mm512_loadu_ps(acc + 16), _mm512_loadu_ps(acc + 32),
                       _mm512_loadu_ps(acc + 48)};
  __m512 t[4];
  lane_transpose(o, t);
  a[0] = _mm512_shuffle_ps(t[0], t[1], 0x88), a[2] = _mm512_shuffle_ps(t[0], t[1], 0xDD);
  a[1] = _mm512_shuffle_ps(t[2], t[3], 0x88), a[3] = _mm512_shuffle_ps(t[2], t[3], 0xDD);
}

// A run of at most kVKeys keys of one span as the two-keys-a-lane V passes read it: the rounded
// weights of up to 4 heads wq [4][kVKeys] (zero past n), the float each head's pass needs (f), the
// codes (rows of pk bytes) and the rows asked for while they are read.
struct VChunk {
  const void* wq;
  const float* f;
  const uint8_t* codes;
  int n;
  const void* next;
};

// R <= 4 heads, channels [c0, c0 + 64) of acc [R][D] += the chunks' sums, kept in registers in
// the internal order from the first chunk to the last (each chunk's sums from zero, less 128 f).
template <int R>
PTLLM_TARGET_BF16 void bf16_v_pass(const VChunk* ch, int nc, size_t pk, int c0, int D, float* acc) {
  __m512 run[R][4];
  for (int h = 0; h < R; ++h) bf16_v_load(acc + size_t(h) * size_t(D) + size_t(c0), run[h]);
  const __m512i lo4 = _mm512_set1_epi16(0x0F0F), hb = _mm512_set1_epi8(0x43);
  for (int c = 0; c < nc; ++c) {
    const int nk = ch[c].n;
    const uint8_t* codes = ch[c].codes;
    __m512 a[R][4];
    for (int h = 0; h < R; ++h)
      for (int k = 0; k < 4; ++k) a[h][k] = _mm512_setzero_ps();
    for (int j = 0; j < nk; j += 2) {
      if (c0 == 0) KA::prefetch_lines(ch[c].next, size_t(j) * pk, size_t(std::min(j + 2, nk)) * pk);
      const uint8_t* r0 = codes + size_t(j) * pk + size_t(c0) / 2;
      const uint8_t* r1 = j + 1 < nk ? r0 + pk : r0;  // an odd last key pairs with itself at weight 0
      const __m512i w0 = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(r0)));
      const __m512i w1 = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(r1)));
      const __m512i x = _mm512_or_si512(w0, _mm512_slli_epi16(w1, 8));  // 16-bit lane i: bytes i of keys j, j+1
      const __m512i el = _mm512_and_si512(x, lo4), od = _mm512_and_si512(_mm512_srli_epi16(x, 4), lo4);
      const __m512bh b[4] = {(__m512bh)_mm512_unpacklo_epi8(el, hb), (__m512bh)_mm512_unpackhi_epi8(el, hb),
                             (__m512bh)_mm512_unpacklo_epi8(od, hb), (__m512bh)_mm512_unpackhi_epi8(od, hb)};
      for (int h = 0; h < R; ++h) {
        const __m512bh wv = (__m512bh)weight_pair(ch[c].wq, h, j);
        for (int k = 0; k < 4; ++k) a[h][k] = _mm512_dpbf16_ps(a[h][k], b[k], wv);
      }
    }
    for (int h = 0; h < R; ++h) {
      const __m512 off = _mm512_set1_ps(128.f * ch[c].f[h]);
      for (int k = 0; k < 4; ++k) run[h][k] = _mm512_add_ps(run[h][k], _mm512_sub_ps(a[h][k], off));
    }
  }
  for (int h = 0; h < R; ++h) bf16_v_store(run[h], acc + size_t(h) * size_t(D) + size_t(c0));
}

// int2 the same way, where the CPU also has AVX-512 VBMI (a byte permute across the register): the
// two keys' code rows side by side in a register; the permute puts in each 32-bit lane t the bytes
// holding channel 16 v + t of both keys, one per 16-bit half; a shift of each half by the channel's
// place in its byte brings its 2 bits down, and one ternary op masks them and sets the high byte
// 0x43 (bf16 128 + c). The channels come out in order: nothing to undo at the end.
#define PTLLM_TARGET_BF16_VBMI \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512bf16,avx512vbmi,avx2,fma,f16c")))
// The permute's byte indices (ib[v]: channels 16 v + t) and each 16-bit half's shift (sb), fixed.
struct V2Tables {
  alignas(64) uint8_t ib[4][64];
  alignas(64) uint16_t sb[32];
};
constexpr V2Tables make_v2_tables() {
  V2Tables t{};
  for (int c = 0; c < 16; ++c) {
    for (int v = 0; v < 4; ++v) {
      t.ib[v][4 * c] = uint8_t(4 * v + c / 4);          // key j's byte of channel 16 v + c
      t.ib[v][4 * c + 2] = uint8_t(16 + 4 * v + c / 4);  // key j + 1's
      t.ib[v][4 * c + 1] = t.ib[v][4 * c + 3] = 63;     // a zero byte
    }
    t.sb[2 * c] = t.sb[2 * c + 1] = uint16_t(2 * (c % 4));
  }
  return t;
}
constexpr V2Tables kV2Tables = make_v2_tables();
template <int R>
PTLLM_TARGET_BF16_VBMI void bf16_v2_pass(const VChunk* ch, int nc, size_t pk, int c0, int D, float* acc) {
  __m512 run[R][4];
  for (int h = 0; h < R; ++h)
    for (int v = 0; v < 4; ++v) run[h][v] = _mm512_loadu_ps(acc + size_t(h) * size_t(D) + size_t(c0 + 16 * v));
  __m512i idx[4];
  for (int v = 0; v < 4; ++v) idx[v] = _mm512_load_si512(kV2Tables.ib[v]);
  const __m512i sh = _mm512_load_si512(kV2Tables.sb), m3 = _mm512_set1_epi32(0x00030003), hb = _mm512_set1_epi32(0x43004300);
  for (int c = 0; c < nc; ++c) {
    const int nk = ch[c].n;
    const uint8_t* codes = ch[c].codes;
    __m512 a[R][4];
    for (int h = 0; h < R; ++h)
      for (int v = 0; v < 4; ++v) a[h][v] = _mm512_setzero_ps();
    for (int j = 0; j < nk; j += 2) {
      if (c0 == 0) KA::prefetch_lines(ch[c].next, size_t(j) * pk, size_t(std::min(j + 2, nk)) * pk);
      const uint8_t* r0 = codes + size_t(j) * pk + size_t(c0) / 4;
      const uint8_t* r1 = j + 1 < nk ? r0 + pk : r0;  // an odd last key pairs with itself at weight 0
      const __m512i x = _mm512_inserti32x4(_mm512_zextsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r0))),
                                           _mm_loadu_si128(reinterpret_cast<const __m128i*>(r1)), 1);
      __m512bh b[4];
      for (int v = 0; v < 4; ++v)
        b[v] = (__m512bh)_mm512_ternarylogic_epi32(_mm512_srlv_epi16(_mm512_permutexvar_epi8(idx[v], x), sh), m3, hb,
                                                    0xEA);  // (y & m3) | hb
      for (int h = 0; h < R; ++h) {
        const __m512bh wv = (__m512bh)weight_pair(ch[c].wq, h, j);
        for (int v = 0; v < 4; ++v) a[h][v] = _mm512_dpbf16_ps(a[h][v], b[v], wv);
      }
    }
    for (int h = 0; h < R; ++h) {
      const __m512 off = _mm512_set1_ps(128.f * ch[c].f[h]);
      for (int v = 0; v < 4; ++v) run[h][v] = _mm512_add_ps(run[h][v], _mm512_sub_ps(a[h][v], off));
    }
  }
  for (int h = 0; h < R; ++h)
    for (int v = 0; v < 4; ++v) _mm512_storeu_ps(acc + size_t(h) * size_t(D) + size_t(c0 + 16 * v), run[h][v]);
}

// kivi_v_block for int8 with AVX-512 VNNI: two keys a 32-bit lane as well (vpdpwssd: 16-bit x 16-bit
// products summed exactly in int32). The weights w = p[h][j] s_j of a call are rounded to 16-bit
// integers on the scale of the largest, max_j w_j / 32767 (absolute error at most max_j w_j / 65534 a
// weight, as quant.h allows); codes enter as 16-bit words (zero-extended bytes), the two keys' words
// interleaved in-lane, the channel order undone once per call.
template <int R>
PTLLM_TARGET_VNNI void w16_v_pass(const VChunk* ch, int nc, size_t pk, int c0, int D, float* acc) {
  // run[h][2 half + e], lane 4L + m: channel c0 + 32 half + 8L + 4e + m (the order of the pass's sums);
  // from and to channel order by swapping 128-bit lanes.
  __m512 run[R][4];
  for (int h = 0; h < R; ++h)
    for (int half = 0; half < 2; ++half) {
      const float* d = acc + size_t(h) * size_t(D) + size_t(c0 + 32 * half);
      const __m512 o0 = _mm512_loadu_ps(d), o1 = _mm512_loadu_ps(d + 16);
      const __m512 t = _mm512_shuffle_f32x4(o0, o0, 0xD8), u = _mm512_shuffle_f32x4(o1, o1, 0xD8);
      run[h][2 * half] = _mm512_shuffle_f32x4(t, u, 0x44);
      run[h][2 * half + 1] = _mm512_shuffle_f32x4(t, u, 0xEE);
    }
  for (int c = 0; c < nc; ++c) {
    const int nk = ch[c].n;
    const uint8_t* codes = ch[c].codes;
    __m512i a[R][4];
    for (int h = 0; h < R; ++h)
      for (int k = 0; k < 4; ++k) a[h][k] = _mm512_setzero_si512();
    for (int j = 0; j < nk; j += 2) {
      if (c0 == 0) KA::prefetch_lines(ch[c].next, size_t(j) * pk, size_t(std::min(j + 2, nk)) * pk);
      const uint8_t* r0 = codes + size_t(j) * pk + size_t(c0);
      const uint8_t* r1 = j + 1 < nk ? r0 + pk : r0;  // an odd last key pairs with itself at weight 0
      __m512i b[4];
      for (int half = 0; half < 2; ++half) {  // channels c0 + 32 half + [0, 32)
        const __m512i x0 = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(r0 + 32 * half)));
        const __m512i x1 = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(r1 + 32 * half)));
        b[2 * half] = _mm512_unpacklo_epi16(x0, x1);      // lane L: channels 8L + 0..3
        b[2 * half + 1] = _mm512_unpackhi_epi16(x0, x1);  // lane L: channels 8L + 4..7
      }
      for (int h = 0; h < R; ++h) {
        const __m512i wv = weight_pair(ch[c].wq, h, j);
        for (int k = 0; k < 4; ++k) a[h][k] = _mm512_dpwssd_epi32(a[h][k], b[k], wv);
      }
    }
    for (int h = 0; h < R; ++h) {
      const __m512 sv = _mm512_set1_ps(ch[c].f[h]);
      for (int k = 0; k < 4; ++k) run[h][k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a[h][k]), sv, run[h][k]);
    }
  }
  for (int h = 0; h < R; ++h)
    for (int half = 0; half < 2; ++half) {
      const __m512 lo = run[h][2 * half], hi = run[h][2 * half + 1];
      const __m512 t = _mm512_shuffle_f32x4(lo, hi, 0x44), u = _mm512_shuffle_f32x4(lo, hi, 0xEE);
      float* d = acc + size_t(h) * size_t(D) + size_t(c0 + 32 * half);
      _mm512_storeu_ps(d, _mm512_shuffle_f32x4(t, t, 0xD8));
      _mm512_storeu_ps(d + 16, _mm512_shuffle_f32x4(u, u, 0xD8));
    }
}

// The weights of one head for keys [0, n): w[j] = p[j] max(kMinScale, s[j]), zeros from n to the
// next multiple of 16; returns sum_j p[j] z[j], the zero-point term (kernels_impl.h's kivi_v_pass).
PTLLM_TARGET_VNNI float v_weights(const float* ph, const uint16_t* scale, const uint16_t* zero, int n, float* w) {
  const __m512 floor = _mm512_set1_ps(kMinScale);
  __m512 zs = _mm512_setzero_ps();
  for (int j = 0; j < n; j += 16) {
    const __mmask16 m = Avx512::mask(std::min(16, n - j));
    const __m512 pv = _mm512_maskz_loadu_ps(m, ph + j);
    const __m512 sv = _mm512_max_ps(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, scale + j)), floor);
    zs = _mm512_fmadd_ps(pv, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, zero + j)), zs);
    _mm512_store_ps(w + j, _mm512_mul_ps(pv, sv));
  }
  return _mm512_reduce_add_ps(zs);
}

// The two kernels that put two keys in a lane, for two_key_v_spans: the width they take, their
// rounded weight type, the rounding of a head's weights (returning the float the pass needs) and
// the pass over 64 channels.
template <int BITS>
struct Bf16V {  // int4 (AVX-512 BF16) and int2 (and VBMI)
  static constexpr int kBits = BITS;
  using W = uint16_t;
  // The weights of r <= 4 heads (rows of p, stride ld_p) for keys [0, n): wq[h][j] = p[h][j]
  // max(kMinScale, s[j]) rounded to bf16 (zeros from n to the next multiple of 16); f[h] = sum_j of
  // the rounded weights (the pass takes off 128 times it); zacc[h] += sum_j p[h][j] z[j], the zero-point
  // term. The heads' sums are reduced together, each in the same order whatever r is.
  PTLLM_TARGET_BF16 static void weights(const float* p, int ld_p, int r, const uint16_t* scale, const uint16_t* zero,
                                        int n, W (*wq)[kVKeys], float* f, float* zacc) {
    switch (r) {  // the heads' sums in registers
      case 4: return weights_r<4>(p, ld_p, scale, zero, n, wq, f, zacc);
      case 3: return weights_r<3>(p, ld_p, scale, zero, n, wq, f, zacc);
      case 2: return weights_r<2>(p, ld_p, scale, zero, n, wq, f, zacc);
      default: return weights_r<1>(p, ld_p, scale, zero, n, wq, f, zacc);
    }
  }
  template <int R>
  PTLLM_TARGET_BF16 static void weights_r(const float* p, int ld_p, const uint16_t* scale, const uint16_t* zero, int n,
                                          W (*wq)[kVKeys], float* f, float* zacc) {
    const __m512 floor = _mm512_set1_ps(kMinScale);
    __m512 zs[4], ws[4];
    PTLLM_UNROLL_VNNI for (int h = 0; h < 4; ++h) zs[h] = ws[h] = _mm512_setzero_ps();
    for (int j = 0; j < n; j += 16) {
      const __mmask16 m = Avx512::mask(std::min(16, n - j));
      const __m512 sv = _mm512_max_ps(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, scale + j)), floor);
      const __m512 zv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, zero + j));
      PTLLM_UNROLL_VNNI for (int h = 0; h < R; ++h) {
        const __m512 pv = _mm512_maskz_loadu_ps(m, p + size_t(h) * size_t(ld_p) + size_t(j));
        zs[h] = _mm512_fmadd_ps(pv, zv, zs[h]);
        const __m256i b = (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(pv, sv));
        _mm256_store_si256(reinterpret_cast<__m256i*>(wq[h] + j), b);
        ws[h] = _mm512_add_ps(ws[h], _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16)));
      }
    }
    alignas(16) float z4[4];
    Avx512::reduce_add4(zs[0], zs[1], zs[2], zs[3], z4);
    Avx512::reduce_add4(ws[0], ws[1], ws[2], ws[3], f);
    for (int h = 0; h < R; ++h) zacc[h] += z4[h];
  }
  template <int R>
  static void pass(const VChunk* ch, int nc, size_t pk, int c0, int D, float* acc) {
    if constexpr (BITS == 4)
      bf16_v_pass<R>(ch, nc, pk, c0, D, acc);
    else
      bf16_v2_pass<R>(ch, nc, pk, c0, D, acc);
  }
};
struct W16V {  // int8, AVX-512 VNNI
  static constexpr int kBits = 8;
  using W = int16_t;
  // w to 16-bit integers on the scale max_j w_j / 32767; returns that scale (0: all weights 0).
  PTLLM_TARGET_VNNI static float round(const float* w, int n, W* out) {
    __m512 wm = _mm512_setzero_ps();
    for (int j = 0; j < n; j += 16) wm = _mm512_max_ps(wm, _mm512_load_ps(w + j));
    const float wmax = _mm512_reduce_max_ps(wm);
    const bool some = wmax > 0.f && wmax <= std::numeric_limits<float>::max();
    const __m512 inv = _mm512_set1_ps(some ? 32767.f / wmax : 0.f);
    for (int j = 0; j < n; j += 16)
      _mm256_store_si256(reinterpret_cast<__m256i*>(out + j),
                         _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_load_ps(w + j), inv))));
    return some ? wmax / 32767.f : 0.f;
  }
  // As Bf16V::weights, on the scales round returns.
  PTLLM_TARGET_VNNI static void weights(const float* p, int ld_p, int r, const uint16_t* scale, const uint16_t* zero,
                                        int n, W (*wq)[kVKeys], float* f, float* zacc) {
    alignas(64) float w[kVKeys];
    for (int h = 0; h < r; ++h) {
      zacc[h] += v_weights(p + size_t(h) * size_t(ld_p), scale, zero, n, w);
      f[h] = round(w, n, wq[h]);
    }
  }
  template <int R>
  static void pass(const VChunk* ch, int nc, size_t pk, int c0, int D, float* acc) {
    w16_v_pass<R>(ch, nc, pk, c0, D, acc);
  }
};

// kivi_v_spans through kernel K (D % 64 == 0), up to 4 heads a pass: the spans cut into chunks of
// at most kVKeys keys, the weights of up to kVChunks chunks rounded, then each 64 channels summed over
// those chunks in one call, in registers (the same sums, in the same order, as chunk by chunk).
// While a batch's weights are rounded, the scales of the next batch's are asked for: the weights of
// a batch are rounded back to back, so scales asked for only two spans ahead arrived too late (int8,
// 8 layers at 16K: 2.7-3.1 ms; a batch ahead: 2.2 ms). 8 chunks a batch: 4 measured about the same.
constexpr int kVChunks = 8;
template <class K>
PTLLM_TARGET_VNNI void two_key_v_spans(const float* p, int ld_p, int nq, const KiviSpan* s, int ns, int D, float* acc,
                                       float* zacc) {
  const size_t pk = size_t(D) * K::kBits / 8;
  alignas(64) typename K::W wq[kVChunks][4][kVKeys];
  alignas(16) float f[kVChunks][4];
  VChunk ch[kVChunks];
  for (int h0 = 0; h0 < nq; h0 += 4) {
    const int r = std::min(4, nq - h0);
    int i = 0, j0 = 0;  // the next chunk: keys from j0 of span i
    while (i < ns) {
      int nc = 0;
      while (i < ns && nc < kVChunks) {
        const KiviSpan& sp = s[i];
        if (j0 >= sp.n) {
          ++i, j0 = 0;
          continue;
        }
        if (j0 == 0 && h0 == 0 && i + kVChunks < ns)  // the scales the next batch's weights read
          prefetch_f16(s[i + kVChunks].vs, s[i + kVChunks].n), prefetch_f16(s[i + kVChunks].vz, s[i + kVChunks].n);
        const int n = std::min(kVKeys, sp.n - j0);
        K::weights(p + size_t(h0) * size_t(ld_p) + size_t(sp.col + j0), ld_p, r, sp.vs + j0, sp.vz + j0, n, wq[nc],
                   f[nc], zacc + h0);
        const void* nx = sp.v_next && h0 == 0 ? static_cast<const uint8_t*>(sp.v_next) + size_t(j0) * pk : nullptr;
        ch[nc] = VChunk{wq[nc], f[nc], sp.v + size_t(j0) * pk, n, nx};
        ++nc, j0 += n;
      }
      float* ah = acc + size_t(h0) * size_t(D);
      for (int c0 = 0; c0 < D; c0 += 64) {
        switch (r) {
          case 4: K::template pass<4>(ch, nc, pk, c0, D, ah); break;
          case 3: K::template pass<3>(ch, nc, pk, c0, D, ah); break;
          case 2: K::template pass<2>(ch, nc, pk, c0, D, ah); break;
          default: K::template pass<1>(ch, nc, pk, c0, D, ah); break;
        }
      }
    }
  }
}
PTLLM_TARGET_VNNI void vnni_v_spans(const float* p, int ld_p, int nq, const KiviSpan* s, int ns, int D, int bits,
                                    float* acc, float* zacc) {
  if (bits != 8 || D % 64 != 0) return v_spans_by_block<KA::kivi_v_block>(p, ld_p, nq, s, ns, D, bits, acc, zacc);
  two_key_v_spans<W16V>(p, ld_p, nq, s, ns, D, acc, zacc);
}

bool has_vbmi() {
  static const bool vbmi = cpu_features().avx512vbmi;
  return vbmi;
}
PTLLM_TARGET_BF16 void bf16_v_spans(const float* p, int ld_p, int nq, const KiviSpan* s, int ns, int D, int bits,
                                    float* acc, float* zacc) {
  if (D % 64 == 0 && bits == 4) return two_key_v_spans<Bf16V<4>>(p, ld_p, nq, s, ns, D, acc, zacc);
  if (D % 64 == 0 && bits == 2 && has_vbmi()) return two_key_v_spans<Bf16V<2>>(p, ld_p, nq, s, ns, D, acc, zacc);
  vnni_v_spans(p, ld_p, nq, s, ns, D, bits, acc, zacc);  // int8, and the rest
}

// kivi_k_spans (and kivi_k_block, one span): each span's keys in passes of up to 4 heads, the first
// pass asking for the rows read next.
template <int BITS, int DK>
PTLLM_TARGET_VNNI void vnni_k_spans_t(const float* q, int nq, const KiviSpan* s, int ns, int G, float qscale, int D,
                                      float* out, int ld_out) {
  for (int i = 0; i < ns; ++i) {
    ask_span_scales(s, ns, i, false, D);
    const KRows k{s[i].k, G, s[i].k0};
    for (int h0 = 0; h0 < nq; h0 += 4) {
      const float* qh = q + size_t(h0) * size_t(D);
      float* oh = out + size_t(h0) * size_t(ld_out) + size_t(s[i].col);
      const void* nx = h0 == 0 ? s[i].k_next : nullptr;
      switch (std::min(4, nq - h0)) {
        case 4: vnni_k_heads<BITS, 4, DK>(qh, k, s[i].ks, s[i].kz, qscale, s[i].n, D, oh, ld_out, nx); break;
        case 3: vnni_k_heads<BITS, 3, DK>(qh, k, s[i].ks, s[i].kz, qscale, s[i].n, D, oh, ld_out, nx); break;
        case 2: vnni_k_heads<BITS, 2, DK>(qh, k, s[i].ks, s[i].kz, qscale, s[i].n, D, oh, ld_out, nx); break;
        default: vnni_k_heads<BITS, 1, DK>(qh, k, s[i].ks, s[i].kz, qscale, s[i].n, D, oh, ld_out, nx); break;
      }
    }
  }
}
template <int BITS>
PTLLM_TARGET_VNNI void vnni_k_spans_b(const float* q, int nq, const KiviSpan* s, int ns, int G, float qscale, int D,
                                      float* out, int ld_out) {
  if (D == 64)  // the common head size known at compile time: the scaled query stays in registers
    vnni_k_spans_t<BITS, 64>(q, nq, s, ns, G, qscale, D, out, ld_out);
  else
    vnni_k_spans_t<BITS, 0>(q, nq, s, ns, G, qscale, D, out, ld_out);
}
PTLLM_TARGET_VNNI void vnni_k_spans(const float* q, int nq, const KiviSpan* s, int ns, int G, float qscale, int D,
                                    int bits, float* out, int ld_out) {
  if (D % 64 != 0 || D > kVnniMaxD)
    return k_spans_by_block<KA::kivi_k_block>(q, nq, s, ns, G, qscale, D, bits, out, ld_out);
  switch (bits) {
    case 8: return vnni_k_spans_b<8>(q, nq, s, ns, G, qscale, D, out, ld_out);
    case 4: return vnni_k_spans_b<4>(q, nq, s, ns, G, qscale, D, out, ld_out);
    default: return vnni_k_spans_b<2>(q, nq, s, ns, G, qscale, D, out, ld_out);
  }
}

constexpr KernelTable kTable = make_table<Avx512>(SimdTarget::AVX512);
constexpr KernelTable with_vnni(KernelTable t) {
  t.kivi_k_spans = vnni_k_spans;
  t.kivi_v_spans = vnni_v_spans;
  t.kivi_k_block = k_block_by_spans<vnni_k_spans>;
  t.kivi_v_block = v_block_by_spans<vnni_v_spans>;
  return t;
}
constexpr KernelTable kTableVnni = with_vnni(kTable);
constexpr KernelTable with_bf16(KernelTable t) {
  t.kivi_v_spans = bf16_v_spans;
  t.kivi_v_block = v_block_by_spans<bf16_v_spans>;
  return t;
}
constexpr KernelTable kTableVnniBf16 = with_bf16(kTableVnni);
}  // namespace
const KernelTable* avx512_kernel_table() {
  static const bool vnni = cpu_features().avx512vnni, bf16 = cpu_features().avx512bf16;
  return vnni ? (bf16 ? &kTableVnniBf16 : &kTableVnni) : &kTable;
}
}  // namespace ptllm

#else
namespace ptllm {
const KernelTable* avx512_kernel_table() { return nullptr; }
}  // namespace ptllm
#endif
