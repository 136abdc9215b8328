#pragma once
// Rows of a weight matrix as a view of the same bytes: the parts of a fused projection (Phi-3's
// qkv_proj and gate_up_proj, llama.cpp's attn_qkv).
#include "kernels/weights.h"

namespace ptllm {

// Rows [r0, r0 + n) of w (a row's data, scales and biases stay together in every format but panels).
WeightMatrix weight_rows(const WeightMatrix& w, int r0, int n);

}  // namespace ptllm
