#include "core/dtype.h"

#include "core/error.h"

namespace ptllm {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::U8: return "U8";
    case DType::U32: return "U32";
  }
  return "?";
}

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: case DType::I32: case DType::U32: return 4;
    case DType::F16: case DType::BF16: return 2;
    case DType::I64: return 8;
    case DType::U8: return 1;
  }
  return 0;
}

uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u)  // inf or NaN
    return uint16_t(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u));
  if (absx >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to inf
  if (absx < 0x38800000u) {  // result is subnormal or zero
    if (absx < 0x33000000u) return uint16_t(sign);
    // value = m * 2^(e-150); in half subnormal units (2^-24) that is m >> (126 - e), shift in [14, 24].
    uint32_t e = absx >> 23;
    uint32_t m = (absx & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;
    uint32_t r = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return uint16_t(sign | r);
  }
  uint32_t r = absx - 0x38000000u;  // rebias exponent 127 -> 15
  uint32_t rounded = (r + 0xfffu + ((r >> 13) & 1u)) >> 13;
  return uint16_t(sign | rounded);
}

void convert_to_f32(DType t, const void* src, float* dst, size_t n) {
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::BF16:
    case DType::F16: {
      // memcpy per element: the source may be misaligned (an unpadded safetensors header). A loop
      // per type: bf16's is a shift the compiler vectorizes (the affine products convert each row's
      // scales with it).
      const auto* b = static_cast<const uint8_t*>(src);
      const auto each = [&](auto f) {
        for (size_t i = 0; i < n; ++i) {
          uint16_t h;
          std::memcpy(&h, b + 2 * i, 2);
          dst[i] = f(h);
        }
      };
      if (t == DType::BF16)
        each([](uint16_t h) { return bf16_to_f32(h); });
      else
        each([](uint16_t h) { return f16_to_f32(h); });
      return;
    }
    default:
      PTLLM_CHECK(!"convert_to_f32: not a float dtype");
  }
}

}  // namespace ptllm
