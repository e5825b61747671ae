#!/usr/bin/env bash
# 4 processes on loopback join one coordinator; one gets a notice; all
# agree on one step and stop exactly there.
source "$(dirname "$0")/lib.sh"
D="$WORK/agree"
start_job "$D" 4 --max-restarts 0 -- --steps 100000 --step-delay-ms 5
wait_for_training "$D" 4
victim=$(workers_of "$JOB_PID" | shuf -n1)
kill -TERM "$victim"
wait_job
[ "$JOB_RC" -eq 44 ] || { cat "$D/log.txt"; fail "expected exit 44 (restart needed, restarts exhausted), got $JOB_RC"; }
E="$D/events.jsonl"
[ "$(count_events "$E" "e['event']=='agreed'")" -eq 1 ] || fail "expected exactly one agreement"
step=$(events "$E" "e['event']=='agreed'" | "$PY" -c 'import json,sys; print(json.loads(sys.stdin.readline())["step"])')
reached=$(events "$E" "e['event']=='reached_agreed_step'" | "$PY" -c 'import json,sys; print(sorted(set(json.loads(l)["step"] for l in sys.stdin)), end="")')
[ "$reached" = "[$step]" ] || fail "workers stopped at $reached, agreed $step"
# A worker that arrives at the agreed step after the commit is already known
# stops there without a reached_agreed_step event (nothing left to do): what
# must hold is that the saver reached it and every worker stopped exactly there.
[ "$(count_events "$E" "e['event']=='reached_agreed_step' and e['rank']==0")" -eq 1 ] || fail "the saver (rank 0) did not reach the agreed step"
[ "$(count_events "$E" "e['event']=='exit' and e['code']==42 and e['step']==$step")" -eq 4 ] ||
  fail "every worker must exit 42 at the agreed step $step: $(events "$E" "e['event']=='exit'")"
"$GRACE_CKPT" verify "$D/ck" --step "$step" >/dev/null || fail "checkpoint at step $step does not verify"
pass "4 workers agreed on step $step after one SIGTERM and saved it"
