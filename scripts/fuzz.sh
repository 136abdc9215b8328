#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan) and runs each for SECONDS (default 60) on its
# corpus: first the kept regression inputs (fuzz/regressions/<target>/, every crash found so far),
# then the fuzzer on the seeds (made from the repository's real files) and the corpus it grew
# before (build-fuzz/corpus/<target>/). Prints one line per target: inputs run, coverage, crashes.
# Exit code 1 when any target crashed, leaked, timed out or failed a regression input; the inputs
# are then in build-fuzz/artifacts/<target>/.
#
#   scripts/fuzz.sh          # 60 s per target
#   scripts/fuzz.sh 600      # the long runs (10 CPU-minutes each)
#   FUZZ_TARGETS="fuzz_config fuzz_encode" scripts/fuzz.sh 30
#   FUZZ_JOBS=9 scripts/fuzz.sh 600   # the targets side by side, one core each (a many-core machine)
#   FUZZ_NO_BUILD=1 ...                # run the binaries already in $FUZZ_BUILD/fuzz (built elsewhere)
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET=${1:-60}
B=${FUZZ_BUILD:-build-fuzz}
ALL="fuzz_cache_file fuzz_safetensors fuzz_config fuzz_tokenizer fuzz_tokenizer_config fuzz_encode fuzz_detokenizer fuzz_chat_template fuzz_request fuzz_gguf fuzz_grammar"
TARGETS=${FUZZ_TARGETS:-$ALL}

JOBS=${FUZZ_JOBS:-1}
if [ -n "${FUZZ_NO_BUILD:-}" ]; then
  :
elif [ ! -f "$B/CMakeCache.txt" ]; then
  # FUZZ_BUILD_TYPE: CI builds None with -O0 and no debug information, which compiles fastest.
  CC=${CC:-clang-14} CXX=${CXX:-clang++-14} cmake -S . -B "$B" -DCMAKE_BUILD_TYPE="${FUZZ_BUILD_TYPE:-RelWithDebInfo}" \
    -DCMAKE_CXX_FLAGS="${FUZZ_CXXFLAGS:-}" -DPTLLM_FUZZ=ON \
    -DPTLLM_SANITIZE=address,undefined -DPTLLM_BUILD_TESTS=OFF -DPTLLM_BUILD_BENCH=OFF >/dev/null
fi
[ -n "${FUZZ_NO_BUILD:-}" ] || cmake --build "$B" -j"${FUZZ_BUILD_JOBS:-2}" --target fuzz_all >/dev/null

SEEDS="$B/seeds"
rm -rf "$SEEDS"
python3 fuzz/make_reader_seeds.py . "$SEEDS"
"$B/fuzz/fuzz_cache_seeds" "$SEEDS/fuzz_cache_file" >/dev/null

dict_of() {
  case "$1" in
    fuzz_chat_template|fuzz_tokenizer_config) echo "-dict=fuzz/jinja.dict" ;;
    fuzz_safetensors|fuzz_config|fuzz_tokenizer) echo "-dict=fuzz/json.dict" ;;
    fuzz_grammar) echo "-dict=fuzz/grammar.dict" ;;
    # Inputs up to 256 KiB: a request nested 100,000 levels deep is 200 KB (libFuzzer's default cap
    # of 4 KiB never reaches a depth that overflows a stack).
    fuzz_request) echo "-dict=fuzz/request.dict -max_len=262144" ;;
    *) echo "" ;;
  esac
}

run_target() {
  local t=$1 corpus art log bad inputs cov ft found
  corpus="$B/corpus/$t" art="$B/artifacts/$t" log="$B/logs/$t.log"
  mkdir -p "$corpus" "$art" "$(dirname "$log")" "$SEEDS/$t"
  rm -f "$art"/*
  bad=0
  # Every kept crashing input must now pass (libFuzzer runs each given file once).
  if compgen -G "fuzz/regressions/$t/*" >/dev/null; then
    if ! "$B/fuzz/$t" -rss_limit_mb=2048 -timeout=30 fuzz/regressions/"$t"/* >"$log.regressions" 2>&1; then
      bad=$((bad + 1))
      echo "$t: a regression input fails again (see $log.regressions)" >&2
    fi
  fi
  # shellcheck disable=SC2046
  "$B/fuzz/$t" "$corpus" "$SEEDS/$t" $(dict_of "$t") -max_total_time="$SECONDS_PER_TARGET" -rss_limit_mb=2048 \
    -timeout=20 -print_final_stats=1 -artifact_prefix="$art/" >"$log" 2>&1 || true
  inputs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1 || true)
  cov=$( (grep -oE 'cov: [0-9]+' "$log" || true) | tail -1 | cut -d' ' -f2)
  ft=$( (grep -oE 'ft: [0-9]+' "$log" || true) | tail -1 | cut -d' ' -f2)
  [ -n "$inputs" ] || { echo "$t: did not run (see $log)" >&2; bad=$((bad + 1)); }
  found=$(find "$art" -type f | wc -l)
  bad=$((bad + found))
  printf '%-24s %12s %10s %10s  %s\n' "$t" "${inputs:-?}" "${cov:-?}" "${ft:-?}" "$found${found:+ }$( [ "$found" -gt 0 ] && echo "(in $art)")"
  [ "$bad" -eq 0 ]
}

status=0
printf '%-24s %12s %10s %10s  %s\n' TARGET INPUTS COVERAGE FEATURES CRASHES
mkdir -p "$B/logs"
running=0
for t in $TARGETS; do
  if [ "$JOBS" -le 1 ]; then
    run_target "$t" || status=1
    continue
  fi
  run_target "$t" >"$B/logs/$t.line" &
  running=$((running + 1))
  if [ "$running" -ge "$JOBS" ]; then wait -n || status=1; running=$((running - 1)); fi
done
while [ "$running" -gt 0 ]; do wait -n || status=1; running=$((running - 1)); done
if [ "$JOBS" -gt 1 ]; then for t in $TARGETS; do cat "$B/logs/$t.line"; done; fi
exit $status
