#!/usr/bin/env bash
# Coordinator failover through etcd (grace-launch --etcd): three hosts x 2
# workers (tests/netns/testbed.sh), an etcd member on each host (one
# three-member cluster), one grace-launch per host, checkpoints in the
# directory shared by all. Host 0's launcher is elected first and hosts the
# coordination service.
#   failover.sh leader_lost   host 0 lost (every process SIGKILLed, link
#                             down): a launcher on host 1 or 2 is elected,
#                             takes the running group over, the survivors
#                             rejoin it and the most advanced one saves just
#                             in time (<= 1 step lost); a new launcher on
#                             host 0 follows the new leader and the job
#                             finishes bit-identical, every step once
#   failover.sh leader_cut    host 0's link down until the others committed
#                             their save and host 0's launcher stepped down
#                             (+3 s), then up: the cut-off leader cannot
#                             renew its lease and closes its service (until
#                             then it may save its own ranks just in time:
#                             the same state); once the others declared it
#                             dead it writes nothing, and nothing newer than
#                             their save; host 0 rejoins the new leader
#                             (no split brain)
source "$(dirname "$0")/../integration/lib.sh"
source "$(dirname "$0")/testbed.sh"
SCENARIO=${1:?scenario: leader_lost or leader_cut}
tb_init 3
tb_etcd_start 0 1 2
STEPS=500
ARGS=(--device cpu --steps $STEPS --step-delay-ms 10 --batch 96 --collective-timeout-ms 20000)
REF=$(reference 6 --steps $STEPS --step-delay-ms 10 --batch 96)
CK="$TB/shared/ck"
COMMON=(--nproc 2 --nnodes 3 --etcd "$(tb_etcd_endpoints 0 1 2)" --etcd-ttl 2 --coordinator-port 29500
        --run-id fo --checkpoint-dir "$CK" --dead-after-ms 1500 --exit-timeout-ms 5000 --max-restarts 6)
declare -A LP

launch() { local pid; tb_launch "$1" pid "$TB/h$1" "${COMMON[@]}" --node-rank "$1" -- "${ARGS[@]}" --output out.json; LP[$1]=$pid; }

start_job() {
  launch 0
  tb_wait_event "$TB/h0/events.jsonl" "e['event']=='coordinator_elected'" 30
  launch 1
  launch 2
  for h in 0 1 2; do tb_wait_event "$TB/h$h/events.jsonl" "e['event']=='first_step'" 60; done
  sleep 1.5   # some training before the fault
}

finish_and_check() {
  tb_launchers_ok 0 1 2
  local out="$TB/h0/out.json"
  [ "$(json "$out" steps_done)" -eq $STEPS ] || fail "steps_done != $STEPS"
  [ "$(json "$out" step_index_sum)" -eq $((STEPS * (STEPS + 1) / 2)) ] || fail "a step ran twice or never"
  [ "$(json "$out" weights_checksum)" = "$REF" ] || fail "final weights differ from the uninterrupted run"
  [ -z "$(find "$CK" -maxdepth 1 -name '.tmp-*')" ] || fail "temporary directory left behind"
  "$GRACE_CKPT" list "$CK" --json | "$PY" -c 'import json,sys
bad = [c["path"] for c in json.load(sys.stdin) if not c["valid"]]
sys.exit("checkpoints that do not verify: %s" % bad if bad else 0)' || fail "a checkpoint left does not verify"
}

