// The kernels for AArch64 Advanced SIMD (NEON, every ARMv8-A core): 4 floats a register, 32
// registers, fused multiply-add and IEEE half <-> single conversions in the base instruction set.
#include "kernels/simd.h"

#if defined(__aarch64__)
#include <arm_neon.h>

#include <cstring>

#define PTLLM_TARGET

namespace ptllm {
namespace {

struct Neon {
  using F = float32x4_t;
  static constexpr int N = 4;
  // gemm tile 6 x 16: 24 accumulators, 4 weight registers and a broadcast of the 32 registers.
  static constexpr int MR = 6, NRV = 4;
  static constexpr int GT = 4;  // 32 registers, as AVX-512

  static F zero() { return vdupq_n_f32(0.f); }
  static F set1(float v) { return vdupq_n_f32(v); }
  static F load(const float* p) { return vld1q_f32(p); }
  static F load_n(const float* p, int n) {
    float t[4] = {};
    std::memcpy(t, p, size_t(n) * sizeof(float));
    return vld1q_f32(t);
  }
  static void store(float* p, F v) { vst1q_f32(p, v); }
  static void store_n(float* p, F v, int n) {
    float t[4];
    vst1q_f32(t, v);
    std::memcpy(p, t, size_t(n) * sizeof(float));
  }

  static F add(F a, F b) { return vaddq_f32(a, b); }
  static F sub(F a, F b) { return vsubq_f32(a, b); }
  static F mul(F a, F b) { return vmulq_f32(a, b); }
  static F div(F a, F b) { return vdivq_f32(a, b); }
  static F fma(F a, F b, F c) { return vfmaq_f32(c, a, b); }
  static F fnma(F a, F b, F c) { return vfmsq_f32(c, a, b); }
  // As x86's minps/maxps and the portable a < b ? a : b: the second operand where either is NaN.
  static F min(F a, F b) { return vbslq_f32(vcltq_f32(a, b), a, b); }
  static F max(F a, F b) { return vbslq_f32(vcgtq_f32(a, b), a, b); }
  // faddp twice: (v0 + v1) + (v2 + v3), the portable target's order.
  static float reduce_add(F v) { return vaddvq_f32(v); }
  static void reduce_add4(F a, F b, F c, F d, float* out) {
    vst1q_f32(out, vpaddq_f32(vpaddq_f32(a, b), vpaddq_f32(c, d)));
  }
  static float reduce_max(F v) {
    const F h = max(v, vextq_f32(v, v, 2));
    return max(h, vextq_f32(h, h, 1))[0];
  }

