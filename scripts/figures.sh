#!/usr/bin/env bash
# Every figure of docs/ in one run: builds what it needs, runs the benchmarks, side by side with
# llama.cpp wherever its tools are found, and writes docs/figures.md (scripts/figures_table.py).
#   scripts/figures.sh [--quick] [--real-size] [--only AREA[,AREA...]] [--llama-cpp DIR] [--model DIR] [--threads N]
#                      [--rounds N] [--out FILE]
#     --quick        about ten minutes: fewer rows, one context length, fewer chunks and rounds
#     --real-size    also random-weight Llama-3.2-1B- and Qwen2.5-0.5B-shaped models (make-model; 14 GiB of
#                    files in $WORK): GGUF BF16/Q8_0/Q4_0/Q4_K_M/Q5_K_M and MLX q8/q4, prefill 512 and decode at depth
#                    0 and 4096 (over 90 minutes with llama.cpp's tools; REAL_LAYERS=N makes smaller models of
#                    those widths)
#     --only A[,A]   measure only these areas (context, batched, quantized, gguf, real-size, real-size-qwen, yoco,
#                    prompt-cache, store, server, kv-quality; real-size* implies --real-size) and keep every other
#                    area's values
#                    and commands from the previous $WORK/results.jsonl, so that the page still comes out whole
#     --llama-cpp D  llama.cpp's build/bin (else llama-bench, llama-batched-bench, llama-perplexity and
#                    llama-server are looked up on PATH; a tool not found leaves its column empty)
#     --model D      the checkpoint (default ../shared/models/kjv-small; YOCO rows need kjv-yoco beside it)
#     --threads N    threads of every run, ours and llama.cpp's (default 2)
#     --rounds N     alternating rounds of each timed pair (default 3; --quick 2)
#     --out FILE     the page (default docs/figures.md); the raw measurements: $WORK/results.jsonl
# Environment: WORK (default /tmp/ptllm-figures), TEXT (the evaluation text, default val.txt of the
# corpus beside the models: ../shared/corpus/val.txt), NOTE (a line about the machine for the page).
# Like for like with llama-bench: our decode rows are timed from the --context depth, as llama-bench's tg
# test with -d (`bench --decode-at-context`), and our KV cache is fp16 wherever llama.cpp runs its
# default f16 cache (the quantized, GGUF and batched rows).
# Run it from the repository root on a quiet machine: a loaded one moves every speed. Idempotent: the
# build is incremental, the work directory ($WORK, default /tmp/ptllm-figures) is reused, the page
# rewritten (delete $WORK after changing the quantizer: its quantized copies are reused).
set -euo pipefail
cd "$(dirname "$0")/.."
QUICK=0 REAL=0 LLAMA="" MODEL=../shared/models/kjv-small T=2 ROUNDS="" OUT=docs/figures.md ONLY=""
AREAS="context batched quantized gguf real-size real-size-qwen yoco prompt-cache store server kv-quality"
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --real-size) REAL=1 ;;
    --only) ONLY=${2:?--only needs a list of areas}; shift ;;
    --llama-cpp) LLAMA=${2:?--llama-cpp needs a directory}; shift ;;
    --model) MODEL=${2:?--model needs a directory}; shift ;;
    --threads) T=${2:?--threads needs a number}; shift ;;
    --rounds) ROUNDS=${2:?--rounds needs a number}; shift ;;
    --out) OUT=${2:?--out needs a file}; shift ;;
    -h|--help) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; exit 0 ;;
    *) echo "figures.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$ROUNDS" ] || ROUNDS=$([ $QUICK = 1 ] && echo 2 || echo 3)
