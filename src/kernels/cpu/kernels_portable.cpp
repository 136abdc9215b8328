// The portable kernels: GCC/Clang vector extensions (4 floats), lowered to whatever SIMD the
// baseline target has (SSE2 on x86-64, NEON on AArch64). The fallback when no faster target runs.
#include <cstring>

#include "core/dtype.h"
#include "kernels/simd.h"

#define PTLLM_TARGET

namespace ptllm {
namespace {

struct Portable {
  typedef float F __attribute__((vector_size(16)));
  typedef int32_t I __attribute__((vector_size(16)));
  typedef uint32_t U __attribute__((vector_size(16)));
  static constexpr int N = 4;
  static constexpr int MR = 4, NRV = 2;
  static constexpr int GT = 2;

  static F zero() { return F{}; }
  static F set1(float v) { return F{v, v, v, v}; }
  static F load(const float* p) {
    F r;
    std::memcpy(&r, p, sizeof r);
    return r;
  }
  static F load_n(const float* p, int n) {
    F r{};
    std::memcpy(&r, p, size_t(n) * sizeof(float));
    return r;
  }
  static void store(float* p, F v) { std::memcpy(p, &v, sizeof v); }
  static void store_n(float* p, F v, int n) { std::memcpy(p, &v, size_t(n) * sizeof(float)); }

  static F add(F a, F b) { return a + b; }
  static F sub(F a, F b) { return a - b; }
  static F mul(F a, F b) { return a * b; }
  static F div(F a, F b) { return a / b; }
  static F fma(F a, F b, F c) { return a * b + c; }
  static F fnma(F a, F b, F c) { return c - a * b; }
  static F min(F a, F b) { return a < b ? a : b; }
  static F max(F a, F b) { return a > b ? a : b; }
  static float reduce_add(F v) { return (v[0] + v[1]) + (v[2] + v[3]); }
  static void reduce_add4(F a, F b, F c, F d, float* out) {
    out[0] = reduce_add(a);
    out[1] = reduce_add(b);
    out[2] = reduce_add(c);
    out[3] = reduce_add(d);
  }
  static float reduce_max(F v) {
    const float a = v[0] > v[1] ? v[0] : v[1], b = v[2] > v[3] ? v[2] : v[3];
    return a > b ? a : b;
  }

  static F load_bf16_n(const void* p, int n) {
    uint16_t h[4] = {};
    std::memcpy(h, p, size_t(n) * 2);
    const U u = U{h[0], h[1], h[2], h[3]} << 16;
    F r;
    std::memcpy(&r, &u, sizeof r);
    return r;
  }
  static F load_bf16(const void* p) { return load_bf16_n(p, N); }
  static F load_f16_n(const void* p, int n) {
    uint16_t h[4] = {};
    std::memcpy(h, p, size_t(n) * 2);
    return F{f16_to_f32(h[0]), f16_to_f32(h[1]), f16_to_f32(h[2]), f16_to_f32(h[3])};
  }
  static F load_f16(const void* p) { return load_f16_n(p, N); }
  static void store_bf16_n(void* p, F v, int n) {
    const uint16_t h[4] = {f32_to_bf16(v[0]), f32_to_bf16(v[1]), f32_to_bf16(v[2]), f32_to_bf16(v[3])};
    std::memcpy(p, h, size_t(n) * 2);
  }
  static void store_bf16(void* p, F v) { store_bf16_n(p, v, N); }
  static void store_f16_n(void* p, F v, int n) {
    const uint16_t h[4] = {f32_to_f16(v[0]), f32_to_f16(v[1]), f32_to_f16(v[2]), f32_to_f16(v[3])};
    std::memcpy(p, h, size_t(n) * 2);
  }
  static void store_f16(void* p, F v) { store_f16_n(p, v, N); }

  static F codes(I c) { return __builtin_convertvector(c, F); }
  static F load_u8(const uint8_t* p) { return codes(I{p[0], p[1], p[2], p[3]}); }
  static F load_u4(const uint8_t* p) { return codes(I{p[0] & 15, p[0] >> 4, p[1] & 15, p[1] >> 4}); }
  static F load_u2(const uint8_t* p) { return codes(I{p[0] & 3, (p[0] >> 2) & 3, (p[0] >> 4) & 3, p[0] >> 6}); }

  // 4 bytes of codes split by position in the byte (kernels_impl.h, "KIVI blocks").
  static void load_u4_split(const uint8_t* p, F& even, F& odd) {
    even = codes(I{p[0] & 15, p[1] & 15, p[2] & 15, p[3] & 15});
    odd = codes(I{p[0] >> 4, p[1] >> 4, p[2] >> 4, p[3] >> 4});
  }
  static void load_u2_split(const uint8_t* p, F* r) {
    for (int s = 0; s < 4; ++s)
      r[s] = codes(I{(p[0] >> (2 * s)) & 3, (p[1] >> (2 * s)) & 3, (p[2] >> (2 * s)) & 3, (p[3] >> (2 * s)) & 3});
  }
  static void deinterleave(F a, F b, F& even, F& odd) {
    even = F{a[0], a[2], b[0], b[2]};
    odd = F{a[1], a[3], b[1], b[3]};
  }
  static void interleave(F even, F odd, F& a, F& b) {
    a = F{even[0], odd[0], even[1], odd[1]};
    b = F{even[2], odd[2], even[3], odd[3]};
  }

  // Consecutive chunks of 8 bf16 of a row, as (even elements, odd elements) in float32.
  // 2N bf16 from any address as (even elements, odd elements) in float32.
  static void bf16_pairs(const char* p, F& even, F& odd) {
    U u;
    std::memcpy(&u, p, sizeof u);
    const U e = u << 16, o = u & 0xffff0000u;
    std::memcpy(&even, &e, sizeof even);
    std::memcpy(&odd, &o, sizeof odd);
  }
  struct Bf16Rows {
    const char* p;
    explicit Bf16Rows(const char* row) : p(row) {}
    void next(F& even, F& odd) {
      bf16_pairs(p, even, odd);
      p += sizeof(U);
    }
  };

  // Adding and subtracting 1.5 * 2^23 rounds to nearest even for |x| < 2^22 (exp's range).
  static F round(F x) { return (x + 12582912.0f) - 12582912.0f; }
  static F ldexp_ge(F y, F n, F x, F lo) {
    const I e = (__builtin_convertvector(n, I) + 127) << 23;
    F p;
    std::memcpy(&p, &e, sizeof p);
    return x < lo ? F{} : y * p;
  }

  static void transpose(F* r) {
    F t[4];
    for (int i = 0; i < 4; ++i) t[i] = F{r[0][i], r[1][i], r[2][i], r[3][i]};
    for (int i = 0; i < 4; ++i) r[i] = t[i];
  }
};

}  // namespace
}  // namespace ptllm

#include "kernels/cpu/kernels_impl.h"

namespace ptllm {
namespace {
constexpr KernelTable kTable = make_table<Portable>(SimdTarget::Portable);
}
const KernelTable* portable_kernel_table() { return &kTable; }
}  // namespace ptllm
