#!/usr/bin/env bash
# Builds (Release) and runs every test through ctest. Run scripts/setup.sh and scripts/setup-dev.sh
# once first.
# SANITIZE=address,undefined scripts/test.sh builds into build-asan with those sanitizers instead.
set -euo pipefail
cd "$(dirname "$0")/.."

dir=build
# The tests and benchmarks on, also in a build/ that scripts/setup.sh configured without them.
args=(-DCMAKE_BUILD_TYPE=Release -DPTLLM_BUILD_TESTS=ON -DPTLLM_BUILD_BENCH=ON)
if [ -n "${SANITIZE:-}" ]; then
  dir=build-asan
  args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DPTLLM_SANITIZE="$SANITIZE" -DPTLLM_BUILD_TESTS=ON -DPTLLM_BUILD_BENCH=OFF)
fi
cmake -S . -B "$dir" "${args[@]}"
cmake --build "$dir" -j"$(nproc)"
ctest --test-dir "$dir" --output-on-failure -j"$(nproc)"
