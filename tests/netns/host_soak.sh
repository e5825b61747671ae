#!/usr/bin/env bash
# Host-fault soak: three hosts x 2 workers (tests/netns/testbed.sh), one
# grace-launch per host, checkpoints in the directory shared by all (node 0's
# chief writes them). ROUNDS random host-level faults, one after another once
# the group trains again, each on host 1 or 2 (node 0 hosts the coordination
# service: its loss ends the job, tests/netns/host_faults.sh coordinator_lost):
#   lost          the host's launcher and workers SIGKILLed, link down; a
#                 new launcher there (same node rank) 0-1.5 s later
#   partition     the host's link down for 3-6 s, then up
#   freeze        every process on the host SIGSTOPped for 3-4 s (longer
#                 than dead-after), then SIGCONT
#   pause         the same for 0.2-0.8 s (shorter than dead-after: no restart)
#   preempt       SIGTERM to one of the host's workers
#   lost+freeze   host 1 lost and host 2 frozen at the same moment (only
#                 node 0 survives), host 2 thawed 3 s later, host 1 relaunched
# At the end: every launcher exits 0, the job finished with every step run
# exactly once and weights bit-identical to an uninterrupted run, every
# incarnation restored one step on all ranks, no restart lost more than one
# step, no host but node 0 wrote a checkpoint, no temporary left, every
# checkpoint left verifies.
#   host_soak.sh [SEED] [ROUNDS]      (defaults 1 and 4; the seed fixes the faults)
source "$(dirname "$0")/../integration/lib.sh"
source "$(dirname "$0")/testbed.sh"
SEED=${1:-1}
ROUNDS=${2:-4}
RANDOM=$SEED
tb_init 3
STEPS=$((400 + ROUNDS * 250))
ARGS=(--device cpu --steps $STEPS --step-delay-ms 10 --batch 96 --collective-timeout-ms 20000)
REF=$(reference 6 --steps $STEPS --step-delay-ms 10 --batch 96)
CK="$TB/shared/ck"
COMMON=(--nproc 2 --nnodes 3 --coordinator h0:29500 --run-id soak --checkpoint-dir "$CK"
        --dead-after-ms 1500 --exit-timeout-ms 5000 --max-restarts $((ROUNDS * 3 + 4)))
declare -A LP   # host -> its current launcher's pid

launch() { local pid; tb_launch "$1" pid "$TB/h$1" "${COMMON[@]}" --node-rank "$1" -- "${ARGS[@]}" --output out.json; LP[$1]=$pid; }
now_ns() { date +%s%N; }
rand_ms() { echo $(($1 + RANDOM % ($2 - $1 + 1))); }   # rand_ms LO HI
sleep_ms() { sleep "$(printf '%d.%03d' $(($1 / 1000)) $(($1 % 1000)))"; }
finished() { [ "$(count_events "$TB/h0/events.jsonl" "e['event']=='finished' and e['rank']==0")" -ge 1 ]; }

# await_group T: until every host's workers took a first step after wall time
# T (ns): the group trains again after a restart. Returns 1 if the job
# finished meanwhile.
await_group() {
  local t=$1 end=$((SECONDS + 120)) h ok
  while [ $SECONDS -lt $end ]; do
    finished && return 1
    ok=1
    for h in 0 1 2; do
      [ "$(count_events "$TB/h$h/events.jsonl" "e['event']=='first_step' and e['t_ns']>=$t")" -ge 1 ] || { ok=0; break; }
    done
    [ $ok -eq 1 ] && return 0
    sleep 0.1
  done
  tail -n 15 "$TB"/h*/log.txt
  fail "the group did not train again within 120 s of the fault"
}

relaunch_after_loss() { # relaunch_after_loss H: link up, a new launcher there
  wait "${LP[$1]}" 2>/dev/null || true
  tb_link "$1" up
  launch "$1"
}