for a in ${ONLY//,/ }; do
  [[ " $AREAS " == *" $a "* ]] || { echo "figures.sh: --only: unknown area '$a' (areas: $AREAS)" >&2; exit 2; }
  [[ $a == real-size* ]] && REAL=1
done
want() {  # want AREA: whether this run measures AREA
  [ -z "$ONLY" ] || [[ ",$ONLY," == *",$1,"* ]]
}
[ -d "$MODEL" ] || { echo "figures.sh: --model $MODEL: no such directory" >&2; exit 2; }
[ -z "$LLAMA" ] || [ -d "$LLAMA" ] || { echo "figures.sh: --llama-cpp $LLAMA: no such directory" >&2; exit 2; }
WORK=${WORK:-/tmp/ptllm-figures}
TEXT=${TEXT:-$(dirname "$MODEL")/../corpus/val.txt}
[ -f "$TEXT" ] || { echo "figures.sh: $TEXT: no such file (set TEXT to the evaluation text)" >&2; exit 2; }
mkdir -p "$WORK"
RES=$WORK/results.jsonl
TABLE="python3 scripts/figures_table.py"
KEPT="{}"  # with --only: the run (date, commit) of every area kept, {area: run}
if [ -n "$ONLY" ] && [ -s "$RES" ]; then
  KEPT=$($TABLE run-of "$RES" "$ONLY")
  $TABLE keep "$RES" "$ONLY" >"$RES.kept"
  mv "$RES.kept" "$RES"
else
  [ -z "$ONLY" ] || echo "figures.sh: --only: no previous $RES: the page has only the areas measured now" >&2
  : >"$RES"
fi

# Build what the runs need (incremental; ccache if present).
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target posttrainllm >/dev/null
BIN=build/posttrainllm

tool() {  # tool NAME: llama.cpp's NAME from --llama-cpp or PATH, or nothing
  if [ -n "$LLAMA" ] && [ -x "$LLAMA/$1" ]; then echo "$LLAMA/$1"; else command -v "$1" || true; fi
}
LBENCH=$(tool llama-bench) LBATCHED=$(tool llama-batched-bench) LPPL=$(tool llama-perplexity)
LSERVER=$(tool llama-server)

val() {  # val AREA ROW METRIC UNIT SIDE ROUND VALUE
  jq -nc --arg a "$1" --arg r "$2" --arg m "$3" --arg u "$4" --arg s "$5" --argjson n "$6" --argjson v "$7" \
    '{kind: "value", area: $a, row: $r, metric: $m, unit: $u, side: $s, round: $n, value: $v}' >>"$RES"
}
record() {  # record AREA COMMAND...: lists the command under AREA's table (arguments with spaces or ';' quoted)
  local area=$1 line="" arg; shift
  for arg in "$@"; do
    [[ $arg =~ [[:space:]\;] ]] && arg="\"$arg\""
    line+="${line:+ }$arg"
  done
  jq -nc --arg a "$area" --arg c "$line" '{kind: "command", area: $a, command: $c}' >>"$RES"
}
cmd() {  # cmd AREA COMMAND...: records the command, runs it
  record "$@"
  shift
  "$@"
}
mib() { jq -n "$(stat -c %s "$1") / 1048576"; }  # mib FILE: its size in MiB

# The machine.
CPU=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
FLAGS=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' |
        grep -E '^(avx2|fma|f16c|avx512f|avx512bw|avx512vl|avx512_vnni|avx512_bf16|avx_vnni|amx_tile|amx_bf16|amx_int8|asimd|sve)$' |
        tr '\n' ' ' | sed 's/ $//')
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
BW=$("$BIN" bench "$MODEL" -p 16 -n 8 -r 1 -t "$T" --json | jq .bandwidth_gb_s)
LVER=""  # llama-bench has no --version; the tools on llama.cpp's common arguments do
for l in "$LSERVER" "$LPPL" "$LBATCHED"; do
  [ -n "$l" ] && { LVER=$("$l" --version 2>&1 | grep -m1 '^version' || true); break; }
done
[ -n "$LVER" ] || [ -z "$LBENCH" ] || LVER="llama-bench (version not printed)"

# GGUF copies of the checkpoint, written by our quantizer, for llama.cpp's tools and our GGUF rows.
declare -A GG
for ty in BF16 Q8_0 Q4_0 Q4_K_M; do
  GG[$ty]=$WORK/model-$ty.gguf
  [ -s "${GG[$ty]}" ] || "$BIN" quantize "$MODEL" "${GG[$ty]}" --format gguf --type "$ty" 2>/dev/null
done

