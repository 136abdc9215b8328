// The affine products for AVX2 without VNNI (kernels/affine_avx2.h).
#define PTLLM_AFFINE_AVXVNNI 0
#include "kernels/affine_avx2.h"

namespace ptllm {
#if defined(__x86_64__)
namespace {
constexpr AffineKernelTable kTable = AffineKernels<Avx2Affine>::table("avx2");
}
const AffineKernelTable* affine_avx2_kernels() {
  static const bool ok =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  return ok ? &kTable : nullptr;
}
#else
const AffineKernelTable* affine_avx2_kernels() { return nullptr; }
#endif
}  // namespace ptllm
