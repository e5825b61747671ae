#!/usr/bin/env bash
# Failures without notice: SIGKILL and SIGSTOP of a worker (just-in-time
# save from the most advanced survivor), SIGKILL of the whole group
# (periodic checkpoint), an error inside a step (fatal, no restart).
source "$(dirname "$0")/lib.sh"
STEPS=150
ARGS=(--device cpu --steps $STEPS --step-delay-ms 8 --save-every 10)
REF=$(reference 4 "${ARGS[@]}")

for seed in 5 6; do
  RANDOM=$seed
  D="$WORK/kill-$seed"
  start_job "$D" 4 -- "${ARGS[@]}"
  wait_for_training "$D" 4
  wait_for_save "$D" $((10 * (RANDOM % 6 + 1)))
  sleep "0.00$((RANDOM % 9))"   # anywhere inside the next step
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
wait_for_save "$D" 40
frozen=$(workers_of "$JOB_PID" | sort | sed -n 3p)
kill -STOP "$frozen"
wait_job
check_finished "$D" $STEPS "$REF"
[ "$(count_events "$D/events.jsonl" "e['event']=='agreed' and e['kind']=='jit'")" -ge 1 ] || fail "a frozen worker must lead to a just-in-time save"
pass "SIGSTOP: frozen worker declared dead, survivors saved just in time, weights identical"

D="$WORK/all"
start_job "$D" 4 -- "${ARGS[@]}" --keep-checkpoints
wait_for_training "$D" 4
wait_for_save "$D" 40
kill -KILL $(workers_of "$JOB_PID")
wait_job
check_finished "$D" $STEPS "$REF"
restored=$(events "$D/events.jsonl" "e['event']=='restored'" | "$PY" -c 'import json,sys; print(json.loads(sys.stdin.readline())["step"])')
[ $((restored % 10)) -eq 0 ] && [ "$restored" -ge 40 ] || fail "whole group killed: expected a periodic checkpoint >= 40, restored $restored"
pass "whole group SIGKILLed: resumed from periodic checkpoint $restored, weights identical"

D="$WORK/error"
start_job "$D" 4 -- "${ARGS[@]}" --fail-at-step 40 --fail-rank 2
wait_job
[ "$JOB_RC" -eq 3 ] || { tail -20 "$D/log.txt"; fail "an error in a step: expected exit 3, got $JOB_RC"; }
[ "$(json "$D/ck/grace-exit.json" restarts)" -eq 0 ] || fail "a bug must not be restarted"
[ "$(count_events "$D/events.jsonl" "e['event']=='exit' and e['code']==3 and 'rank 2' in e['reason'] and 'step 40' in e['reason']")" -eq 4 ] \
  || { grep '"exit"' "$D/events.jsonl"; fail "every worker must stop with the error naming rank 2 and step 40"; }
pass "error at step 40 on rank 2: every worker stopped with it, launcher exit 3, no restart"

# A kill during a save: the previous checkpoint stays the newest valid one
# and is restored; the half-written temporary is cleaned; weights identical.
BIG=(--device cpu --steps 30 --hidden 2048,2048 --input-dim 1024 --batch 32 --save-every 10 --keep-checkpoints)
"$GRACE_TRAIN" "${BIG[@]}" --checkpoint-dir "$WORK/bigref" --output "$WORK/bigref.json" >/dev/null 2>&1
BREF=$(json "$WORK/bigref.json" weights_checksum)
# The kill must land while step 20 is being written: after its snapshot and
# before its commit. A write that finished first proves nothing, so such a
# try is repeated (a fresh directory each time), and a test that never got
# its kill inside the save fails instead of passing.
landed=""
for try in 1 2 3 4 5; do
  D="$WORK/killsave-$try"
  mkdir -p "$D"
  (cd "$D" && GRACE_EVENTS_FILE="$D/events.jsonl" exec "$GRACE_TRAIN" "${BIG[@]}" --checkpoint-dir ck --output out.json >log.txt 2>&1) &
  P=$!
  track_pid "$P"
  for _ in $(seq 1 4000); do
    grep -q '"event":"snapshot_done".*"step":20' "$D/events.jsonl" 2>/dev/null && break
    sleep 0.002
  done
  kill -KILL $P 2>/dev/null || true
  wait $P 2>/dev/null || true
  if grep -q '"event":"snapshot_done".*"step":20' "$D/events.jsonl" && \
     ! grep -q '"event":"committed_local".*"step":20' "$D/events.jsonl"; then
    landed=$try
    break
  fi
  echo "try $try: the kill missed the save of step 20; again"
done
[ -n "$landed" ] || fail "five tries and the kill never landed inside the save of step 20"
(cd "$D" && GRACE_EVENTS_FILE="$D/events.jsonl" "$GRACE_TRAIN" "${BIG[@]}" --checkpoint-dir ck --output out.json >>log.txt 2>&1) \
  || { tail -20 "$D/log.txt"; fail "resume after a kill during a save failed"; }
restored=$(events "$D/events.jsonl" "e['event']=='restored'" | "$PY" -c 'import json,sys; print(json.loads(sys.stdin.readline())["step"])')
[ "$restored" -eq 10 ] || fail "restored $restored after a kill during the save of step 20 (expected the previous checkpoint, 10)"
[ "$(json "$D/out.json" weights_checksum)" = "$BREF" ] || fail "weights differ after a kill during a save"
[ -z "$(find "$D/ck" -maxdepth 1 -name '.tmp-*')" ] || fail "the killed writer's temporary was not cleaned"
pass "kill during the save of step 20 (try $landed): restored step 10, temporary cleaned, weights identical"

# SIGKILL of the launcher, which hosts the coordination service, during a
# step that ends with a periodic save: the chief's commit of that save is
# fenced (no service to ask), so the chief saves the step alone before it
# exits; a new launcher restores it and the run ends identical. Aimed at
# the middle of the step before the save at 20 (300 ms steps); wherever
# the kill lands, at most one step may be lost.
D="$WORK/launcher"
LARGS=(--device cpu --steps 30 --step-delay-ms 300 --save-every 10)
LREF=$(reference 2 "${LARGS[@]}")
start_job "$D" 2 -- "${LARGS[@]}"
wait_for_training "$D" 2
wait_for_event "$D" "e['event']=='snapshot_done' and e['step']==10"
W=$(workers_of "$JOB_PID")
t10=$(events "$D/events.jsonl" "e['event']=='snapshot_done' and e['step']==10" | "$PY" -c 'import json,sys; print(json.loads(sys.stdin.readline())["t_ns"])')
"$PY" -c "import time; time.sleep(max(0, ($t10 + 2_850_000_000 - time.time_ns()) / 1e9))"  # 9.5 steps after it
kill -KILL "$JOB_PID"
wait_job
for w in $W; do timeout 60 tail --pid="$w" -f /dev/null || fail "worker $w did not exit after the service was lost"; done
reached=$(events "$D/events.jsonl" "e['event']=='exit' and e.get('rank')==0" | "$PY" -c 'import json,sys; print(json.loads(sys.stdin.readline())["step"])')
start_job "$D" 2 -- "${LARGS[@]}"
wait_job
check_finished "$D" 30 "$LREF"
restored=$(events "$D/events.jsonl" "e['event']=='restored'" | "$PY" -c 'import json,sys; print(json.loads(sys.stdin.readline())["step"])')
[ "$restored" -ge $((reached - 1)) ] || fail "launcher killed at step $reached: restored $restored (more than one step lost)"
pass "launcher SIGKILLed at step $reached: the chief saved alone, restored $restored, weights identical"
