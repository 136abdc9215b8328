#!/usr/bin/env bash
# The quantizer's quality (docs/quantization.md): kjv-small quantized with the defaults at 4 and 8
# bits (q4, q8), and at groups of 64 with RTN (mlx-lm's convert -q), --method search and --method
# gptq, the last also with an 8-bit embedding and mlx-lm's mixed_4_6 recipe, and scored in llama.cpp's protocol against the bf16 original (PPL of
# both, KL, top-1), then each checkpoint's decode speed and weight bytes (bench). Run it on a quiet
# machine, from the repository root, after building (build/posttrainllm).
#   scripts/quant_quality.sh [THREADS]    THREADS: for eval and bench (default 2)
# Environment: BIN, SRC (default ../shared/models/kjv-small), TEXT, CALIB (gptq's calibration text,
# default ../shared/corpus/train.txt), WORK, OUT, CHUNKS (default 100).
# Output: one JSON object per line in $OUT (default quant-quality.jsonl), tagged with the
# measurement and the checkpoint; a summary table on stdout.
set -euo pipefail
BIN=${BIN:-build/posttrainllm}
SRC=${SRC:-../shared/models/kjv-small}
TEXT=${TEXT:-../shared/corpus/val.txt}
CALIB=${CALIB:-../shared/corpus/train.txt}
WORK=${WORK:-/tmp/quant-quality}
OUT=${OUT:-quant-quality.jsonl}
T=${1:-2}
CHUNKS=${CHUNKS:-100}
mkdir -p "$WORK"
: >"$OUT"

tag() {  # tag NAME WHICH: adds {"measure": NAME, "which": WHICH} to the JSON object on stdin
  python3 -c 'import json,sys
j=json.load(sys.stdin); j["measure"]=sys.argv[1]; j["which"]=sys.argv[2]; print(json.dumps(j))' "$1" "$2"
}

G="--method gptq --calib $CALIB"  # GPTQ calibrates on training text, never on $TEXT
G64="--group-size 64 --embedding-bits 0"  # all matrices at the same bits, groups of 64
declare -A FLAGS=([q8]="--bits 8" [q8-rtn]="--bits 8 --method rtn" [q4]="--bits 4"
                  [q4-g64-rtn]="--bits 4 $G64 --method rtn" [q4-g64-search]="--bits 4 $G64 --method search"
                  [q4-g64-gptq]="--bits 4 $G64 $G" [q4-g64-gptq-emb8]="--bits 4 --group-size 64 $G --embedding-bits 8"
                  [mixed46-g64-gptq]="--recipe mixed_4_6 --group-size 64 $G")
NAMES=(q8 q8-rtn q4 q4-g64-rtn q4-g64-search q4-g64-gptq q4-g64-gptq-emb8 mixed46-g64-gptq)
for n in "${NAMES[@]}"; do
  # shellcheck disable=SC2086
  "$BIN" quantize "$SRC" "$WORK/$n" ${FLAGS[$n]}
done

# llama.cpp's perplexity protocol: 100 chunks of 512 tokens of the documents joined, second halves
# scored; the baseline is the bf16 model with an fp32 full cache.
E=(--text "$TEXT" --documents --ppl-chunks 512 --max-chunks "$CHUNKS" --threads "$T" --json)
for n in "${NAMES[@]}"; do
  "$BIN" eval "$WORK/$n" --baseline-model "$SRC" "${E[@]}" | tag eval "$n" >>"$OUT"
done
# Decode at a short context (bench's defaults) and the bytes each step reads.
for n in source "${NAMES[@]}"; do
  m="$WORK/$n"
  [[ $n == source ]] && m="$SRC"
  "$BIN" bench "$m" --threads "$T" --json | tag bench "$n" >>"$OUT"
done

python3 - "$OUT" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
base = next(r for r in rows if r["measure"] == "eval")["baseline"]
print(f"baseline (the source, fp32 full cache): PPL {base['ppl']:.4f} ± {base['ppl_stderr']:.4f}")
print(f"{'checkpoint':<12} {'PPL':>9} {'dPPL%':>8} {'KL mean':>9} {'top-1':>7}")
for r in rows:
    if r["measure"] == "eval":
        c = r["configs"][0]
        print(f"{r['which']:<12} {c['ppl']:9.4f} {c['delta_ppl_pct']:+8.3f} {c['kl_mean']:9.6f} {100*c['top1_agreement']:6.2f}%")
print(f"{'checkpoint':<12} {'weights':>40} {'MiB':>7} {'decode tok/s':>13} {'prefill tok/s':>14}")
for r in rows:
    if r["measure"] == "bench":
        print(f"{r['which']:<12} {r['weight_format'][:40]:>40} {r['weight_bytes']/2**20:7.2f} {r['decode_tok_s']:13.1f} {r['prefill_tok_s']:14.1f}")
PY
