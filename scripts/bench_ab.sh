#!/bin/bash
# A/B speed check of two builds, run alternately so drift on the machine hits both alike:
#   scripts/bench_ab.sh BUILD_A BUILD_B [ROUNDS] [MODEL]
# e.g. a build of main and one of this branch (each: cmake -S . -B DIR -DCMAKE_BUILD_TYPE=Release &&
# cmake --build DIR -j). Runs bench_attention's BM_Attention and BM_AttentionLayers (decode-step
# attention per precision and context) and `posttrainllm bench` (prefill and decode tok/s at fp32 and
# int4) ROUNDS times each (default 3), printing one line per measurement tagged with the build. Meant
# for a quiet machine; numbers from a loaded one mean nothing.
set -euo pipefail
A=${1:?build dir A}; B=${2:?build dir B}; ROUNDS=${3:-3}; MODEL=${4:-../shared/models/kjv-small}
THREADS=${THREADS:-2}
for r in $(seq 1 "$ROUNDS"); do
  for build in "$A" "$B"; do
    "$build/bench/bench_attention" --benchmark_filter='BM_Attention' --benchmark_min_time=0.5 \
      --benchmark_format=csv 2>/dev/null | grep '^"BM_' | sed "s|^|$build,round$r,|"
    for kv in fp32 int4; do
      "$build/posttrainllm" bench "$MODEL" --kv-quantize "$kv" -t "$THREADS" --json 2>/dev/null |
        jq -c --arg b "$build" --arg r "round$r" --arg kv "$kv" \
          '{build: $b, round: $r, kv: $kv, prefill_tok_s, decode_tok_s}'
    done
  done
done
