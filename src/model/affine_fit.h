#pragma once
// The pieces of the MLX affine quantizer (model/quantize.cpp) that GPTQ (model/gptq.cpp) reuses: a
// group's scale and bias, one code against them, and the packing of a row's codes.
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "model/quantize.h"

namespace ptllm {

struct AffineGroupFit {
  float scale = 0, bias = 0;  // as stored in scale_dtype, read back
};

// The scale and bias of the group x[0..g) by `m` (Rtn or Search; not Gptq), rounded to scale_dtype.
AffineGroupFit affine_fit_group(const float* x, int g, int bits, QuantMethod m, DType scale_dtype);

// x's code against (scale, bias) as stored: round to nearest, clamped to [0, nmax]. A zero or
// non-finite scale (an F16 underflow) gives code 0, the value `bias`.
inline uint8_t affine_code(float x, float scale, float bias, int nmax);

// Code j of q at bits [j * bits, (j + 1) * bits) of the row's little-endian bit stream.
void affine_pack_row(const uint8_t* q, int cols, int bits, uint32_t* words);

// p[i] = v in dtype t (F32, F16 or BF16).
void affine_store(void* p, DType t, size_t i, float v);

}  // namespace ptllm

#include <algorithm>
#include <cmath>

namespace ptllm {
inline uint8_t affine_code(float x, float scale, float bias, int nmax) {
  if (scale == 0 || !std::isfinite(scale)) return 0;
  return uint8_t(std::clamp(std::nearbyint((x - bias) / scale), 0.f, float(nmax)));
}
}  // namespace ptllm
