#!/usr/bin/env bash
# A notice with a grace period: the first save does not stop training; the
# chief proposes a final save when the time left reaches the margin; the
# final save lands before the deadline; exit 42; the restart resumes from it
# and the final weights are bit-identical to an uninterrupted run.
source "$(dirname "$0")/lib.sh"
STEPS=400
ARGS=(--device cpu --steps $STEPS --step-delay-ms 6 --save-every 25)
REF=$(reference 4 "${ARGS[@]}")
GRACE_MS=1500

check_grace() { # check_grace DIR
  local E="$1/events.jsonl"
  "$PY" - "$E" "$GRACE_MS" <<'PYEOF'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
grace_ns = int(sys.argv[2]) * 1_000_000
inc0 = [e for e in ev if e["incarnation"] == 0]
claim = next(e for e in inc0 if e["event"] == "claim")
agreed = [e for e in inc0 if e["event"] == "agreed"]
kinds = [a["kind"] for a in agreed]
assert kinds == ["initial", "final"], f"expected an initial then a final agreement, got {kinds}"
commits = [e for e in inc0 if e["event"] == "committed"]
assert len(commits) == 2, f"expected two commits, got {len(commits)}"
first, final = agreed[0]["step"], agreed[1]["step"]
assert final > first + 5, f"training must continue between the saves ({first} -> {final})"
deadline = claim["t_ns"] + grace_ns
assert commits[1]["t_ns"] <= deadline, f"final save {(commits[1]['t_ns'] - deadline)/1e6:.0f} ms after the deadline"
exits = [e for e in inc0 if e["event"] == "exit"]
assert exits and all(e["code"] == 42 for e in exits), "every worker exits 42 after the final save"
restored = next(e for e in ev if e["event"] == "restored")
assert restored["step"] == final, f"restored {restored['step']}, final save was {final}"
print(f"initial save at step {first}, final save at step {final}, "
      f"{(deadline - commits[1]['t_ns'])/1e6:.0f} ms before the deadline")
PYEOF
}

D="$WORK/worker-notice"
start_job "$D" 4 -- "${ARGS[@]}" --grace-period-ms $GRACE_MS
wait_for_training "$D" 4
wait_for_save "$D" 50
kill -TERM "$(workers_of "$JOB_PID" | sort | sed -n 2p)"
wait_job
check_finished "$D" $STEPS "$REF"
msg=$(check_grace "$D") || fail "grace period (worker notice): $msg"
pass "grace period, notice to a worker: $msg; weights identical"

D="$WORK/launcher-notice"
start_job "$D" 4 --grace-period-ms $GRACE_MS -- "${ARGS[@]}"
wait_for_training "$D" 4
wait_for_save "$D" 50
kill -TERM "$JOB_PID"
wait_job
[ "$JOB_RC" -eq 42 ] || { tail -20 "$D/log.txt"; fail "launcher with a grace period: expected 42, got $JOB_RC"; }
start_job "$D" 4 -- "${ARGS[@]}"
wait_job
check_finished "$D" $STEPS "$REF"
msg=$(check_grace "$D") || fail "grace period (launcher notice): $msg"
pass "grace period, notice to the launcher: $msg; weights identical"
