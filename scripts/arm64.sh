#!/usr/bin/env bash
# AArch64 by emulation on a Debian 12 x86-64 host: cross-builds the tests (build-arm64, with
# cmake/aarch64-linux-gnu.cmake) and runs groups of them under qemu-aarch64, each on the CPU models
# that make its ARM kernel paths run:
#   cortex-a72   plain NEON (ARMv8.0)
#   neoverse-n1  + dotprod, FP16 arithmetic (ARMv8.2: Graviton 2, Ampere Altra)
#   max          + i8mm, BF16 (ARMv8.6 and later: Apple M2+, Graviton 3/4)
# Usage: scripts/arm64.sh [GROUP...] (default: all). Groups (docs/arm64.md gives their times):
#   dispatch  the dispatcher's choice on the three models: NEON, dotprod, i8mm, BF16, never scalar
#   gguf      the GGUF block products and x's quantization against their scalar twin (plain, sdot,
#             smmla)
#   bf16      the F32/BF16/F16 products against their twin: plain NEON, bfdot and bfmmla (BF16)
#   kernels   every other NEON kernel against its twin (attention dense and KIVI, norms, RoPE,
#             softmax, conversions) and the MLX affine products (plain, sdot, usdot)
#   goldens   the shipped models' goldens against transformers (greedy ids, teacher-forced logits
#             and NLL), the architectures' logits against their reference, KIVI's and
#             StreamingLLM's quality on kjv-tiny
#   goldens-long  the rest of the golden tests of the shipped models (no cache, prefill against
#             token by token, the 1,024-token sequence, 300 greedy tokens) and every KV feature on
#             each architecture's model (not in CI)
#   ci        what .ci/run runs: dispatch gguf bf16 kernels goldens
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

# The loader and libc must come from one glibc build: they share private state (the thread stacks'
# list, read by pthread_create). The arm64 libraries the tests link (libpcre2-dev:arm64 ...) pull in
# multiarch's libc6:arm64, which the loader finds through /etc/ld.so.cache, so its loader is the one
# to run: `-L /`. The cross compiler's copy (-L /usr/aarch64-linux-gnu, libc6-arm64-cross) has
# another build of the loader, with multiarch's libc the first pthread_create never returns.
# run GROUP FILTER CPU...: the filter on each CPU model, timed (wall-clock and CPU seconds).
run() {
  local group=$1 filter=${ARM64_FILTER:-$2}
  shift 2
  local cpus=${ARM64_CPUS:-$*} cpu
  for cpu in $cpus; do
    echo "== $group: qemu-aarch64 -cpu $cpu --gtest_filter=$filter"
    local TIMEFORMAT="== $group on $cpu: %R s wall, %U s user, %S s system"
    time qemu-aarch64 -L / -cpu "$cpu" "$dir/tests/ptllm_kernel_tests" --gtest_brief=1 --gtest_filter="$filter"
  done
}

# tests/ptllm_kernel_tests: the kernels against their scalar twins and the dispatcher's choice, the
# KV cache and its policies (KIVI, windows), and the forward pass against transformers' goldens of
# the models in models/ (and ../shared/models when present).
# The shipped models: kjv-tiny (models/) and the six architectures' tiny models (tests/data/models).
shipped='kjv_tiny qwen3_tiny qwen3moe_tiny gemma3_tiny gemma3mm_tiny phi3_tiny smollm3_tiny'
goldens='' long=''
for m in $shipped; do
  goldens+="Models/GoldenTest.TeacherForcedMatchesTransformers/$m:Models/GoldenTest.GreedyMatchesTransformers/$m:"
  long+="Models/GoldenTest.NoCacheEqualsCachedPath/$m:Models/GoldenTest.PrefillEqualsTokenByToken/$m:"
  long+="Models/GoldenTest.Long*/$m:"
done
goldens+='Archs/ArchReferenceTest.*:EvalQualityTest.*'
long+='Tiny/ArchKvTest.KvFeaturesCompose/*:Models/EvalGoldenTest.*/kjv_tiny'
kernels='Targets/KernelTest.*:-Targets/KernelTest.Bf16Gemv*:Targets/KernelTest.ProductKernels*'
kernels+=':Targets/KernelTest.Matmul*:Targets/KernelTest.PackedProduct*'

groups=("${@:-all}")
[ "${groups[*]}" = ci ] && groups=(dispatch gguf bf16 kernels goldens)
for group in "${groups[@]}"; do
  case "$group" in
    dispatch) run dispatch 'SimdDispatch*' cortex-a72 neoverse-n1 max ;;
    gguf) run gguf 'SimdDispatch*:Types/GgmlProduct.EveryVariantMatchesTheScalarTwin/*:GgmlActs.*' cortex-a72 max ;;
    bf16)
      run bf16 'SimdDispatch*:Targets/KernelTest.Bf16Gemv*:Targets/KernelTest.ProductKernels*:Targets/KernelTest.Matmul*:Targets/KernelTest.PackedProduct*' \
        cortex-a72 max ;;
    kernels)
      run kernels "SimdDispatch*:AffineKernelTest.*:KVPolicyTargetsTest.*:QuantTest.FusedBlocksMatchDequantized:$kernels" max
      run kernels 'SimdDispatch*:AffineKernelTest.EveryKernelAndPathMatchesTheScalarTwin' cortex-a72 ;;
    goldens) run goldens "$goldens" max ;;
    goldens-long) run goldens-long "$long" max ;;
    all)
      run all '*:-EvalCliTest.*' max  # EvalCliTest runs the posttrainllm binary, not built here
      run dispatch 'SimdDispatch*' cortex-a72 neoverse-n1 ;;
    *) echo "scripts/arm64.sh: unknown group '$group' (dispatch, gguf, bf16, kernels, goldens, goldens-long, ci, all)" >&2; exit 2 ;;
  esac
done
