#pragma once
// Storage dtypes of weights and their conversion to float32 (math is always float32, as transformers
// upcasts bf16/f16 checkpoints).
#include <cstdint>
#include <cstring>
#include <string_view>

namespace ptllm {

enum class DType : uint8_t { F32, F16, BF16, I32, I64, U8, U32 };  // U32: MLX's packed quantized codes

std::string_view dtype_name(DType t);
size_t dtype_size(DType t);

inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even, as torch does when casting float32 -> bfloat16.
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);  // quiet NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t(bits >> 16);
}

// IEEE half -> float, exact for every input (subnormals, inf, NaN).
inline float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) { mant <<= 1; --exp; }
      mant &= 0x3ffu;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// float -> IEEE half, round to nearest even.
uint16_t f32_to_f16(float f);

// Converts n elements of `src` (stored as `t`, one of F32/F16/BF16) to float32.
void convert_to_f32(DType t, const void* src, float* dst, size_t n);

}  // namespace ptllm
