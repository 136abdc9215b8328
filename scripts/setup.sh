#!/usr/bin/env bash
# One-time set-up on Debian 12 for a user: installs what building and running posttrainllm needs
# (Debian packages only), builds build/posttrainllm (Release) and runs `posttrainllm sample` on the
# model shipped in models/kjv-tiny. The tests, benchmarks and fuzzers need more: scripts/setup-dev.sh.
# Idempotent: run it again at any time.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(build-essential cmake pkg-config
  nlohmann-json3-dev libpcre2-dev libssl-dev libxxhash-dev libcli11-dev
  libcpp-httplib-dev  # the HTTP server of `posttrainllm serve`
  libhiredis-dev      # serve --kv-store (Redis); without it that flag says what is missing
  libedit-dev         # chat's line editing and history on a terminal; without it plain lines
  libjs-marked node-dompurify node-highlight.js)  # serve's chat page: built into the binary

source scripts/apt_install.sh
install_packages "${PACKAGES[@]}"

# Without the tests and benchmarks: their libraries are scripts/setup-dev.sh's.
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DPTLLM_BUILD_TESTS=OFF -DPTLLM_BUILD_BENCH=OFF
cmake --build build -j"$(nproc)" --target posttrainllm

./build/posttrainllm sample --prompt "In the beginning" --tokens 48 --temperature 0
