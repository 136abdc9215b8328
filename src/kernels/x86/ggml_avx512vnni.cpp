// The products over llama.cpp's block formats for AVX-512 VNNI (Ice Lake, Zen 4 and later): vpdpbusd /
// vpdpwssd on 256-bit vectors (ggml_kernels_impl.h).
#include "kernels/ggml.h"

#if defined(__x86_64__)
// GCC 12 reports the _mm512_undefined_* placeholders inside its own intrinsics as uninitialized
// (GCC PR 105593), once per use.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#define PTLLM_GGML_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
#define PTLLM_GGML_VNNI 1
#define PTLLM_GGML_ZMM 1
#define PTLLM_GGML_NAME "avx512vnni"
#include "kernels/x86/ggml_kernels_impl.h"

namespace ptllm {
const GgmlKernel* detail::ggml_avx512vnni_kernel() { return &kKernel; }
GgmlRowsFn detail::ggml_avx512vnni_panel_rows(GgmlType t) { return tiled_takes(t, 1) ? tiled_rows : nullptr; }
}  // namespace ptllm
#else
namespace ptllm {
const GgmlKernel* detail::ggml_avx512vnni_kernel() { return nullptr; }
GgmlRowsFn detail::ggml_avx512vnni_panel_rows(GgmlType) { return nullptr; }
}  // namespace ptllm
#endif
