#!/usr/bin/env bash
# The developer's set-up on Debian 12, on top of scripts/setup.sh: the libraries and tools of the
# tests (GoogleTest, redis-server for serve --kv-store's tests, tmux for chat's terminal test,
# Chromium and playwright-core for the chat page's test, the openai npm client), the benchmarks
# (Google Benchmark, OpenBLAS) and the fuzzers (clang 14 with libFuzzer). Then scripts/test.sh
# builds and runs the tests. Idempotent.
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

# The openai npm client for the server's client tests (ctest node_openai_client) and
# scripts/serve_load.mjs, playwright-core for the chat page's (node_webui); optional: without npm
# those tests are skipped.
if command -v npm >/dev/null 2>&1; then
  (cd tests/node && npm ci --no-audit --no-fund) ||
    echo "npm ci failed (no registry?): the openai-client tests of posttrainllm serve will be skipped"
else
  echo "npm not found: the openai-client tests of posttrainllm serve will be skipped"
fi