# 1. Prefill and decode by context length and KV precision; llama-bench on the BF16 GGUF with the
# matching cache type (-ctk/-ctv; llama-bench has no f32 cache, so the fp32 rows are ours alone).
declare -A LKV=([fp32]="" [fp16]=f16 [int8]=q8_0 [int4]=q4_0)
CTXS="0 1024"; KVS="fp32 fp16 int8 int4"
[ $QUICK = 1 ] && CTXS="0" KVS="fp16 int4"
want context && for r in $(seq 1 "$ROUNDS"); do
  for c in $CTXS; do
    for kv in $KVS; do
      rows=("context $c, KV $kv")
      # llama.cpp rounds activations to bf16 for BF16 weights; --bf16-activations does the same here.
      [ "$kv" = fp16 ] && rows+=("context $c, KV $kv, --bf16-activations")
      for row in "${rows[@]}"; do
        flag=(); [[ $row == *", --"* ]] && flag=("${row##*, }")
        j=$(cmd context "$BIN" bench "$MODEL" -p 512 -n 128 --context "$c" --decode-at-context --kv-quantize "$kv" -r 1 \
          -t "$T" "${flag[@]}" --json)
        val context "$row" "prefill 512" tok/s ours "$r" "$(jq .prefill_tok_s <<<"$j")"
        val context "$row" "decode" tok/s ours "$r" "$(jq .decode_tok_s <<<"$j")"
      done
      if [ -n "$LBENCH" ] && [ -n "${LKV[$kv]}" ]; then
        cmd context "$LBENCH" -m "${GG[BF16]}" -p 512 -n 128 -d "$c" -ctk "${LKV[$kv]}" -ctv "${LKV[$kv]}" \
          -t "$T" -r 1 -o jsonl >"$WORK/lb.jsonl" 2>/dev/null
        while read -r np ng _ ts; do
          for row in "${rows[@]}"; do
            [ "$np" -gt 0 ] && val context "$row" "prefill 512" tok/s llama.cpp "$r" "$ts"
            [ "$ng" -gt 0 ] && val context "$row" "decode" tok/s llama.cpp "$r" "$ts"
          done
        done < <($TABLE llama-bench "$WORK/lb.jsonl")
      fi
    done
  done
done

# 2. Batched decode: N sequences decoding together; llama-batched-bench's text-generation speed.
NPL="1,4,16"; [ $QUICK = 1 ] && NPL="1,16"
want batched && for r in $(seq 1 "$ROUNDS"); do
  for suffix in "" ", --bf16-activations"; do
    flag=(); [ -n "$suffix" ] && flag=(--bf16-activations)
    while read -r line; do
      val batched "$(jq -r '"N = \(.parallel)"' <<<"$line")$suffix" "aggregate decode" tok/s ours "$r" \
        "$(jq .aggregate_decode_tok_s <<<"$line")"
    done < <(cmd batched "$BIN" bench "$MODEL" --parallel "$NPL" -p 128 -n 64 --kv-quantize fp16 -t "$T" "${flag[@]}" --json)
  done
  if [ -n "$LBATCHED" ]; then
    cmd batched "$LBATCHED" -m "${GG[BF16]}" -c 4096 -npp 128 -ntg 64 -npl "$NPL" -t "$T" --output-format jsonl \
      >"$WORK/bb.jsonl" 2>/dev/null
    while read -r pl tg; do
      for suffix in "" ", --bf16-activations"; do val batched "N = $pl$suffix" "aggregate decode" tok/s llama.cpp "$r" "$tg"; done
    done < <($TABLE batched-bench "$WORK/bb.jsonl")
  fi
done

