// The affine products for AVX2 + FMA + F16C, 32-byte registers: the traits of affine_impl.h,
// included by affine_avx2.cpp (PTLLM_AFFINE_AVXVNNI 0: bytes multiplied by vpmaddubsw, summed by
// vpmaddwd) and affine_avx2_vnni.cpp (1: AVX-VNNI's vpdpbusd, Alder Lake and Zen 5 on).
#include "kernels/affine_q8.h"

#if defined(__x86_64__)
#include <immintrin.h>

#if PTLLM_AFFINE_AVXVNNI
#define PTLLM_AFFINE_TARGET __attribute__((target("avx2,fma,f16c,avxvnni")))
#else
#define PTLLM_AFFINE_TARGET __attribute__((target("avx2,fma,f16c")))
#endif

namespace ptllm {
namespace {

struct Avx2Affine {
  using I = __m256i;
  using F = __m256;
  static constexpr int RB = 32, GTT = 2;  // 16 registers
  static constexpr int kPackedLineAhead = 4096;

  PTLLM_AFFINE_TARGET static I zero_i() { return _mm256_setzero_si256(); }
  PTLLM_AFFINE_TARGET static I load_i(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
  PTLLM_AFFINE_TARGET static I load_i_n(const void* p, int n) {
    alignas(32) uint8_t b[32] = {};
    std::memcpy(b, p, size_t(n));
    return load_i(b);
  }
  PTLLM_AFFINE_TARGET static I bcst32(const void* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
  }
  PTLLM_AFFINE_TARGET static I srl32(I v, int n) { return _mm256_srli_epi32(v, n); }
  PTLLM_AFFINE_TARGET static I sll32(I v, int n) { return _mm256_slli_epi32(v, n); }
  PTLLM_AFFINE_TARGET static I sra32(I v, int n) { return _mm256_srai_epi32(v, n); }
  PTLLM_AFFINE_TARGET static I and_i(I a, I b) { return _mm256_and_si256(a, b); }
  PTLLM_AFFINE_TARGET static I or_i(I a, I b) { return _mm256_or_si256(a, b); }
  PTLLM_AFFINE_TARGET static I add_i(I a, I b) { return _mm256_add_epi32(a, b); }
  PTLLM_AFFINE_TARGET static I set1_u8(uint8_t v) { return _mm256_set1_epi8(char(v)); }
#if PTLLM_AFFINE_AVXVNNI
  PTLLM_AFFINE_TARGET static I dot4(I acc, I u, I s) { return _mm256_dpbusd_avx_epi32(acc, u, s); }
  PTLLM_AFFINE_TARGET static I dot8(I acc, I u, I s) { return _mm256_dpbusd_avx_epi32(acc, u, s); }
#else
  // u < 16: a pair of products is at most 2 * 15 * 127, no saturation in 16 bits.
  PTLLM_AFFINE_TARGET static I dot4(I acc, I u, I s) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
  }
  // u < 256: by nibbles, each a dot4, the high one times 16.
  PTLLM_AFFINE_TARGET static I dot8(I acc, I u, I s) {
    const I m = _mm256_set1_epi8(0x0f);
    const I lo = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_and_si256(u, m), s), _mm256_set1_epi16(1));
    const I hi = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(u, 4), m), s),
                                   _mm256_set1_epi16(1));
    return _mm256_add_epi32(acc, _mm256_add_epi32(lo, _mm256_slli_epi32(hi, 4)));
  }
  // Byte products summed in 16-bit lanes (the packed product adds several before widening: with
  // codes below 16, eight products of pairs stay below 2^15): vpmaddubsw, vpaddw, vpmaddwd by ones.
  PTLLM_AFFINE_TARGET static I mul_pairs(I u, I s) { return _mm256_maddubs_epi16(u, s); }
  // Saturating, though the sums never reach 2^15: GCC does not reassociate these, where plain adds
  // became a tree over all of a block's products, spilled to the stack.
  PTLLM_AFFINE_TARGET static I add16(I a, I b) { return _mm256_adds_epi16(a, b); }
  PTLLM_AFFINE_TARGET static I widen16(I v) { return _mm256_madd_epi16(v, _mm256_set1_epi16(1)); }
  // The gemv's 8-bit codes centred: acc + the products of u - 128 (a signed byte whose sign moves
  // onto s, |u - 128| <= 128 the unsigned operand: pairs at most 2 * 128 * 127, no saturation), one
  // product where dot8 takes two (affine_impl.h, kCentred8).
  static constexpr bool kCentred8 = true;
  PTLLM_AFFINE_TARGET static I dot8c(I acc, I u, I s) {
    const I c = _mm256_xor_si256(u, _mm256_set1_epi8(char(0x80)));
    I sum = _mm256_add_epi32(
        acc, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(c, c), _mm256_sign_epi8(s, c)), _mm256_set1_epi16(1)));
    asm("" : "+x"(sum));  // a chain kept in order (as add16: reassociated, its products were spilled)
    return sum;
  }
#endif
  PTLLM_AFFINE_TARGET static F cvt(I v) { return _mm256_cvtepi32_ps(v); }
  PTLLM_AFFINE_TARGET static F zero_f() { return _mm256_setzero_ps(); }
  PTLLM_AFFINE_TARGET static F set1_f(float v) { return _mm256_set1_ps(v); }
  PTLLM_AFFINE_TARGET static I mask(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  PTLLM_AFFINE_TARGET static F load_f(const float* p) { return _mm256_loadu_ps(p); }
  PTLLM_AFFINE_TARGET static F load_f_n(const float* p, int n) { return _mm256_maskload_ps(p, mask(n)); }
  PTLLM_AFFINE_TARGET static void store_f(float* p, F v) { _mm256_storeu_ps(p, v); }
  PTLLM_AFFINE_TARGET static void store_f_n(float* p, F v, int n) { _mm256_maskstore_ps(p, mask(n), v); }
  PTLLM_AFFINE_TARGET static F add(F a, F b) { return _mm256_add_ps(a, b); }
  PTLLM_AFFINE_TARGET static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  PTLLM_AFFINE_TARGET static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  PTLLM_AFFINE_TARGET static F perm(F a, I idx) { return _mm256_permutevar8x32_ps(a, idx); }
  PTLLM_AFFINE_TARGET static float reduce_add(F v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  PTLLM_AFFINE_TARGET static __m128i load16_n(const uint16_t* p, int n) {
    if (n >= 8) return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));  // no stack copy to wait on
    alignas(16) uint16_t h[8] = {};
    std::memcpy(h, p, size_t(std::min(n, 8)) * 2);
    return _mm_load_si128(reinterpret_cast<const __m128i*>(h));
  }
  PTLLM_AFFINE_TARGET static F load_bf16_n(const uint16_t* p, int n) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(load16_n(p, n)), 16));
  }
  PTLLM_AFFINE_TARGET static F load_f16_n(const uint16_t* p, int n) { return _mm256_cvtph_ps(load16_n(p, n)); }
};

}  // namespace
}  // namespace ptllm

#include "kernels/cpu/affine_impl.h"
#endif
