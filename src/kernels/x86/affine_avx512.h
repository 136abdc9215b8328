// The affine products for AVX-512 (F/BW/VL/DQ), 64-byte registers: the traits of affine_impl.h,
// included by affine_avx512.cpp (PTLLM_AFFINE_VNNI 0: bytes multiplied by vpmaddubsw, summed by
// vpmaddwd) and affine_avx512_vnni.cpp (1: vpdpbusd, four byte products summed a lane at once).
#include "kernels/affine_q8.h"
#include "kernels/x86/transpose_avx512.h"

#if defined(__x86_64__)
#include <immintrin.h>

// GCC 12 reports the _mm512_undefined_* placeholders inside its own intrinsics as uninitialized
// (GCC PR 105593), as in kernels_avx512.cpp.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#if PTLLM_AFFINE_VNNI
#define PTLLM_AFFINE_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
#else
#define PTLLM_AFFINE_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#endif

namespace ptllm {
namespace {

struct Avx512Affine {
  using I = __m512i;
  using F = __m512;
  static constexpr int RB = 64, GTT = 4;
  static constexpr int kPackedLineAhead = 4096;
  static constexpr bool kPackedTouch = true;

  PTLLM_AFFINE_TARGET static I zero_i() { return _mm512_setzero_si512(); }
  PTLLM_AFFINE_TARGET static I load_i(const void* p) { return _mm512_loadu_si512(p); }
  PTLLM_AFFINE_TARGET static I load_i_n(const void* p, int n) {
    return _mm512_maskz_loadu_epi8(n >= 64 ? ~__mmask64(0) : (__mmask64(1) << n) - 1, p);
  }
  PTLLM_AFFINE_TARGET static I bcst32(const void* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
  }
  PTLLM_AFFINE_TARGET static I srl32(I v, int n) { return _mm512_srli_epi32(v, unsigned(n)); }
  PTLLM_AFFINE_TARGET static I sll32(I v, int n) { return _mm512_slli_epi32(v, unsigned(n)); }
  PTLLM_AFFINE_TARGET static I sra32(I v, int n) { return _mm512_srai_epi32(v, unsigned(n)); }
  PTLLM_AFFINE_TARGET static I and_i(I a, I b) { return _mm512_and_si512(a, b); }
  PTLLM_AFFINE_TARGET static I or_i(I a, I b) { return _mm512_or_si512(a, b); }
  PTLLM_AFFINE_TARGET static I add_i(I a, I b) { return _mm512_add_epi32(a, b); }
  PTLLM_AFFINE_TARGET static I set1_u8(uint8_t v) { return _mm512_set1_epi8(char(v)); }
#if PTLLM_AFFINE_VNNI
  PTLLM_AFFINE_TARGET static I dot4(I acc, I u, I s) { return _mm512_dpbusd_epi32(acc, u, s); }
  PTLLM_AFFINE_TARGET static I dot8(I acc, I u, I s) { return _mm512_dpbusd_epi32(acc, u, s); }
#else
  // u < 64 (4- and 6-bit codes): a pair of products is at most 2 * 63 * 127, no saturation in 16 bits.
  PTLLM_AFFINE_TARGET static I dot4(I acc, I u, I s) {
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)));
  }
  // u < 256: by nibbles, each a dot4, the high one times 16.
  PTLLM_AFFINE_TARGET static I dot8(I acc, I u, I s) {
    const I m = _mm512_set1_epi8(0x0f);
    const I lo = _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_and_si512(u, m), s), _mm512_set1_epi16(1));
    const I hi = _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_and_si512(_mm512_srli_epi16(u, 4), m), s),
                                   _mm512_set1_epi16(1));
    return _mm512_add_epi32(acc, _mm512_add_epi32(lo, _mm512_slli_epi32(hi, 4)));
  }
#endif
  PTLLM_AFFINE_TARGET static F cvt(I v) { return _mm512_cvtepi32_ps(v); }
  PTLLM_AFFINE_TARGET static F zero_f() { return _mm512_setzero_ps(); }
  PTLLM_AFFINE_TARGET static F set1_f(float v) { return _mm512_set1_ps(v); }
  PTLLM_AFFINE_TARGET static __mmask16 mask(int n) { return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1u); }
  PTLLM_AFFINE_TARGET static F load_f(const float* p) { return _mm512_loadu_ps(p); }
  PTLLM_AFFINE_TARGET static F load_f_n(const float* p, int n) { return _mm512_maskz_loadu_ps(mask(n), p); }
  PTLLM_AFFINE_TARGET static void store_f(float* p, F v) { _mm512_storeu_ps(p, v); }
  PTLLM_AFFINE_TARGET static void store_f_n(float* p, F v, int n) { _mm512_mask_storeu_ps(p, mask(n), v); }
  PTLLM_AFFINE_TARGET static F add(F a, F b) { return _mm512_add_ps(a, b); }
  PTLLM_AFFINE_TARGET static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  PTLLM_AFFINE_TARGET static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  PTLLM_AFFINE_TARGET static F perm(F a, I idx) { return _mm512_permutexvar_ps(idx, a); }
  PTLLM_AFFINE_TARGET static float reduce_add(F v) { return _mm512_reduce_add_ps(v); }
  PTLLM_AFFINE_TARGET static F load_bf16_n(const uint16_t* p, int n) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask(n), p)), 16));
  }
  PTLLM_AFFINE_TARGET static F load_f16_n(const uint16_t* p, int n) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask(n), p));
  }
  // out[q][i] = dword q of rows[i] (null: 0), q < n, 16 dwords of 16 rows at a time
  // (transpose_avx512.h).
  PTLLM_AFFINE_TARGET static void transpose_dwords(const uint8_t* const* rows, int n, uint32_t (*out)[16]) {
    for (int q0 = 0; q0 < n; q0 += 16) {
      const __mmask16 m = mask(n - q0);
      I r[16];
      for (int i = 0; i < 16; ++i) r[i] = rows[i] ? _mm512_maskz_loadu_epi32(m, rows[i] + 4 * q0) : zero_i();
      transpose16_epi32(r);
      for (int j = 0; j < std::min(16, n - q0); ++j) _mm512_storeu_si512(out[q0 + j], r[j]);
    }
  }
};

}  // namespace
}  // namespace ptllm

#include "kernels/cpu/affine_impl.h"
#endif
