// The affine products for AVX-512 without VNNI (kernels/x86/affine_avx512.h).
#define PTLLM_AFFINE_VNNI 0
#include "kernels/simd.h"
#include "kernels/x86/affine_avx512.h"

namespace ptllm {
#if defined(__x86_64__)
namespace {
constexpr AffineKernelTable kTable = AffineKernels<Avx512Affine>::table("avx512");
}
const AffineKernelTable* affine_avx512_kernels() {
  // The dense kernels' AVX-512 target checks the same (F, BW, VL, DQ) and the OS's zmm state.
  static const bool ok = kernel_table(SimdTarget::AVX512) != nullptr;
  return ok ? &kTable : nullptr;
}
#else
const AffineKernelTable* affine_avx512_kernels() { return nullptr; }
#endif
}  // namespace ptllm
