#pragma once
// MLX-layout affine-quantized weights (kernels/weights.h, WeightFormat::Affine): the products and
// the row dequantization, each with a scalar reference twin.
#include "kernels/weights.h"

namespace ptllm {

class ThreadPool;

// Code j of a row: bits [j * bits, (j + 1) * bits) of the row's little-endian bit stream (for 2, 4
// and 8 bits: word j * bits / 32, shifted by j * bits % 32, as mlx packs them).
// Row r of w as float32: out [cols].
void affine_dequant_row(const WeightMatrix& w, int r, float* out);
// y[t][r] = sum_k x[t][k] * W[r][k] + bias[r], as ops.h's matmul (which forwards here).
void affine_matmul(const float* x, int T, const WeightMatrix& w, const float* bias, float* y, ThreadPool& pool);

}  // namespace ptllm
