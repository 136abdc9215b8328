// The affine products for AVX2 with AVX-VNNI (kernels/x86/affine_avx2.h).
#define PTLLM_AFFINE_AVXVNNI 1
#include "kernels/x86/affine_avx2.h"
#include "kernels/cpu/features.h"

namespace ptllm {
#if defined(__x86_64__)
namespace {
constexpr AffineKernelTable kTable = AffineKernels<Avx2Affine>::table("avx2-vnni");
}  // namespace
const AffineKernelTable* affine_avx2_vnni_kernels() {
  static const bool ok = affine_avx2_kernels() && cpu_features().avx_vnni;
  return ok ? &kTable : nullptr;
}
#else
const AffineKernelTable* affine_avx2_vnni_kernels() { return nullptr; }
#endif
}  // namespace ptllm
