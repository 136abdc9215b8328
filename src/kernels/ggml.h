#pragma once
// llama.cpp's block formats (kernels/weights.h, WeightFormat::Ggml): row dequantization, the
// reference quantizers and the products, each product with a scalar reference twin. Formulas and
// byte layouts as ggml-quants.c / ggml-common.h define them (ggml_ref.cpp spells out each block).
//
// The products quantize x once per call, as llama.cpp does: to int8 per 32 values (one float scale
// a block, "Q8_0-style") for the 32-value types, per 256 (Q8_K-style) for the K-quants, with the
// sums of every 16 codes beside them (the weights' offsets and mins need them). Each block's
// product is then an integer dot product, scaled in float once per block (K-quants: the 6- or 8-bit
// sub-block scales are applied in integers). The error against float x is that of rounding x to
// int8 per block: |x_i - d q_i| <= d / 2 with d = max|x| / 127 over the block, so a product's
// error is at most sum_i |w_i| d / 2: for Gaussian-like x about 1% (32-value blocks) to 1.5% (256)
// of sum_i |w_i x_i|; the actual error, a sum of roundings of either sign, is far smaller.
#include <cstdint>
#include <string_view>

#include "kernels/weights.h"

namespace ptllm {

class ThreadPool;

// The type named `name` ("Q4_K", as ggml_type_info names it); ptllm::Error for an unknown name.
GgmlType ggml_type_by_name(std::string_view name);
// Whether the kernels read type t (ggml_dequant_row and ggml_matmul accept it).
bool ggml_supported(GgmlType t);
// Row r of w as float32: out [cols].
void ggml_dequant_row(const WeightMatrix& w, int r, float* out);
// n values (a multiple of the type's block) from consecutive blocks of type t.
void ggml_dequant_blocks(GgmlType t, const void* blocks, int n, float* out);
// y[t][r] = sum_k x[t][k] * W[r][k] + bias[r], as ops.h's matmul (which forwards here).
void ggml_matmul(const float* x, int T, const WeightMatrix& w, const float* bias, float* y, ThreadPool& pool);

// The reference quantizers (llama.cpp's quantize_row_*_ref, which llama-quantize uses when it has no
// importance matrix): Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K.
bool ggml_quantizable(GgmlType t);
// n values (a multiple of the block; else ptllm::Error) into n / block_elems blocks of type t.
void ggml_quantize_row(GgmlType t, const float* x, int n, void* blocks);

// Q4_K/Q5_K's 12 scale bytes hold eight 6-bit scales and eight 6-bit mins: for j < 4 the low six
// bits of byte j (scale) and byte j + 4 (min); for j >= 4 the low and high nibbles of byte j + 4,
// topped by the two high bits of byte j - 4 (scale) and byte j (min).
struct GgmlScaleMin {
  uint8_t scale, min;
};
GgmlScaleMin ggml_k_scale_min(const uint8_t* scales12, int j);

// ---- the products' pieces, for the kernels and their tests ------------------------------------

// x quantized for the products: T rows of K int8 codes, one float scale per `block` codes (32 or
// 256), and the sum of every 16 codes.
struct GgmlActs {
  int T = 0, K = 0, block = 32;
  const int8_t* q = nullptr;     // [T][K]
  const float* d = nullptr;      // [T][K / block]
  const int16_t* sums = nullptr;  // [T][K / 16]
};
// The block the products quantize x to for weights of type t: 256 for the K-quants, else 32.
int ggml_act_block(GgmlType t);
// Whether the integer products (GgmlKernel::rows) take type t; ggml_matmul dequantizes the others.
bool ggml_int_kernel(GgmlType t);
// Rows [t0, t1) of x [T][K] into the buffers of a (q, d, sums laid out as GgmlActs says):
// d = max|x| / 127 (llama.cpp's Q8_K takes the signed max and -127, the same codes up to sign),
// q = round(x / d), half away from zero.
void ggml_quantize_acts(const float* x, int K, int block, int t0, int t1, int8_t* q, float* d, int16_t* sums);

// One implementation of the products: y[t][r] (+ bias[r]) for t < a.T and rows [r0, r1) of w.
// Variants: "scalar" (the reference twin, and the portable target's), "avx2", "avx512" (AVX2's
// kernels built for AVX-512: more registers, EVEX), "avx512vnni" (vpdpbusd / vpdpwssd); on AArch64
// "neon" (16-bit products), "neon-dotprod" (sdot, ARMv8.2 dotprod) and "neon-i8mm" (smmla for the
// 32-value types, ARMv8.6 i8mm).
struct GgmlKernel {
  const char* name;
  void (*rows)(const WeightMatrix& w, const GgmlActs& a, const float* bias, float* y, int r0, int r1);
  // ggml_quantize_acts, bit for bit.
  void (*quantize)(const float* x, int K, int block, int t0, int t1, int8_t* q, float* d, int16_t* sums);
};
// The variants this CPU runs, the scalar first.
const GgmlKernel* const* ggml_kernels(int* n);
// The variant ggml_matmul uses under the active SIMD target (kernels/simd.h).
const GgmlKernel& ggml_active_kernel();

// The panel products of the active variant for weights of type t, one row of x included: Q4_0 and
// Q8_0 under AVX-512 (Q4_0 alone without VNNI), where GgmlKernel::rows takes them from two rows. A
// row's result is the same bits for any T. Null where the variant has none for t.
using GgmlRowsFn = void (*)(const WeightMatrix& w, const GgmlActs& a, const float* bias, float* y, int r0, int r1);
GgmlRowsFn ggml_panel_rows(GgmlType t);

namespace detail {
const GgmlKernel* ggml_avx2_kernel();        // null where not compiled in
const GgmlKernel* ggml_avx512_kernel();      // null where not compiled in
const GgmlKernel* ggml_avx512vnni_kernel();  // null where not compiled in
GgmlRowsFn ggml_avx512_panel_rows(GgmlType t);      // null where not compiled in or not for t
GgmlRowsFn ggml_avx512vnni_panel_rows(GgmlType t);  // null where not compiled in or not for t
const GgmlKernel* ggml_neon_kernel();          // null where not compiled in
const GgmlKernel* ggml_neon_dotprod_kernel();  // null where not compiled in (the CPU is not asked)
const GgmlKernel* ggml_neon_i8mm_kernel();     // null where not compiled in (the CPU is not asked)
}  // namespace detail

}  // namespace ptllm
