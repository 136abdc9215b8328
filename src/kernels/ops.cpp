// The public kernels: each forwards to the active SIMD target (kernels/simd.h); matmul also splits
// the work over the thread pool.
#include "kernels/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/affine.h"
#include "kernels/amx.h"
#include "kernels/ggml.h"
#include "kernels/panels.h"
#include "kernels/quant.h"
#include "kernels/scratch.h"
#include "kernels/simd.h"

namespace ptllm {

float dot(const float* a, const float* b, int n) { return active_kernels().dot(a, b, n); }

void axpy(float a, const float* x, float* y, int n) { active_kernels().axpy(a, x, y, n); }

float dot_stored(const float* a, const void* b, DType t, int n) {
  const KernelTable& k = active_kernels();
  switch (t) {
    case DType::F32: return k.dot(a, static_cast<const float*>(b), n);
    case DType::BF16: return k.dot_bf16(a, b, n);
    case DType::F16: return k.dot_f16(a, b, n);
    default: PTLLM_CHECK(!"dot_stored: not a float dtype");
  }
  return 0.f;
}

void axpy_stored(float a, const void* x, DType t, float* y, int n) {
  const KernelTable& k = active_kernels();
  switch (t) {
    case DType::F32: k.axpy(a, static_cast<const float*>(x), y, n); return;
    case DType::BF16: k.axpy_bf16(a, x, y, n); return;
    case DType::F16: k.axpy_f16(a, x, y, n); return;
    default: PTLLM_CHECK(!"axpy_stored: not a float dtype");
  }
}

void dense_k_block(const float* q, int nq, const void* k, DType t, float qscale, int nk, int D, float* out,
                   int ld_out, const void* next) {
  PTLLM_CHECK(t == DType::F32 || t == DType::BF16 || t == DType::F16);
  active_kernels().dense_k_block(q, nq, k, t, qscale, nk, D, out, ld_out, next);
}

void dense_v_block(const float* p, int ld_p, int nq, const void* v, DType t, int nk, int D, float* acc,
                   const void* next) {
  PTLLM_CHECK(t == DType::F32 || t == DType::BF16 || t == DType::F16);
  active_kernels().dense_v_block(p, ld_p, nq, v, t, nk, D, acc, next);
}

void store_as(const float* src, void* dst, DType t, int n) {
  switch (t) {
    case DType::F32: std::memcpy(dst, src, size_t(n) * sizeof(float)); return;
    case DType::BF16: active_kernels().to_bf16(src, dst, n); return;
    case DType::F16: active_kernels().to_f16(src, dst, n); return;
    default: PTLLM_CHECK(!"store_as: not a float dtype");
  }
}

void load_from(const void* src, DType t, float* dst, int n) {
  switch (t) {
    case DType::F32: std::memcpy(dst, src, size_t(n) * sizeof(float)); return;
    case DType::BF16: active_kernels().from_bf16(src, dst, n); return;
    case DType::F16: active_kernels().from_f16(src, dst, n); return;
    default: PTLLM_CHECK(!"load_from: not a float dtype");
  }
}

void weight_row(const WeightMatrix& w, int r, float* out) {
  if (w.format == WeightFormat::Panels) return panels_row(w, r, out);
  if (w.format == WeightFormat::Affine) return affine_dequant_row(w, r, out);
  if (w.format == WeightFormat::Ggml) return ggml_dequant_row(w, r, out);
  load_from(static_cast<const uint8_t*>(w.data) + size_t(r) * size_t(w.cols) * dtype_size(w.dtype), w.dtype, out,
            w.cols);
}

void kivi_k_block(const float* q, int nq, KRows codes, const uint16_t* scale, const uint16_t* zero, float qscale,
                  int nk, int D, int bits, float* out, int ld_out, const void* next) {
  active_kernels().kivi_k_block(q, nq, codes, scale, zero, qscale, nk, D, bits, out, ld_out, next);
}

void kivi_v_block(const float* p, int ld_p, int nq, const uint8_t* codes, const uint16_t* scale, const uint16_t* zero,
                  int nk, int D, int bits, float* acc, float* zacc, const void* next) {
  active_kernels().kivi_v_block(p, ld_p, nq, codes, scale, zero, nk, D, bits, acc, zacc, next);
}

void kivi_k_spans(const float* q, int nq, const KiviSpan* s, int ns, int G, float qscale, int D, int bits,
                  float* out, int ld_out) {
  active_kernels().kivi_k_spans(q, nq, s, ns, G, qscale, D, bits, out, ld_out);
}

void kivi_v_spans(const float* p, int ld_p, int nq, const KiviSpan* s, int ns, int D, int bits, float* acc,
                  float* zacc) {
  active_kernels().kivi_v_spans(p, ld_p, nq, s, ns, D, bits, acc, zacc);
}

void kivi_k_dequant(KRows codes, const uint16_t* scale, const uint16_t* zero, int nk, int D, int bits, float* out) {
  active_kernels().kivi_k_dequant(codes, scale, zero, nk, D, bits, out);
}

namespace {
// Up to this many rows of x the weights are streamed once and converted in registers (decode is
// memory-bound); beyond it packing converted tiles pays for itself (bench_kernels product/*: the
// two meet near T = 6 on Zen).
constexpr int kGemvMaxT = 6;
// BF16 weights: the gemv's tiles of several weight rows (kernels_impl.h gemv_tiles_bf16) stay ahead
// of packing up to here (product/gemv/16 and product/gemm/16). The largest of the formats' switch
// points, which ops.h publishes as kMatmulSmallRows.
constexpr int kGemvMaxTBf16 = kMatmulSmallRows;
static_assert(kGemvMaxT <= kMatmulSmallRows);
// Fewest weights a thread's share of a gemv holds: below it, handing work to another thread costs
// more than it saves (tiny models).
constexpr size_t kGemvMinWeightsPerThread = 32 * 1024;
constexpr size_t kGemmMaxPartRows = 512;  // matmul, gemm: the widest part a thread takes
// BF16 gemv: from this many rows of x (the row tiles' range) x is deinterleaved once for all the
// threads' parts. Below it x is a few KiB and each part's own copy costs next to nothing; a shared
// one for all rows measured 0.96 of N = 1 decode (kjv-small, 2 threads, median of 12 alternating
// runs; a binary against a copy of itself gave 0.98), so one-row products keep their own.
constexpr int kSharedXMinT = 5;
// BF16 weights (in panels) on AMX (kernels/amx.h) from this many rows of x: fewer stream faster
// through the panels' own product. Other formats take AMX (through bf16 copies of their rows) only
// above kMatmulSmallRows, where their rows are shared by enough rows of x to pay for the copies.
constexpr int kAmxMinRows = 8;
static_assert(kAmxMinRows <= kMatmulSmallRows);

// Whether matmul takes w on AMX for T rows of x.
bool amx_wants(const WeightMatrix& w, int T) {
  if (w.format == WeightFormat::Panels) return T >= kAmxMinRows && amx_takes(w);
  return T > kMatmulSmallRows && amx_takes_dequantized(w);
}
}  // namespace

void matmul(const float* x, int T, const WeightMatrix& w, const float* bias, float* y, ThreadPool& pool) {
  if (amx_wants(w, T)) return amx_matmul(x, T, w, bias, y, pool);
  if (w.format == WeightFormat::Panels) return panels_matmul(x, T, w, bias, y, pool);
  if (w.format == WeightFormat::Affine) return affine_matmul(x, T, w, bias, y, pool);
  if (w.format == WeightFormat::Ggml) return ggml_matmul(x, T, w, bias, y, pool);
  const KernelTable& k = active_kernels();
  if (T <= (w.dtype == DType::BF16 ? kGemvMaxTBf16 : kGemvMaxT)) {
    const size_t min_rows = kGemvMinWeightsPerThread / size_t(std::max(1, w.cols));
    const size_t grain = std::max<size_t>(4, (min_rows + 3) / 4 * 4);
    // BF16 from kSharedXMinT rows: x deinterleaved once here for every part (a 1376 x 512 matrix
    // is 22 parts); fewer rows, each part makes its own small copy in its own core's cache.
    float* xdp = nullptr;
    if (w.dtype == DType::BF16 && T >= kSharedXMinT) {
      thread_local Scratch xd;
      xdp = xd.get(size_t(T) * size_t(w.cols));
      k.deinterleave_bf16(x, T, w.cols, xdp);
    }
    pool.parallel_for(size_t(w.rows), [&](size_t b, size_t e) { k.gemv(x, xdp, T, w, bias, y, int(b), int(e)); },
                      grain);
  } else {
    // x packed once into the caller's buffer, shared by the threads (reused by every prefill).
    thread_local std::vector<float> packed;
    const size_t panels = size_t((T + k.gemm_mr - 1) / k.gemm_mr);
    const size_t need = panels * size_t(k.gemm_mr) * size_t(w.cols);
    if (packed.size() < need) packed.resize(need);
    float* ap = packed.data();
    pool.parallel_for(panels, [&](size_t b, size_t e) { k.pack_a(x, T, w.cols, int(b), int(e), ap); });
    // A thread's part walks all of packed x once, whatever its width, and rewrites its slice of y
    // once per KC columns of x: parts of about two per thread (whole NR-row tiles), not the pool's
    // default eight, so x is streamed less often (kv, 512 x 2048: 16 parts of one tile each before),
    // but of at most kGemmMaxPartRows rows, so that slice of y stays small.
    const size_t nr = size_t(k.gemm_nr);
    const size_t per = std::min(kGemmMaxPartRows, (size_t(w.rows) + 2 * pool.size() - 1) / (2 * pool.size()));
    pool.parallel_for(size_t(w.rows), [&](size_t b, size_t e) { k.gemm(ap, T, w, bias, y, int(b), int(e)); },
                      std::max(nr, (per + nr - 1) / nr * nr));
  }
}

void matmul_shared_x(const float* x, int T, std::span<const MatmulOutput> outs, ThreadPool& pool) {
  const auto all = [&](auto&& pred) {
    return !outs.empty() && std::all_of(outs.begin(), outs.end(), [&](const MatmulOutput& o) {
      return o.w->cols == outs[0].w->cols && pred(*o.w);
    });
  };
  if (all([&](const WeightMatrix& w) { return amx_wants(w, T); })) return amx_matmul(x, T, outs, pool);
  if (all([&](const WeightMatrix& w) { return w.format == WeightFormat::Panels && !amx_wants(w, T); }))
    return panels_matmul(x, T, outs, pool);
  if (affine_matmul_shares(outs)) return affine_matmul(x, T, outs, pool);
  if (ggml_matmul_shares(outs)) return ggml_matmul(x, T, outs, pool);
  for (const MatmulOutput& o : outs) matmul(x, T, *o.w, o.bias, o.y, pool);
}

void rmsnorm(const float* x, const float* w, float* out, int n, float eps) {
  active_kernels().rmsnorm(x, w, out, n, eps);
}

void silu_mul(float* gate, const float* up, int n) { active_kernels().silu_mul(gate, up, n); }

void softmax(float* x, int n) { active_kernels().softmax(x, n); }

float max_of(const float* x, int n) { return active_kernels().max_of(x, n); }

float exp_sum(float* x, int n, float m) { return active_kernels().exp_sum(x, n, m); }

void rope_cos_sin(const float* inv_freq, int half, int64_t pos, float* cos, float* sin) {
  for (int i = 0; i < half; ++i) {
    const float a = float(pos) * inv_freq[i];
    cos[i] = float(std::cos(double(a)));
    sin[i] = float(std::sin(double(a)));
  }
}

void rope_rotate_one(const float* x, int head_dim, const float* cos, const float* sin, float* out) {
  active_kernels().rope_rotate_one(x, head_dim, cos, sin, out);
}

void rope_rotate(float* x, int n_heads, int head_dim, const float* cos, const float* sin) {
  active_kernels().rope_rotate(x, n_heads, head_dim, cos, sin);
}

}  // namespace ptllm
