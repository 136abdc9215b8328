// The affine products for AVX-512 without VNNI (kernels/affine_avx512.h).
#define PTLLM_AFFINE_VNNI 0
#include "kernels/affine_avx512.h"

namespace ptllm {
#if defined(__x86_64__)
namespace {
constexpr AffineKernelTable kTable = AffineKernels<Avx512Affine>::table("avx512");
}
const AffineKernelTable* affine_avx512_kernels() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  return ok ? &kTable : nullptr;
}
#else
const AffineKernelTable* affine_avx512_kernels() { return nullptr; }
#endif
}  // namespace ptllm
