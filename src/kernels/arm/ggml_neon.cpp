// The products over llama.cpp's block formats for AArch64, plain NEON (every ARMv8-A core) (kernels/arm/ggml_neon.h).
#define PTLLM_GGML_NEON_DOT 0
#define PTLLM_GGML_NAME "neon"
#include "kernels/arm/ggml_neon.h"

namespace ptllm {
#if defined(__aarch64__)
const GgmlKernel* detail::ggml_neon_kernel() { return &kKernel; }
#else
const GgmlKernel* detail::ggml_neon_kernel() { return nullptr; }
#endif
}  // namespace ptllm
