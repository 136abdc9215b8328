#!/usr/bin/env bash
# AArch64 by emulation on a Debian 12 x86-64 host: cross-builds the tests (build-arm64, with
# cmake/aarch64-linux-gnu.cmake) and runs the kernel, KV and golden tests under qemu-aarch64, once
# per CPU model so that every ARM kernel path runs:
#   cortex-a72   plain NEON (ARMv8.0)
#   neoverse-n1  + dotprod, FP16 arithmetic (ARMv8.2: Graviton 2, Ampere Altra)
#   max          + i8mm, BF16 (ARMv8.6 and later: Apple M2+, Graviton 3/4)
# Needs scripts/setup-dev.sh's arm64 packages (the cross compiler, qemu-user, the libraries' arm64
# builds). ARM64_CPUS="max" runs one model; ARM64_FILTER replaces the gtest filters;
# ARM64_SKIP_BUILD=1 runs what build-arm64 holds.
set -euo pipefail
cd "$(dirname "$0")/.."

dir=build-arm64
if [ -z "${ARM64_SKIP_BUILD:-}" ]; then
  cmake -S . -B "$dir" -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DCMAKE_BUILD_TYPE=Release \
    -DPTLLM_BUILD_TESTS=ON -DPTLLM_BUILD_BENCH=OFF -DPTLLM_REDIS=OFF -DPTLLM_LIBEDIT=OFF
  cmake --build "$dir" -j"$(nproc)" --target ptllm_kernel_tests
fi

# tests/ptllm_kernel_tests: the kernels against their scalar twins and the dispatcher's choice, the
# KV cache and its policies (KIVI, windows), and the forward pass against transformers' goldens of
# the models in models/ (and ../shared/models when present). All of it on `max`, where every ARM
# kernel variant is available and each is tested against its twin; on the others the dispatcher's
# choice for that CPU (plain NEON, dotprod).
per_cpu="SimdDispatch*"
for cpu in ${ARM64_CPUS:-max cortex-a72 neoverse-n1}; do
  filter="${ARM64_FILTER:-$([ "$cpu" = max ] && echo '*' || echo "$per_cpu")}"
  echo "== qemu-aarch64 -cpu $cpu --gtest_filter=$filter"
  qemu-aarch64 -L /usr/aarch64-linux-gnu -cpu "$cpu" "$dir/tests/ptllm_kernel_tests" --gtest_brief=1 \
    --gtest_filter="$filter"
done
