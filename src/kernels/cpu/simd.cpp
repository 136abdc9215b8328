#include "kernels/simd.h"

#include <string>

#include "core/error.h"
#include "kernels/amx.h"
#include "kernels/cpu/features.h"
#include "kernels/panels.h"

namespace ptllm {

namespace detail {
std::atomic<const KernelTable*> g_active_kernels{nullptr};
}

std::string_view simd_target_name(SimdTarget t) {
  switch (t) {
    case SimdTarget::Portable: return "portable";
    case SimdTarget::AVX2: return "avx2";
    case SimdTarget::AVX512: return "avx512";
    case SimdTarget::NEON: return "neon";
  }
  return "?";
}

const KernelTable* kernel_table(SimdTarget t) {
  switch (t) {
    case SimdTarget::Portable: return portable_kernel_table();
    case SimdTarget::AVX2: return cpu_features().avx2 ? avx2_kernel_table() : nullptr;
    case SimdTarget::AVX512: return cpu_features().avx512 ? avx512_kernel_table() : nullptr;
    case SimdTarget::NEON: return cpu_features().neon ? neon_kernel_table() : nullptr;
  }
  return nullptr;
}

std::vector<SimdTarget> available_simd_targets() {
  std::vector<SimdTarget> out;
  for (SimdTarget t : {SimdTarget::Portable, SimdTarget::AVX2, SimdTarget::AVX512, SimdTarget::NEON})
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
  return std::string(simd_target_name(active_simd_target())) + active_kernels().variant + (amx_active() ? "+amx" : "") +
         (panels_wanted() ? (panels_bf16_x() ? "+panels-bf16x" : "+panels") : "");
}

void set_simd_target(SimdTarget t) {
  const KernelTable* k = kernel_table(t);
  if (!k) throw Error("SIMD target " + std::string(simd_target_name(t)) + " is not available on this CPU");
  detail::g_active_kernels.store(k);
}

}  // namespace ptllm
