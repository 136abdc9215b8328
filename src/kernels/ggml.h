#pragma once
// llama.cpp's block formats (kernels/weights.h, WeightFormat::Ggml): the products and the row
// dequantization, each with a scalar reference twin. Formulas as ggml-quants defines them.
#include "kernels/weights.h"

namespace ptllm {

class ThreadPool;

// Whether the kernels read type t (ggml_dequant_row and ggml_matmul accept it).
bool ggml_supported(GgmlType t);
// Row r of w as float32: out [cols].
void ggml_dequant_row(const WeightMatrix& w, int r, float* out);
// y[t][r] = sum_k x[t][k] * W[r][k] + bias[r], as ops.h's matmul (which forwards here).
void ggml_matmul(const float* x, int T, const WeightMatrix& w, const float* bias, float* y, ThreadPool& pool);

}  // namespace ptllm
