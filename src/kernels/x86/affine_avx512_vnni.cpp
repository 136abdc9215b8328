// The affine products for AVX-512 with VNNI (kernels/x86/affine_avx512.h): Ice Lake, Zen 4 and later.
#define PTLLM_AFFINE_VNNI 1
#include "kernels/x86/affine_avx512.h"
#include "kernels/cpu/features.h"

namespace ptllm {
#if defined(__x86_64__)
namespace {
constexpr AffineKernelTable kTable = AffineKernels<Avx512Affine>::table("avx512-vnni");
}
const AffineKernelTable* affine_avx512_vnni_kernels() {
  static const bool ok = affine_avx512_kernels() && cpu_features().avx512vnni;
  return ok ? &kTable : nullptr;
}
#else
const AffineKernelTable* affine_avx512_vnni_kernels() { return nullptr; }
#endif
}  // namespace ptllm
