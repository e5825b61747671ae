#!/usr/bin/env bash
# A trainer that calls torch.distributed itself (examples/pytorch_train.py
# --collective torch: an unchanged init_process_group("gloo") from
# grace-launch's torchrun variables, dist.all_reduce inside g.collective()).
#  - a restart gets a fresh MASTER_PORT and TORCHELASTIC_RESTART_COUNT, and
#    init_process_group works again; with --standby the warm spares take
#    the new variables at `import grace` and are the restarted group;
#  - with g.abortable_sockets() around init_process_group, SIGKILL or SIGSTOP
#    of a worker: the lost peer's verdict shuts the group's connections down,
#    every survivor's blocked dist.all_reduce fails at once, and they save
#    just in time (the SIGSTOP case prints the freeze -> exit times);
#  - without it (torch 1.13's Gloo group has no abort): survivors not next to
#    the dead peer in the ring stay blocked until grace-launch's
#    --exit-timeout-ms kill (or torch's timeout, whichever is first), the
#    just-in-time save is lost, and the job resumes from the newest periodic
#    checkpoint: the bound is the exit timeout plus the work since that
#    checkpoint, and the weights are still those of an uninterrupted run.
source "$(dirname "$0")/lib.sh"
STEPS=60
ARGS=(--steps $STEPS --save-every 5 --step-delay-ms 5 --collective torch)
REF="$WORK/ref"
py_reference "$REF" 4 "${ARGS[@]}"
pass "uninterrupted reference with torch.distributed (gloo)"

env_of() { # env_of PID VAR
  tr '\0' '\n' <"/proc/$1/environ" | sed -n "s/^$2=//p"
}

D="$WORK/restart"
start_py_job "$D" 4 -- "${ARGS[@]}"
wait_saved "$D" 10
p0=$(pid_of "$D" 0 0)
port0=$(env_of "$p0" MASTER_PORT)
for v in RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE GROUP_RANK MASTER_ADDR TORCHELASTIC_RESTART_COUNT; do
  [ -n "$(env_of "$p0" $v)" ] || fail "grace-launch did not export $v"
done
[ "$(env_of "$(pid_of "$D" 3 0)" RANK)" = 3 ] || fail "rank 3's RANK"
kill -TERM "$(pid_of "$D" 1 0)"
wait_event "$D" "e['event']=='first_step' and e['incarnation']==1 and e['rank']==0" "the restarted group's first step"
p1=$(pid_of "$D" 0 1)
port1=$(env_of "$p1" MASTER_PORT 2>/dev/null || true)
count1=$(env_of "$p1" TORCHELASTIC_RESTART_COUNT 2>/dev/null || true)
wait_job
same=$(same_as_reference "$REF" "$D" $STEPS)
if [ -n "$port1" ]; then
  [ "$port0" != "$port1" ] || fail "MASTER_PORT $port0 reused by the restarted group"
  [ "$count1" = 1 ] || fail "TORCHELASTIC_RESTART_COUNT is '$count1' after one restart"
  ports="MASTER_PORT $port0 -> $port1, TORCHELASTIC_RESTART_COUNT 0 -> 1"
else
  ports="MASTER_PORT $port0 (the restarted group finished before its environment could be read)"
fi
pass "SIGTERM and restart: init_process_group again on a fresh port ($ports); $same"

D="$WORK/standby"
start_py_job "$D" 4 --standby --standby-delay-ms 0 -- "${ARGS[@]}"
wait_event "$D" "e['event']=='standby_ready'" "the spares ready"
wait_saved "$D" 10
kill -KILL "$(pid_of "$D" 1 0)"
wait_job
same=$(same_as_reference "$REF" "$D" $STEPS)
spares=$(events "$D/events.jsonl" "e['event']=='standby_released'" | "$PY" -c 'import json,sys; print(sorted(json.loads(l)["pid"] for l in sys.stdin))')
group1=$(events "$D/events.jsonl" "e['event']=='first_step' and e['incarnation']==1" | "$PY" -c 'import json,sys; print(sorted(json.loads(l)["pid"] for l in sys.stdin))')
[ "$spares" = "$group1" ] && [ "$spares" != "[]" ] || fail "standby: incarnation 1 ran $group1, the spares released were $spares"
pass "SIGKILL with --standby: the four spares ran incarnation 1 (init_process_group on the new port); $same"

