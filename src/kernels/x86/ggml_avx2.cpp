// The products over llama.cpp's block formats for AVX2 (Haswell, Zen 1 and later) (ggml_kernels_impl.h).
#include "kernels/ggml.h"

#if defined(__x86_64__)
#define PTLLM_GGML_TARGET __attribute__((target("avx2,fma,f16c")))
#define PTLLM_GGML_VNNI 0
#define PTLLM_GGML_NAME "avx2"
#include "kernels/x86/ggml_kernels_impl.h"

namespace ptllm {
const GgmlKernel* detail::ggml_avx2_kernel() { return &kKernel; }
}  // namespace ptllm
#else
namespace ptllm {
const GgmlKernel* detail::ggml_avx2_kernel() { return nullptr; }
}  // namespace ptllm
#endif
