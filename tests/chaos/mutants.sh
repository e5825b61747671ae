#!/usr/bin/env bash
# Every invariant of grace-chaos can fail: one broken-on-purpose trainer flag
# per invariant, run under the same schedule as a control run with the
# correct trainer (which must PASS). A mutant must be caught by the
# invariants listed for it and by no other.
#   mutants.sh control | MUTANT-FLAG
# Env: GRACE_CHAOS GRACE_LAUNCH GRACE_TRAIN GRACE_CKPT (set by CTest);
# CHAOS_CACHE: reference cache shared by the runs (same trainer, same key).
set -u
: "${GRACE_CHAOS:?set GRACE_CHAOS to the grace-chaos binary}"
which=${1:?usage: mutants.sh control|--broken-...}

# The invariants each mutant must fail (and only these).
declare -A expect=(
  [control]=""
  [--broken-skip-optimizer-restore]="bit_identical"
  [--broken-repeat-step]="bit_identical exactly_once"
  [--broken-restore-without-checksums]="bit_identical no_corrupt_restore"
  [--broken-keep-stale-temporaries]="no_temp_left"
  [--broken-exit-zero]="exit_codes"
  [--broken-no-jit-save]="work_lost"
)
[ -n "${expect[$which]+x}" ] || { echo "unknown mutant '$which'"; exit 2; }

OUT=$(mktemp -d /tmp/grace-chaos-mutant.XXXXXX)
CACHE=${CHAOS_CACHE:-$OUT/cache}
# One schedule that exercises every mutant: a notice (restart codes), a
# SIGKILL 15 steps after the last periodic save (just-in-time save), a
# damaged newest checkpoint (restore checksums) and a stale temporary.
cat > "$OUT/schedule.json" <<'JSON'
[{"at_step": 30, "fault": "sigterm_worker", "target": 1},
 {"at_step": 75, "fault": "sigkill_worker", "target": 2},
 {"at_step": 100, "fault": "flip_byte", "file": "model-00001-of-00001.safetensors"},
 {"at_step": 125, "fault": "stale_tmp"}]
JSON
args=(--schedule "$OUT/schedule.json" --steps 150 --save-every 20 --out "$OUT/run" --cache-dir "$CACHE")
[ "$which" != control ] && args+=(--mutant-arg="$which")
"$GRACE_CHAOS" "${args[@]}" > "$OUT/chaos.log" 2>&1
rc=$?
cat "$OUT/chaos.log"

if grep -qE 'skipped' <(sed -n '/^faults:/,/^invariants:/p' "$OUT/chaos.log"); then
  echo "mutants: FAIL: a fault of the schedule was not injected, so the run proves nothing"
  exit 1
fi
failed=$(grep -oE '^ *FAIL +[a-z_]+' "$OUT/chaos.log" | awk '{print $2}' | sort | tr '\n' ' ' | sed 's/ $//')
want=$(echo "${expect[$which]}" | tr ' ' '\n' | sort | tr '\n' ' ' | sed 's/ $//' | sed 's/^ //')
if [ "$which" = control ]; then
  [ "$rc" = 0 ] && [ -z "$failed" ] || { echo "mutants: FAIL: the control run must pass (exit $rc, failed: $failed)"; exit 1; }
  echo "mutants: control PASS (every invariant holds with the correct trainer)"
  rm -rf "$OUT"
  exit 0
fi
[ "$rc" != 0 ] || { echo "mutants: FAIL: grace-chaos passed the broken trainer $which"; exit 1; }
[ "$failed" = "$want" ] || { echo "mutants: FAIL: $which failed [$failed], expected exactly [$want]"; exit 1; }
echo "mutants: $which caught by [$failed] and nothing else"
rm -rf "$OUT"
