#include "kernels/cpu/features.h"

#if defined(__x86_64__)
#include <cpuid.h>
#elif defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#elif defined(__aarch64__) && defined(__APPLE__)
#include <sys/sysctl.h>
#endif

namespace ptllm {
namespace {

#if defined(__aarch64__) && defined(__APPLE__)
bool sysctl_flag(const char* name) {
  int v = 0;
  size_t n = sizeof v;
  return sysctlbyname(name, &v, &n, nullptr, 0) == 0 && v != 0;
}
#endif

CpuFeatures detect() {
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
  f.avx512vnni = f.avx512 && (c & (1u << 11));
  f.avx512vbmi = f.avx512 && (c & (1u << 1));
  f.amx_bf16 = (d & (1u << 22)) && (d & (1u << 24));
  unsigned a1 = 0, b1 = 0, c1 = 0, d1 = 0;
  if (__get_cpuid_count(7, 1, &a1, &b1, &c1, &d1)) {
    f.avx_vnni = f.avx2 && (a1 & (1u << 4));
    f.avx512bf16 = f.avx512 && (a1 & (1u << 5));
  }
#elif defined(__aarch64__)
  f.neon = true;
#if defined(__linux__)
  // Linux's arch/arm64/include/uapi/asm/hwcap.h (named here: older libc headers lack the newer ones).
  const unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
  f.fp16 = hw & (1ul << 9);      // HWCAP_FPHP
  f.dotprod = hw & (1ul << 20);  // HWCAP_ASIMDDP
  f.i8mm = hw2 & (1ul << 13);    // HWCAP2_I8MM
  f.bf16 = hw2 & (1ul << 14);    // HWCAP2_BF16
#elif defined(__APPLE__)
  f.fp16 = sysctl_flag("hw.optional.arm.FEAT_FP16");
  f.dotprod = sysctl_flag("hw.optional.arm.FEAT_DotProd");
  f.i8mm = sysctl_flag("hw.optional.arm.FEAT_I8MM");
  f.bf16 = sysctl_flag("hw.optional.arm.FEAT_BF16");
#endif
#endif
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

std::string cpu_features_text() {
  const CpuFeatures& f = cpu_features();
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(f.avx2, "avx2");
  add(f.avx512, "avx512");
  add(f.avx512vnni, "avx512vnni");
  add(f.avx512vbmi, "avx512vbmi");
  add(f.avx_vnni, "avx-vnni");
  add(f.avx512bf16, "avx512bf16");
  add(f.amx_bf16, "amx-bf16");
  add(f.neon, "neon");
  add(f.fp16, "fp16");
  add(f.dotprod, "dotprod");
  add(f.i8mm, "i8mm");
  add(f.bf16, "bf16");
  return s;
}

}  // namespace ptllm