# 3. Quantized weights: our defaults at 4 and 8 bits against llama.cpp's Q4_K_M and Q8_0 of the same
# weights (written by our GGUF writer); speed, then quality in llama.cpp's perplexity protocol.
if want quantized; then
  CHUNKS=100; [ $QUICK = 1 ] && CHUNKS=10
  PLAIN=$WORK/val-plain.txt
  python3 -c 'import sys; d=open(sys.argv[1],"rb").read(); open(sys.argv[2],"wb").write(d.replace(b"\n\x1e\n", b"\n\n"))' \
    "$TEXT" "$PLAIN"
  declare -A QDIR=([q4]="$WORK/q4" [q8]="$WORK/q8") QTY=([q4]=Q4_K_M [q8]=Q8_0) QBITS=([q4]=4 [q8]=8)
  for q in q4 q8; do
    [ -s "${QDIR[$q]}/model.safetensors" ] || cmd quantized "$BIN" quantize "$MODEL" "${QDIR[$q]}" --bits "${QBITS[$q]}" -t "$T" 2>/dev/null
  done
  for r in $(seq 1 "$ROUNDS"); do
    for q in q4 q8; do
      row="$q default vs ${QTY[$q]}"
      j=$(cmd quantized "$BIN" bench "${QDIR[$q]}" -p 512 -n 128 --decode-at-context --kv-quantize fp16 -r 1 -t "$T" --json)
      val quantized "$row" "prefill 512" tok/s ours "$r" "$(jq .prefill_tok_s <<<"$j")"
      val quantized "$row" "decode" tok/s ours "$r" "$(jq .decode_tok_s <<<"$j")"
      if [ -n "$LBENCH" ]; then
        cmd quantized "$LBENCH" -m "${GG[${QTY[$q]}]}" -p 512 -n 128 -t "$T" -r 1 -o jsonl >"$WORK/lb.jsonl" 2>/dev/null
        while read -r np ng _ ts; do
          [ "$np" -gt 0 ] && val quantized "$row" "prefill 512" tok/s llama.cpp "$r" "$ts"
          [ "$ng" -gt 0 ] && val quantized "$row" "decode" tok/s llama.cpp "$r" "$ts"
        done < <($TABLE llama-bench "$WORK/lb.jsonl")
      fi
    done
  done
  E=(--text "$PLAIN" --ppl-chunks 512 --max-chunks "$CHUNKS" -t "$T" --json)
  for q in q4 q8; do
    row="$q default vs ${QTY[$q]}"
    j=$(cmd quantized "$BIN" eval "${QDIR[$q]}" --baseline-model "$MODEL" "${E[@]}")
    val quantized "$row" "PPL increase over bf16" "%" ours 1 "$(jq '.configs[0].delta_ppl_pct' <<<"$j")"
    val quantized "$row" "file size" MiB ours 1 "$(mib "${QDIR[$q]}/model.safetensors")"
    if [ -n "$LPPL" ]; then
      base=$(jq '.baseline.ppl' <<<"$j")
      cmd quantized "$LPPL" -m "${GG[${QTY[$q]}]}" -f "$PLAIN" -c 512 --chunks "$CHUNKS" -t "$T" >"$WORK/ppl.log" 2>&1
      p=$($TABLE perplexity "$WORK/ppl.log")
      val quantized "$row" "PPL increase over bf16" "%" llama.cpp 1 "$(python3 -c "print(100 * ($p / $base - 1))")"
    fi
    val quantized "$row" "file size" MiB llama.cpp 1 "$(mib "${GG[${QTY[$q]}]}")"
  done
fi

# 4. GGUF files: ours reading the files llama.cpp reads.
if want gguf; then
  GTYPES="BF16 Q8_0 Q4_0 Q4_K_M"; [ $QUICK = 1 ] && GTYPES="Q4_K_M"
  for r in $(seq 1 "$ROUNDS"); do
    for ty in $GTYPES; do
      rows=("$ty"); [ "$ty" = BF16 ] && rows+=("BF16, --no-bf16-activations")
      for row in "${rows[@]}"; do
        flag=(); [[ $row == *", --"* ]] && flag=("${row##*, }")
        j=$(cmd gguf "$BIN" bench "${GG[$ty]}" -p 512 -n 128 --decode-at-context --kv-quantize fp16 -r 1 -t "$T" \
          "${flag[@]}" --json)
        val gguf "$row" "prefill 512" tok/s ours "$r" "$(jq .prefill_tok_s <<<"$j")"
        val gguf "$row" "decode" tok/s ours "$r" "$(jq .decode_tok_s <<<"$j")"
      done
      if [ -n "$LBENCH" ]; then
        cmd gguf "$LBENCH" -m "${GG[$ty]}" -p 512 -n 128 -t "$T" -r 1 -o jsonl >"$WORK/lb.jsonl" 2>/dev/null
        while read -r np ng _ ts; do
          for row in "${rows[@]}"; do
            [ "$np" -gt 0 ] && val gguf "$row" "prefill 512" tok/s llama.cpp "$r" "$ts"
            [ "$ng" -gt 0 ] && val gguf "$row" "decode" tok/s llama.cpp "$r" "$ts"
          done
        done < <($TABLE llama-bench "$WORK/lb.jsonl")
      fi
    done
  done
