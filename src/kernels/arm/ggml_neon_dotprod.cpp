// The products over llama.cpp's block formats for AArch64, ARMv8.2 dotprod (sdot): Cortex-A76/Neoverse N1,
// Graviton 2, Apple M1 and later (kernels/arm/ggml_neon.h). Chosen only where cpu/features.h found dotprod.
#define PTLLM_GGML_NEON_DOT 1
#define PTLLM_GGML_NAME "neon-dotprod"
#include "kernels/arm/ggml_neon.h"

namespace ptllm {
#if defined(__aarch64__)
const GgmlKernel* detail::ggml_neon_dotprod_kernel() { return &kKernel; }
#else
const GgmlKernel* detail::ggml_neon_dotprod_kernel() { return nullptr; }
#endif
}  // namespace ptllm
