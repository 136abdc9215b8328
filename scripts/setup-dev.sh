#!/usr/bin/env bash
# The developer's set-up on Debian 12, on top of scripts/setup.sh: the libraries and tools of the
# tests (GoogleTest, redis-server for serve --kv-store's tests, tmux for chat's terminal test,
# Chromium and playwright-core for the chat page's test, the openai npm client, the AArch64 cross
# compiler and qemu-user), the benchmarks (Google Benchmark, OpenBLAS) and the fuzzers (clang 14
# with libFuzzer). Then scripts/test.sh builds and runs the tests. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

DEV_PACKAGES=(libgtest-dev libgmock-dev libbenchmark-dev
  libopenblas-dev  # OpenBLAS: only the sgemm comparison in bench/bench_kernels.cpp (loaded at run time)
  redis-server     # the tests of serve --kv-store start their own redis-server
  tmux             # chat's terminal test types into a tmux pane (skipped without it)
  chromium         # serve's chat page is tested in headless Chromium (with npm playwright-core)
  clang-14 libclang-rt-14-dev)  # the libFuzzer targets (scripts/fuzz.sh), which .ci/run runs briefly

source scripts/apt_install.sh
install_packages "${DEV_PACKAGES[@]}"

# AArch64 by emulation (scripts/arm64.sh, which .ci/run runs): the cross compiler, qemu-user and the
# arm64 builds of the libraries the kernel tests link (Debian multiarch; header-only packages serve
# both). Only on an x86-64 host.
if [ "$(dpkg --print-architecture)" = amd64 ]; then
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    if [ "$(id -u)" -ne 0 ]; then sudo dpkg --add-architecture arm64; else dpkg --add-architecture arm64; fi
  fi
  install_packages g++-aarch64-linux-gnu qemu-user libpcre2-dev:arm64 libssl-dev:arm64 libxxhash-dev:arm64 \
    libgtest-dev:arm64 libcpp-httplib-dev:arm64
fi

# The openai npm client for the server's client tests (ctest node_openai_client) and
# scripts/serve_load.mjs, playwright-core for the chat page's (node_webui); optional: without npm
# those tests are skipped.
if command -v npm >/dev/null 2>&1; then
  (cd tests/node && npm ci --no-audit --no-fund) ||
    echo "npm ci failed (no registry?): the openai-client tests of posttrainllm serve will be skipped"
else
  echo "npm not found: the openai-client tests of posttrainllm serve will be skipped"
fi