  static F from_bf16(uint16x4_t h) { return vreinterpretq_f32_u32(vshll_n_u16(h, 16)); }
  // Round to nearest even, quiet NaNs (as torch), then the 4 high halves.
  static uint16x4_t to_bf16(F v) {
    const uint32x4_t b = vreinterpretq_u32_f32(v);
    const uint32x4_t hi = vshrq_n_u32(b, 16);
    const uint32x4_t lsb = vandq_u32(hi, vdupq_n_u32(1));
    const uint32x4_t r = vshrq_n_u32(vaddq_u32(b, vaddq_u32(vdupq_n_u32(0x7fff), lsb)), 16);
    const uint32x4_t ok = vceqq_f32(v, v);
    return vmovn_u32(vbslq_u32(ok, r, vorrq_u32(hi, vdupq_n_u32(0x40))));
  }
  static uint16x4_t load16_n(const void* p, int n) {
    uint16_t t[4] = {};
    std::memcpy(t, p, size_t(n) * 2);
    return vld1_u16(t);
  }
  static void store16_n(void* p, uint16x4_t v, int n) {
    uint16_t t[4];
    vst1_u16(t, v);
    std::memcpy(p, t, size_t(n) * 2);
  }
  static uint16x4_t load16(const void* p) {
    uint16x4_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  static F load_bf16(const void* p) { return from_bf16(load16(p)); }
  static F load_bf16_n(const void* p, int n) { return from_bf16(load16_n(p, n)); }
  static F load_f16(const void* p) { return vcvt_f32_f16(vreinterpret_f16_u16(load16(p))); }
  static F load_f16_n(const void* p, int n) { return vcvt_f32_f16(vreinterpret_f16_u16(load16_n(p, n))); }
  static void store_bf16(void* p, F v) { store16_n(p, to_bf16(v), 4); }
  static void store_bf16_n(void* p, F v, int n) { store16_n(p, to_bf16(v), n); }
  // fcvtn rounds by FPCR: to nearest even unless a program changed it.
  static uint16x4_t to_f16(F v) { return vreinterpret_u16_f16(vcvt_f16_f32(v)); }
  static void store_f16(void* p, F v) { store16_n(p, to_f16(v), 4); }
  static void store_f16_n(void* p, F v, int n) { store16_n(p, to_f16(v), n); }

  // 4 bytes, each widened to a 32-bit lane.
  static uint32x4_t bytes_u32(const uint8_t* p) {
    uint32_t w;
    std::memcpy(&w, p, 4);
    return vmovl_u16(vget_low_u16(vmovl_u8(vcreate_u8(w))));
  }
  static F cvt(uint32x4_t v) { return vcvtq_f32_u32(v); }
  // 4 codes: int8 from 4 bytes, int4 from 2 (low nibble first), int2 from 1 (low bits first).
  static F load_u8(const uint8_t* p) { return cvt(bytes_u32(p)); }
  static F load_u4(const uint8_t* p) {
    const uint32_t t[4] = {uint32_t(p[0] & 15), uint32_t(p[0] >> 4), uint32_t(p[1] & 15), uint32_t(p[1] >> 4)};
    return cvt(vld1q_u32(t));
  }
  static F load_u2(const uint8_t* p) {
    const int32_t s[4] = {0, -2, -4, -6};
    return cvt(vandq_u32(vshlq_u32(vdupq_n_u32(p[0]), vld1q_s32(s)), vdupq_n_u32(3)));
  }
  // 4 bytes of codes split by position in the byte (kernels_impl.h, "KIVI blocks").
  static void load_u4_split(const uint8_t* p, F& even, F& odd) {
    const uint32x4_t x = bytes_u32(p);
    even = cvt(vandq_u32(x, vdupq_n_u32(15)));
    odd = cvt(vshrq_n_u32(x, 4));
  }
  static void load_u2_split(const uint8_t* p, F* r) {
    const uint32x4_t x = bytes_u32(p), m = vdupq_n_u32(3);
    r[0] = cvt(vandq_u32(x, m));
    r[1] = cvt(vandq_u32(vshrq_n_u32(x, 2), m));
    r[2] = cvt(vandq_u32(vshrq_n_u32(x, 4), m));
    r[3] = cvt(vshrq_n_u32(x, 6));
  }
  static void deinterleave(F a, F b, F& even, F& odd) {
    even = vuzp1q_f32(a, b);
    odd = vuzp2q_f32(a, b);
  }
  static void interleave(F even, F odd, F& a, F& b) {
    a = vzip1q_f32(even, odd);
    b = vzip2q_f32(even, odd);
  }

  // 8 bf16 from any address as (even elements, odd elements) in float32.
  static void bf16_pairs(const char* p, F& even, F& odd) {
    const uint32x4_t u = vld1q_u32(reinterpret_cast<const uint32_t*>(p));
    even = vreinterpretq_f32_u32(vshlq_n_u32(u, 16));
    odd = vreinterpretq_f32_u32(vandq_u32(u, vdupq_n_u32(0xffff0000u)));
  }
  struct Bf16Rows {
    const char* p;
    explicit Bf16Rows(const char* row) : p(row) {}
    void next(F& even, F& odd) {
      bf16_pairs(p, even, odd);
      p += 16;
    }
  };

  static F round(F x) { return vrndnq_f32(x); }
  static F ldexp_ge(F y, F n, F x, F lo) {
    const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    const F r = vmulq_f32(y, vreinterpretq_f32_s32(e));
    return vbslq_f32(vcltq_f32(x, lo), vdupq_n_f32(0.f), r);
  }

  // 4 x 4 transpose: 32-bit pairs, then 64-bit pairs.
  static void transpose(F* r) {
    const F t0 = vtrn1q_f32(r[0], r[1]), t1 = vtrn2q_f32(r[0], r[1]);
    const F t2 = vtrn1q_f32(r[2], r[3]), t3 = vtrn2q_f32(r[2], r[3]);
    r[0] = vreinterpretq_f32_f64(vtrn1q_f64(vreinterpretq_f64_f32(t0), vreinterpretq_f64_f32(t2)));
    r[1] = vreinterpretq_f32_f64(vtrn1q_f64(vreinterpretq_f64_f32(t1), vreinterpretq_f64_f32(t3)));
    r[2] = vreinterpretq_f32_f64(vtrn2q_f64(vreinterpretq_f64_f32(t0), vreinterpretq_f64_f32(t2)));
    r[3] = vreinterpretq_f32_f64(vtrn2q_f64(vreinterpretq_f64_f32(t1), vreinterpretq_f64_f32(t3)));
  }
};

}  // namespace
}  // namespace ptllm

#include "kernels/cpu/kernels_impl.h"

#include "kernels/cpu/features.h"

namespace ptllm {
// kernels_neon_bf16.cpp: BF16 weights with bfdot (gemv) and bfmmla (gemm, x packed by pack_a in
// panels of MR rows and blocks of KC columns), x split into two bf16 numbers.
void neon_bf16_gemv(const float* x, int T, const WeightMatrix& w, const float* bias, float* y, int r0, int r1);
void neon_bf16_gemm(const float* ap, int MR, int KC, int T, const WeightMatrix& w, const float* bias, float* y, int r0,
                    int r1);
namespace {
constexpr KernelTable kTable = make_table<Neon>(SimdTarget::NEON);
void gemv_bf16(const float* x, const float* xd, int T, const WeightMatrix& w, const float* bias, float* y, int r0,
               int r1) {
  if (w.dtype == DType::BF16) return neon_bf16_gemv(x, T, w, bias, y, r0, r1);
  kTable.gemv(x, xd, T, w, bias, y, r0, r1);
}
void gemm_bf16(const float* ap, int T, const WeightMatrix& w, const float* bias, float* y, int r0, int r1) {
  if (w.dtype == DType::BF16) return neon_bf16_gemm(ap, Kernels<Neon>::MR, Kernels<Neon>::KC, T, w, bias, y, r0, r1);
  kTable.gemm(ap, T, w, bias, y, r0, r1);
}
constexpr KernelTable with_bf16(KernelTable t) {
  t.gemv = gemv_bf16;
  t.gemm = gemm_bf16;
  t.variant = "+bf16";
  return t;
}
constexpr KernelTable kTableBf16 = with_bf16(kTable);
}  // namespace
const KernelTable* neon_kernel_table() {
  static const bool bf16 = cpu_features().bf16;
  return bf16 ? &kTableBf16 : &kTable;
}
}  // namespace ptllm

#else
namespace ptllm {
const KernelTable* neon_kernel_table() { return nullptr; }
}  // namespace ptllm
#endif
