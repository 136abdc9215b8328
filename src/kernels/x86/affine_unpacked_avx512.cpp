// The affine products of bits 3, 5 and 6 (kernels/affine_q8.h, AffineUnpackedRows) for AVX-512 with
// VNNI and VBMI (Ice Lake, Zen 4 and later). A row's codes are unpacked to bytes once per call (6-bit
// codes 64 at a time: vpermb gives each dword the 3 bytes of 4 codes, vpmultishiftqb picks the 6-bit
// fields at bits 0, 6, 12, 18 of each dword), then every row of x is dotted with them by vpdpbusd, a
// register of 64 columns (two blocks of 32) scaled by its blocks' d_b s_g and summed in float.
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "kernels/affine_q8.h"
#include "kernels/cpu/features.h"
#include "kernels/simd.h"

#if defined(__x86_64__)
#include <immintrin.h>

// GCC 12 reports the _mm512_undefined_* placeholders inside its own intrinsics as uninitialized
// (GCC PR 105593), as in kernels_avx512.cpp.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#define PTLLM_UNPACKED_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi,avx2,fma,f16c")))

namespace ptllm {
namespace {

// 64 six-bit codes (48 bytes at p) as 64 bytes in column order.
PTLLM_UNPACKED_TARGET inline __m512i unpack6(const uint8_t* p) {
  alignas(64) static const uint8_t spread[64] = {
      0,  1,  2,  2,  3,  4,  5,  5,  6,  7,  8,  8,  9,  10, 11, 11, 12, 13, 14, 14, 15, 16,
      17, 17, 18, 19, 20, 20, 21, 22, 23, 23, 24, 25, 26, 26, 27, 28, 29, 29, 30, 31, 32, 32,
      33, 34, 35, 35, 36, 37, 38, 38, 39, 40, 41, 41, 42, 43, 44, 44, 45, 46, 47, 47};
  const __m512i v = _mm512_maskz_loadu_epi8((__mmask64(1) << 48) - 1, p);
  const __m512i d = _mm512_permutexvar_epi8(_mm512_load_si512(spread), v);
  // Per qword (two dwords of 24 bits each): the byte at bit offsets 0, 6, 12, 18, 32, 38, 44, 50.
  const __m512i fields = _mm512_set1_epi64(0x322C2620120C0600LL);
  return _mm512_and_si512(_mm512_multishift_epi64_epi8(fields, d), _mm512_set1_epi8(0x3F));
}

// The integer sums of 64 columns (codes c, int8 x q, the first bits of qm), as float: lanes 0-7 the
// first block of 32, lanes 8-15 the second.
PTLLM_UNPACKED_TARGET inline __m512 sums64(const uint8_t* c, const int8_t* q, __mmask64 qm) {
  return _mm512_cvtepi32_ps(
      _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_loadu_si512(c), _mm512_maskz_loadu_epi8(qm, q)));
}

// d_b s_g of the blocks of columns k .. k + 63, spread to their lanes: s_g from sc, the groups' scales
// (groups of 32, or of 2^gshift columns).
PTLLM_UNPACKED_TARGET inline __m512 scale64(const float* d, const float* sc, int k, bool g32, int gshift,
                                            __m512i halves) {
  const __m128 s = g32 ? _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(sc + k / 32)))
                       : _mm_set1_ps(sc[k >> gshift]);
  const __m128 ds2 = _mm_mul_ps(_mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(d + k / 32))), s);
  return _mm512_permutexvar_ps(halves, _mm512_castps128_ps512(ds2));
}