fi

# 4b. Real size: the Llama-3.2-1B and Qwen2.5-0.5B shapes (random weights: speed only), the files
# llama.cpp reads and our MLX-layout copies against the GGUF type of the same bits; decode at depth 0
# (KV fp16 / f16) and at depth 4096 (fp16 / f16 and int4 / q4_0). Qwen2.5-0.5B's rows of 896 values
# are narrower than a K-quant block: its Q4_K_M holds Q5_0 and Q8_0 where Llama's holds Q4_K and Q6_K,
# its Q5_K_M mostly Q5_1 where Llama's holds Q5_K and Q6_K.
real_size() {  # real_size AREA SHAPE NAME: the rows of AREA, files $WORK/NAME*
  local area=$1 base=$WORK/$3${REAL_LAYERS:+-$REAL_LAYERS} ty b r spec row ours theirs run d kv metric j np ng ts
  [ -f "$base/model.safetensors" ] || "$BIN" make-model --shape "$2" ${REAL_LAYERS:+--layers "$REAL_LAYERS"} "$base" >/dev/null
  for ty in BF16 Q8_0 Q4_0 Q4_K_M Q5_K_M; do
    [ -f "$base-$ty.gguf" ] || "$BIN" quantize "$base" "$base-$ty.gguf" --format gguf --type "$ty" >/dev/null
  done
  # Random weights: the rounding method changes no byte count or kernel, so the fast one.
  for b in 8 4; do
    [ -f "$base-q$b/config.json" ] || "$BIN" quantize "$base" "$base-q$b" --bits "$b" --method rtn >/dev/null
  done
  # row, our file, llama.cpp's file
  local rows=("BF16|$base-BF16.gguf|$base-BF16.gguf" "BF16, --no-bf16-activations|$base-BF16.gguf|$base-BF16.gguf"
              "Q8_0|$base-Q8_0.gguf|$base-Q8_0.gguf" "Q4_0|$base-Q4_0.gguf|$base-Q4_0.gguf"
              "Q4_K_M|$base-Q4_K_M.gguf|$base-Q4_K_M.gguf" "Q5_K_M|$base-Q5_K_M.gguf|$base-Q5_K_M.gguf"
              "MLX q8 vs Q8_0|$base-q8|$base-Q8_0.gguf"
              "MLX q4 vs Q4_0|$base-q4|$base-Q4_0.gguf")
  declare -A RKV=([fp16]=f16 [int4]=q4_0)
  for r in $(seq 1 "$ROUNDS"); do
    for spec in "${rows[@]}"; do
      IFS='|' read -r row ours theirs <<<"$spec"
      local flag=(); [[ $row == *", --"* ]] && flag=("${row##*, }")
      for run in "0 fp16" "4096 fp16" "4096 int4"; do
        read -r d kv <<<"$run"
        metric="decode, depth $d, KV $kv"
        j=$(cmd "$area" "$BIN" bench "$ours" -p 512 -n 32 --context "$d" --decode-at-context --kv-quantize "$kv" -r 1 \
          -t "$T" "${flag[@]}" --json)
        [ "$d" = 0 ] && val "$area" "$row" "prefill 512" tok/s ours "$r" "$(jq .prefill_tok_s <<<"$j")"
        val "$area" "$row" "$metric" tok/s ours "$r" "$(jq .decode_tok_s <<<"$j")"
        [ "$d" = 0 ] && val "$area" "$row" "decode, share of the bandwidth floor" "%" ours "$r" \
          "$(jq '100 * .decode_floor_fraction' <<<"$j")"
        if [ -n "$LBENCH" ]; then
          cmd "$area" "$LBENCH" -m "$theirs" -p 512 -n 32 -d "$d" -ctk "${RKV[$kv]}" -ctv "${RKV[$kv]}" -t "$T" -r 1 \
            -o jsonl >"$WORK/lb.jsonl" 2>/dev/null
          while read -r np ng _ ts; do
            [ "$np" -gt 0 ] && [ "$d" = 0 ] && val "$area" "$row" "prefill 512" tok/s llama.cpp "$r" "$ts"
            [ "$ng" -gt 0 ] && val "$area" "$row" "$metric" tok/s llama.cpp "$r" "$ts"
          done < <($TABLE llama-bench "$WORK/lb.jsonl")
        fi
      done
    done
  done
}
if [ $REAL = 1 ]; then
  want real-size && real_size real-size llama-3.2-1b l1b
  want real-size-qwen && real_size real-size-qwen qwen2.5-0.5b q05
