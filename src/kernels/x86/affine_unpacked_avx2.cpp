// The affine products of bits 3, 5 and 6 (kernels/affine_q8.h, AffineUnpackedRows) for AVX2 (Haswell,
// Zen 1 and later; AVX-512 CPUs without VBMI too). A row's codes are unpacked to bytes once per call
// (6-bit codes 32 at a time: vpshufb gives each dword the 3 bytes of 4 codes, shifts and masks move
// the fields at bits 0, 6, 12, 18 to bytes 0-3), then every row of x is dotted with them: vpmaddubsw
// (codes below 64, no saturation) and vpmaddwd give a block of 32 columns in one register, scaled by
// its d_b s_g and summed in float.
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "kernels/affine_q8.h"
#include "kernels/simd.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define PTLLM_UNPACKED_TARGET __attribute__((target("avx2,fma,f16c")))

namespace ptllm {
namespace {

// 32 six-bit codes (the 24 bytes at p, none read past) as 32 bytes in column order.
PTLLM_UNPACKED_TARGET inline __m256i unpack6(const uint8_t* p) {
  // Low lane: bytes 0-15 (codes 0-15 in bytes 0-11); high lane: bytes 8-23 (codes 16-31 in 12-23).
  const __m256i v = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(p + 8), reinterpret_cast<const __m128i*>(p));
  const __m256i spread = _mm256_setr_epi8(0, 1, 2, 2, 3, 4, 5, 5, 6, 7, 8, 8, 9, 10, 11, 11,  //
                                          4, 5, 6, 6, 7, 8, 9, 9, 10, 11, 12, 12, 13, 14, 15, 15);
  const __m256i d = _mm256_shuffle_epi8(v, spread);  // dword j: codes 4j .. 4j + 3 at bits 0, 6, 12, 18
  const __m256i b0 = _mm256_and_si256(d, _mm256_set1_epi32(0x3f));
  const __m256i b1 = _mm256_and_si256(_mm256_slli_epi32(d, 2), _mm256_set1_epi32(0x3f00));
  const __m256i b2 = _mm256_and_si256(_mm256_slli_epi32(d, 4), _mm256_set1_epi32(0x3f0000));
  const __m256i b3 = _mm256_and_si256(_mm256_slli_epi32(d, 6), _mm256_set1_epi32(0x3f000000));
  return _mm256_or_si256(_mm256_or_si256(b0, b1), _mm256_or_si256(b2, b3));
}

// The integer sums of the 32 columns at c (codes below 64) and q, 4 columns a lane, as float.
PTLLM_UNPACKED_TARGET inline __m256 sums32(const uint8_t* c, const int8_t* q) {
  const __m256i p = _mm256_maddubs_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c)),
                                         _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)));
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}

PTLLM_UNPACKED_TARGET inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The codes' stream is asked for this far ahead (as the other products' weights, kernels/stream.h).
constexpr size_t kAhead = 4096;

PTLLM_UNPACKED_TARGET __m256i first(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

PTLLM_UNPACKED_TARGET void rows_avx2(const AffineX& ax, const WeightMatrix& w, const float* bias, float* y, int r0,
                                     int r1) {
  const int gs = w.group_size, G = w.cols / gs, K = w.cols, gshift = __builtin_ctz(unsigned(gs));
  thread_local std::vector<uint8_t> codes;
  thread_local std::vector<float> params;  // the row's scales [G] and biases [G]
  if (codes.size() < size_t(K)) codes.resize(size_t(K));
  if (params.size() < size_t(2 * G)) params.resize(size_t(2 * G));
  float* sc = params.data();
  float* bi = sc + G;
  for (int r = r0; r < r1; ++r) {
    const auto* row = static_cast<const uint8_t*>(w.data) + size_t(r) * w.row_bytes();
    if (w.bits == 6) {
      for (int k = 0; k < K; k += 32) {  // K: whole groups of at least 32
        const uint8_t* p = row + size_t(k) * 6 / 8;
        if (k % 64 == 0) __builtin_prefetch(p + kAhead);  // a line every 48 bytes: each line at least once
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes.data() + k), unpack6(p));
      }
    } else {
      affine_unpack_codes(w, r, codes.data());
    }
    const size_t g0 = size_t(r) * size_t(G), es = dtype_size(w.dtype);
    convert_to_f32(w.dtype, static_cast<const uint8_t*>(w.scales) + g0 * es, sc, size_t(G));
    convert_to_f32(w.dtype, static_cast<const uint8_t*>(w.biases) + g0 * es, bi, size_t(G));
    for (int t = 0; t < ax.T; ++t) {
      const int8_t* q = ax.q + size_t(t) * ax.ldq;
      const float* d = ax.d + size_t(t) * ax.ldd;
      __m256 acc = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
      int k = 0;
      for (; k + 64 <= K; k += 64) {  // two chains: the FMAs' latency, not their rate, bounds one
        acc = _mm256_fmadd_ps(sums32(codes.data() + k, q + k), _mm256_set1_ps(d[k / 32] * sc[k >> gshift]), acc);
        acc1 = _mm256_fmadd_ps(sums32(codes.data() + k + 32, q + k + 32),
                               _mm256_set1_ps(d[k / 32 + 1] * sc[(k + 32) >> gshift]), acc1);
      }
      if (k < K)
        acc = _mm256_fmadd_ps(sums32(codes.data() + k, q + k), _mm256_set1_ps(d[k / 32] * sc[k >> gshift]), acc);
      acc = _mm256_add_ps(acc, acc1);
      const float* xc = ax.xc + size_t(t) * ax.ldg;
      const float* xs = ax.xs + size_t(t) * ax.ldg;
      for (int g = 0; g < G; g += 8) {  // + s_g xc_g + b_g xs_g
        const __m256i m = first(G - g);
        acc = _mm256_fmadd_ps(_mm256_maskload_ps(sc + g, m), _mm256_maskload_ps(xc + g, m), acc);
        acc = _mm256_fmadd_ps(_mm256_maskload_ps(bi + g, m), _mm256_maskload_ps(xs + g, m), acc);
      }
      y[size_t(t) * size_t(w.rows) + size_t(r)] = hsum(acc) + (bias ? bias[r] : 0.f);
    }
  }
}

}  // namespace

AffineUnpackedRows affine_unpacked_rows_avx2() { return kernel_table(SimdTarget::AVX2) ? rows_avx2 : nullptr; }

}  // namespace ptllm
#else
namespace ptllm {
AffineUnpackedRows affine_unpacked_rows_avx2() { return nullptr; }
}  // namespace ptllm
#endif
