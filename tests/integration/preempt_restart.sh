#!/usr/bin/env bash
# SIGTERM a random worker at a random time (several seeds), two workers at
# once, and the launcher itself: the run finishes, every step ran exactly
# once, the final weights are bit-identical to an uninterrupted run.
source "$(dirname "$0")/lib.sh"
STEPS=150
ARGS=(--device cpu --steps $STEPS --step-delay-ms 8 --save-every 10)
REF=$(reference 4 "${ARGS[@]}")
pass "reference checksum $REF"

for seed in 11 22 33; do
  RANDOM=$seed
  D="$WORK/seed-$seed"
  start_job "$D" 4 -- "${ARGS[@]}"
  wait_for_training "$D" 4
  wait_for_save "$D" $((10 * (RANDOM % 6 + 1)))
  sleep "0.00$((RANDOM % 9))"   # anywhere inside the next step
  victim=$(workers_of "$JOB_PID" | sort | sed -n "$((RANDOM % 4 + 1))p")
  kill -TERM "$victim"
  wait_job
  check_finished "$D" $STEPS "$REF"
  [ "$(json "$D/ck/grace-exit.json" restarts)" -eq 1 ] || fail "seed $seed: expected one restart"
  agreed=$(events "$D/events.jsonl" "e['event']=='agreed'" | "$PY" -c 'import json,sys; print(json.loads(sys.stdin.readline())["step"])')
  restored=$(events "$D/events.jsonl" "e['event']=='restored'" | "$PY" -c 'import json,sys; print(json.loads(sys.stdin.readline())["step"])')
  [ "$agreed" = "$restored" ] || fail "seed $seed: agreed $agreed but restored $restored (lost work on a notice)"
  pass "seed $seed: SIGTERM to pid $victim, saved and restored step $agreed, weights identical"
done

D="$WORK/two"
start_job "$D" 4 -- "${ARGS[@]}"
wait_for_training "$D" 4
kill -TERM $(workers_of "$JOB_PID" | head -2)
wait_job
check_finished "$D" $STEPS "$REF"
[ "$(count_events "$D/events.jsonl" "e['event']=='agreed' and e['incarnation']==0")" -eq 1 ] || fail "two notices must make one agreement"
pass "two SIGTERMs at once: one agreement, weights identical"

D="$WORK/launcher"
start_job "$D" 4 -- "${ARGS[@]}"
wait_for_training "$D" 4
wait_for_save "$D" 40
kill -TERM "$JOB_PID"
wait_job
[ "$JOB_RC" -eq 42 ] || { tail -20 "$D/log.txt"; fail "launcher got SIGTERM: expected exit 42, got $JOB_RC"; }
[ "$(json "$D/ck/grace-exit.json" exit_code)" -eq 42 ] || fail "reason file must say 42"
start_job "$D" 4 -- "${ARGS[@]}"   # the scheduler restarts the job
wait_job
check_finished "$D" $STEPS "$REF"
pass "SIGTERM to the launcher: exit 42, the rerun resumes, weights identical"
