#!/usr/bin/env bash
# grace-launch --recovery in-place: a lost worker is replaced while the
# others train on (runtime/coordination/agreement.hpp, "Recovery in place").
#  1. Two SIGKILLs, one after the other's recovery: each time one
#     replacement process, the survivors keep their processes (one group
#     for the whole run, every original survivor exits 0 at the end), and
#     the run ends bit-identical to an uninterrupted one, every step once.
#  2. A frozen worker (SIGSTOP past --dead-after-ms): the launcher kills it
#     on the verdict and replaces it; bit-identical again.
#  3. Sharded state cannot recover in place: the same loss restarts the
#     group (the run still ends bit-identical).
source "$(dirname "$0")/lib.sh"
STEPS=240
ARGS=(--steps $STEPS --step-delay-ms 10 --save-every 50)
REF=$(reference 4 "${ARGS[@]}")
pass "reference checksum $REF"
IP=(--recovery in-place --max-restarts 3)

group_pids() { # group_pids DIR INCARNATION: the pids the group started with, rank order
  events "$1/events.jsonl" "e['event']=='group_started' and e['incarnation']==$2" |
    "$PY" -c 'import json,sys; p=json.loads(sys.stdin.readline())["pids"]; print(" ".join(str(p[k]) for k in sorted(p, key=int)))'
}
exited_ok() { # exited_ok DIR PID: the launcher saw PID exit 0
  [ "$(count_events "$1/events.jsonl" "e['event']=='worker_exit' and e['pid']==$2 and e['code']==0")" -eq 1 ]
}
one_group() { # one_group DIR: no restart: a single group for the whole run
  [ "$(count_events "$1/events.jsonl" "e['event']=='group_started'")" -eq 1 ] ||
    fail "$1: the group was restarted ($(count_events "$1/events.jsonl" "e['event']=='group_started'") groups)"
}

D="$WORK/kill"
start_job "$D" 4 "${IP[@]}" -- "${ARGS[@]}"
wait_for_save "$D" 50
read -r -a PIDS0 <<<"$(group_pids "$D" 0)"
kill -KILL "${PIDS0[2]}"
wait_for_event "$D" "e['event']=='resumed'"
wait_for_save "$D" 150
kill -KILL "${PIDS0[1]}"
await_events "$D" "e['event']=='resumed'" 2 60 || { tail -20 "$D/log.txt"; fail "kill: no second recovery"; }
wait_job
check_finished "$D" $STEPS "$REF"
one_group "$D"
[ "$(count_events "$D/events.jsonl" "e['event']=='worker_replaced'")" -eq 2 ] || fail "kill: expected two replacements"
for r in 0 3; do exited_ok "$D" "${PIDS0[$r]}" || fail "kill: survivor rank $r (pid ${PIDS0[$r]}) did not run to the end"; done
# Each recovery: every member reported it, and the replacement took the state.
[ "$(count_events "$D/events.jsonl" "e['event']=='recovered'")" -eq 8 ] || fail "kill: expected 8 recovered reports"
[ "$(count_events "$D/events.jsonl" "e['event']=='recovered' and e['bytes']>0")" -ge 2 ] ||
  fail "kill: the replacements took no state from a donor"
[ "$(json "$D/ck/grace-exit.json" restarts)" -eq 2 ] || fail "kill: the two replacements count toward --max-restarts"
pass "two SIGKILLs: each replaced in place, survivors ${PIDS0[0]} ${PIDS0[3]} ran throughout, weights identical"

D="$WORK/freeze"
start_job "$D" 4 "${IP[@]}" --dead-after-ms 800 -- "${ARGS[@]}"
wait_for_save "$D" 50
read -r -a PIDS0 <<<"$(group_pids "$D" 0)"
kill -STOP "${PIDS0[3]}"
wait_for_event "$D" "e['event']=='resumed'"
wait_job
check_finished "$D" $STEPS "$REF"
one_group "$D"
grep -q "declared lost by the coordinator" "$D/log.txt" || fail "freeze: the frozen worker was not declared lost"
for r in 0 1 2; do exited_ok "$D" "${PIDS0[$r]}" || fail "freeze: survivor rank $r did not run to the end"; done
pass "a frozen worker: killed on the verdict, replaced in place, weights identical"

SH=(--steps 120 --step-delay-ms 10 --save-every 20 --shard-optimizer)
REF_SH=$(reference 2 "${SH[@]}")
D="$WORK/sharded"
start_job "$D" 2 "${IP[@]}" -- "${SH[@]}"
wait_for_save "$D" 40
kill -KILL "$(group_pids "$D" 0 | cut -d' ' -f2)"
wait_job
check_finished "$D" 120 "$REF_SH"
[ "$(count_events "$D/events.jsonl" "e['event']=='group_started'")" -eq 2 ] || fail "sharded: expected a restart"
[ "$(count_events "$D/events.jsonl" "e['event']=='resumed'")" -eq 0 ] || fail "sharded: recovered in place"
grep -q "cannot recover in place" "$D/log.txt" || fail "sharded: the service did not say why it restarts"
pass "sharded state: the loss restarts the group (said once), weights identical"
