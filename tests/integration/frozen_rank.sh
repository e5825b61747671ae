#!/usr/bin/env bash
# A worker frozen for good (SIGSTOP, never SIGCONT): the coordinator declares
# it dead, the survivors save just in time, and grace-launch SIGKILLs the
# frozen worker at once (it launched it) instead of waiting out
# --exit-timeout-ms. The group restarts before that timeout could fire and
# finishes exactly once with the weights of an uninterrupted run. Promptness
# is an order of the launcher's events (kill_lost, then the frozen worker's
# exit by signal 9, then the new group; no exit_timeout before it), never a
# wall-clock bound.
source "$(dirname "$0")/lib.sh"
STEPS=150
ARGS=(--device cpu --steps $STEPS --step-delay-ms 8 --save-every 10)
REF=$(reference 4 "${ARGS[@]}")

D="$WORK/frozen"
# A long exit timeout: only the kill on the verdict can make the restart prompt.
start_job "$D" 4 --dead-after-ms 1500 --exit-timeout-ms 60000 -- "${ARGS[@]}"
wait_for_training "$D" 4
wait_for_save "$D" 40
frozen=$(workers_of "$JOB_PID" | sort | sed -n 2p)
kill -STOP "$frozen"
wait_job
check_finished "$D" $STEPS "$REF"

lost_rank=$(events "$D/events.jsonl" "e['event']=='peer_lost'" | "$PY" -c 'import json,sys; print(json.loads(sys.stdin.readline())["lost_rank"])')
[ "$(count_events "$D/events.jsonl" "e['event']=='agreed' and e['kind']=='jit'")" -ge 1 ] || fail "a frozen worker must lead to a just-in-time save"
[ "$(count_events "$D/events.jsonl" "e['event']=='kill_lost' and e['worker_rank']==$lost_rank")" -eq 1 ] \
  || fail "the launcher must kill the declared-dead rank $lost_rank once"
# The order of the launcher's own events (one process appending to the file:
# file order is the order they happened in).
"$PY" - "$D/events.jsonl" "$lost_rank" <<'PYEOF' || fail "the frozen rank was not killed on the verdict before the exit timeout"
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
lost = int(sys.argv[2])
def first(pred, what):
    for i, e in enumerate(ev):
        if pred(e): return i
    sys.exit("no " + what)
kill = first(lambda e: e['event'] == 'kill_lost' and e['worker_rank'] == lost and e['incarnation'] == 0,
             "kill_lost of rank %d in incarnation 0" % lost)
exit_ = first(lambda e: e['event'] == 'worker_exit' and e['worker_rank'] == lost and e['incarnation'] == 0,
              "worker_exit of rank %d in incarnation 0" % lost)
start = first(lambda e: e['event'] == 'group_started' and e['incarnation'] == 1, "group_started of incarnation 1")
timeouts = [i for i, e in enumerate(ev) if e['event'] == 'exit_timeout']
if ev[exit_]['signal'] != 9: sys.exit("rank %d exited %s, not by SIGKILL" % (lost, ev[exit_]))
if not kill < exit_: sys.exit("rank %d's SIGKILL exit came before the launcher's kill_lost: something else killed it" % lost)
if not exit_ < start: sys.exit("incarnation 1 started before rank %d of incarnation 0 exited" % lost)
early = [ev[i] for i in timeouts if i < start]
if early: sys.exit("the exit timeout fired before the new group started: %s" % early)
PYEOF
[ "$(count_events "$D/events.jsonl" "e['event']=='restored'")" -ge 1 ] || fail "the new group must restore the just-in-time checkpoint"
kill -CONT "$frozen" 2>/dev/null || true
pass "frozen rank $lost_rank: kill_lost, then its exit by SIGKILL, then the new group, no exit timeout before it; $STEPS steps exactly once, weights identical"
