// The affine products for AVX2 without VNNI (kernels/x86/affine_avx2.h).
#define PTLLM_AFFINE_AVXVNNI 0
#include "kernels/simd.h"
#include "kernels/x86/affine_avx2.h"

namespace ptllm {
#if defined(__x86_64__)
namespace {
constexpr AffineKernelTable kTable = AffineKernels<Avx2Affine>::table("avx2");
}
const AffineKernelTable* affine_avx2_kernels() {
  // The dense kernels' AVX2 target checks the same (AVX2, FMA, F16C) and the OS's ymm state.
  static const bool ok = kernel_table(SimdTarget::AVX2) != nullptr;
  return ok ? &kTable : nullptr;
}
#else
const AffineKernelTable* affine_avx2_kernels() { return nullptr; }
#endif
}  // namespace ptllm
