// The portable affine products: GCC/Clang vector extensions, 16-byte registers (the traits of
// affine_impl.h), lowered to whatever the baseline target has. Four byte products a lane are
// widened and summed in 32 bits.
#include <algorithm>

#include "kernels/affine_q8.h"

#define PTLLM_AFFINE_TARGET

namespace ptllm {
namespace {

struct PortableAffine {
  typedef int32_t I __attribute__((vector_size(16)));
  typedef uint32_t U __attribute__((vector_size(16)));
  typedef float F __attribute__((vector_size(16)));
  static constexpr int RB = 16, GTT = 2;

  static I zero_i() { return I{}; }
  static I load_i(const void* p) {
    I v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  static I load_i_n(const void* p, int n) {
    I v{};
    std::memcpy(&v, p, size_t(n));
    return v;
  }
  static I bcst32(const void* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return I{v, v, v, v};
  }
  static I srl32(I v, int n) { return I(U(v) >> n); }
  static I and_i(I a, I b) { return a & b; }
  static I add_i(I a, I b) { return a + b; }
  static I set1_u8(uint8_t v) {
    const int32_t w = int32_t(uint32_t(v) * 0x01010101u);
    return I{w, w, w, w};
  }
  // Byte i of each lane: unsigned from u, signed from s.
  static I dot8(I acc, I u, I s) {
    for (int i = 0; i < 4; ++i) acc += I((U(u) >> (8 * i)) & 0xffu) * ((s << (24 - 8 * i)) >> 24);
    return acc;
  }
  static I dot4(I acc, I u, I s) { return dot8(acc, u, s); }
  static F cvt(I v) { return __builtin_convertvector(v, F); }
  static F zero_f() { return F{}; }
  static F set1_f(float v) { return F{v, v, v, v}; }
  static F load_f(const float* p) {
    F v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  static F load_f_n(const float* p, int n) {
    F v{};
    std::memcpy(&v, p, size_t(std::min(n, 4)) * 4);
    return v;
  }
  static void store_f(float* p, F v) { std::memcpy(p, &v, sizeof v); }
  static void store_f_n(float* p, F v, int n) { std::memcpy(p, &v, size_t(std::min(n, 4)) * 4); }
  static F add(F a, F b) { return a + b; }
  static F mul(F a, F b) { return a * b; }
  static F fma(F a, F b, F c) { return a * b + c; }
  static F perm(F a, I idx) { return F{a[idx[0]], a[idx[1]], a[idx[2]], a[idx[3]]}; }
  static float reduce_add(F v) { return (v[0] + v[1]) + (v[2] + v[3]); }
  static F load_bf16_n(const uint16_t* p, int n) {
    F v{};
    for (int i = 0; i < std::min(n, 4); ++i) v[i] = bf16_to_f32(p[i]);
    return v;
  }
  static F load_f16_n(const uint16_t* p, int n) {
    F v{};
    for (int i = 0; i < std::min(n, 4); ++i) v[i] = f16_to_f32(p[i]);
    return v;
  }
};

}  // namespace
}  // namespace ptllm

#include "kernels/cpu/affine_impl.h"

namespace ptllm {
namespace {
constexpr AffineKernelTable kTable = AffineKernels<PortableAffine>::table("portable");
}
const AffineKernelTable* affine_portable_kernels() { return &kTable; }
}  // namespace ptllm
