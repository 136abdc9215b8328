#include <string>

#include "kernels/affine.h"
#include "kernels/cpu/features.h"
#include "kernels/ggml.h"
#include "kernels/simd.h"

namespace ptllm {

std::string kernels_description() {
  const std::string cpu = cpu_features_text();
  return active_kernels_name() + " (affine " + std::string(affine_kernel_name(affine_active_kernel())) + ", gguf " +
         ggml_active_kernel().name + "; cpu " + (cpu.empty() ? "baseline" : cpu) + ")";
}

}  // namespace ptllm
