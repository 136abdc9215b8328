#!/usr/bin/env bash
# One-time set-up on Debian 12: installs the build dependencies (Debian packages only), builds
# posttrainllm in Release and runs `posttrainllm sample` on the model shipped in models/kjv-tiny.
# Idempotent: run it again at any time.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(build-essential cmake pkg-config
  nlohmann-json3-dev libpcre2-dev libssl-dev libxxhash-dev libcli11-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libopenblas-dev  # OpenBLAS: only the sgemm comparison in bench/bench_kernels.cpp (loaded at run time)
  libcpp-httplib-dev  # the HTTP server of `posttrainllm serve`
  libhiredis-dev redis-server  # serve --kv-store (Redis) and its tests, which start their own redis-server
  clang-14 libclang-rt-14-dev)  # the libFuzzer targets (scripts/fuzz.sh), which .ci/run runs briefly

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "installing: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)"

# The openai npm client for the server's client tests (ctest node_openai_client) and
# scripts/serve_load.mjs; optional: without npm those tests are skipped.
if command -v npm >/dev/null 2>&1; then
  (cd tests/node && npm ci --no-audit --no-fund) ||
    echo "npm ci failed (no registry?): the openai-client tests of posttrainllm serve will be skipped"
else
  echo "npm not found: the openai-client tests of posttrainllm serve will be skipped"
fi

./build/posttrainllm sample --prompt "In the beginning" --tokens 48 --temperature 0
