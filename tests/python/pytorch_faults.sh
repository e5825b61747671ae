#!/usr/bin/env bash
# The PyTorch trainer (examples/pytorch_train.py: nn.Module, AdamW,
# grace.data.ResumableLoader, grace.all_reduce_) under
# grace-launch --nproc 4 survives every fault and ends byte for byte in the
# state of an uninterrupted run: SIGTERM to a random worker, two notices at
# once, SIGTERM to the launcher, a notice with a grace period, SIGKILL of a
# worker (restart, and in place: the survivors keep their processes) and
# SIGSTOP of a worker; an exception in one rank's step stops everyone with
# exit 3 and no restart. Faults are placed after a periodic checkpoint event.
source "$(dirname "$0")/lib.sh"
STEPS=80
ARGS=(--steps $STEPS --save-every 5 --step-delay-ms 5)
REF="$WORK/ref"
py_reference "$REF" 4 "${ARGS[@]}"
pass "uninterrupted reference: $("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["weights_checksum"])' "$REF/out.json")"

RANDOM=16
D="$WORK/sigterm"
at=$((RANDOM % 4 * 5 + 10))
victim=$((RANDOM % 4))
start_py_job "$D" 4 -- "${ARGS[@]}"
wait_saved "$D" $at
kill -TERM "$(pid_of "$D" $victim)"
wait_job
same=$(same_as_reference "$REF" "$D" $STEPS)
[ "$(json "$D/ck/grace-exit.json" restarts)" -eq 1 ] || fail "SIGTERM: expected one restart"
agreed=$(first_step_of "$D" agreed)
restored=$(first_step_of "$D" restored)
[ "$agreed" = "$restored" ] || fail "SIGTERM: agreed step $agreed but restored $restored"
pass "SIGTERM to rank $victim after step $at: saved and restored step $agreed; $same"

D="$WORK/two"
start_py_job "$D" 4 -- "${ARGS[@]}"
wait_saved "$D" 15
kill -TERM "$(pid_of "$D" 1)" "$(pid_of "$D" 2)"
wait_job
same=$(same_as_reference "$REF" "$D" $STEPS)
[ "$(count_events "$D/events.jsonl" "e['event']=='agreed' and e['incarnation']==0")" -eq 1 ] || fail "two notices must make one agreement"
pass "two SIGTERMs at once: one agreement; $same"

D="$WORK/launcher"
start_py_job "$D" 4 -- "${ARGS[@]}"
wait_saved "$D" 20
kill -TERM "$JOB_PID"
wait_job
[ "$JOB_RC" -eq 42 ] || { tail -20 "$D/log.txt"; fail "SIGTERM to the launcher: expected exit 42, got $JOB_RC"; }
start_py_job "$D" 4 -- "${ARGS[@]}"   # the scheduler starts the job again
wait_job
same=$(same_as_reference "$REF" "$D" $STEPS)
pass "SIGTERM to the launcher: exit 42, the rerun resumed; $same"

D="$WORK/grace-period"
GRACE_MS=1000
# Steps of at least 20 ms (the delay does not change the weights): the grace
# period ends at most 50 steps after the notice, well before step 80.
start_py_job "$D" 4 -- "${ARGS[@]}" --step-delay-ms 20 --grace-period-ms $GRACE_MS
wait_saved "$D" 5
kill -TERM "$(pid_of "$D" 2)"
wait_job
same=$(same_as_reference "$REF" "$D" $STEPS)
msg=$("$PY" "$(dirname "$0")/../integration/check_grace.py" "$D/events.jsonl" "$GRACE_MS" --workers 4) || fail "grace period: $msg"
pass "notice with a ${GRACE_MS} ms grace period: $msg; $same"

D="$WORK/sigkill"
victim=$((RANDOM % 4))
start_py_job "$D" 4 -- "${ARGS[@]}"
wait_saved "$D" 15
kill -KILL "$(pid_of "$D" $victim)"
wait_job
same=$(same_as_reference "$REF" "$D" $STEPS)
jit=$(first_step_of "$D" agreed jit)
restored=$(first_step_of "$D" restored)
[ "$jit" = "$restored" ] || fail "SIGKILL: restored $restored, the just-in-time save was $jit"
pass "SIGKILL of rank $victim: just-in-time save at step $jit restored; $same"

D="$WORK/in-place"
start_py_job "$D" 4 --recovery in-place -- "${ARGS[@]}"
wait_saved "$D" 15
kill -KILL "$(pid_of "$D" 2)"
wait_job
same=$(same_as_reference "$REF" "$D" $STEPS)
[ "$(count_events "$D/events.jsonl" "e['event']=='group_started'")" -eq 1 ] || fail "in place: the group was restarted"
[ "$(count_events "$D/events.jsonl" "e['event']=='worker_replaced'")" -eq 1 ] || fail "in place: expected one replacement"
[ "$(count_events "$D/events.jsonl" "e['event']=='recovered'")" -eq 4 ] || fail "in place: expected 4 recovered reports"
[ "$(count_events "$D/events.jsonl" "e['event']=='worker_exit' and e['code']==0")" -eq 4 ] ||
  fail "in place: the 3 survivors and the replacement must run to the end (exit 0)"
pass "SIGKILL of rank 2 with --recovery in-place: replaced, the 3 survivors never restarted (no torch import again); $same"

D="$WORK/sigstop"
start_py_job "$D" 4 --dead-after-ms 1500 -- "${ARGS[@]}"
wait_saved "$D" 15
frozen=$(pid_of "$D" 3)
kill -STOP "$frozen"
wait_job
kill -CONT "$frozen" 2>/dev/null || true
same=$(same_as_reference "$REF" "$D" $STEPS)
[ "$(count_events "$D/events.jsonl" "e['event']=='agreed' and e['kind']=='jit'")" -ge 1 ] || fail "SIGSTOP: no just-in-time save"
[ "$(count_events "$D/events.jsonl" "e['event']=='kill_lost' and e['worker_rank']==3")" -eq 1 ] || fail "SIGSTOP: the launcher must kill the frozen rank"
pass "SIGSTOP of rank 3: declared dead, survivors saved just in time; $same"

D="$WORK/error"
start_py_job "$D" 4 -- "${ARGS[@]}" --fail-at-step 20 --fail-rank 2
wait_job
[ "$JOB_RC" -eq 3 ] || { tail -30 "$D/log.txt"; fail "an exception in a step: expected exit 3, got $JOB_RC"; }
[ "$(json "$D/ck/grace-exit.json" restarts)" -eq 0 ] || fail "an exception must not be restarted"
n=$(count_events "$D/events.jsonl" "e['event']=='exit' and e['code']==3 and 'rank 2' in e['reason'] and 'step 20' in e['reason']")
[ "$n" -eq 4 ] || { grep '"exit"' "$D/events.jsonl"; fail "every worker must stop with the error naming rank 2 and step 20 ($n did)"; }
[ "$(count_events "$D/events.jsonl" "e['event']=='worker_exit' and e['code']==3")" -eq 4 ] || fail "every worker must exit 3"
grep -q "RuntimeError: injected failure at step 20" "$D/log.txt" || fail "the traceback of rank 2's exception must be in the log"
pass "exception at step 20 on rank 2: every worker stopped with it (exit 3), launcher exit 3, no restart"
