// The affine products for AArch64 NEON, 16-byte registers: the traits of cpu/affine_impl.h, included by
// affine_neon.cpp (PTLLM_AFFINE_NEON_DOT 0: byte products widened to 16 bits and summed in pairs),
// affine_neon_dotprod.cpp (1: sdot, ARMv8.2 dotprod) and affine_neon_i8mm.cpp (2: usdot, i8mm).
// Every variant's sums are the same exact integers.
#include "kernels/affine_q8.h"
#include "kernels/arm/arm_target.h"

#if defined(__aarch64__)
#include <arm_neon.h>

#include <algorithm>
#include <cstring>

#if PTLLM_AFFINE_NEON_DOT == 2
#define PTLLM_AFFINE_TARGET PTLLM_ARM_TARGET_I8MM
#elif PTLLM_AFFINE_NEON_DOT == 1
#define PTLLM_AFFINE_TARGET PTLLM_ARM_TARGET_DOTPROD
#else
#define PTLLM_AFFINE_TARGET
#endif

namespace ptllm {
namespace {

struct NeonAffine {
  using I = int32x4_t;
  using F = float32x4_t;
  static constexpr int RB = 16, GTT = 4;  // 32 registers

  PTLLM_AFFINE_TARGET static I zero_i() { return vdupq_n_s32(0); }
  PTLLM_AFFINE_TARGET static I load_i(const void* p) { return vld1q_s32(static_cast<const int32_t*>(p)); }
  PTLLM_AFFINE_TARGET static I load_i_n(const void* p, int n) {
    alignas(16) uint8_t b[16] = {};
    std::memcpy(b, p, size_t(n));
    return load_i(b);
  }
  PTLLM_AFFINE_TARGET static I bcst32(const void* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return vdupq_n_s32(v);
  }
  PTLLM_AFFINE_TARGET static I srl32(I v, int n) {
    return vreinterpretq_s32_u32(vshlq_u32(vreinterpretq_u32_s32(v), vdupq_n_s32(-n)));
  }
  PTLLM_AFFINE_TARGET static I and_i(I a, I b) { return vandq_s32(a, b); }
  PTLLM_AFFINE_TARGET static I add_i(I a, I b) { return vaddq_s32(a, b); }
  PTLLM_AFFINE_TARGET static I set1_u8(uint8_t v) { return vreinterpretq_s32_u8(vdupq_n_u8(v)); }
#if PTLLM_AFFINE_NEON_DOT == 2
  // usdot: unsigned bytes times signed bytes, four a lane.
  PTLLM_AFFINE_TARGET static I dot8(I acc, I u, I s) {
    return vusdotq_s32(acc, vreinterpretq_u8_s32(u), vreinterpretq_s8_s32(s));
  }
  PTLLM_AFFINE_TARGET static I dot4(I acc, I u, I s) { return dot8(acc, u, s); }
#elif PTLLM_AFFINE_NEON_DOT == 1
  // u < 16 is a signed byte as it is.
  PTLLM_AFFINE_TARGET static I dot4(I acc, I u, I s) {
    return vdotq_s32(acc, vreinterpretq_s8_s32(u), vreinterpretq_s8_s32(s));
  }
  // u < 256: by nibbles, each an sdot, the high one times 16.
  PTLLM_AFFINE_TARGET static I dot8(I acc, I u, I s) {
    const uint8x16_t b = vreinterpretq_u8_s32(u);
    const int8x16_t lo = vreinterpretq_s8_u8(vandq_u8(b, vdupq_n_u8(15))), hi = vreinterpretq_s8_u8(vshrq_n_u8(b, 4));
    const int8x16_t q = vreinterpretq_s8_s32(s);
    const I h = vdotq_s32(vdupq_n_s32(0), hi, q);
    return vdotq_s32(vaddq_s32(acc, vshlq_n_s32(h, 4)), lo, q);
  }
#else
  // 16-bit products (at most 255 * 127), summed in pairs twice.
  PTLLM_AFFINE_TARGET static I dot8(I acc, I u, I s) {
    const uint8x16_t b = vreinterpretq_u8_s32(u);
    const int8x16_t q = vreinterpretq_s8_s32(s);
    const int16x8_t lo = vmulq_s16(vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(b))), vmovl_s8(vget_low_s8(q)));
    const int16x8_t hi = vmulq_s16(vreinterpretq_s16_u16(vmovl_high_u8(b)), vmovl_high_s8(q));
    return vaddq_s32(acc, vpaddq_s32(vpaddlq_s16(lo), vpaddlq_s16(hi)));
  }
  PTLLM_AFFINE_TARGET static I dot4(I acc, I u, I s) { return dot8(acc, u, s); }
#endif
  PTLLM_AFFINE_TARGET static F cvt(I v) { return vcvtq_f32_s32(v); }
  PTLLM_AFFINE_TARGET static F zero_f() { return vdupq_n_f32(0.f); }
  PTLLM_AFFINE_TARGET static F set1_f(float v) { return vdupq_n_f32(v); }
  PTLLM_AFFINE_TARGET static F load_f(const float* p) { return vld1q_f32(p); }
  PTLLM_AFFINE_TARGET static F load_f_n(const float* p, int n) {
    float t[4] = {};
    std::memcpy(t, p, size_t(std::min(n, 4)) * 4);
    return vld1q_f32(t);
  }
  PTLLM_AFFINE_TARGET static void store_f(float* p, F v) { vst1q_f32(p, v); }
  PTLLM_AFFINE_TARGET static void store_f_n(float* p, F v, int n) {
    float t[4];
    vst1q_f32(t, v);
    std::memcpy(p, t, size_t(std::min(n, 4)) * 4);
  }
  PTLLM_AFFINE_TARGET static F add(F a, F b) { return vaddq_f32(a, b); }
  PTLLM_AFFINE_TARGET static F mul(F a, F b) { return vmulq_f32(a, b); }
  PTLLM_AFFINE_TARGET static F fma(F a, F b, F c) { return vfmaq_f32(c, a, b); }
  // Lanes of a picked by idx (each 0..3): a table lookup on the 16 bytes.
  PTLLM_AFFINE_TARGET static F perm(F a, I idx) {
    const uint8x16_t i4 = vmulq_u8(vreinterpretq_u8_u32(vmulq_n_u32(vreinterpretq_u32_s32(idx), 0x01010101u)),
                                   vdupq_n_u8(4));
    const uint8x16_t bytes = vaddq_u8(i4, vreinterpretq_u8_u32(vdupq_n_u32(0x03020100u)));
    return vreinterpretq_f32_u8(vqtbl1q_u8(vreinterpretq_u8_f32(a), bytes));
  }
  PTLLM_AFFINE_TARGET static float reduce_add(F v) { return vaddvq_f32(v); }
  PTLLM_AFFINE_TARGET static uint16x4_t load16_n(const uint16_t* p, int n) {
    uint16_t h[4] = {};
    std::memcpy(h, p, size_t(std::min(n, 4)) * 2);
    return vld1_u16(h);
  }
  PTLLM_AFFINE_TARGET static F load_bf16_n(const uint16_t* p, int n) {
    return vreinterpretq_f32_u32(vshll_n_u16(load16_n(p, n), 16));
  }
  PTLLM_AFFINE_TARGET static F load_f16_n(const uint16_t* p, int n) {
    return vcvt_f32_f16(vreinterpret_f16_u16(load16_n(p, n)));
  }
};

}  // namespace
}  // namespace ptllm

#include "kernels/cpu/affine_impl.h"
#endif
