#!/usr/bin/env bash
# A trainer that calls torch.distributed itself (examples/pytorch_train.py
# --collective torch: an unchanged init_process_group("gloo") from
# grace-launch's torchrun variables, dist.all_reduce inside g.collective()).
#  - a restart gets a fresh MASTER_PORT and TORCHELASTIC_RESTART_COUNT 1
#    (read from the restarted worker's /proc environ: a value that cannot
#    be read fails), and init_process_group works again; with --standby
#    the warm spares take the new variables at `import grace` and are the
#    restarted group;
#  - with g.abortable_sockets() around init_process_group, SIGKILL or SIGSTOP
#    of a worker: the lost peer's verdict shuts the group's connections down,
#    every survivor's blocked dist.all_reduce fails at once, and they save
#    just in time (the SIGSTOP case prints the freeze -> exit times);
#  - without it (torch 1.13's Gloo group has no abort): survivors not next to
#    the dead peer in the ring stay blocked until grace-launch's
#    --exit-timeout-ms kill (or torch's timeout, whichever is first), the
#    just-in-time save is lost, and the job resumes from the newest periodic
#    checkpoint: the bound is the exit timeout plus the work since that
#    checkpoint, and the weights are still those of an uninterrupted run
#    (asserted from the events: every survivor out within the exit timeout,
#    42 or SIGKILLed, one restart, every rank resumed from the newest
#    checkpoint committed, at most one save interval lost).
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
# Slower steps than the reference (a sleep: the same weights), so the
# restarted group is certain to run when its environment is read below.
start_py_job "$D" 4 -- "${ARGS[@]}" --step-delay-ms 20
wait_saved "$D" 10
p0=$(pid_of "$D" 0 0)
port0=$(env_of "$p0" MASTER_PORT)
for v in RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE GROUP_RANK MASTER_ADDR TORCHELASTIC_RESTART_COUNT; do
  [ -n "$(env_of "$p0" $v)" ] || fail "grace-launch did not export $v"
done
[ "$(env_of "$(pid_of "$D" 3 0)" RANK)" = 3 ] || fail "rank 3's RANK"
[ "$(env_of "$p0" TORCHELASTIC_RESTART_COUNT)" = 0 ] || fail "TORCHELASTIC_RESTART_COUNT is not 0 before any restart"
kill -TERM "$(pid_of "$D" 1 0)"
# Read at the restarted rank 0's restore (its own event: it runs the new
# program, with the new environment), while the group still has a
# rendezvous, init_process_group and 50 steps of 20 ms ahead of it.
wait_event "$D" "e['event']=='restored' and e['incarnation']==1 and e['rank']==0" "the restarted rank 0's restore"
p1=$(events "$D/events.jsonl" "e['event']=='restored' and e['incarnation']==1 and e['rank']==0" |
  "$PY" -c 'import json,sys; print(json.loads(sys.stdin.readline())["pid"])')
port1=$(env_of "$p1" MASTER_PORT 2>/dev/null || true)
count1=$(env_of "$p1" TORCHELASTIC_RESTART_COUNT 2>/dev/null || true)
[ -n "$port1" ] && [ -n "$count1" ] ||
  fail "could not read MASTER_PORT and TORCHELASTIC_RESTART_COUNT of the restarted rank 0 (pid $p1): the restart's environment is unchecked"
wait_job
same=$(same_as_reference "$REF" "$D" $STEPS)
[ "$port0" != "$port1" ] || fail "MASTER_PORT $port0 reused by the restarted group"
[ "$count1" = 1 ] || fail "TORCHELASTIC_RESTART_COUNT is '$count1' after one restart"
pass "SIGTERM and restart: init_process_group again on a fresh port (MASTER_PORT $port0 -> $port1, TORCHELASTIC_RESTART_COUNT 0 -> 1); $same"

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
SAVE_EVERY=5
start_py_job "$D" 4 --exit-timeout-ms $EXIT_MS -- "${ARGS[@]}" --torch-unabortable
wait_saved "$D" 15
kill -KILL "$(pid_of "$D" 2)"
wait_job
same=$(same_as_reference "$REF" "$D" $STEPS)
# The bound for torch.distributed's own collectives (docs/ARCHITECTURE.md,
# "The Python layer"): every survivor is out by grace-launch's exit timeout
# after the death (blocked ones SIGKILLed then; torch's 30 s timeout comes
# later), and the job resumes from the newest checkpoint it committed, so
# it loses at most the steps since the last periodic save.
how=$("$PY" - "$D/events.jsonl" "$EXIT_MS" "$SAVE_EVERY" <<'PYEOF'
import json, sys


def bound():
    ev = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
    exit_ms, save_every = int(sys.argv[2]), int(sys.argv[3])
    exits = {e["worker_rank"]: e for e in ev if e["event"] == "worker_exit" and e["incarnation"] == 0}
    assert sorted(exits) == [0, 1, 2, 3], "incarnation 0: worker exits of ranks %s, want all four" % sorted(exits)
    assert exits[2]["signal"] == 9, "rank 2 (SIGKILLed) exited %s" % exits[2]
    death = exits[2]["t_ns"]
    survivors = [exits[r] for r in (0, 1, 3)]
    for e in survivors:
        assert e["code"] == 42 or e["signal"] == 9, \
            "rank %d exited %s: want 42 (its collective failed) or SIGKILL (the launcher's exit timeout)" % (
                e["worker_rank"], "by signal %d" % e["signal"] if e["signal"] else "with %d" % e["code"])
    last = max(e["t_ns"] for e in survivors) - death
    assert last <= (exit_ms + 1500) * 1e6, \
        "last survivor out %.2f s after the death: over --exit-timeout-ms %d ms (+1.5 s)" % (last / 1e9, exit_ms)
    incs = sorted({e["incarnation"] for e in ev if e["event"] == "group_started"})
    assert incs == [0, 1], "one restart expected, groups started: %s" % incs
    restored = {e["rank"]: e["step"] for e in ev if e["event"] == "restored" and e["incarnation"] == 1}
    assert sorted(restored) == [0, 1, 2, 3] and len(set(restored.values())) == 1, \
        "incarnation 1 restored %s, want one step on all four ranks" % restored
    step = restored[0]
    saved = [e for e in ev if e["event"] == "committed_local" and e["incarnation"] == 0]
    newest = max(e["step"] for e in saved)
    assert step == newest, "resumed from step %d, not the newest checkpoint committed (%d)" % (step, newest)
    periodic = max(e["step"] for e in saved if e["kind"] == "periodic" and e["t_ns"] <= death)
    reached = max(e.get("step", 0) for e in ev if e["incarnation"] == 0)
    assert reached - step <= save_every, \
        "reached step %d, resumed from %d: lost more than the %d steps since a periodic save" % (reached, step, save_every)
    killed = sum(1 for e in survivors if e["signal"] == 9)
    kind = next(e["kind"] for e in saved if e["step"] == step)
    print("%d of 3 survivors blocked until the launcher killed them, last out %.2f s after the death (bound %d ms); "
          "reached step %d, resumed from step %d (%s; newest periodic before the death: %d), %d step(s) lost" % (
              killed, last / 1e9, exit_ms, reached, step, kind, periodic, reached - step))


try:
    bound()
except AssertionError as e:  # the reason, for fail
    print(e)
    sys.exit(1)
PYEOF
) || fail "unabortable: $how"
pass "SIGKILL with an unabortable torch.distributed group (--exit-timeout-ms $EXIT_MS): $how; $same"
