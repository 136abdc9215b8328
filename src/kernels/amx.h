#pragma once
// BF16 weights times float32 activations on Intel AMX (Sapphire Rapids and later: AMX-TILE and
// AMX-BF16, the tile state granted by the OS). ops.h matmul takes it for BF16 matrices in panels
// from 8 rows of x (batched decode and prefill; fewer rows take the panels' own product) and for
// llama.cpp's block matrices in the file's layout above kMatmulSmallRows rows (prefill).
//
// A tile product (tdpbf16ps) adds A B into 16 x 16 float32 sums, A 16 rows x 32 bf16 columns, B the
// same 32 columns as 16 pairs x 16 outputs x 2: exactly 32 columns of a panel (kernels/panels.h), 1
// KiB in one piece, so the weights are read as loaded, in order. A is a slab of packed x.
// Activations are float32, and rounding them to bf16 would change results by far more than the
// float path does (about 2^-9 of each x, where the float32 kernels are exact in x), so each x is
// split into two bf16 numbers, hi = bf16(x) and lo = bf16(x - hi), which together carry 16
// significant bits: a slab's 16 rows hold 8 rows of x as hi and the same 8 as lo, and y = hi W +
// lo W. The products are exact in float32; only the order of the float32 sums differs from the
// float kernels.
//
// Each y[t][r] is computed by the same sequence of operations whatever T, whichever other rows share
// its tile, and however the rows are split over threads: a row's result does not depend on the
// batch among the batches amx_matmul takes (so ops.h's kMatmulSmallRows rule still holds).
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/ops.h"
#include "kernels/weights.h"

namespace ptllm {

class ThreadPool;

// Whether this CPU has AMX-TILE and AMX-BF16 and the OS lets this process use the tile state
// (asked for once, Linux's ARCH_REQ_XCOMP_PERM). False when PTLLM_NO_AMX is set in the environment
// (a non-empty value other than "0"), or after set_amx_enabled(false).
bool amx_available();
// Tests and benchmarks: turn the AMX path off or back on (on only where amx_available() was).
void set_amx_enabled(bool on);
// Whether matmul uses AMX now: available, and the active SIMD target is AVX-512 (a test that picks
// another target with set_simd_target gets that target's kernels alone).
bool amx_active();
// Whether amx_matmul reads w in place: BF16 in panels, cols a multiple of 32, and AMX active.
bool amx_takes(const WeightMatrix& w);
// Whether amx_matmul takes w through bf16 copies of its rows: llama.cpp's block formats in the
// file's layout, not packed at load (kernels/ggml.h; cols a multiple of 32, AMX active). Each group
// of 16 rows is dequantized once per call (weight_row) and each weight split as x is (hi + lo: 16
// significant bits, so the product is as close to the float32 one as for bf16 weights, at twice the
// tile products), so it pays where many rows of x share the rows: prefill, not decode.
bool amx_takes_dequantized(const WeightMatrix& w);

// y[t][r] = sum_k x[t][k] * W[r][k] + bias[r], as ops.h matmul, for a matrix amx_takes or
// amx_takes_dequantized.
void amx_matmul(const float* x, int T, const WeightMatrix& w, const float* bias, float* y, ThreadPool& pool);
// The same for several matrices of the same cols against one x (ops.h matmul_shared_x): x is packed
// once and the threads share all the matrices' panels in one call.
void amx_matmul(const float* x, int T, std::span<const MatmulOutput> outs, ThreadPool& pool);

// The packed activations amx_matmul reads, exposed for the tests: x [T][K] as ceil(T / 8) slabs,
// each K / 32 tiles of 16 rows x 32 bf16 values (row c < 8: hi of x[8 s + c]'s 32 columns, c >= 8:
// lo of x[8 s + c - 8]'s), zeros past T.
void amx_pack_x(const float* x, int T, int K, uint16_t* out);
size_t amx_packed_values(int T, int K);
// hi and lo of one value, as amx_pack_x splits it (bf16 bit patterns).
void amx_split(float x, uint16_t& hi, uint16_t& lo);

}  // namespace ptllm
