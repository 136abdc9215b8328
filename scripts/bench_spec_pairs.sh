#!/bin/bash
# Decode tok/s of `posttrainllm sample` with and without speculation, the two alternating, PAIRS times
# after a warm-up; prints each pair and the medians and ranges (decode tok/s from --json).
#   scripts/bench_spec_pairs.sh PAIRS "SAMPLE ARGS" "SPECULATION FLAGS"
# e.g. scripts/bench_spec_pairs.sh 7 "$M -p 'And the LORD said unto Moses' -n 256 --temperature 0 --ignore-eos -t 2" \
#        "--model-draft ../shared/models/kjv-tiny"
set -euo pipefail
PAIRS=${1:?pairs}; ARGS=${2:?sample args}; SPEC=${3:?speculation flags}
BIN=${BIN:-build/posttrainllm}
run() { eval "$BIN sample $ARGS --json $1" 2>/dev/null; }
run "$SPEC" >/dev/null; run "" >/dev/null
for i in $(seq 1 "$PAIRS"); do
  s=$(run "$SPEC"); p=$(run "")
  [ "$(jq -c .tokens <<<"$s")" = "$(jq -c .tokens <<<"$p")" ] && same=same || same=DIFFERENT
  echo "$(jq -r '.timings.decode_tok_s' <<<"$s") $(jq -r '.timings.decode_tok_s' <<<"$p") $same $(jq -c '.speculative | [.drafted, .accepted, .verify_steps, .plain_steps]' <<<"$s")"
done | tee /dev/stderr | python3 -c '
import sys, statistics as st
rows = [l.split() for l in sys.stdin]
s = [float(r[0]) for r in rows]; p = [float(r[1]) for r in rows]; q = [a / b for a, b in zip(s, p)]
f = lambda x: "%.1f (%.1f-%.1f)" % (st.median(x), min(x), max(x))
print("spec", f(s), "| plain", f(p), "| ratio %.3f (%.3f-%.3f)" % (st.median(q), min(q), max(q)))'