fi

# 5. YOCO: kjv-yoco against kjv-small, time to first token of 2,000 tokens and decode at 2K context.
YOCO=$(dirname "$MODEL")/kjv-yoco
if [ -d "$YOCO" ] && want yoco; then
  P=2000; [ $QUICK = 1 ] && P=1000
  for r in $(seq 1 "$ROUNDS"); do
    for m in "$MODEL" "$YOCO"; do
      j=$(cmd yoco "$BIN" bench "$m" -p "$P" -n 16 -r 1 -t "$T" --json)
      val yoco "$(basename "$m")" "time to first token, $P-token prompt" ms ours "$r" "$(jq .ttft_ms <<<"$j")"
      val yoco "$(basename "$m")" "KV logical bytes" MiB ours "$r" "$(jq '.kv_logical_bytes / 1048576' <<<"$j")"
    done
  done
fi

# 6. Prompt cache: a restarted server's time to first token on a history the previous one wrote, and
# 7. the prefix store (needs redis-server): a second replica's. Both start their own servers (node).
HIST=1984 REPS=5; [ $QUICK = 1 ] && HIST=400 REPS=2
if command -v node >/dev/null; then
  if want prompt-cache; then
    cmd prompt-cache node scripts/bench_prompt_cache_dir.mjs --binary "$BIN" --model "$MODEL" --threads "$T" \
      --history "$HIST" --reps "$REPS" --requests 8 --rounds 2 >"$WORK/pc.log" 2>&1 || true
    if read -r cold warm < <($TABLE node-ttft "$WORK/pc.log" 2>/dev/null); then
      val prompt-cache "$HIST-token history" "TTFT, cold prefill" ms ours 1 "$cold"
      val prompt-cache "$HIST-token history" "TTFT after a restart" ms ours 1 "$warm"
    fi
  fi
  if want store && command -v redis-server >/dev/null; then
    cmd store node scripts/bench_kv_store.mjs --binary "$BIN" --model "$MODEL" --threads "$T" \
      --history "$HIST" --reps "$REPS" --requests 8 --rounds 2 >"$WORK/store.log" 2>&1 || true
    if read -r cold warm < <($TABLE node-ttft "$WORK/store.log" 2>/dev/null); then
      val store "$HIST-token history" "TTFT, cold prefill" ms ours 1 "$cold"
      val store "$HIST-token history" "TTFT on a second replica" ms ours 1 "$warm"
    fi
  fi
fi

