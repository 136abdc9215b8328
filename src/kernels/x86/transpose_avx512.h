#pragma once
// A 16 x 16 transpose of 32-bit words in AVX-512 registers, shared by the kernels that need one
// (kernels_avx512.cpp's float tiles, the affine gemm's code tiles, the AMX products' packing and
// output tiles): pairs, then quads within 128-bit lanes, then the lanes. Included only by
// translation units that compile AVX-512 code; the caller's target must include avx512f.
#if defined(__x86_64__)
#include <immintrin.h>

// GCC 12 reports the _mm512_undefined_* placeholders inside its own intrinsics as uninitialized
// (GCC PR 105593), as the files that include this one do.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace ptllm {

// r[i] lane j -> r[j] lane i, in place.
__attribute__((target("avx512f"))) static inline void transpose16_epi32(__m512i* r) {
  __m512i t[16], s[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int g = 0; g < 4; ++g) {  // s[4g + j], lane L: word 4L + j of rows 4g .. 4g + 3
    s[4 * g] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    s[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    s[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    s[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  for (int j = 0; j < 4; ++j) {
    const __m512i p = _mm512_shuffle_i32x4(s[j], s[4 + j], 0x44), q = _mm512_shuffle_i32x4(s[j], s[4 + j], 0xee);
    const __m512i p2 = _mm512_shuffle_i32x4(s[8 + j], s[12 + j], 0x44);
    const __m512i q2 = _mm512_shuffle_i32x4(s[8 + j], s[12 + j], 0xee);
    r[j] = _mm512_shuffle_i32x4(p, p2, 0x88);
    r[4 + j] = _mm512_shuffle_i32x4(p, p2, 0xdd);
    r[8 + j] = _mm512_shuffle_i32x4(q, q2, 0x88);
    r[12 + j] = _mm512_shuffle_i32x4(q, q2, 0xdd);
  }
}

// The same for floats.
__attribute__((target("avx512f"))) static inline void transpose16_ps(__m512* r) {
  __m512i w[16];
  for (int i = 0; i < 16; ++i) w[i] = _mm512_castps_si512(r[i]);
  transpose16_epi32(w);
  for (int i = 0; i < 16; ++i) r[i] = _mm512_castsi512_ps(w[i]);
}

}  // namespace ptllm
#endif