PTLLM_UNPACKED_TARGET void rows_avx512vbmi(const AffineX& ax, const WeightMatrix& w, const float* bias, float* y,
                                           int r0, int r1) {
  const int gs = w.group_size, G = w.cols / gs, K = w.cols;
  thread_local std::vector<uint8_t> codes;
  thread_local std::vector<float> params;  // the row's scales [G + 2] and biases [G]
  // K + 64: a 32-column tail reads a whole register; the bytes past K meet zeroed x (masked loads).
  if (codes.size() < size_t(K) + 64) codes.resize(size_t(K) + 64);
  if (params.size() < size_t(2 * G + 2)) params.resize(size_t(2 * G + 2));
  float* sc = params.data();
  float* bi = sc + G + 2;
  // Lanes 0-7 take the first block of 32 columns, lanes 8-15 the second.
  const __m512i halves = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  for (int r = r0; r < r1; ++r) {
    const auto* row = static_cast<const uint8_t*>(w.data) + size_t(r) * w.row_bytes();
    if (w.bits == 6) {
      int k = 0;
      for (; k + 64 <= K; k += 64) _mm512_storeu_si512(codes.data() + k, unpack6(row + size_t(k) * 6 / 8));
      if (k < K) {  // 32 columns left: the 24 bytes of their codes
        uint8_t tail[48] = {};
        std::memcpy(tail, row + size_t(k) * 6 / 8, size_t(K - k) * 6 / 8);
        _mm512_storeu_si512(codes.data() + k, unpack6(tail));
      }
    } else {
      affine_unpack_codes(w, r, codes.data());
    }
    const size_t g0 = size_t(r) * size_t(G);
    const size_t es = dtype_size(w.dtype);
    convert_to_f32(w.dtype, static_cast<const uint8_t*>(w.scales) + g0 * es, sc, size_t(G));
    convert_to_f32(w.dtype, static_cast<const uint8_t*>(w.biases) + g0 * es, bi, size_t(G));
    // The scale of each block of 32 columns: with groups of 32 the groups' own (a register's two
    // blocks: two groups), with wider groups (a power of two, at least 64) their group's, both blocks.
    const bool g32 = gs == 32;
    const int gshift = __builtin_ctz(unsigned(gs));
    sc[G] = sc[G + 1] = 0.f;  // read past the last block when K is an odd multiple of 32
    for (int t = 0; t < ax.T; ++t) {
      const int8_t* q = ax.q + size_t(t) * ax.ldq;
      const float* d = ax.d + size_t(t) * ax.ldd;
      __m512 acc = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
      int k = 0;
      for (; k + 128 <= K; k += 128) {  // two chains: the FMAs' latency, not their rate, bounds one
        acc = _mm512_fmadd_ps(sums64(codes.data() + k, q + k, ~__mmask64(0)), scale64(d, sc, k, g32, gshift, halves), acc);
        acc1 = _mm512_fmadd_ps(sums64(codes.data() + k + 64, q + k + 64, ~__mmask64(0)),
                               scale64(d, sc, k + 64, g32, gshift, halves), acc1);
      }
      for (; k < K; k += 64)
        acc = _mm512_fmadd_ps(sums64(codes.data() + k, q + k, k + 64 <= K ? ~__mmask64(0) : (__mmask64(1) << (K - k)) - 1),
                              scale64(d, sc, k, g32, gshift, halves), acc);
      acc = _mm512_add_ps(acc, acc1);
      const float* xc = ax.xc + size_t(t) * ax.ldg;
      const float* xs = ax.xs + size_t(t) * ax.ldg;
      for (int g = 0; g < G; g += 16) {  // + s_g xc_g + b_g xs_g
        const __mmask16 m = G - g >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (G - g)) - 1);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, sc + g), _mm512_maskz_loadu_ps(m, xc + g), acc);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, bi + g), _mm512_maskz_loadu_ps(m, xs + g), acc);
      }
      y[size_t(t) * size_t(w.rows) + size_t(r)] = _mm512_reduce_add_ps(acc) + (bias ? bias[r] : 0.f);
    }
  }
}

}  // namespace

AffineUnpackedRows affine_unpacked_rows_avx512vbmi() {
  static const bool ok =
      kernel_table(SimdTarget::AVX512) != nullptr && cpu_features().avx512vnni && cpu_features().avx512vbmi;
  return ok ? rows_avx512vbmi : nullptr;
}

}  // namespace ptllm
#else
namespace ptllm {
AffineUnpackedRows affine_unpacked_rows_avx512vbmi() { return nullptr; }
}  // namespace ptllm
#endif
