#!/usr/bin/env bash
# YOCO's figures, kjv-yoco against kjv-small (docs/yoco.md). Run it on a quiet machine, from the
# repository root, after building (build/posttrainllm). Every result is one JSON line in $OUT
# (default yoco-bench.jsonl), tagged with the measurement and the model; a summary follows.
#   scripts/bench_yoco.sh [ROUNDS]    ROUNDS: alternating rounds for the timings (default 3)
set -euo pipefail
BIN=${BIN:-build/posttrainllm}
MODELS=${MODELS:-../shared/models}
OUT=${OUT:-yoco-bench.jsonl}
ROUNDS=${1:-3}
: >"$OUT"

tag() {  # tag NAME MODEL: prefixes each JSON line with {"measure": NAME, "which": MODEL}
  python3 -c 'import json,sys
for line in sys.stdin:
    line=line.strip()
    if line.startswith("{"):
        j=json.loads(line); j["measure"]=sys.argv[1]; j["which"]=sys.argv[2]; print(json.dumps(j))' "$1" "$2"
}

# KV memory after a 2,047-token prompt and one generated token (2,048 stored: the models' whole
# context, max_position_embeddings), fp32 and int4.
for m in kjv-small kjv-yoco; do
  for kv in fp32 int4; do
    "$BIN" bench "$MODELS/$m" -p 2047 -n 1 -r 1 --kv-quantize "$kv" --json | tag "memory-$kv" "$m" >>"$OUT"
  done
done
# Time to first token on a 2,000-token prompt, and decode at 2K context (1,916 to 2,044 tokens),
# the models alternating.
for ((i = 0; i < ROUNDS; ++i)); do
  for m in kjv-small kjv-yoco; do
    "$BIN" bench "$MODELS/$m" -p 2000 -n 16 -r 3 --json | tag ttft "$m" >>"$OUT"
    "$BIN" bench "$MODELS/$m" --context 1900 -p 16 -n 128 -r 3 --json | tag decode-2k "$m" >>"$OUT"
  done
done
# Quality: PPL on val.txt (documents, 4096 predictions), fp32 / int8 / int4 caches.
for m in kjv-small kjv-yoco; do
  "$BIN" eval "$MODELS/$m" --text ../shared/corpus/val.txt --documents --max-tokens 4096 \
    --configs "fp32; int8; int4" --json | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)))' |
    tag ppl "$m" >>"$OUT"
done

python3 - "$OUT" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def pick(measure, which): return [r for r in rows if r["measure"] == measure and r["which"] == which]
for kv in ("fp32", "int4"):
    s, y = pick("memory-" + kv, "kjv-small")[0], pick("memory-" + kv, "kjv-yoco")[0]
    print(f"KV logical bytes with 2,048 tokens stored, {kv}: kjv-small {s['kv_logical_bytes']}, kjv-yoco "
          f"{y['kv_logical_bytes']} ({y['kv_logical_bytes'] / s['kv_logical_bytes']:.3f}x; stored layers "
          f"{y['kv_layers']['stored_layers']})")
t = {m: statistics.median(r["ttft_ms"] for r in pick("ttft", m)) for m in ("kjv-small", "kjv-yoco")}
print(f"TTFT, 2,000-token prompt (median of the rounds): kjv-small {t['kjv-small']:.1f} ms, kjv-yoco "
      f"{t['kjv-yoco']:.1f} ms ({t['kjv-small'] / t['kjv-yoco']:.2f}x lower)")
d = {m: statistics.median(r["decode_tok_s"] for r in pick("decode-2k", m)) for m in ("kjv-small", "kjv-yoco")}
print(f"decode at 2K context: kjv-small {d['kjv-small']:.1f} tok/s, kjv-yoco {d['kjv-yoco']:.1f} tok/s")
for m in ("kjv-small", "kjv-yoco"):
    cfgs = pick("ppl", m)[0]["configs"]
    print(f"{m} PPL: " + ", ".join(f"{c['name']} {c['ppl']:.4f} ({c['delta_ppl_pct']:+.3f}%)" for c in cfgs))
EOF
