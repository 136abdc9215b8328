#pragma once
// Math kernels. They know nothing of the model: plain arrays in, plain arrays out, float32 math.
// Weights are read in their stored format (kernels/weights.h), never copied to float32 as a whole.
// Each kernel runs the best SIMD target of the CPU (kernels/simd.h) and has a scalar reference
// twin (*_ref, plain loops the compiler is told not to vectorize) that the tests compare it with.
#include <cstddef>
#include <cstdint>
#include <span>

#include "core/dtype.h"
#include "kernels/weights.h"

namespace ptllm {

class ThreadPool;

// y[t][r] = sum_k x[t][k] * W[r][k] + bias[r]      x: [T][cols], y: [T][rows], bias: [rows] or null
// Split over the pool by output columns: a matrix-vector product streaming the weights for small T
// (decode), a packed matrix-matrix product for larger T (prefill).
void matmul(const float* x, int T, const WeightMatrix& w, const float* bias, float* y, ThreadPool& pool);
// One of several products of the same x (q, k and v of a layer; gate and up): y = x W^T + bias.
struct MatmulOutput {
  const WeightMatrix* w;
  const float* bias;  // [w->rows] or null
  float* y;           // [T][w->rows]
};
// matmul for each output, every w with the same cols; the results are those of separate calls, bit
// for bit. Where one kernel takes them all (AMX; BF16 in panels; packed MLX matrices of one bit width
// and group size; GGUF types whose x is quantized alike), the threads are handed all the products in
// one call, and x is packed, rounded or quantized once for them.
void matmul_shared_x(const float* x, int T, std::span<const MatmulOutput> outs, ThreadPool& pool);
// A kernel's part of such a call: groups [b, e) of all the outputs' groups of `rows_per_group` rows,
// one output's after another's (a part may cross from one matrix into the next). fn(output, g0, g1)
// for each output's share, g0 and g1 its own groups.
inline size_t groups_of(const WeightMatrix& w, int rows_per_group) {
  return size_t((w.rows + rows_per_group - 1) / rows_per_group);
}
inline size_t groups_of(std::span<const MatmulOutput> outs, int rows_per_group) {
  size_t n = 0;
  for (const MatmulOutput& o : outs) n += groups_of(*o.w, rows_per_group);
  return n;
}
template <class F>
void for_each_share(std::span<const MatmulOutput> outs, int rows_per_group, size_t b, size_t e, F&& fn) {
  size_t first = 0;
  for (const MatmulOutput& o : outs) {
    const size_t n = groups_of(*o.w, rows_per_group);
    const size_t g0 = b > first ? b : first, g1 = e < first + n ? e : first + n;
    if (g0 < g1) fn(o, int(g0 - first), int(g1 - first));
    first += n;
  }
}
// The most rows any weight format's matmul takes the matrix-vector path for (BF16's: ops.cpp; Q8_0's:
// ggml_tiled_impl.h): a speculative verification of 16 drafts and the token before them. Up to it a
// row's result is the same as alone; it may differ in its last bits from the same row in a larger
// batch, above which a row's result does not depend on the batch (a prefix adopted instead of
// computed must leave the prompt's last append on the same side: engine/session.h adoption_is_exact).
inline constexpr int kMatmulSmallRows = 17;
// Scalar reference twin of matmul (one thread, plain loops, double accumulation), for tests.
void matmul_ref(const float* x, int T, const WeightMatrix& w, const float* bias, float* y);

// Row `r` of w converted to float32 (any format): out [cols].
void weight_row(const WeightMatrix& w, int r, float* out);

float dot(const float* a, const float* b, int n);
// y += a * x
void axpy(float a, const float* x, float* y, int n);

// The same over a row stored as F32, F16 or BF16 (dense KV storage), converted on the fly.
float dot_stored(const float* a, const void* b, DType t, int n);
void axpy_stored(float a, const void* x, DType t, float* y, int n);
// A block of nk rows stored as t (F32, BF16, F16), k/v [nk][D], for the nq query heads sharing a KV
// head (GQA): each row is converted once and used by all of them.
// K: out[h][j] = qscale * sum_i q[h][i] * k_j[i]       q: [nq][D], out: [nq][ld_out]
// next (optional): the rows attention reads after these, laid out the same; their cache lines are
// asked for (prefetched) a few at a time while these rows are read. It changes no result.
void dense_k_block(const float* q, int nq, const void* k, DType t, float qscale, int nk, int D, float* out,
                   int ld_out, const void* next = nullptr);
// V: acc[h][i] += sum_j p[h][j] * v_j[i]                p: [nq][ld_p], acc: [nq][D]
void dense_v_block(const float* p, int ld_p, int nq, const void* v, DType t, int nk, int D, float* acc,
                   const void* next = nullptr);
// dst (stored as t) = src
void store_as(const float* src, void* dst, DType t, int n);
void load_from(const void* src, DType t, float* dst, int n);

// out = x / sqrt(mean(x^2) + eps) * w     (transformers' LlamaRMSNorm, float32)
void rmsnorm(const float* x, const float* w, float* out, int n, float eps);
// gate = silu(gate) * up
void silu_mul(float* gate, const float* up, int n);
// In place, numerically stable.
void softmax(float* x, int n);
// The largest of x [n], n >= 1.
float max_of(const float* x, int n);
// x[i] = e^(x[i] - m) in place; returns the sum (softmax numerators against a known max m).
float exp_sum(float* x, int n, float m);

// RoPE tables for one position: cos/sin [head_dim/2], angle = pos * inv_freq[i] (float32, as transformers).
void rope_cos_sin(const float* inv_freq, int half, int64_t pos, float* cos, float* sin);
// Rotates one vector x [head_dim] (rotate_half convention) into out.
void rope_rotate_one(const float* x, int head_dim, const float* cos, const float* sin, float* out);
// Rotates every head of x [n_heads][head_dim] (rotate_half convention: pairs (i, i + head_dim/2)).
void rope_rotate(float* x, int n_heads, int head_dim, const float* cos, const float* sin);

// Scalar reference twins of the kernels above (same contracts).
float dot_ref(const float* a, const float* b, int n);
void axpy_ref(float a, const float* x, float* y, int n);
float dot_stored_ref(const float* a, const void* b, DType t, int n);
void axpy_stored_ref(float a, const void* x, DType t, float* y, int n);
void dense_k_block_ref(const float* q, int nq, const void* k, DType t, float qscale, int nk, int D, float* out,
                       int ld_out);
void dense_v_block_ref(const float* p, int ld_p, int nq, const void* v, DType t, int nk, int D, float* acc);
void store_as_ref(const float* src, void* dst, DType t, int n);
void load_from_ref(const void* src, DType t, float* dst, int n);
void rmsnorm_ref(const float* x, const float* w, float* out, int n, float eps);
void silu_mul_ref(float* gate, const float* up, int n);
void softmax_ref(float* x, int n);
float max_of_ref(const float* x, int n);
float exp_sum_ref(float* x, int n, float m);
void rope_rotate_one_ref(const float* x, int head_dim, const float* cos, const float* sin, float* out);
void rope_rotate_ref(float* x, int n_heads, int head_dim, const float* cos, const float* sin);

}  // namespace ptllm
