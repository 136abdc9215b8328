// The kernels for AVX2 + FMA + F16C (Haswell, Zen 1 and later), 8 floats a register.
#include "kernels/simd.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstring>

#define PTLLM_TARGET __attribute__((target("avx2,fma,f16c")))

namespace ptllm {
namespace {

struct Avx2 {
  using F = __m256;
  static constexpr int N = 8;
  static constexpr int MR = 6, NRV = 2;  // 12 accumulators of the 16 registers
  static constexpr int GT = 2;
  static constexpr size_t kGemvAhead = 2048;  // the gemv's weight stream asked for this far ahead

  PTLLM_TARGET static __m256i mask(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  PTLLM_TARGET static F zero() { return _mm256_setzero_ps(); }
  PTLLM_TARGET static F set1(float v) { return _mm256_set1_ps(v); }
  PTLLM_TARGET static F load(const float* p) { return _mm256_loadu_ps(p); }
  PTLLM_TARGET static F load_n(const float* p, int n) { return _mm256_maskload_ps(p, mask(n)); }
  PTLLM_TARGET static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
  PTLLM_TARGET static void store_n(float* p, F v, int n) { _mm256_maskstore_ps(p, mask(n), v); }

  PTLLM_TARGET static F add(F a, F b) { return _mm256_add_ps(a, b); }
  PTLLM_TARGET static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  PTLLM_TARGET static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  PTLLM_TARGET static F div(F a, F b) { return _mm256_div_ps(a, b); }
  PTLLM_TARGET static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  PTLLM_TARGET static F fnma(F a, F b, F c) { return _mm256_fnmadd_ps(a, b, c); }
  PTLLM_TARGET static F min(F a, F b) { return _mm256_min_ps(a, b); }
  PTLLM_TARGET static F max(F a, F b) { return _mm256_max_ps(a, b); }
  PTLLM_TARGET static float reduce_add(F v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  // The sums of a, b, c and d at once: interleaved pairwise sums within 128-bit lanes leave each
  // lane holding (a, b, c, d) partial sums, then the two lanes are folded.
  PTLLM_TARGET static void reduce_add4(F a, F b, F c, F d, float* out) {
    const __m256d ab = _mm256_castps_pd(_mm256_add_ps(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b)));
    const __m256d cd = _mm256_castps_pd(_mm256_add_ps(_mm256_unpacklo_ps(c, d), _mm256_unpackhi_ps(c, d)));
    const F s = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(ab, cd)), _mm256_castpd_ps(_mm256_unpackhi_pd(ab, cd)));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1)));
  }
  PTLLM_TARGET static float reduce_max(F v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }

  PTLLM_TARGET static F from_bf16(__m128i h) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  // Round to nearest even, quiet NaNs (as torch), then pack the 8 high halves.
  PTLLM_TARGET static __m128i to_bf16(F v) {
    const __m256i b = _mm256_castps_si256(v);
    const __m256i hi = _mm256_srli_epi32(b, 16);
    const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(b, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  }
  PTLLM_TARGET static __m128i load16(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }
  PTLLM_TARGET static __m128i load16_n(const void* p, int n) {
    uint16_t tmp[8] = {};
    std::memcpy(tmp, p, size_t(n) * 2);
    return load16(tmp);
  }
  PTLLM_TARGET static void store16_n(void* p, __m128i v, int n) {
    uint16_t tmp[8];
    _mm_storeu_si128(reinterpret_cast<__m128i*>(tmp), v);
    std::memcpy(p, tmp, size_t(n) * 2);
  }
  PTLLM_TARGET static F load_bf16(const void* p) { return from_bf16(load16(p)); }
  PTLLM_TARGET static F load_bf16_n(const void* p, int n) { return from_bf16(load16_n(p, n)); }
  PTLLM_TARGET static F load_f16(const void* p) { return _mm256_cvtph_ps(load16(p)); }
  PTLLM_TARGET static F load_f16_n(const void* p, int n) { return _mm256_cvtph_ps(load16_n(p, n)); }
  PTLLM_TARGET static void store_bf16(void* p, F v) { _mm_storeu_si128(static_cast<__m128i*>(p), to_bf16(v)); }
  PTLLM_TARGET static void store_bf16_n(void* p, F v, int n) { store16_n(p, to_bf16(v), n); }
  PTLLM_TARGET static __m128i to_f16(F v) { return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  PTLLM_TARGET static void store_f16(void* p, F v) { _mm_storeu_si128(static_cast<__m128i*>(p), to_f16(v)); }
  PTLLM_TARGET static void store_f16_n(void* p, F v, int n) { store16_n(p, to_f16(v), n); }

  // 8 codes: int8 from 8 bytes, int4 from 4 (low nibble first), int2 from 2 (low bits first).
  PTLLM_TARGET static F load_u8(const uint8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  PTLLM_TARGET static F load_u4(const uint8_t* p) {
    int32_t u;
    std::memcpy(&u, p, 4);
    const __m128i b = _mm_cvtsi32_si128(u);
    const __m128i m = _mm_set1_epi8(0x0f);
    const __m128i c = _mm_unpacklo_epi8(_mm_and_si128(b, m), _mm_and_si128(_mm_srli_epi16(b, 4), m));
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(c));
  }
  PTLLM_TARGET static F load_u2(const uint8_t* p) {
    uint16_t u;
    std::memcpy(&u, p, 2);
    const __m256i shifts = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    const __m256i c = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(u), shifts), _mm256_set1_epi32(3));
    return _mm256_cvtepi32_ps(c);
  }

  // 8 bytes of codes split by position in the byte (kernels_impl.h, "KIVI blocks"): int4 gives
  // the low nibbles (even channels) and the high ones (odd channels); int2 r[s] = bits 2s, 2s + 1.
  PTLLM_TARGET static __m256i bytes_u32(const uint8_t* p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  PTLLM_TARGET static void load_u4_split(const uint8_t* p, F& even, F& odd) {
    const __m256i x = bytes_u32(p);
    even = _mm256_cvtepi32_ps(_mm256_and_si256(x, _mm256_set1_epi32(0xf)));
    odd = _mm256_cvtepi32_ps(_mm256_srli_epi32(x, 4));
  }
  PTLLM_TARGET static void load_u2_split(const uint8_t* p, F* r) {
    const __m256i x = bytes_u32(p), m = _mm256_set1_epi32(3);
    r[0] = _mm256_cvtepi32_ps(_mm256_and_si256(x, m));
    r[1] = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(x, 2), m));
    r[2] = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(x, 4), m));
    r[3] = _mm256_cvtepi32_ps(_mm256_srli_epi32(x, 6));
  }
  // (a, b) as 16 lanes -> its even lanes and its odd lanes; interleave is the inverse.
  PTLLM_TARGET static void deinterleave(F a, F b, F& even, F& odd) {
    // Per 128-bit lane (a0 a2 b0 b2 | a4 a6 b4 b6), then the 64-bit pairs reordered.
    const __m256d e = _mm256_castps_pd(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)));
    const __m256d o = _mm256_castps_pd(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
    even = _mm256_castpd_ps(_mm256_permute4x64_pd(e, _MM_SHUFFLE(3, 1, 2, 0)));
    odd = _mm256_castpd_ps(_mm256_permute4x64_pd(o, _MM_SHUFFLE(3, 1, 2, 0)));
  }
  PTLLM_TARGET static void interleave(F even, F odd, F& a, F& b) {
    const F lo = _mm256_unpacklo_ps(even, odd), hi = _mm256_unpackhi_ps(even, odd);
    a = _mm256_permute2f128_ps(lo, hi, 0x20);
    b = _mm256_permute2f128_ps(lo, hi, 0x31);
  }

  // Consecutive chunks of 16 bf16 of a row, as (even elements, odd elements) in float32.
  // 16 bf16 from any address as (even elements, odd elements) in float32.
  PTLLM_TARGET static void bf16_pairs(const char* p, F& even, F& odd) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    odd = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(int(0xffff0000u))));
  }
  struct Bf16Rows {
    const char* p;
    explicit Bf16Rows(const char* row) : p(row) {}
    PTLLM_TARGET void next(F& even, F& odd) {
      bf16_pairs(p, even, odd);
      p += 32;
    }
  };

  PTLLM_TARGET static F round(F x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  PTLLM_TARGET static F ldexp_ge(F y, F n, F x, F lo) {
    const F p = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
    return _mm256_blendv_ps(_mm256_mul_ps(y, p), _mm256_setzero_ps(), _mm256_cmp_ps(x, lo, _CMP_LT_OQ));
  }

  // 8 x 8 transpose: pairs, quads within 128-bit lanes, then lanes.
  PTLLM_TARGET static void transpose(F* r) {
    F t[8], s[8];
    for (int i = 0; i < 4; ++i) {
      t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int g = 0; g < 2; ++g) {
      s[4 * g] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
      s[4 * g + 1] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0xee);
      s[4 * g + 2] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
      s[4 * g + 3] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xee);
    }
    for (int j = 0; j < 4; ++j) {
      r[j] = _mm256_permute2f128_ps(s[j], s[4 + j], 0x20);
      r[4 + j] = _mm256_permute2f128_ps(s[j], s[4 + j], 0x31);
    }
  }
};

}  // namespace
}  // namespace ptllm

#include "kernels/cpu/kernels_impl.h"

namespace ptllm {
namespace {
constexpr KernelTable kTable = make_table<Avx2>(SimdTarget::AVX2);
}
const KernelTable* avx2_kernel_table() { return &kTable; }
}  // namespace ptllm

#else
namespace ptllm {
const KernelTable* avx2_kernel_table() { return nullptr; }
}  // namespace ptllm
#endif
