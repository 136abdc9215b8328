// The products over llama.cpp's block formats for AArch64, ARMv8.6 i8mm (smmla; the K-quants by sdot):
// Neoverse V1/N2/V2 (Graviton 3/4), Apple M2 and later (kernels/arm/ggml_neon.h). Chosen only where
// cpu/features.h found i8mm and dotprod.
#define PTLLM_GGML_NEON_DOT 2
#define PTLLM_GGML_NAME "neon-i8mm"
#include "kernels/arm/ggml_neon.h"

namespace ptllm {
#if defined(__aarch64__)
const GgmlKernel* detail::ggml_neon_i8mm_kernel() { return &kKernel; }
#else
const GgmlKernel* detail::ggml_neon_i8mm_kernel() { return nullptr; }
#endif
}  // namespace ptllm