# 8. Server: time to first token of a chat load, N conversations of T turns streamed at once over one
# shared 600-token system prompt (scripts/serve_load.mjs), ours against llama-server on the BF16 GGUF
# of the same weights: 8 parallel sequences each, -c 16384 (the context of all of them, 2,048 tokens a
# sequence, on both), the ChatML template.
# A load that outlasts LOADMAX seconds (a loaded machine: llama.cpp's threads spin-wait for each other)
# is stopped and leaves its cells empty.
CONV=16 TURNS=4 LOADMAX=600; [ $QUICK = 1 ] && CONV=8 TURNS=2 LOADMAX=90
LOAD=(--no-verify --conversations "$CONV" --turns "$TURNS")
row="$CONV conversations x $TURNS turns, shared 600-token system prompt"
load_vals() {  # load_vals SIDE ROUND LOG: the load's TTFT p50 / p95 and aggregate decode
  local p50 p95 tps
  if read -r p50 p95 tps < <($TABLE serve-load "$3"); then
    val server "$row" "TTFT p50" ms "$1" "$2" "$p50"
    val server "$row" "TTFT p95" ms "$1" "$2" "$p95"
    val server "$row" "aggregate decode" tok/s "$1" "$2" "$tps"
  else
    echo "figures.sh: the $1 server load of round $2 failed: $3" >&2
  fi
}
LPID=""
trap '[ -z "$LPID" ] || kill "$LPID" 2>/dev/null || true' EXIT
if want server && command -v node >/dev/null; then
  [ -d tests/node/node_modules ] || (cd tests/node && npm ci --silent)
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  for r in $(seq 1 "$ROUNDS"); do
    cmd server timeout "$LOADMAX" node scripts/serve_load.mjs --binary "$BIN" --model "$MODEL" \
      "--server-args=-np 8 -t $T -c 16384" "${LOAD[@]}" >"$WORK/load-ours.log" 2>&1 || true
    load_vals ours "$r" "$WORK/load-ours.log"
    if [ -n "$LSERVER" ]; then
      LS=("$LSERVER" -m "${GG[BF16]}" --host 127.0.0.1 --port "$port" -np 8 -t "$T" -c 16384 --chat-template chatml)
      record server "${LS[@]}"
      "${LS[@]}" >"$WORK/llama-server.log" 2>&1 &
      LPID=$!
      for _ in $(seq 1 240); do  # up to two minutes to load
        curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
        kill -0 "$LPID" 2>/dev/null || break
        sleep 0.5
      done
      cmd server timeout "$LOADMAX" node scripts/serve_load.mjs --url "http://127.0.0.1:$port/v1" "${LOAD[@]}" \
        >"$WORK/load-llama.log" 2>&1 || true
      load_vals llama.cpp "$r" "$WORK/load-llama.log"
      kill "$LPID" 2>/dev/null || true
      wait "$LPID" 2>/dev/null || true
      LPID=""
    fi
  done
fi

# 9. KIVI and StreamingLLM: PPL of each cache against the fp32 full cache on the same text.
MAXT=4096; [ $QUICK = 1 ] && MAXT=1024
if want kv-quality; then
  j=$(cmd kv-quality "$BIN" eval "$MODEL" --text "$TEXT" --documents --max-tokens "$MAXT" \
      --configs "fp32; int8; int4; int2; sink4 w508; sink0 w512" -t "$T" --json)
  while IFS=$'\t' read -r name d; do  # names hold spaces ("sink4 w508")
    val kv-quality "$name" "PPL increase over the fp32 full cache, $MAXT tokens" "%" ours 1 "$d"
  done < <(jq -r '.configs[] | [.name, (.delta_ppl_pct | tostring)] | @tsv' <<<"$j")
fi

# The page.
jq -nc --arg cpu "$CPU" --arg flags "$FLAGS" --argjson cores "$(nproc)" --argjson bw "$BW" \
  --arg date "$(date -u '+%Y-%m-%d %H:%M')" --arg commit "$(git rev-parse --short HEAD)" --argjson t "$T" \
  --arg load "$LOAD0 / $(cut -d' ' -f1-3 /proc/loadavg)" --arg llama "${LVER:-not found}" --argjson quick "$QUICK" \
  --argjson mem "$(awk '/MemTotal/ {printf "%.1f", $2 / 1048576}' /proc/meminfo)" --arg note "${NOTE:-}" \
  --arg only "${ONLY//,/, }" --argjson kept "$KEPT" \
  '{kind: "machine", cpu: $cpu, flags: $flags, cores: $cores, bandwidth_gb_s: $bw, date: $date, commit: $commit,
    threads: $t, load: $load, llama_cpp: $llama, quick: ($quick == 1), memory_gib: $mem}
   + (if $note == "" then {} else {note: $note} end)
   + (if $only == "" then {} else {only: $only} end) + (if $kept == {} then {} else {kept_from: $kept} end)' >>"$RES"
$TABLE table "$RES" >"$OUT"
echo "wrote $OUT (measurements: $RES)"
