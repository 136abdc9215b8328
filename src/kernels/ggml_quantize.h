#pragma once
// Row quantizers for the GGUF writer (model/gguf_writer): float32 -> llama.cpp's Q8_0 and Q4_0
// blocks, as ggml-quants' reference quantize_row_*_ref computes them (the dequantization is
// kernels/ggml.h's). K-quants (Q4_K, Q6_K) come with the block kernels.
#include <cstdint>

#include "kernels/weights.h"

namespace ptllm {

// Whether quantize_row_ggml writes type t.
bool ggml_quantize_supported(GgmlType t);
// x [n] (n a multiple of the type's block size) -> n / block_elems blocks at out.
void quantize_row_ggml(GgmlType t, const float* x, int n, uint8_t* out);

}  // namespace ptllm
