#pragma once
// BF16 weights in panels (batched decode). A row-major BF16 matrix is copied at load time
// into panels of 16 rows, each a run of column pairs: panel p holds rows 16p..16p+15, and for each
// pair of columns (2j, 2j+1) one 64-byte line of the 16 rows' two values,
//   data[((p * cols/2 + j) * 16 + i) * 2 + c] = W[16p + i][2j + c].
// One aligned 512-bit load gives 16 outputs' weights for two columns: the product keeps 16 outputs in
// the lanes and broadcasts x, so a weight is loaded and widened once for every row of x in a tile
// and no output needs a horizontal sum (the row-major gemv's 4 x 4 tiles widen each chunk once per
// 4 rows of x and fold every output's lanes at the end; its gemm packs the weights again on every
// call). Each output is the sum over its even columns plus the sum over its odd ones, each in column
// order, whatever the rows of x and the tile: a row of x gets the same bits alone or in any batch.
//
// Taken on AVX-512 and AVX2 CPUs (AVX2: each line as two registers of 8 rows, the same operations a
// lane), for BF16 matrices of rows % 16 == 0 and even cols. Where AMX is there too,
// its tile products read the same panels from 8 rows of x (kernels/amx.h: 32 columns of a panel are
// one 1 KiB tile, its second operand); this file's products take fewer rows. Other kernel targets
// compute the same products from the panels (slowly: a row at a time), so a model packed under one
// target still runs when a test switches.
// PTLLM_NO_PANELS=1 keeps the row-major layout (for comparisons).
//
// PTLLM_PANELS_BF16_X=1 (or set_panels_bf16_x) trades precision for speed: x is rounded to bf16 (as
// llama.cpp does for BF16 weights) and each output is one sum, pair by pair, of exact bf16 products,
// AVX512_BF16's vdpbf16ps (two multiply-adds a lane an instruction: twice the rate of float32 FMAs).
// A row of x still gets the same bits alone or in any batch, and every target the same bits; what
// changes is x's precision (8 mantissa bits instead of 24), so outputs move by about 2^-9 of their
// terms' size against the exact product. Off by default.
#include <cstddef>
#include <cstdint>
#include <span>

#include "kernels/ops.h"
#include "kernels/weights.h"

namespace ptllm {

class ThreadPool;

inline constexpr int kPanelRows = 16;

// Whether `w` (row-major) can be packed, and whether this process's kernels want it packed (models
// loaded while set_panels_enabled(false) keep the row-major layout: tests, comparisons).
bool panels_fit(const WeightMatrix& w);
bool panels_wanted();
void set_panels_enabled(bool on);
// Whether the products round x to bf16 (above); read from PTLLM_PANELS_BF16_X at first use.
bool panels_bf16_x();
void set_panels_bf16_x(bool on);
namespace detail {
// Tests: false makes the AVX-512 products of panels_bf16_x take fused multiply-adds (as on CPUs
// without AVX512_BF16) where vdpbf16ps is there.
void set_panels_bf16_dp(bool on);
bool g_bf16_dp_on();
}  // namespace detail
// The packed copy's size in bytes, and the packing (rows split among the pool's threads).
size_t panels_bytes(const WeightMatrix& w);
void pack_panels(const WeightMatrix& w, void* out, ThreadPool& pool);
// One panel: 16 rows of bf16 values (`row_bytes` apart, `cols` even) into out [cols/2][16][2].
void pack_panel(const void* rows, size_t row_bytes, int cols, uint16_t* out);
// A matrix over packed bytes (format Panels, dtype BF16).
WeightMatrix panels_matrix(const void* data, int rows, int cols);

// Row r as floats (an embedding lookup of a tied LM head).
void panels_row(const WeightMatrix& w, int r, float* out);
// y[T][w.rows] = x[T][w.cols] W^T + bias.
void panels_matmul(const float* x, int T, const WeightMatrix& w, const float* bias, float* y, ThreadPool& pool);
// The same for several matrices in panels of the same cols against one x (ops.h matmul_shared_x): one
// call hands the threads all their panels.
void panels_matmul(const float* x, int T, std::span<const MatmulOutput> outs, ThreadPool& pool);

}  // namespace ptllm