# The just-in-time round after the takeover: its step, the furthest step a
# survivor completed in that incarnation, and the step the next one restored.
check_jit() { # check_jit T0_NS: prints "jit_step lost_steps commit_ms"
  tb_all_events | "$PY" -c 'import json,sys
t0 = int(sys.argv[1])
ev = sorted((json.loads(l) for l in sys.stdin if l.startswith("{")), key=lambda e: e["t_ns"])
take = [e for e in ev if e["event"] == "takeover" and e["t_ns"] >= t0]
if not take: sys.exit("no takeover after the fault")
inc = take[0]["incarnation"]
first = take[0]["first_id"]  # rounds of the successor (a cut-off leader may have had its own)
agreed = [e for e in ev if e["event"] == "agreed" and e.get("kind") == "jit" and e["t_ns"] >= t0 and e["id"] > first]
commit = [e for e in ev if e["event"] == "committed" and e["t_ns"] >= t0 and agreed and e["id"] == agreed[0]["id"]]
if not agreed or not commit: sys.exit("the successor committed no just-in-time checkpoint")
reached = max([e.get("step", 0) for e in ev if e["event"] == "exit" and e.get("incarnation") == inc] or [0])
restored = sorted({e["step"] for e in ev if e["event"] == "restored" and e.get("incarnation") == inc + 1})
if restored != [agreed[0]["step"]]: sys.exit("incarnation %d restored %s, the jit save was %d" % (inc + 1, restored, agreed[0]["step"]))
print(agreed[0]["step"], reached - agreed[0]["step"], (commit[0]["t_ns"] - t0) // 1000000)' "$1"
}

leader_lost() {
  start_job
  local t0 r jit lost ms
  t0=$(date +%s%N)
  tb_kill_host 0
  tb_wait_all "e['event']=='coordinator_elected' and e['takeover'] and e['t_ns']>=$t0" 30
  tb_wait_all "e['event']=='committed' and e['t_ns']>=$t0" 30
  tb_link 0 up
  wait "${LP[0]}" 2>/dev/null || true
  launch 0
  finish_and_check
  r=$(check_jit "$t0") || fail "$r"
  read -r jit lost ms <<<"$r"
  [ "$lost" -le 1 ] || fail "the just-in-time save lost $lost steps (at most 1)"
  grep -q "following the coordination service" "$TB/h0/log.txt" || fail "the new host 0 launcher did not follow the new leader"
  # torch.distributed's rendezvous is rank 0's (host 0's), whoever hosts Grace's service.
  local master
  master=$(tb_all_events | "$PY" -c 'import json,sys
ev = [e for e in map(json.loads, sys.stdin) if e["event"] == "group_plan"]
print(ev[-1]["master_addr"] if ev else "")')
  [ "$master" = "$(tb_ip 0)" ] || fail "MASTER_ADDR of the last group is '$master', not host 0's $(tb_ip 0)"
  pass "leader's host lost: a successor took the group over, jit step $jit committed ${ms} ms after the loss ($lost step(s) lost; dead-after 1.5 s, etcd TTL 2 s), host 0 relaunched as a follower, weights identical"
}

leader_cut() {
  start_job
  local t0 r jit lost ms
  t0=$(date +%s%N)
  tb_link 0 down
  tb_wait_all "e['event']=='coordinator_elected' and e['takeover'] and e['t_ns']>=$t0" 30
  tb_wait_all "e['event']=='committed' and e['t_ns']>=$t0" 30
  tb_wait_event "$TB/h0/events.jsonl" "e['event']=='coordinator_deposed'" 30
  sleep 3
  tb_link 0 up
  finish_and_check
  # The isolated side wrote nothing of the incarnation it was cut off in.
  r=$(check_jit "$t0") || fail "$r"
  read -r jit lost ms <<<"$r"
  # Until its lease ran out host 0 still led: it may have declared the
  # others dead and saved its own ranks just in time (the same state).
  # Once the others declared host 0 dead (the takeover's end), host 0 wrote
  # nothing, and nothing it wrote is newer than the successor's save.
  local inc ended
  inc=$(tb_field "e['event']=='takeover' and e['t_ns']>=$t0" incarnation)
  ended=$(tb_field "e['event']=='takeover_end' and e['t_ns']>=$t0" t_ns)
  [ "$(count_events "$TB/h0/events.jsonl" "e['event'] in ('committed_local','snapshot_done') and e['incarnation']==$inc and e['t_ns']>=$ended")" -eq 0 ] \
    || fail "split brain: the cut-off host wrote a checkpoint after the others declared it dead"
  [ "$(count_events "$TB/h0/events.jsonl" "e['event']=='committed_local' and e['incarnation']==$inc and e['step']>$jit")" -eq 0 ] \
    || fail "the cut-off host committed a step newer than the successor's save ($jit)"
  [ "$lost" -le 1 ] || fail "the just-in-time save lost $lost steps (at most 1)"
  pass "leader's host cut off: it closed its service (deposed), wrote nothing after the others declared it dead, a successor saved jit step $jit ${ms} ms after the cut ($lost step(s) lost), host 0 rejoined, weights identical"
}

case $SCENARIO in
  leader_lost) leader_lost ;;
  leader_cut) leader_cut ;;
  *) fail "unknown scenario $SCENARIO" ;;
esac
