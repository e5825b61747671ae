#!/usr/bin/env bash
# grace-launch --standby: warm spares take over at a restart.
#  1. A SIGTERM to a worker: the restarted group's workers are the spares
#     started while incarnation 0 trained (same pids), and the run ends
#     bit-identical to an uninterrupted one, every step exactly once.
#  2. A SIGKILL of a worker, spares ready: the same, through the
#     just-in-time save.
#  3. A spare killed before it was needed: that worker starts from scratch,
#     the others come from spares, the run still ends bit-identical.
#  4. After the job, no spare is left running.
source "$(dirname "$0")/lib.sh"
STEPS=120
ARGS=(--steps $STEPS --step-delay-ms 10 --save-every 10)
REF=$(reference 2 "${ARGS[@]}")
pass "reference checksum $REF"
SB=(--standby --standby-delay-ms 0 --max-restarts 3)

released_pids() { # released_pids DIR: pids the launcher handed a worker's environment
  events "$1/events.jsonl" "e['event']=='standby_released'" | "$PY" -c 'import json,sys; print(" ".join(sorted(str(json.loads(l)["pid"]) for l in sys.stdin)))'
}
group_pids() { # group_pids DIR INCARNATION
  events "$1/events.jsonl" "e['event']=='group_started' and e['incarnation']==$2" |
    "$PY" -c 'import json,sys; print(" ".join(sorted(str(p) for p in json.loads(sys.stdin.readline())["pids"].values())))'
}
spare_pids() { # spare_pids DIR: every spare the launcher started, on one line (no reader
  # may close the pipe early: with pipefail a BrokenPipeError fails the test)
  events "$1/events.jsonl" "e['event']=='standby_started'" |
    "$PY" -c 'import json,sys; print(" ".join(str(p) for l in sys.stdin for p in json.loads(l)["pids"].values()))'
}
no_spares_left() { # no_spares_left DIR: no spare or worker of this job still runs
  local p
  for p in $(spare_pids "$1") $(group_pids "$1" 0) $(group_pids "$1" 1); do
    kill -0 "$p" 2>/dev/null && fail "$1: process $p of the job still runs"
  done
  return 0
}
first_worker() { group_pids "$1" 0 | cut -d' ' -f1; }

D="$WORK/term"
start_job "$D" 2 "${SB[@]}" -- "${ARGS[@]}"
wait_for_event "$D" "e['event']=='standby_ready'"
wait_for_save "$D" 30
kill -TERM "$(first_worker "$D")"
wait_job
check_finished "$D" $STEPS "$REF"
[ "$(json "$D/ck/grace-exit.json" restarts)" -eq 1 ] || fail "term: expected one restart"
r=$(released_pids "$D"); g=$(group_pids "$D" 1)
[ -n "$r" ] && [ "$r" = "$g" ] || fail "term: incarnation 1 ran pids [$g], the spares released were [$r]"
no_spares_left "$D"
pass "SIGTERM: incarnation 1 is the two spares ($r), weights identical, nothing left running"

D="$WORK/kill"
start_job "$D" 2 "${SB[@]}" -- "${ARGS[@]}"
wait_for_event "$D" "e['event']=='standby_ready'"
wait_for_save "$D" 30
kill -KILL "$(first_worker "$D")"
wait_job
check_finished "$D" $STEPS "$REF"
r=$(released_pids "$D"); g=$(group_pids "$D" 1)
[ "$(json "$D/ck/grace-exit.json" restarts)" -eq 1 ] || fail "kill: expected one restart"
[ "$r" = "$g" ] || fail "kill: incarnation 1 ran pids [$g], the spares released were [$r]"
no_spares_left "$D"
pass "SIGKILL: incarnation 1 is the two spares, weights identical"

D="$WORK/dead-spare"
start_job "$D" 2 "${SB[@]}" -- "${ARGS[@]}"
wait_for_event "$D" "e['event']=='standby_ready'"
spare=$(spare_pids "$D" | cut -d' ' -f1)
[ -n "$spare" ] || fail "dead-spare: no spare process found"
kill -KILL "$spare"
wait_for_save "$D" 30
kill -TERM "$(first_worker "$D")"
wait_job
check_finished "$D" $STEPS "$REF"
[ "$(count_events "$D/events.jsonl" "e['event']=='standby_released'")" -eq 1 ] || fail "dead-spare: expected one spare released"
grep -q "spare exited before it was needed\|spare not used" "$D/log.txt" || fail "dead-spare: the launcher did not say the spare was lost"
no_spares_left "$D"
pass "a spare SIGKILLed before the restart: that worker started from scratch, the other from its spare, weights identical"
