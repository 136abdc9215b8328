// The affine products for AArch64, plain NEON (every ARMv8-A core) (kernels/arm/affine_neon.h).
#define PTLLM_AFFINE_NEON_DOT 0
#include "kernels/arm/affine_neon.h"
#include "kernels/cpu/features.h"

namespace ptllm {
#if defined(__aarch64__)
namespace {
constexpr AffineKernelTable kTable = AffineKernels<NeonAffine>::table("neon");
}  // namespace
const AffineKernelTable* affine_neon_kernels() {
  static const bool ok = cpu_features().neon;
  return ok ? &kTable : nullptr;
}
#else
const AffineKernelTable* affine_neon_kernels() { return nullptr; }
#endif
}  // namespace ptllm
