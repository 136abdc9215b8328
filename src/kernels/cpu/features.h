#pragma once
// What this CPU and OS offer the kernels: the one place that asks the hardware (x86: cpuid and
// xgetbv; Linux on ARM: getauxval; macOS on ARM: sysctlbyname). Read once, at first use.
#include <string>

namespace ptllm {

struct CpuFeatures {
  // x86-64. Each includes the OS's saving of the registers it needs (xgetbv).
  bool avx2 = false;        // AVX2 + FMA + F16C, ymm state enabled
  bool avx512 = false;      // AVX-512 F/BW/VL/DQ, zmm and mask state enabled
  bool avx512vnni = false;  // vpdpbusd on zmm
  bool avx512vbmi = false;  // vpermb, vpermt2b
  bool avx_vnni = false;    // vpdpbusd on ymm (AVX-VNNI: Alder Lake, Zen 5)
  bool avx512bf16 = false;
  bool amx_bf16 = false;    // AMX-TILE + AMX-BF16 in hardware; the OS's permission: kernels/x86/amx.cpp
  // AArch64 (Advanced SIMD is part of the base architecture).
  bool neon = false;
  bool fp16 = false;     // FEAT_FP16: half-precision arithmetic
  bool dotprod = false;  // FEAT_DotProd: sdot/udot
  bool i8mm = false;     // FEAT_I8MM: smmla/usdot
  bool bf16 = false;     // FEAT_BF16: bfdot/bfmmla
};

const CpuFeatures& cpu_features();
// The features above that this CPU has, space-separated ("avx2 avx512 avx512vnni", "neon dotprod").
std::string cpu_features_text();

}  // namespace ptllm
