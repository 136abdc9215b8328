#!/usr/bin/env bash
# AArch64 by emulation on a Debian 12 x86-64 host: cross-builds the tests (build-arm64, with
# cmake/aarch64-linux-gnu.cmake) and runs groups of them under qemu-aarch64, each on the CPU models
# that make its ARM kernel paths run:
#   cortex-a72   plain NEON (ARMv8.0)
#   neoverse-n1  + dotprod, FP16 arithmetic (ARMv8.2: Graviton 2, Ampere Altra)
#   max          + i8mm, BF16 (ARMv8.6 and later: Apple M2+, Graviton 3/4)
# Usage: scripts/arm64.sh [GROUP...] (default: all). Groups (docs/arm64.md gives their times):
#   dispatch  the dispatcher's choice on the three models: NEON, dotprod, i8mm, BF16, never scalar
#   gguf      the GGUF block products and x's quantization against their scalar twin (plain, dotprod)
#   bf16      the F32/BF16/F16 products against their twin: plain NEON, and bfdot (BF16 weights)
#   goldens   greedy ids of the shipped model (and ../shared's kjv-small) against transformers
#   all       every test of the program on max, then dispatch
# Needs scripts/setup-dev.sh's arm64 packages (the cross compiler, qemu-user, the libraries' arm64
# builds). ARM64_CPUS replaces a group's CPU models, ARM64_FILTER its gtest filter;
# ARM64_SKIP_BUILD=1 runs what build-arm64 holds.
set -euo pipefail
cd "$(dirname "$0")/.."

dir=build-arm64
if [ -z "${ARM64_SKIP_BUILD:-}" ]; then
  cmake -S . -B "$dir" -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DCMAKE_BUILD_TYPE=Release \
    -DPTLLM_BUILD_TESTS=ON -DPTLLM_BUILD_BENCH=OFF -DPTLLM_REDIS=OFF -DPTLLM_LIBEDIT=OFF -DPTLLM_WEBUI=OFF
  cmake --build "$dir" -j"$(nproc)" --target ptllm_kernel_tests
fi

# run GROUP FILTER CPU...: the filter on each CPU model, timed.
run() {
  local group=$1 filter=${ARM64_FILTER:-$2}
  shift 2
  local cpus=${ARM64_CPUS:-$*} start cpu
  for cpu in $cpus; do
    echo "== $group: qemu-aarch64 -cpu $cpu --gtest_filter=$filter"
    start=$(date +%s)
    qemu-aarch64 -L /usr/aarch64-linux-gnu -cpu "$cpu" "$dir/tests/ptllm_kernel_tests" --gtest_brief=1 \
      --gtest_filter="$filter"
    echo "== $group on $cpu: $(($(date +%s) - start)) s"
  done
}

# tests/ptllm_kernel_tests: the kernels against their scalar twins and the dispatcher's choice, the
# KV cache and its policies (KIVI, windows), and the forward pass against transformers' goldens of
# the models in models/ (and ../shared/models when present).
for group in "${@:-all}"; do
  case "$group" in
    dispatch) run dispatch 'SimdDispatch*' cortex-a72 neoverse-n1 max ;;
    gguf) run gguf 'SimdDispatch*:Types/GgmlProduct.EveryVariantMatchesTheScalarTwin/*:GgmlActs.*' cortex-a72 max ;;
    bf16) run bf16 'SimdDispatch*:Targets/KernelTest.Bf16Gemv*:Targets/KernelTest.ProductKernels*' cortex-a72 max ;;
    goldens)
      run goldens 'Models/GoldenTest.GreedyMatchesTransformers/kjv_tiny:Models/GoldenTest.GreedyMatchesTransformers/kjv_small' max ;;
    all)
      run all '*' max
      run dispatch 'SimdDispatch*' cortex-a72 neoverse-n1 ;;
    *) echo "scripts/arm64.sh: unknown group '$group' (dispatch, gguf, bf16, goldens, all)" >&2; exit 2 ;;
  esac
done
