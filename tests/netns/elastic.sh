#!/usr/bin/env bash
# Elastic jobs (grace-launch --nnodes 2:3, runtime/coordination/elastic.hpp): three hosts x
# 2 workers (tests/netns/testbed.sh), one grace-launch per host. Host 2 is lost
# for good (every process SIGKILLed, link down): the survivors save just in
# time, and once the service waited --elastic-wait-ms for it, the group goes
# on with hosts 0 and 1 (4 workers, the checkpoint of 6 restored on 4). Then
# host 2 comes back (link up, a new launcher): the group of 4 saves at an
# agreed step and restarts with it (6 workers). Each scenario checks: every
# launcher exits 0, the groups were 6, 4 and 6 workers, each restored the
# step the previous size saved, every step ran exactly once (the global
# batch of a step is the same on any number of workers, so every sample
# once), the growth was not counted as a restart, and the final weights are
# bit for bit those of a run that changed size at the same steps without a
# fault (6 workers to T1, 4 to T2, 6 to the end).
#   elastic.sh shrink_grow       replicated state, checkpoints in the
#                                directory shared by all hosts
#   elastic.sh sharded_local     sharded state (--shard-optimizer) on
#                                node-local disks (--node-local-checkpoints):
#                                host 2's disk is lost with it; the survivors
#                                write its ranks' parts from their replicas,
#                                the group of 4 reshards the 6 parts, and the
#                                relaunched host 2 (empty disk) fetches the
#                                parts of the group of 4's save it reads
#   elastic.sh leader_lost       the coordination service elected through
#                                etcd (--etcd, a member on each host), and
#                                the host lost is host 0, which hosts it: a
#                                launcher on host 1 or 2 takes the group over
#                                (the survivors save just in time), the next
#                                group is hosts 1 and 2, and host 0 comes back
#                                as the newcomer
source "$(dirname "$0")/../integration/lib.sh"
source "$(dirname "$0")/testbed.sh"
SCENARIO=${1:?scenario: shrink_grow, sharded_local or leader_lost}
tb_init 3
STEPS=500
TRAIN=(--device cpu --step-delay-ms 10 --batch 48 --save-every 50)
COMMON=(--nproc 2 --nnodes 2:3 --run-id el --elastic-wait-ms 2000 --dead-after-ms 1500 --exit-timeout-ms 5000
        --max-restarts 6)
LOST=2
case "$SCENARIO" in
  shrink_grow) COMMON+=(--coordinator h0:29500) ;;
  sharded_local) COMMON+=(--coordinator h0:29500 --node-local-checkpoints); TRAIN+=(--shard-optimizer) ;;
  leader_lost)
    tb_etcd_start 0 1 2
    COMMON+=(--etcd "$(tb_etcd_endpoints 0 1 2)" --etcd-ttl 2 --coordinator-port 29500)
    LOST=0 ;;
  *) fail "unknown scenario $SCENARIO" ;;
esac
SURVIVORS=$(printf '%s\n' 0 1 2 | grep -vx "$LOST" | paste -sd' ')
FIRST=${SURVIVORS%% *}
declare -A LP

ckdir() { # the checkpoint directory of host I
  if [ "$SCENARIO" = sharded_local ]; then echo "$TB/h$1/ck"; else echo "$TB/shared/ck"; fi
}
launch() {
  local pid
  tb_launch "$1" pid "$TB/h$1" "${COMMON[@]}" --node-rank "$1" --checkpoint-dir "$(ckdir "$1")" --memory-dir "$TB/h$1/mem" -- \
    "${TRAIN[@]}" --steps $STEPS --collective-timeout-ms 20000 --output out.json
  LP[$1]=$pid
}
restored_on() { # restored_on HOST INCARNATION STEP: how many of the host's ranks restored STEP there
  count_events "$TB/h$1/events.jsonl" "e['event']=='restored' and e['incarnation']==$2 and e['step']==$3"
}
# The same size changes without a fault: 6 workers to $1, 4 to $2, 6 to the end.
schedule_reference() {
  local d="$WORK/ref" n steps
  mkdir -p "$d"
  for phase in "6 $1" "4 $2" "6 $STEPS"; do
    read -r n steps <<<"$phase"
    (cd "$d" && "$GRACE_LAUNCH" --quiet --nproc "$n" --checkpoint-dir ck -- "$GRACE_TRAIN" "${TRAIN[@]}" \
      --steps "$steps" --output out.json >>log.txt 2>&1) || { tail -n 20 "$d/log.txt"; fail "reference ($n workers to $steps) failed"; }
  done
  json "$d/out.json" weights_checksum
}

launch 0
[ "$SCENARIO" = leader_lost ] && tb_wait_event "$TB/h0/events.jsonl" "e['event']=='coordinator_elected'" 30
launch 1
launch 2
tb_wait_all "e['event']=='group_formed' and e['world_size']==6" 60
for h in 0 1 2; do tb_wait_event "$TB/h$h/events.jsonl" "e['event']=='first_step'" 60; done
sleep 1

