// The affine products for AArch64, ARMv8.2 dotprod (sdot): Cortex-A76/Neoverse N1, Graviton 2, Apple M1 and later (kernels/arm/affine_neon.h).
#define PTLLM_AFFINE_NEON_DOT 1
#include "kernels/arm/affine_neon.h"
#include "kernels/cpu/features.h"

namespace ptllm {
#if defined(__aarch64__)
namespace {
constexpr AffineKernelTable kTable = AffineKernels<NeonAffine>::table("neon-dotprod");
}  // namespace
const AffineKernelTable* affine_neon_dotprod_kernels() {
  static const bool ok = cpu_features().dotprod;
  return ok ? &kTable : nullptr;
}
#else
const AffineKernelTable* affine_neon_dotprod_kernels() { return nullptr; }
#endif
}  // namespace ptllm
