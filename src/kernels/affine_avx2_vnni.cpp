// The affine products for AVX2 with AVX-VNNI (kernels/affine_avx2.h).
#define PTLLM_AFFINE_AVXVNNI 1
#include "kernels/affine_avx2.h"

namespace ptllm {
#if defined(__x86_64__)
namespace {
constexpr AffineKernelTable kTable = AffineKernels<Avx2Affine>::table("avx2-vnni");
}
const AffineKernelTable* affine_avx2_vnni_kernels() {
  static const bool ok = affine_avx2_kernels() && __builtin_cpu_supports("avxvnni");
  return ok ? &kTable : nullptr;
}
#else
const AffineKernelTable* affine_avx2_vnni_kernels() { return nullptr; }
#endif
}  // namespace ptllm
