#!/usr/bin/env bash
# Faults on top of faults in real processes: scripted grace-chaos schedules
# with overlapping faults (a few ms apart, or keyed to the agreement, the
# save, the restart). Every fault must be injected (a fault that found no
# target is not covered) and every invariant must hold, work_lost with the
# bound of each overlapping group's worst fault.
# Env: GRACE_CHAOS GRACE_LAUNCH GRACE_TRAIN GRACE_CKPT (set by CTest).
set -u
: "${GRACE_CHAOS:?set GRACE_CHAOS to the grace-chaos binary}"
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${CHAOS_OUT:-$(mktemp -d /tmp/grace-chaos-overlap.XXXXXX)}
failed=0
for s in overlap-agreement overlap-restart overlap-grace; do
  dir=$OUT/$s
  # A 1024x1024 model: its saves last long enough for a fault keyed to
  # "snapshot_done" to land while the write is in flight.
  if "$GRACE_CHAOS" --schedule "$HERE/schedules/$s.json" --steps 200 --out "$dir" --cache-dir "$OUT/cache" \
       --trainer-arg=--hidden --trainer-arg=1024,1024 > "$OUT/$s.log" 2>&1; then
    echo "$s: PASS"
  else
    echo "$s: FAIL (grace-chaos exit $?)"
    sed -n '/^faults:/,$p' "$OUT/$s.log"
    failed=1
    continue
  fi
  not_injected=$(python3 - "$dir/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(" ".join("#%d %s (%s: %s)" % (f["index"], f["spec"]["fault"], f["status"], f.get("detail", ""))
               for f in r["faults"] if f["status"] != "injected"))
PY
)
  if [ -n "$not_injected" ]; then
    echo "$s: faults not injected: $not_injected"
    failed=1
  fi
done
echo "overlap: output in $OUT"
[ "$failed" = 0 ] && echo "overlap: PASS" || echo "overlap: FAIL"
exit $failed
