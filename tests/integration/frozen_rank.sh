#!/usr/bin/env bash
# A worker frozen for good (SIGSTOP, never SIGCONT): the coordinator declares
# it dead, the survivors save just in time, and grace-launch SIGKILLs the
# frozen worker at once (it launched it) instead of waiting out
# --exit-timeout-ms. The group restarts promptly and finishes exactly once
# with the weights of an uninterrupted run.
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
T0=$(date +%s.%N)
wait_job
T1=$(date +%s.%N)
check_finished "$D" $STEPS "$REF"

lost_rank=$(events "$D/events.jsonl" "e['event']=='peer_lost'" | "$PY" -c 'import json,sys; print(json.loads(sys.stdin.readline())["lost_rank"])')
[ "$(count_events "$D/events.jsonl" "e['event']=='agreed' and e['kind']=='jit'")" -ge 1 ] || fail "a frozen worker must lead to a just-in-time save"
[ "$(count_events "$D/events.jsonl" "e['event']=='kill_lost' and e['worker_rank']==$lost_rank")" -eq 1 ] \
  || fail "the launcher must kill the declared-dead rank $lost_rank once"
[ "$(count_events "$D/events.jsonl" "e['event']=='worker_exit' and e['worker_rank']==$lost_rank and e['incarnation']==0 and e['signal']==9")" -eq 1 ] \
  || fail "rank $lost_rank must end by SIGKILL"
# Prompt: from the verdict to the new group's start, far below the 60 s exit timeout.
gap=$("$PY" - "$D/events.jsonl" <<'PYEOF'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
lost = min(e['t_ns'] for e in ev if e['event'] == 'peer_lost')
start = min(e['t_ns'] for e in ev if e['event'] == 'group_started' and e['incarnation'] == 1)
print((start - lost) / 1e9)
PYEOF
)
"$PY" -c "import sys; sys.exit(0 if float('$gap') < 10 else 1)" || fail "restart took ${gap}s after the verdict (the frozen worker was not killed at once)"
[ "$(count_events "$D/events.jsonl" "e['event']=='restored'")" -ge 1 ] || fail "the new group must restore the just-in-time checkpoint"
kill -CONT "$frozen" 2>/dev/null || true
pass "frozen rank $lost_rank killed on the verdict, restart ${gap}s after it, $STEPS steps exactly once, weights identical"