inject() { # inject KIND HOST
  local kind=$1 h=$2 ms
  case $kind in
    lost) tb_kill_host "$h"; sleep_ms "$(rand_ms 0 1500)"; relaunch_after_loss "$h" ;;
    partition) ms=$(rand_ms 3000 6000); tb_link "$h" down; sleep_ms "$ms"; tb_link "$h" up ;;
    freeze) ms=$(rand_ms 3000 4000); tb_freeze_host "$h"; sleep_ms "$ms"; tb_thaw_host "$h" ;;
    pause) ms=$(rand_ms 200 800); tb_freeze_host "$h"; sleep_ms "$ms"; tb_thaw_host "$h" ;;
    preempt) kill -TERM "$(pgrep -P "${LP[$h]}" -f grace-train | head -1)" ;;
    lost+freeze) tb_kill_host 1; tb_freeze_host 2; sleep 3; tb_thaw_host 2; relaunch_after_loss 1 ;;
  esac
}

for h in 0 1 2; do launch "$h"; done
await_group 0 || fail "the job finished before the first fault"
KINDS=(lost partition freeze pause preempt lost+freeze)
DONE=()
for r in $(seq 1 "$ROUNDS"); do
  sleep_ms "$(rand_ms 500 2500)"   # some training between faults
  finished && break
  kind=${KINDS[$((RANDOM % ${#KINDS[@]}))]}
  h=$((1 + RANDOM % 2))
  [ "$kind" = "lost+freeze" ] && h=1,2
  t=$(now_ns)
  echo "round $r: $kind on host $h"
  inject "$kind" "$h"
  DONE+=("$kind@$h")
  [ "$kind" = "pause" ] && continue
  await_group "$t" || break
done
[ ${#DONE[@]} -ge 1 ] || fail "no fault was injected"

tb_launchers_ok 0 1 2
out="$TB/h0/out.json"
[ "$(json "$out" steps_done)" -eq $STEPS ] || fail "steps_done != $STEPS"
[ "$(json "$out" step_index_sum)" -eq $((STEPS * (STEPS + 1) / 2)) ] || fail "a step ran twice or never"
[ "$(json "$out" weights_checksum)" = "$REF" ] || fail "final weights differ from the uninterrupted run"
[ -z "$(find "$CK" -maxdepth 1 -name '.tmp-*')" ] || fail "temporary directory left behind"
for h in 1 2; do
  [ "$(count_events "$TB/h$h/events.jsonl" "e['event'] in ('committed_local','snapshot_done')")" -eq 0 ] \
    || fail "split brain: host $h wrote a checkpoint (only node 0's chief writes to the shared directory)"
done
"$GRACE_CKPT" list "$CK" --json | "$PY" -c 'import json,sys
bad = [c["path"] for c in json.load(sys.stdin) if not c["valid"]]
sys.exit("checkpoints that do not verify: %s" % bad if bad else 0)' || fail "a checkpoint left does not verify"
# Per incarnation: one restored step on all ranks that trained, every rank finished in the
# last one, and the work lost by each restart (the furthest step any rank of
# an earlier incarnation completed, minus the step restored) at most one.
summary=$(cat "$TB"/h*/events.jsonl | "$PY" -c 'import json,sys
ev = [json.loads(l) for l in sys.stdin if l.startswith("{")]
# A group a stale launcher started restores, is refused and never trains:
# only the restores of worker processes that trained count.
trained = {e["pid"] for e in ev if e["event"] == "first_step"}
restored, reached = {}, {}
for e in ev:
    inc = e.get("incarnation")
    if e["event"] == "restored" and e["pid"] in trained: restored.setdefault(inc, set()).add(e["step"])
    if e["event"] in ("exit", "finished"): reached[inc] = max(reached.get(inc, 0), e.get("step", 0))
fin = {e["incarnation"] for e in ev if e["event"] == "finished"}
nfin = sum(1 for e in ev if e["event"] == "finished")
if any(len(s) != 1 for s in restored.values()): sys.exit("MIXED restores %s" % restored)
if len(fin) != 1 or nfin != 6: sys.exit("BAD %d finished events in incarnations %s" % (nfin, fin))
lost = []
for inc, s in sorted(restored.items()):
    before = [v for i, v in reached.items() if i < inc]
    if before: lost.append(max(before) - next(iter(s)))
print("%d incarnations, work lost per restart %s" % (max(fin) + 1, lost or "[]"))
if lost and max(lost) > 1: sys.exit("LOST more than one step: %s" % lost)') || fail "$summary"
pass "seed $SEED: ${#DONE[@]} host faults (${DONE[*]}); $summary; finished, every step once, weights identical"