# Host $LOST lost for good: the survivors save just in time, then train on 4.
tb_kill_host $LOST
wait "${LP[$LOST]}" 2>/dev/null || true
tb_wait_all "e['event']=='agreed' and e['kind']=='jit'" 30
T1=$(tb_field "e['event']=='agreed' and e['kind']=='jit'" step)
tb_wait_all "e['event']=='group_formed' and e['world_size']==4" 30
inc4=$(tb_field "e['event']=='group_formed' and e['world_size']==4" incarnation)
tb_wait_event "$TB/h$FIRST/events.jsonl" "e['event']=='first_step' and e['incarnation']==$inc4" 60
grep -q "the group of incarnation $inc4: nodes ${SURVIVORS// /, }" "$TB/h$FIRST/log.txt" ||
  fail "host $FIRST's launcher did not report the group of hosts $SURVIVORS"
sleep 1.5

# Host $LOST comes back (a replacement with the same node rank): the group grows.
[ "$SCENARIO" = sharded_local ] && rm -rf "$(ckdir $LOST)" "$TB/h$LOST/mem"   # its disk and memory were lost with it
tb_link $LOST up
launch $LOST
tb_wait_all "e['event']=='grow'" 60
tb_wait_all "e['event']=='group_formed' and e['world_size']==6 and e['incarnation']>$inc4" 60
inc6=$(tb_field "e['event']=='group_formed' and e['world_size']==6 and e['incarnation']>$inc4" incarnation)
T2=$(tb_field "e['event']=='agreed' and e['incarnation']==$inc4 and e['kind']!='jit'" step)
tb_launchers_ok 0 1 2

out="$TB/h0/out.json"
[ "$(json "$out" steps_done)" -eq $STEPS ] || fail "steps_done != $STEPS across the size changes"
[ "$(json "$out" step_index_sum)" -eq $((STEPS * (STEPS + 1) / 2)) ] || fail "a step ran twice or never"
[ "$(json "$out" world_size)" -eq 6 ] || fail "the last group did not run on 6 workers"
worlds=$(tb_all_events | "$PY" -c 'import json,sys; print(" ".join(str(e["world_size"]) for e in map(json.loads, sys.stdin) if e["event"]=="group_formed"))')
[ "$worlds" = "6 4 6" ] || fail "groups of $worlds workers, expected 6 4 6"
for h in $SURVIVORS; do
  [ "$(restored_on $h $inc4 $T1)" -eq 2 ] || fail "host $h's ranks did not restore step $T1 in the group of 4"
  [ "$(restored_on $h $inc6 $T2)" -eq 2 ] || fail "host $h's ranks did not restore step $T2 in the group of 6"
  [ "$(grep -c '\] restart [0-9]*/' "$TB/h$h/log.txt")" -eq 1 ] ||
    fail "expected one counted restart on host $h (the loss); the growth is a membership change"
  grep -q "regrouping (incarnation $inc6)" "$TB/h$h/log.txt" || fail "host $h did not regroup for the growth"
done
[ "$(restored_on $LOST $inc6 $T2)" -eq 2 ] || fail "host $LOST's ranks did not restore step $T2"
grep -q "formed without node $LOST: this node waits for the next group" "$TB/h$LOST/log.txt" ||
  fail "the relaunched host $LOST did not say it waits for the next group"
if [ "$SCENARIO" = sharded_local ]; then
  for r in 4 5; do
    cat "$TB"/h0/log.txt "$TB"/h1/log.txt | grep "writing rank $r's part of step $T1 from the replica" >/dev/null ||
      fail "rank $r's part of step $T1 was not written from its replica"
  done
  grep -q "step $T2: fetched rank-" "$TB/h2/log.txt" || fail "host 2 fetched no part of step $T2"
fi
if [ "$SCENARIO" = leader_lost ]; then
  [ -n "$(tb_field "e['event']=='coordinator_elected' and e['takeover']" t_ns)" ] || fail "no launcher took the group over"
fi
# torch.distributed's MASTER_ADDR follows rank 0: host 1's while hosts 1, 2
# (or 0, 1) trained, host 0's in the last group.
[ "$(tb_field "e['event']=='group_plan' and e['incarnation']==$inc4" master_addr)" = "$(tb_ip "$FIRST")" ] ||
  fail "MASTER_ADDR of the group of 4 is not host $FIRST's"
[ "$(tb_field "e['event']=='group_plan' and e['incarnation']==$inc6" master_addr)" = "$(tb_ip 0)" ] ||
  fail "MASTER_ADDR of the last group is not host 0's"
REF=$(schedule_reference "$T1" "$T2")
[ "$(json "$out" weights_checksum)" = "$REF" ] ||
  fail "final weights differ from the run that changed size at steps $T1 and $T2 without a fault"
pass "$SCENARIO: host $LOST lost at step ~$T1 (just-in-time save), 4 workers from $T1, host $LOST back: agreed save $T2, 6 workers to $STEPS; every step once, weights identical ($REF)"
