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
  "$PY" "$(dirname "$0")/check_grace.py" "$1/events.jsonl" "$GRACE_MS" --min-gap 6 --commits 2
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
