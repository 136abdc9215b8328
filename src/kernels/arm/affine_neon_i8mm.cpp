// The affine products for AArch64, ARMv8.6 i8mm (usdot): Neoverse V1/N2, Graviton 3/4, Apple M2 and later (kernels/arm/affine_neon.h).
#define PTLLM_AFFINE_NEON_DOT 2
#include "kernels/arm/affine_neon.h"
#include "kernels/cpu/features.h"

namespace ptllm {
#if defined(__aarch64__)
namespace {
constexpr AffineKernelTable kTable = AffineKernels<NeonAffine>::table("neon-i8mm");
}  // namespace
const AffineKernelTable* affine_neon_i8mm_kernels() {
  static const bool ok = cpu_features().i8mm;
  return ok ? &kTable : nullptr;
}
#else
const AffineKernelTable* affine_neon_i8mm_kernels() { return nullptr; }
#endif
}  // namespace ptllm
