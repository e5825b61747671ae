#!/usr/bin/env bash
# Builds the libFuzzer harnesses (tests/fuzz) with clang, ASan and UBSan
# into build-fuzz/ (shared with scripts/sanitize.sh address) and runs each for a bounded time, starting from the seed
# corpora in the repo. A crash fails the run; its input is kept in
# build-fuzz/crashes/<harness>/ - add it to tests/fuzz/regressions/<harness>/
# (replayed by the ordinary tests) with the fix.
#   bash scripts/fuzz.sh            # 30 s per harness
#   FUZZ_SECONDS=600 bash scripts/fuzz.sh messages checkpoint
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/sanitizers/asan_build.sh
SECONDS_EACH=${FUZZ_SECONDS:-30}
HARNESSES=("$@")
[ ${#HARNESSES[@]} -gt 0 ] || HARNESSES=(messages safetensors manifest config checkpoint coordinator gate)
dir=$ASAN_DIR
asan_configure
targets=()
for h in "${HARNESSES[@]}"; do targets+=("fuzz_$h"); done
asan_build "${targets[@]}"
export ASAN_OPTIONS="detect_leaks=1 abort_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1 halt_on_error=1"
# fuzz_one HARNESS: one bounded run; its verdict in $dir/fuzz_HARNESS.verdict.
fuzz_one() {
  local h=$1 work="$dir/corpus/$1" crashes="$dir/crashes/$1" runs
  mkdir -p "$work" "$crashes"
  local seeds=(tests/fuzz/corpus/$h)
  [ -d tests/fuzz/regressions/$h ] && seeds+=(tests/fuzz/regressions/$h)
  # The first directory collects new inputs; the seeds are read only.
  if "$dir/tests/fuzz/fuzz_$h" "$work" "${seeds[@]}" -max_total_time="$SECONDS_EACH" -timeout=10 \
       -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 -artifact_prefix="$crashes/" \
       > "$dir/fuzz_$h.log" 2>&1; then
    runs=$(grep -o "stat::number_of_executed_units: *[0-9]*" "$dir/fuzz_$h.log" | grep -o "[0-9]*$" || echo "?")
    echo "==> fuzz_$h: ${SECONDS_EACH} s from $(find "${seeds[@]}" -type f | wc -l) seed(s): ok, $runs inputs, corpus $(find "$work" -type f | wc -l) files, no crash" \
      > "$dir/fuzz_$h.verdict"
  else
    { echo "==> fuzz_$h: FAIL: crashed; input in $crashes/, log $dir/fuzz_$h.log"
      grep -E "ERROR|SUMMARY|runtime error" "$dir/fuzz_$h.log" | head -5; } > "$dir/fuzz_$h.verdict"
    return 1
  fi
}
# Two harnesses at a time (2 cores; each libFuzzer run is one process).
failed=0
pids=()
for h in "${HARNESSES[@]}"; do
  if [ ${#pids[@]} -ge 2 ]; then
    wait "${pids[0]}" || failed=1
    pids=("${pids[@]:1}")
  fi
  fuzz_one "$h" &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || failed=1; done
for h in "${HARNESSES[@]}"; do cat "$dir/fuzz_$h.verdict"; done
[ $failed -eq 0 ] && echo "fuzz: PASS" || echo "fuzz: FAIL"
exit $failed
