#!/usr/bin/env bash
# Failures without notice: SIGKILL and SIGSTOP of a worker (just-in-time
# save from the most advanced survivor), SIGKILL of the whole group
# (periodic checkpoint), an error inside a step (fatal, no restart).
source "$(dirname "$0")/lib.sh"
STEPS=150
ARGS=(--steps $STEPS --step-delay-ms 8)
REF=$(reference 4 "${ARGS[@]}")

for seed in 5 6; do
  RANDOM=$seed
  D="$WORK/kill-$seed"
  start_job "$D" 4 -- "${ARGS[@]}"
  wait_for_training "$D" 4
  sleep "0.$((RANDOM % 6 + 1))"
  kill -KILL "$(workers_of "$JOB_PID" | sort | sed -n "$((RANDOM % 4 + 1))p")"
  wait_job
  check_finished "$D" $STEPS "$REF"
  jit=$(events "$D/events.jsonl" "e['event']=='agreed' and e['kind']=='jit'" | "$PY" -c 'import json,sys; print(json.loads(sys.stdin.readline())["step"])')
  restored=$(events "$D/events.jsonl" "e['event']=='restored'" | "$PY" -c 'import json,sys; print(json.loads(sys.stdin.readline())["step"])')
  [ "$jit" = "$restored" ] || fail "restored $restored, just-in-time save was $jit"
  pass "SIGKILL (seed $seed): just-in-time save at step $jit, weights identical"
done

D="$WORK/stop"
start_job "$D" 4 --dead-after-ms 1500 --exit-timeout-ms 3000 -- "${ARGS[@]}"
wait_for_training "$D" 4
sleep 0.4
frozen=$(workers_of "$JOB_PID" | sort | sed -n 3p)
kill -STOP "$frozen"
wait_job
check_finished "$D" $STEPS "$REF"
[ "$(count_events "$D/events.jsonl" "e['event']=='agreed' and e['kind']=='jit'")" -ge 1 ] || fail "a frozen worker must lead to a just-in-time save"
pass "SIGSTOP: frozen worker declared dead, survivors saved just in time, weights identical"

D="$WORK/all"
start_job "$D" 4 -- "${ARGS[@]}" --save-every 20 --keep-checkpoints
wait_for_training "$D" 4
sleep 0.8
kill -KILL $(workers_of "$JOB_PID")
wait_job
check_finished "$D" $STEPS "$REF"
restored=$(events "$D/events.jsonl" "e['event']=='restored'" | "$PY" -c 'import json,sys; print(json.loads(sys.stdin.readline())["step"])')
[ $((restored % 20)) -eq 0 ] || fail "whole group killed: expected a periodic checkpoint, restored $restored"
pass "whole group SIGKILLed: resumed from periodic checkpoint $restored, weights identical"

D="$WORK/error"
start_job "$D" 4 -- "${ARGS[@]}" --fail-at-step 40 --fail-rank 2
wait_job
[ "$JOB_RC" -eq 3 ] || { tail -20 "$D/log.txt"; fail "an error in a step: expected exit 3, got $JOB_RC"; }
[ "$(json "$D/ck/grace-exit.json" restarts)" -eq 0 ] || fail "a bug must not be restarted"
[ "$(count_events "$D/events.jsonl" "e['event']=='exit' and e['code']==3 and 'rank 2' in e['reason'] and 'step 40' in e['reason']")" -eq 4 ] \
  || { grep '"exit"' "$D/events.jsonl"; fail "every worker must stop with the error naming rank 2 and step 40"; }
pass "error at step 40 on rank 2: every worker stopped with it, launcher exit 3, no restart"
