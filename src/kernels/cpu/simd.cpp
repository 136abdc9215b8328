#include "kernels/simd.h"

#include <string>

#include "core/error.h"
#include "kernels/amx.h"
#include "kernels/panels.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace ptllm {

namespace detail {
std::atomic<const KernelTable*> g_active_kernels{nullptr};
}

namespace {

struct CpuFeatures {
  bool avx2 = false;    // AVX2 + FMA + F16C, ymm state enabled by the OS
  bool avx512 = false;  // AVX-512 F/BW/VL/DQ, zmm and mask state enabled by the OS
};

CpuFeatures detect_cpu() {
  CpuFeatures f;
#if defined(__x86_64__)
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = c & (1u << 27), avx = c & (1u << 28), fma = c & (1u << 12), f16c = c & (1u << 29);
  if (!osxsave || !avx) return f;
  uint32_t xlo, xhi;
  __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
  const bool ymm_state = (xlo & 0x6u) == 0x6u;
  const bool zmm_state = (xlo & 0xe6u) == 0xe6u;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return f;
  const bool avx2 = b & (1u << 5);
  const bool avx512 = (b & (1u << 16)) && (b & (1u << 17)) && (b & (1u << 30)) && (b & (1u << 31));
  f.avx2 = ymm_state && avx2 && fma && f16c;
  f.avx512 = f.avx2 && zmm_state && avx512;
#endif
  return f;
}

const CpuFeatures& cpu() {
  static const CpuFeatures f = detect_cpu();
  return f;
}

}  // namespace

std::string_view simd_target_name(SimdTarget t) {
  switch (t) {
    case SimdTarget::Portable: return "portable";
    case SimdTarget::AVX2: return "avx2";
    case SimdTarget::AVX512: return "avx512";
  }
  return "?";
}

const KernelTable* kernel_table(SimdTarget t) {
  switch (t) {
    case SimdTarget::Portable: return portable_kernel_table();
    case SimdTarget::AVX2: return cpu().avx2 ? avx2_kernel_table() : nullptr;
    case SimdTarget::AVX512: return cpu().avx512 ? avx512_kernel_table() : nullptr;
  }
  return nullptr;
}

std::vector<SimdTarget> available_simd_targets() {
  std::vector<SimdTarget> out;
  for (SimdTarget t : {SimdTarget::Portable, SimdTarget::AVX2, SimdTarget::AVX512})
    if (kernel_table(t)) out.push_back(t);
  return out;
}

const KernelTable& detail::select_best_kernels() {
  const KernelTable* best = nullptr;
  for (SimdTarget t : available_simd_targets()) best = kernel_table(t);  // listed slowest first
  const KernelTable* expected = nullptr;
  g_active_kernels.compare_exchange_strong(expected, best);
  return *g_active_kernels.load();
}

std::string active_kernels_name() {
  // "+panels": BF16 weights packed at load (kernels/panels.h), whose products give other last bits
  // than the row-major ones: in the prompt cache's key, like "+amx".
  return std::string(simd_target_name(active_simd_target())) + (amx_active() ? "+amx" : "") +
         (panels_wanted() ? "+panels" : "");
}

void set_simd_target(SimdTarget t) {
  const KernelTable* k = kernel_table(t);
  if (!k) throw Error("SIMD target " + std::string(simd_target_name(t)) + " is not available on this CPU");
  detail::g_active_kernels.store(k);
}

}  // namespace ptllm
