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
#include <span>
#include <string_view>

#include "kernels/weights.h"

namespace ptllm {

class ThreadPool;
struct MatmulOutput;

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
// Several products of the same x (ops.h matmul_shared_x), each w of a type with integer products
// (ggml_matmul_shares) and the same cols: x quantized once and, up to a decode's rows, the threads
// handed every output's rows in one call (k and v alone are too small to keep two threads streaming).
// The results are those of separate calls, bit for bit.
void ggml_matmul(const float* x, int T, std::span<const MatmulOutput> outs, ThreadPool& pool);
// Whether ggml_matmul takes these outputs in one call: every w Ggml with integer products and x
// quantized the same way for all (ggml_act_block).
bool ggml_matmul_shares(std::span<const MatmulOutput> outs);

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

// ---- the 32-value types, Q4_K, Q5_K and Q6_K repacked at load time --------------------------------
// The products stream such a matrix faster as one sequential run of 16-row groups (the idea of
// llama.cpp's interleaved "repack" buffers; this layout is our own). For each group and each unit of
// ggml_pack_block_elems(type) values (two 32-value blocks for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, one
// 256-value block for the K-quants), ggml_pack_block_bytes(type) bytes; i is the row in the group:
// Q4_0 (576 bytes, the file's size)
//   [0, 64)      d (f16) of row i: the first block's at 2 i, the second's at 32 + 2 i
//   [64, 576)    per block h (0, 1), 256 bytes from 64 + 256 h: byte 64 c + 4 i + k holds the nibbles of
//                values 4 c + k (low) and 16 + 4 c + k (high), as the file's qs[4 c + k] does
// Q5_0 (704 bytes, the file's size)
//   [0, 64)      d (f16) as Q4_0's
//   [64, 704)    per block h (0, 1), 320 bytes from 64 + 320 h: first the fifth bits, byte 4 i + k
//                holding that of value 4 c + k at bit c and that of 16 + 4 c + k at bit 4 + c
//                (c < 4), then the 256 bytes of nibbles as Q4_0's (codes 0..31, offset 16)
// Q4_1, Q5_1 (640 and 768 bytes, the file's sizes)
//   [0, 64)      d (f16) as Q4_0's;  [64, 128) m (f16), the first block's at 64 + 2 i
//   [128, ...)   per block h, as Q4_0's (256 bytes) and Q5_0's (320) from 128 + 256 h or 128 + 320 h
//                (codes 0..15 and 0..31, no offset)
// Q8_0 (1088 bytes, the file's size)
//   [0, 64)      d (f16) as Q4_0's
//   [64, 1088)   per block h (0, 1), 512 bytes from 64 + 512 h: byte 64 k + 4 i + j holds the code of
//                value 4 k + j plus 128 (its sign bit flipped: the unsigned operand of vpdpbusd)
// Q4_K (2368 bytes: 4 more a row than the file, the scales unpacked to a byte each)
//   [0, 32)      the 16 rows' d (f16),  [32, 64) their dmin (f16)
//   [64, 192)    scale j of row i at 64 + 16 j + i (0..63)
//   [192, 320)   min j of row i at 192 + 32 (j / 2) + 2 i + j % 2 (pairs for 16-bit products)
//   [320, 2368)  byte 320 + 256 j + 64 c + 4 i + k: the code of value 32 j + 8 c + k in its low
//                nibble, of value 32 j + 8 c + 4 + k in its high one
// Q5_K (2880 bytes: 4 more a row than the file, as Q4_K's)
//   [0, 320)     as Q4_K's
//   [320, 2880)  per sub-block j, 320 bytes from 320 + 320 j: first the fifth bits, byte 4 i + k
//                holding that of value 32 j + 8 c + k at bit c and that of 32 j + 8 c + 4 + k at bit
//                4 + c (c < 4), then Q4_K's four lines of sub-block j (codes 0..31)
// Q6_K (3360 bytes, the file's size)
//   [0, 32)      d (f16);  [32, 288) scale g (of values 16 g ..) of row i at 32 + 16 g + i (int8)
//   [288, 3360)  per g, 192 bytes from 288 + 192 g: bytes 4 i + k of the first 64 hold the low four
//                bits of the codes of values 16 g + k (low nibble) and 16 g + 4 + k (high), of the
//                next 64 those of 16 g + 8 + k and 16 g + 12 + k; byte 4 i + k of the last 64 holds
//                the top two bits of value 16 g + 4 c + k at bits 2c, 2c + 1
// so one 64-byte load gives 16 rows x 4 values (twice or four times over), against 4 bytes of x
// broadcast (vpdpbusd with the 16 outputs in the lanes: no horizontal sums). A row's integer sums
// are those of the file's blocks, so the products equal the row-major ones up to float rounding
// (Q4_0, Q8_0: bit for bit, the same operations in the same order as the unpacked panels; for Q8_0
// those are the file layout's prefill, at every count of rows of x). AVX2 reads the 64-byte lines as
// two halves of 8 rows: for Q4_0 the same bits as its file-layout panels; for the others (Q8_0's codes
// made signed again, vpmaddubsw with the sign moved onto x) those of the AVX-512 VNNI packed product.
inline constexpr int kGgmlPackRows = 16;
int ggml_pack_block_bytes(GgmlType t);  // 0: a type that is not packed
int ggml_pack_block_elems(GgmlType t);  // values of a row in one unit: 64 (32-value types) or 256
// Whether w (row-major) can be packed: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K or Q6_K, rows a
// multiple of kGgmlPackRows, columns of ggml_pack_block_elems.
bool ggml_pack_fit(const WeightMatrix& w);
// Whether this process packs matrices of type t: the active kernels have its packed product (AVX-512
// VNNI and AVX2: all eight types) and neither PTLLM_NO_GGML_PACK=1 nor set_ggml_pack_enabled(false)
// says otherwise. Other kernels still compute packed matrices (a row at a time, slowly), so tests can
// switch. Without a type: whether any is packed.
bool ggml_pack_wanted(GgmlType t);
bool ggml_pack_wanted();
void set_ggml_pack_enabled(bool on);
size_t ggml_packed_bytes(const WeightMatrix& w);
// Groups [g0, g1) of w (row-major) into out (ggml_packed_bytes(w) bytes for all of them).
void ggml_pack(const WeightMatrix& w, void* out, int g0, int g1);
// The packed matrix over `data`.
WeightMatrix ggml_packed_matrix(GgmlType t, const void* data, int rows, int cols);
// Row r of a packed matrix as the file's blocks (bit for bit those ggml_pack read).
void ggml_unpack_row(const WeightMatrix& w, int r, uint8_t* blocks);

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

// The panel product of the active variant for weights of type t, one row of x included: Q4_0 under
// AVX-512, which GgmlKernel::rows takes for every T (Q8_0's only above kMatmulSmallRows rows, ops.h).
// A row's result is the same bits for any T. Null where the variant has none for t.
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
