#!/usr/bin/env bash
# grace-chaos drives the PyTorch trainer as it drives grace-train: a trainer
# command after `--`, a random schedule from a fixed seed (a damaged
# checkpoint, a SIGKILL, a notice), every invariant checked (job finished,
# exactly once, bit-identical to its own uninterrupted run, no damaged
# checkpoint restored, no temporary left, exit codes, work lost in bounds).
# Then the same with grace-launch --standby: the restarts run on warm spares
# under the same faults, and the invariants still hold.
source "$(dirname "$0")/lib.sh"
: "${GRACE_CHAOS:?}"
OUT="$WORK/chaos"
mkdir -p "$OUT"
KINDS=sigterm_worker,sigkill_worker,sigstop_worker,flip_byte,truncate_file,sigterm_launcher
set +e
"$GRACE_CHAOS" --seed "${CHAOS_SEED:-29}" --faults 3 --kinds "$KINDS" --workers 4 --steps 60 --save-every 10 \
  --step-delay-ms 10 --timeout-s 400 --out "$OUT" --cache-dir "$OUT/cache" \
  --launcher "$GRACE_LAUNCH" --ckpt-tool "$GRACE_CKPT" -- "${TRAINER[@]}" >"$OUT/chaos.log" 2>&1
rc=$?
set -e
sed -n '/^schedule/,$p' "$OUT/chaos.log"
[ $rc -eq 0 ] || fail "grace-chaos with the PyTorch trainer: exit $rc"
"$PY" - "$OUT/report.json" <<'PYEOF' || fail "the schedule injected nothing"
import json, sys
r = json.load(open(sys.argv[1]))
injected = [f["spec"]["fault"] for f in r["faults"] if f["status"] == "injected"]
assert injected, "no fault was injected"
print("injected: " + ", ".join(injected))
PYEOF
pass "grace-chaos -- python3 examples/pytorch_train.py: every invariant holds"

OUT="$WORK/chaos-standby"
mkdir -p "$OUT"
set +e
"$GRACE_CHAOS" --seed "${CHAOS_STANDBY_SEED:-31}" --faults 3 --kinds "$KINDS" --workers 4 --steps 60 --save-every 10 \
  --step-delay-ms 10 --timeout-s 400 --out "$OUT" --cache-dir "$WORK/chaos/cache" \
  --launcher-arg=--standby --launcher-arg=--standby-delay-ms=0 \
  --launcher "$GRACE_LAUNCH" --ckpt-tool "$GRACE_CKPT" -- "${TRAINER[@]}" >"$OUT/chaos.log" 2>&1
rc=$?
set -e
sed -n '/^schedule/,$p' "$OUT/chaos.log"
[ $rc -eq 0 ] || fail "grace-chaos --launcher-arg=--standby with the PyTorch trainer: exit $rc"
n=$(count_events "$OUT/run/events.jsonl" "e['event']=='standby_released'")
[ "$n" -ge 1 ] || fail "--standby: no restart ran on a spare"
pass "grace-chaos with --standby: every invariant holds, $n worker(s) of restarted groups were warm spares"
