#pragma once
// MLX-layout affine-quantized weights (kernels/weights.h, WeightFormat::Affine): the products and
// the row dequantization, each with a scalar reference twin.
//
// The products for bits 2, 4 and 8 (group sizes 32, 64, 128, ...: powers of two) read the codes in place
// and round x to int8 once per call, per block of 32 columns (kernels/affine_q8.h: the block's
// scale d_b = max |x| / 127 and its float sums), so that the code term is a sum of exact
// integer products (AVX-512 VNNI vpdpbusd: unsigned codes times signed bytes):
//   y[t][r] = bias[r] + sum_g s_g (sum_{b in g} d_b sum_{k in b} c_k q_k + xc_g) + b_g xs_g.
// Error bound: x_k is replaced by d_b q_k in the centred term s_g (c_k - m) x_k only (m = 2^(bits-1)),
// so |y - exact| <= sum_k |s_g (c_k - m)| d_b / 2 (plus float32 rounding): relative to the term,
// at most 1 / 254 of the block's largest |x|, as llama.cpp's Q8_0 activations.
// - gemv (decode, small T): a row's codes streamed once, each register of codes unpacked (a shift
//   and a mask) and dotted with x stored in the matching "split order", every row of x in turn.
// - gemm (prefill, larger T): tiles of L rows (16 with AVX-512) x 512 columns, the packed codes
//   transposed by dwords into a per-thread buffer (12 KiB), one weight row a lane, reused by every
//   row of x: each lane sums a whole block of 32 columns before it is scaled.
// - bits 3, 5 and 6 (codes straddle bytes): each row's codes unpacked to bytes, then the same integer
//   sums over x in plain order; with AVX-512 VBMI, 6-bit codes are unpacked 64 at a time (vpermb
//   spreads 3 bytes a dword, vpmultishiftqb picks the four 6-bit fields). Where matrices are packed
//   at load (below), 6-bit ones are too, into planes of 4 and 2 bits.
// Group sizes that are not a power of two take the generic product: each row dequantized
// (affine_dequant_row), then dotted.
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "kernels/weights.h"

