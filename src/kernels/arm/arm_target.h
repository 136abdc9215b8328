#pragma once
// Function attributes that compile one function for an ARMv8 extension while the rest of the
// library stays ARMv8.0: the kernels that use them run only where kernels/cpu/features.h found the
// extension. GCC names the architecture level the intrinsics of arm_neon.h ask for; clang the feature.
#if defined(__clang__)
#define PTLLM_ARM_TARGET_DOTPROD __attribute__((target("dotprod")))
#define PTLLM_ARM_TARGET_I8MM __attribute__((target("dotprod,i8mm")))
#define PTLLM_ARM_TARGET_BF16 __attribute__((target("bf16")))
#else
#define PTLLM_ARM_TARGET_DOTPROD __attribute__((target("arch=armv8.2-a+dotprod")))
#define PTLLM_ARM_TARGET_I8MM __attribute__((target("arch=armv8.2-a+dotprod+i8mm")))
#define PTLLM_ARM_TARGET_BF16 __attribute__((target("arch=armv8.2-a+bf16")))
#endif
