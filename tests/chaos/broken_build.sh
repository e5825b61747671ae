#!/usr/bin/env bash
# The harness must catch lost state: with the trainer's deliberately broken
# --skip-optimizer-restore (momentum zeroed after a restore), a preempted
# run must FAIL the bit_identical invariant.
set -u
: "${GRACE_CHAOS:?set GRACE_CHAOS to the grace-chaos binary}"
OUT=${CHAOS_OUT:-$(mktemp -d /tmp/grace-chaos-broken.XXXXXX)}
cat > "$OUT/schedule.json" <<'JSON'
[{"at_step": 60, "fault": "sigterm_worker", "target": 1}]
JSON
"$GRACE_CHAOS" --schedule "$OUT/schedule.json" --steps 120 --out "$OUT/run" --cache-dir "$OUT/cache" \
  --trainer-arg=--skip-optimizer-restore > "$OUT/chaos.log" 2>&1
rc=$?
cat "$OUT/chaos.log"
if [ "$rc" = 0 ]; then
  echo "broken_build: FAIL: grace-chaos passed a trainer that drops the optimizer state"
  exit 1
fi
if ! grep -qE '^ *FAIL bit_identical' "$OUT/chaos.log"; then
  echo "broken_build: FAIL: grace-chaos failed (exit $rc) but not on bit_identical"
  exit 1
fi
# The fault itself must have been handled correctly: only bit-identity fails.
if grep -E '^ *FAIL ' "$OUT/chaos.log" | grep -vq bit_identical; then
  echo "broken_build: FAIL: other invariants failed too"
  exit 1
fi
echo "broken_build: PASS (bit_identical caught the lost optimizer state; grace-chaos exit $rc)"
