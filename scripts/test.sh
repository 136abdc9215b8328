#!/usr/bin/env bash
# Builds (Release) and runs every test through ctest. Run scripts/setup.sh once first.
# SANITIZE=address,undefined scripts/test.sh builds into build-asan with those sanitizers instead.
set -euo pipefail
cd "$(dirname "$0")/.."

dir=build
args=(-DCMAKE_BUILD_TYPE=Release)
if [ -n "${SANITIZE:-}" ]; then
  dir=build-asan
  args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DPTLLM_SANITIZE="$SANITIZE" -DPTLLM_BUILD_BENCH=OFF)
fi
cmake -S . -B "$dir" "${args[@]}"
cmake --build "$dir" -j"$(nproc)"
ctest --test-dir "$dir" --output-on-failure -j"$(nproc)"
