#pragma once
// Runtime dispatch of the SIMD kernels. The library is compiled for a baseline CPU; each SIMD target
// is a translation unit whose functions are compiled for that instruction set (x86/kernels_avx2.cpp,
// x86/kernels_avx512.cpp, arm/kernels_neon.cpp; cpu/kernels_portable.cpp uses compiler vector
// extensions, whatever the CPU). What the CPU has: cpu/features.h.
// At first use the best target this CPU and OS support is chosen; ops.h's functions go through it.
#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/ops.h"
#include "kernels/quant.h"

namespace ptllm {

enum class SimdTarget : uint8_t { Portable, AVX2, AVX512, NEON };
std::string_view simd_target_name(SimdTarget t);

// Every kernel of one target. 16-bit rows (BF16/F16) are passed as void*: any alignment is fine.
struct KernelTable {
  SimdTarget target;
  float (*dot)(const float* a, const float* b, int n);
  float (*dot_bf16)(const float* a, const void* b, int n);
  float (*dot_f16)(const float* a, const void* b, int n);
  void (*axpy)(float a, const float* x, float* y, int n);
  void (*axpy_bf16)(float a, const void* x, float* y, int n);
  void (*axpy_f16)(float a, const void* x, float* y, int n);
  void (*to_bf16)(const float* src, void* dst, int n);  // round to nearest even, as torch
  void (*to_f16)(const float* src, void* dst, int n);
  void (*from_bf16)(const void* src, float* dst, int n);
  void (*from_f16)(const void* src, float* dst, int n);
  // A KIVI block for the query heads sharing a KV head (kernels/quant.h).
  // `next`: rows attention reads later, laid out the same, asked for while these are read (may be null).
  void (*kivi_k_block)(const float* q, int nq, KRows codes, const uint16_t* scale, const uint16_t* zero, float qscale,
                       int nk, int D, int bits, float* out, int ld_out, const void* next);
  void (*kivi_v_block)(const float* p, int ld_p, int nq, const uint8_t* codes, const uint16_t* scale,
                       const uint16_t* zero, int nk, int D, int bits, float* acc, float* zacc, const void* next);
  void (*kivi_k_spans)(const float* q, int nq, const KiviSpan* s, int ns, int G, float qscale, int D, int bits,
                       float* out, int ld_out);
  void (*kivi_v_spans)(const float* p, int ld_p, int nq, const KiviSpan* s, int ns, int D, int bits, float* acc,
                       float* zacc);
  // A dense block (rows stored as F32/BF16/F16) for the query heads sharing a KV head (ops.h).
  void (*dense_k_block)(const float* q, int nq, const void* k, DType t, float qscale, int nk, int D, float* out,
                        int ld_out, const void* next);
  void (*dense_v_block)(const float* p, int ld_p, int nq, const void* v, DType t, int nk, int D, float* acc,
                        const void* next);
  void (*kivi_k_dequant)(KRows codes, const uint16_t* scale, const uint16_t* zero, int nk, int D, int bits, float* out);
  float (*max_of)(const float* x, int n);
  float (*exp_sum)(float* x, int n, float m);
  void (*rmsnorm)(const float* x, const float* w, float* out, int n, float eps);
  void (*silu_mul)(float* gate, const float* up, int n);
  void (*softmax)(float* x, int n);
  void (*rope_rotate)(float* x, int n_heads, int head_dim, const float* cos, const float* sin);
  void (*rope_rotate_one)(const float* x, int head_dim, const float* cos, const float* sin, float* out);
  // Output columns [r0, r1) of y[T][w.rows] = x[T][w.cols] W^T + bias, one thread's share.
  // gemv: weights streamed once and converted in registers (decode, small T). BF16 weights are
  // multiplied against xd, x with its chunks' even and odd elements apart (deinterleave_bf16): the
  // caller's copy, made once for every thread, or nullptr (then each call makes its own).
  void (*deinterleave_bf16)(const float* x, int T, int K, float* xd);
  void (*gemv)(const float* x, const float* xd, int T, const WeightMatrix& w, const float* bias, float* y, int r0,
               int r1);
  // gemm (prefill): x is first packed into panels of gemm_mr rows, shared by every thread
  // (pack_a writes panels [p0, p1) of ceil(T / gemm_mr) into ap, [T rounded up to gemm_mr][K]);
  // then each thread converts tiles of its weight rows into a buffer reused by every row of x.
  void (*pack_a)(const float* x, int T, int K, int p0, int p1, float* ap);
  void (*gemm)(const float* ap, int T, const WeightMatrix& w, const float* bias, float* y, int r0, int r1);
  int gemm_mr;
  int gemm_nr;  // gemm's column tile: thread shares are multiples of it
  // Appended to the target's name where some products round differently from the target's own
  // (NEON "+bf16": BF16 weights through bfdot); part of active_kernels_name.
  const char* variant = "";
  // Dense F32 weights in the gemm's tiles, copied once (WeightMatrix::f32_tiles): tiles [t0, t1) of
  // gemm_nr rows each, tile t at out + t * gemm_nr * cols, [cols][gemm_nr] (rows past w.rows zero),
  // exactly what gemm packs per call, so a product reading them gets the same bits.
  void (*pack_f32_tiles)(const WeightMatrix& w, int t0, int t1, float* out) = nullptr;
};

// nullptr when the target is not compiled in or this CPU/OS lacks it.
const KernelTable* kernel_table(SimdTarget t);
std::vector<SimdTarget> available_simd_targets();
namespace detail {
extern std::atomic<const KernelTable*> g_active_kernels;
const KernelTable& select_best_kernels();
}  // namespace detail
// The table ops.h dispatches to (the best available unless set_simd_target chose another). Inline:
// attention calls dot/axpy once per stored token and head.
inline const KernelTable& active_kernels() {
  const KernelTable* k = detail::g_active_kernels.load(std::memory_order_relaxed);
  return k ? *k : detail::select_best_kernels();
}
inline SimdTarget active_simd_target() { return active_kernels().target; }
// What computes the numbers: the active target's name and variant, with "+amx" where BF16 products
// run on AMX (kernels/amx.h). Part of the prompt cache's key: another name may round differently.
std::string active_kernels_name();
// For people (--version, bench): the active target's name, the affine and GGUF products it takes
// and the CPU's features, e.g. "neon (affine neon-i8mm, gguf scalar; cpu neon fp16 dotprod i8mm bf16)".
std::string kernels_description();
// Process-wide switch, for tests and benchmarks; not safe while kernels run on other threads.
// Throws ptllm::Error if the target is unavailable.
void set_simd_target(SimdTarget t);

// Defined by the target translation units (nullptr where a target is not compiled in).
const KernelTable* portable_kernel_table();
const KernelTable* avx2_kernel_table();
const KernelTable* avx512_kernel_table();
const KernelTable* neon_kernel_table();

}  // namespace ptllm