D="$WORK/sigkill"
start_py_job "$D" 4 -- "${ARGS[@]}"
wait_saved "$D" 15
kill -KILL "$(pid_of "$D" 2)"
wait_job
same=$(same_as_reference "$REF" "$D" $STEPS)
jit=$(first_step_of "$D" agreed jit)
[ "$jit" = "$(first_step_of "$D" restored)" ] || fail "SIGKILL: the just-in-time save was not restored"
pass "SIGKILL with torch.distributed and abortable_sockets: just-in-time save at step $jit; $same"

D="$WORK/sigstop"
DEAD_MS=1500
start_py_job "$D" 4 --dead-after-ms $DEAD_MS -- "${ARGS[@]}"
wait_saved "$D" 15
frozen=$(pid_of "$D" 1)
T0=$(date +%s%N)
kill -STOP "$frozen"
wait_job
kill -CONT "$frozen" 2>/dev/null || true
same=$(same_as_reference "$REF" "$D" $STEPS)
[ "$(count_events "$D/events.jsonl" "e['event']=='kill_lost' and e['worker_rank']==1")" -eq 1 ] || fail "SIGSTOP: the launcher must kill the frozen rank"
jit=$(first_step_of "$D" agreed jit)
[ "$jit" = "$(first_step_of "$D" restored)" ] || fail "SIGSTOP: the just-in-time save was not restored"
bound=$("$PY" - "$D/events.jsonl" "$T0" <<'PYEOF'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
t0 = int(sys.argv[2])
exits = [e["t_ns"] for e in ev if e["event"] == "exit" and e["incarnation"] == 0 and e["rank"] != 1]
assert len(exits) == 3, "three survivors must exit"
lost = min(e["t_ns"] for e in ev if e["event"] == "peer_lost")
print("freeze -> declared dead %.2f s -> last survivor out %.2f s" % ((lost - t0) / 1e9, (max(exits) - t0) / 1e9))
PYEOF
) || fail "SIGSTOP: $bound"
pass "SIGSTOP with torch.distributed (dead-after ${DEAD_MS} ms): just-in-time save at step $jit; $bound; $same"

D="$WORK/unabortable"
EXIT_MS=3000
start_py_job "$D" 4 --exit-timeout-ms $EXIT_MS -- "${ARGS[@]}" --torch-unabortable
wait_saved "$D" 15
T0=$(date +%s%N)
kill -KILL "$(pid_of "$D" 2)"
wait_job
same=$(same_as_reference "$REF" "$D" $STEPS)
how=$("$PY" - "$D/events.jsonl" "$T0" <<'PYEOF'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
t0 = int(sys.argv[2])
out = [e for e in ev if e["event"] == "worker_exit" and e["incarnation"] == 0 and e["worker_rank"] != 2]
killed = sum(1 for e in out if e["signal"] == 9)
restored = next(e["step"] for e in ev if e["event"] == "restored")
jit_ids = {e["id"] for e in ev if e["event"] == "agreed" and e["kind"] == "jit"}
jit = [e["step"] for e in ev if e["event"] == "committed" and e["id"] in jit_ids]
print("%d of 3 survivors blocked until the launcher killed them, last out %.2f s after the kill; "
      "resumed from step %d (%s)" % (killed, (max(e["t_ns"] for e in out) - t0) / 1e9, restored,
                                     "just-in-time" if restored in jit else "periodic"))
PYEOF
) || fail "unabortable: $how"
pass "SIGKILL with an unabortable torch.distributed group (--exit-timeout-ms $EXIT_MS): $how; $same"
