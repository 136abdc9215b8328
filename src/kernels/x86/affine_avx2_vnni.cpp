// The affine products for AVX2 with AVX-VNNI (kernels/x86/affine_avx2.h).
#define PTLLM_AFFINE_AVXVNNI 1
#include "kernels/x86/affine_avx2.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace ptllm {
#if defined(__x86_64__)
namespace {
constexpr AffineKernelTable kTable = AffineKernels<Avx2Affine>::table("avx2-vnni");
// AVX-VNNI: CPUID leaf 7 sub-leaf 1, EAX bit 4 (read directly: clang 14's __builtin_cpu_supports
// does not know "avxvnni").
bool has_avx_vnni() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 4));
}
}  // namespace
const AffineKernelTable* affine_avx2_vnni_kernels() {
  static const bool ok = affine_avx2_kernels() && has_avx_vnni();
  return ok ? &kTable : nullptr;
}
#else
const AffineKernelTable* affine_avx2_vnni_kernels() { return nullptr; }
#endif
}  // namespace ptllm