namespace ptllm {

class ThreadPool;
struct MatmulOutput;

// Code j of a row: bits [j * bits, (j + 1) * bits) of the row's little-endian bit stream (for 2, 4
// and 8 bits: word j * bits / 32, shifted by j * bits % 32, as mlx packs them).
// Row r of w as float32: out [cols].
void affine_dequant_row(const WeightMatrix& w, int r, float* out);
// y[t][r] = sum_k x[t][k] * W[r][k] + bias[r], as ops.h's matmul (which forwards here).
void affine_matmul(const float* x, int T, const WeightMatrix& w, const float* bias, float* y, ThreadPool& pool);

// The SIMD kernels of the products, slowest first; the default follows kernels/simd.h's active
// target (AVX-512, AVX2: with VNNI where the CPU has it; NEON: with i8mm, else dotprod, where the
// CPU has them).
enum class AffineKernel : uint8_t { Portable, AVX2, AVX2Vnni, AVX512, AVX512Vnni, NEON, NEONDotprod, NEONI8mm };
enum class AffinePath : uint8_t { Auto, Gemv, Gemm };
std::string_view affine_kernel_name(AffineKernel k);
std::vector<AffineKernel> available_affine_kernels();
// The kernel affine_matmul takes by default (follows set_simd_target).
AffineKernel affine_active_kernel();
// Rows of x up to which Auto takes the gemv: ops.h's kMatmulSmallRows, so that a speculative
// verification's rows equal the lone rows of plain decoding where matrices stay in the file's layout.
constexpr int kAffineGemvMaxT = 17;
// affine_matmul through kernel k and the given path (tests, benchmarks). Throws ptllm::Error if k
// is not available.
void affine_matmul(const float* x, int T, const WeightMatrix& w, const float* bias, float* y, ThreadPool& pool,
                   AffineKernel k, AffinePath path = AffinePath::Auto);
// Several products of the same x (ops.h matmul_shared_x), every w packed with the same bits, group
// size and cols (affine_matmul_shares): x rounded once and the threads handed every output's 16-row
// groups in one call. The results are those of separate calls, bit for bit.
void affine_matmul(const float* x, int T, std::span<const MatmulOutput> outs, ThreadPool& pool);
bool affine_matmul_shares(std::span<const MatmulOutput> outs);
// Whether the fast products take w (bits 2, 4, 8; group size a power of two, at least 32).
bool affine_fast(const WeightMatrix& w);
// Whether the unpacking integer products take w (bits 3, 5, 6; the same group sizes).
bool affine_unpacked(const WeightMatrix& w);
struct AffineKernelTable;
// The kernel table affine_matmul takes by default (kernels/affine_q8.h), for a caller that rounds one
// x once for many products (a mixture-of-experts layer's experts).
const AffineKernelTable& affine_active_table();

// ---- 2, 4, 6 and 8 bits repacked at load time ---------------------------------------------------
// A decode step streams each matrix once; row-major codes leave every row one horizontal sum and
// one pass over its scales. Repacked, 16 rows are read as one stream and summed in the 16 lanes of
// a register (as the GGUF K-quants, kernels/ggml.h). Layout, for each group of 16 rows and each
// group g of group_size columns (es: the scales' dtype size), GB = 32 es + group_size * bits * 2
// bytes from (16-row group * G + g) * GB:
//   [0, 16 es)      the 16 rows' scales of group g (the file's dtype),  [16 es, 32 es) their biases
//   [32 es, GB)     per block b of 32 columns of the group, bits * 64 bytes: dword q of row i at
//                   64 (b * bits + q) + 4 i, the file's dword q of the row's block (bytes unchanged)
// 6 bits (planes of 4 and 2 bits, as Q6_K's ql and qh): the block's 6 dwords of row i are 4 of
// nibbles (q = 0..3) and 2 of 2-bit fields (q = 4, 5). Code register n = 0..7 meets x's bytes
// 4 n .. 4 n + 3 in the 4-bit split order (column 2 (4 n + k) for n < 4, 2 (4 n + k - 16) + 1 after);
// with j = n % 4, byte k of dword j holds code c of byte k of register j in its low nibble as c & 15
// and that of register 4 + j in its high nibble as c >> 2; byte k of dword 4 + j / 2 holds the other
// two bits of each (c >> 4, c & 3) at bits 4, 2 (j even) or 0, 6 (j odd) for registers j, 4 + j. Two
// masks and an or give register j, and register 4 + j as 4 c (its sum is shifted back), no nibble is
// shifted and each 2-bit dword once either way: no shuffle. The same codes as the file's, rearranged; for 2,
// 4 and 8 bits the same bytes, only moved. The product (every T, prefill and decode alike) takes x in
// the per-block split order (affine_q8.h, chunk 32): the codes at bit s * bits of dword q meet x's
// bytes 4 (s * bits + q) .. + 3, broadcast, one vpdpbusd for 16 rows (AVX2: each 64-byte line as two
// registers of 8 rows). Per chunk of 512 columns and x row, lane i sums d_b s_g times each block's
// integer sum, then s_g xc_g + b_g xs_g per group, in that order whatever T and the thread split: a
// row's result does not depend on the batch. Against the row-major products only the float summation
// order differs (same integer sums). AVX2 without VNNI sums 8-bit codes centred, c - 128 (one
// vpmaddubsw where unsigned codes take two), and adds s_g 128 xs_g for s_g xc_g: the same sum.
inline constexpr int kAffinePackRows = 16;
// Whether w can be packed: bits 2, 4, 6 or 8, groups a power of two from 32 to 512 columns, rows a
// multiple of kAffinePackRows.
bool affine_pack_fit(const WeightMatrix& w);
// Whether this process packs such matrices at load: the active kernel is AVX-512 VNNI or AVX2 and
// neither PTLLM_NO_AFFINE_PACK=1 nor set_affine_pack_enabled(false) says otherwise. Packed matrices
// run on every kernel (without an 8- or 16-lane product: affine_packed_rows_scalar, slowly), so tests
// can switch.
bool affine_pack_wanted();
void set_affine_pack_enabled(bool on);
// Row groups [g0, g1) of w (row-major) into out (w.nbytes() bytes for all of them).
void affine_pack(const WeightMatrix& w, void* out, int g0, int g1);
// The packed matrix of w's shape and format over `data`.
WeightMatrix affine_packed_matrix(const WeightMatrix& w, const void* data);
// The scalar twin of the packed product (and the product of targets without an 8- or 16-lane one):
// the same float operations in the same order as the SIMD kernel, so the results are equal bit for
// bit. x: quantize_affine_x with chunk 32. Rows [r0, r1), multiples of kAffinePackRows. centred8:
// 8-bit codes summed as c - 128 (as affine_packed_centred8(k) says kernel k does).
struct AffineX;
void affine_packed_rows_scalar(const AffineX& x, const WeightMatrix& w, const float* bias, float* y, int r0, int r1,
                               bool centred8 = false);
bool affine_packed_centred8(AffineKernel k);

// Scalar twin of the fast products (plain loops, double sums): the same int8 x and integer sums.
void affine_matmul_q8_ref(const float* x, int T, const WeightMatrix& w, const float* bias, float* y);

}  // namespace ptllm
