#!/usr/bin/env bash
# serve's chat page libraries (marked, DOMPurify, highlight.js) from npm, for systems without
# Debian's packages (macOS): the versions Debian 12 ships, pinned with their lockfile in
# src/server/webui/npm, installed into BUILD_DIR/webui-npm, where the CMake build looks for them.
# Usage: scripts/webui-npm.sh [BUILD_DIR] (default: build). Needs npm (Homebrew: brew install node).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
command -v npm >/dev/null || { echo "scripts/webui-npm.sh: npm not found (macOS: brew install node)" >&2; exit 1; }
mkdir -p "$build/webui-npm"
cp src/server/webui/npm/package.json src/server/webui/npm/package-lock.json "$build/webui-npm/"
# --ignore-scripts: only the libraries' files are read; highlight.js 9's install script only prints a notice.
(cd "$build/webui-npm" && npm ci --ignore-scripts --no-audit --no-fund)
echo "serve's chat page libraries in $build/webui-npm/node_modules; now configure: cmake -S . -B $build ..."
