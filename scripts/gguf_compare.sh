#!/usr/bin/env bash
# GGUF figures for docs/gguf.md, on a quiet machine.
#   scripts/gguf_compare.sh ppl [FILE.gguf ...]   our PPL in llama.cpp's protocol (512-token chunks, the
#       first 100, each starting with BOS, second halves scored) over ../shared/corpus/val.txt with the
#       record separators replaced by blank lines, as ../shared/models/gguf/README.md's figures were
#       made; default: every file of ../shared/models/gguf.
#   scripts/gguf_compare.sh speed LLAMA_BIN_DIR [FILE.gguf]   decode and prefill tok/s, 2 threads, ours
#       (posttrainllm bench) and llama.cpp's (llama-bench) side by side; default kjv-small-Q4_K_M.gguf.
#       LLAMA_BIN_DIR: llama.cpp's build/bin (../shared/tools/llama-cpp-anchor.sh builds it).
#   scripts/gguf_compare.sh writer LLAMA_BIN_DIR [MIX ...]   our writer's files (default Q8_0, Q4_0 and
#       Q4_K_M of kjv-tiny, and Q4_K_M of kjv-small) through llama.cpp's llama-perplexity and our eval,
#       the same protocol as `ppl` (CHUNKS=N: the first N chunks), one thread each. LLAMA_PPL_FLAGS adds flags to llama-perplexity
#       (default --no-repack: the AMX kernels of a -march=native build fault where the VM does not
#       grant AMX state).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${PTLLM_BIN:-build/posttrainllm}
G=../shared/models/gguf
mode=${1:?ppl or speed}; shift
case "$mode" in
  ppl)
    plain=$(mktemp /tmp/val-plain-XXXXXX.txt)
    trap 'rm -f "$plain"' EXIT
    python3 -c 'import sys; d=open(sys.argv[1],"rb").read(); open(sys.argv[2],"wb").write(d.replace(b"\n\x1e\n", b"\n\n"))' \
      ../shared/corpus/val.txt "$plain"
    files=("$@"); [ ${#files[@]} -gt 0 ] || files=("$G"/*.gguf)
    printf '%-40s %10s %10s\n' FILE OURS LLAMA.CPP
    for f in "${files[@]}"; do
      ours=$("$BIN" eval "$f" --text "$plain" --ppl-chunks 512 --max-chunks 100 -t 2 --json | \
             python3 -c 'import json,sys; j=json.load(sys.stdin); print("%.4f" % j["baseline"]["ppl"])')
      ref=$(grep -F "| $(basename "$f") |" "$G/README.md" | awk -F'|' '{gsub(/ /,"",$3); print $3}')
      printf '%-40s %10s %10s\n' "$(basename "$f")" "$ours" "${ref:--}"
    done
    ;;
  speed)
    L=${1:?LLAMA_BIN_DIR}; f=${2:-$G/kjv-small-Q4_K_M.gguf}
    echo "== posttrainllm bench $f -t 2"
    "$BIN" bench "$f" -t 2 -p 512 -n 128 -r 3
    echo "== llama-bench -m $f -t 2"
    "$L/llama-bench" -m "$f" -t 2 -p 512 -n 128 -r 3
    ;;
  writer)
    L=${1:?LLAMA_BIN_DIR}; shift
    mixes=("$@"); [ ${#mixes[@]} -gt 0 ] || mixes=(Q8_0 Q4_0 Q4_K_M)
    tmp=$(mktemp -d /tmp/gguf-writer-XXXXXX)
    trap 'rm -rf "$tmp"' EXIT
    python3 -c 'import sys; d=open(sys.argv[1],"rb").read(); open(sys.argv[2],"wb").write(d.replace(b"\n\x1e\n", b"\n\n"))' \
      ../shared/corpus/val.txt "$tmp/val-plain.txt"
    jobs=()
    for m in "${mixes[@]}"; do jobs+=("models/kjv-tiny:$m"); done
    [ -d ../shared/models/kjv-small ] && jobs+=("../shared/models/kjv-small:Q4_K_M")
    printf '%-28s %10s %10s\n' FILE OURS LLAMA.CPP
    for j in "${jobs[@]}"; do
      dir=${j%%:*}; mix=${j##*:}; f="$tmp/$(basename "$dir")-$mix.gguf"
      "$BIN" quantize "$dir" "$f" --format gguf --type "$mix" 2>/dev/null
      ours=$("$BIN" eval "$f" --text "$tmp/val-plain.txt" --ppl-chunks 512 --max-chunks "${CHUNKS:-100}" -t 1 --json 2>/dev/null | \
             python3 -c 'import json,sys; j=json.load(sys.stdin); print("%.4f" % j["baseline"]["ppl"])')
      # shellcheck disable=SC2086
      ref=$(LD_LIBRARY_PATH="$L" "$L/llama-perplexity" -m "$f" -f "$tmp/val-plain.txt" -c 512 --chunks "${CHUNKS:-100}" -t 1 \
            -fa on ${LLAMA_PPL_FLAGS---no-repack} 2>&1 | sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p')
      printf '%-28s %10s %10s\n' "$(basename "$f")" "$ours" "${ref:-refused}"
    done
    ;;
  *) echo "usage: $0 ppl [FILE...] | speed LLAMA_BIN_DIR [FILE] | writer LLAMA_BIN_DIR [MIX...]" >&2; exit 2 ;;
esac
