#!/usr/bin/env bash
# Host-level faults on two hosts x 2 workers (tests/netns/testbed.sh), one
# grace-launch per host, checkpoints in the directory shared by both (node 0's
# chief writes them; fetching a checkpoint from a peer's node-local disk is
# not built yet). Each scenario checks: finished, every step exactly once,
# final weights bit-identical to an uninterrupted run, exit codes.
#   host_faults.sh preempt    SIGTERM to a worker on host 1 (both groups save,
#                             restart, resume), then SIGTERM to host 1's
#                             launcher (it exits 42 after the save, as a
#                             scheduler would see it) and a new launcher there
#   host_faults.sh lost       host 1 lost: its launcher and workers SIGKILLed at
#                             once and its link down; the survivors save just
#                             in time; a new launcher on host 1 (same node
#                             rank) rejoins and the job completes
#   host_faults.sh lost_sharded
#                             the same with sharded state (--shard-optimizer):
#                             host 1's ranks hold parts nobody else has; the
#                             replicas sit on host 0 (the same local rank on
#                             the other host), so the survivors write host
#                             1's parts from them and lose at most two steps
#   host_faults.sh partition  host 1 cut off for 6 s, then healed: no split
#                             brain (the isolated side commits nothing and
#                             stops instead of training alone), host 1 rejoins
#                             the current incarnation
#   host_faults.sh freeze     host 1 frozen (every process SIGSTOPped) for 4 s,
#                             longer than dead-after, then continued: the
#                             survivors save just in time; the thawed side
#                             is refused (stale incarnation), writes nothing
#                             and restarts into the current incarnation
#   host_faults.sh node_local_sharded
#                             sharded state on node-local disks
#                             (--node-local-checkpoints: every node commits
#                             its own parts): host 1 lost with its disk; the
#                             survivors write host 1's parts from their
#                             replicas into host 0's directory; host 1,
#                             relaunched with an empty disk, levels its
#                             directory from host 0's (the step, then the
#                             parts its ranks read) and all four ranks resume
#                             at the just-in-time step
#   host_faults.sh node_local_memory
#                             the same, but host 0's workers die too (host 1
#                             frozen, host 0's workers SIGKILLed, host 1
#                             lost with its disk): no just-in-time save is
#                             possible. Host 0's replica holders had
#                             mirrored host 1's parts of the last periodic
#                             save into host 0's memory directory, which
#                             outlives them: host 0's launcher adopts them
#                             into that step (checked against the
#                             manifest), the relaunched host 1 fetches them,
#                             and every rank resumes at that step instead of
#                             losing it
#   host_faults.sh node_local_no_memory
#                             the same without mirrors (--memory-dir off):
#                             no step has every part anywhere, so host 0's
#                             launcher stops with 44 naming the failed
#                             leveling (not the addresses), its checkpoints
#                             untouched for a node that may come back
#   host_faults.sh coordinator_lost
#                             host 0 (the coordination service's) lost: host
#                             1's workers stop without writing, its launcher
#                             exits 42 within --coordinator-wait-ms naming the
#                             newest checkpoint, which stays valid; the
#                             relaunched job resumes there
#   host_faults.sh node_local each host its own node-local checkpoint
#                             directory: a preemption save (written by the
#                             chief, on host 0 only), then host 1 lost and
#                             relaunched with an empty disk: before each group
#                             host 1's launcher fetches the newest checkpoint
#                             from host 0's (verified by its checksums), so
#                             every rank resumes from the same step (nothing
#                             else would stop ranks resuming from different
#                             steps: agreement::on_join ignores the restored step).
source "$(dirname "$0")/../integration/lib.sh"
source "$(dirname "$0")/testbed.sh"
SCENARIO=${1:?scenario: preempt, lost, lost_sharded, partition, freeze, node_local, node_local_sharded, node_local_memory, node_local_no_memory or coordinator_lost}
tb_init 2
STEPS=400
ARGS=(--device cpu --steps $STEPS --step-delay-ms 10 --collective-timeout-ms 20000)
REF=$(reference 4 --steps $STEPS --step-delay-ms 10)
CK="$TB/shared/ck"
E0="$TB/h0/events.jsonl"
E1="$TB/h1/events.jsonl"
COMMON=(--nproc 2 --nnodes 2 --coordinator h0:29500 --run-id faults --checkpoint-dir "$CK"
        --dead-after-ms 1500 --exit-timeout-ms 5000 --max-restarts 6)

launch() { # launch HOST VAR
  tb_launch "$1" "$2" "$TB/h$1" "${COMMON[@]}" --node-rank "$1" -- "${ARGS[@]}" --output out.json
}

first_event() { # first_event FILE EXPR FIELD: FIELD of the first matching event
  events "$1" "$2" | "$PY" -c "import json,sys; print(json.loads(sys.stdin.readline())['$3'])"
}

check_result() {
  local out="$TB/h0/out.json"
  [ -f "$out" ] || { tail -n 30 "$TB"/h*/log.txt; fail "no output from rank 0"; }
  [ "$(json "$out" steps_done)" -eq $STEPS ] || fail "steps_done != $STEPS"
  [ "$(json "$out" step_index_sum)" -eq $((STEPS * (STEPS + 1) / 2)) ] || fail "a step ran twice or never"
  [ "$(json "$out" weights_checksum)" = "$REF" ] || fail "final weights differ from the uninterrupted run"
  [ -z "$(find "$CK" -maxdepth 1 -name '.tmp-*')" ] || fail "temporary directory left behind"
  # Every rank finished in one and the same incarnation.
  local fin
  fin=$(cat "$E0" "$E1" | grep '"event":"finished"' | "$PY" -c 'import json,sys
ev = [json.loads(l) for l in sys.stdin]
print(len(ev), len({e["incarnation"] for e in ev}))')
  [ "$fin" = "4 1" ] || fail "expected 4 workers finished in one incarnation (count, incarnations: $fin)"
}

# relaunch_and_finish LAUNCH: host 1 back (link up, a new launcher started by
# LAUNCH 1), both launchers exit 0, the result checked.
relaunch_and_finish() {
  tb_link 1 up
  "$1" 1 L1
  tb_wait_pid "$L0" rc0
  tb_wait_pid "$L1" rc1
  [ "$rc0" -eq 0 ] && [ "$rc1" -eq 0 ] || { tail -n 30 "$TB"/h*/log.txt; fail "launchers exited $rc0 and $rc1"; }
  check_result
}

preempt() {
  launch 0 L0
  launch 1 L1
  tb_wait_event "$E1" "e['event']=='first_step'" 60
  kill -TERM "$(pgrep -P "$L1" -f grace-train | head -1)"
  tb_wait_event "$E0" "e['event']=='committed'" 30
  tb_wait_event "$E1" "e['event']=='first_step' and e['incarnation']>=1" 60
  kill -TERM "$L1"
  tb_wait_pid "$L1" rc1
  [ "$rc1" -eq 42 ] || { tail -n 20 "$TB/h1/log.txt"; fail "host 1's launcher after SIGTERM: exit $rc1, expected 42"; }
  grep -q "preempted: workers saved and exited" "$TB/h1/log.txt" || fail "host 1's launcher must say it was preempted"
  launch 1 L1
  tb_wait_pid "$L0" rc0
  tb_wait_pid "$L1" rc1
  [ "$rc0" -eq 0 ] && [ "$rc1" -eq 0 ] || { tail -n 30 "$TB"/h*/log.txt; fail "launchers exited $rc0 and $rc1"; }
  check_result
  local commits restores
  commits=$(count_events "$E0" "e['event']=='committed'")
  restores=$(events "$E0" "e['event']=='restored' and e['rank']==0" | "$PY" -c 'import json,sys; print(" ".join(str(json.loads(l)["step"]) for l in sys.stdin))')
  [ "$commits" -ge 2 ] || fail "expected two preemption saves, saw $commits"
  pass "SIGTERM on host 1 (a worker, then its launcher): saved, restarted, restored steps $restores, weights identical"
}

lost() {
  launch 0 L0
  launch 1 L1
  tb_wait_event "$E1" "e['event']=='first_step'" 60
  tb_wait_event "$E0" "e['event']=='first_step' and e['rank']==0" 60
  local t0 jit_id jit_step restored
  t0=$(date +%s%N)
  tb_kill_host 1
  wait "$L1" 2>/dev/null || true
  tb_wait_event "$E0" "e['event']=='agreed' and e['kind']=='jit'" 30
  jit_id=$(first_event "$E0" "e['event']=='agreed' and e['kind']=='jit'" id)
  jit_step=$(first_event "$E0" "e['event']=='agreed' and e['kind']=='jit'" step)
  tb_wait_event "$E0" "e['event']=='committed' and e['id']==$jit_id" 30
  local t_commit
  t_commit=$(first_event "$E0" "e['event']=='committed' and e['id']==$jit_id" t_ns)
  echo "host lost -> just-in-time checkpoint of step $jit_step committed in $(( (t_commit - t0) / 1000000 )) ms (dead-after 1500 ms)"
  relaunch_and_finish launch
  restored=$(first_event "$E0" "e['event']=='restored'" step)
  [ "$restored" = "$jit_step" ] || fail "restored step $restored, the just-in-time save was $jit_step"
  pass "host 1 lost (SIGKILL + link down): just-in-time save at step $jit_step, host 1 relaunched, resumed there, weights identical"
}

lost_sharded() {
  ARGS+=(--shard-optimizer)
  lost
  local r
  for r in 2 3; do
    grep -q "writing rank $r's part of step [0-9]* from the replica" "$TB/h0/log.txt" ||
      fail "rank $r's part was not written from its replica on host 0"
  done
  pass "sharded state: host 1's parts (ranks 2 and 3) written from their replicas on host 0"
}

partition() {
  launch 0 L0
  launch 1 L1
  tb_wait_event "$E1" "e['event']=='first_step'" 60
  tb_wait_event "$E0" "e['event']=='first_step' and e['rank']==0" 60
  local t0=$SECONDS jit_id jit_step
  tb_link 1 down
  tb_wait_event "$E0" "e['event']=='agreed' and e['kind']=='jit'" 30
  jit_id=$(first_event "$E0" "e['event']=='agreed' and e['kind']=='jit'" id)
  jit_step=$(first_event "$E0" "e['event']=='agreed' and e['kind']=='jit'" step)
  tb_wait_event "$E0" "e['event']=='committed' and e['id']==$jit_id" 30
  # The isolated side stops (its coordinator is gone) instead of training on.
  tb_wait_event "$E1" "e['event']=='exit' and e['incarnation']==0 and e['rank']==2" 30
  tb_wait_event "$E1" "e['event']=='exit' and e['incarnation']==0 and e['rank']==3" 30
  local isolated_steps
  isolated_steps=$(events "$E1" "e['event']=='exit' and e['incarnation']==0" | "$PY" -c 'import json,sys; print(max(json.loads(l)["step"] for l in sys.stdin))')
  [ "$isolated_steps" -le "$jit_step" ] || fail "the isolated side trained to step $isolated_steps, past the survivors' save at $jit_step"
  while [ $((SECONDS - t0)) -lt 6 ]; do sleep 0.2; done   # the partition lasts 6 s
  tb_link 1 up
  tb_wait_pid "$L0" rc0
  tb_wait_pid "$L1" rc1
  [ "$rc0" -eq 0 ] && [ "$rc1" -eq 0 ] || { tail -n 30 "$TB"/h*/log.txt; fail "launchers exited $rc0 and $rc1"; }
  check_result
  [ "$(count_events "$E1" "e['event'] in ('committed_local','snapshot_done')")" -eq 0 ] \
    || fail "split brain: the isolated host wrote a checkpoint"
  local restored
  restored=$(first_event "$E0" "e['event']=='restored'" step)
  [ "$restored" = "$jit_step" ] || fail "restored step $restored, the survivors' save was $jit_step"
  pass "host 1 partitioned 6 s: survivors saved step $jit_step, the isolated side stopped at <= $isolated_steps and wrote nothing, host 1 rejoined, weights identical"
}

freeze() {
  launch 0 L0
  launch 1 L1
  tb_wait_event "$E1" "e['event']=='first_step'" 60
  tb_wait_event "$E0" "e['event']=='first_step' and e['rank']==0" 60
  local t0=$SECONDS jit_id jit_step
  tb_freeze_host 1
  tb_wait_event "$E0" "e['event']=='agreed' and e['kind']=='jit'" 30
  jit_id=$(first_event "$E0" "e['event']=='agreed' and e['kind']=='jit'" id)
  jit_step=$(first_event "$E0" "e['event']=='agreed' and e['kind']=='jit'" step)
  tb_wait_event "$E0" "e['event']=='committed' and e['id']==$jit_id" 30
  local written_before
  written_before=$(count_events "$E1" "e['event'] in ('committed_local','snapshot_done')")
  while [ $((SECONDS - t0)) -lt 4 ]; do sleep 0.2; done   # frozen 4 s (dead-after 1.5 s)
  tb_thaw_host 1
  tb_wait_pid "$L0" rc0
  tb_wait_pid "$L1" rc1
  [ "$rc0" -eq 0 ] && [ "$rc1" -eq 0 ] || { tail -n 30 "$TB"/h*/log.txt; fail "launchers exited $rc0 and $rc1"; }
  check_result
  # The thawed workers of incarnation 0 committed nothing after the verdict.
  [ "$(count_events "$E1" "e['event'] in ('committed_local','snapshot_done') and e['incarnation']==0")" -eq "$written_before" ] \
    || fail "split brain: host 1 wrote a checkpoint of incarnation 0 after it was declared dead"
  local isolated_steps
  isolated_steps=$(events "$E1" "e['event']=='exit' and e['incarnation']==0" | "$PY" -c 'import json,sys; print(max([json.loads(l)["step"] for l in sys.stdin] or [0]))')
  [ "$isolated_steps" -le "$jit_step" ] || fail "the thawed side trained to step $isolated_steps, past the survivors' save at $jit_step"
  local restored
  restored=$(first_event "$E0" "e['event']=='restored'" step)
  [ "$restored" = "$jit_step" ] || fail "restored step $restored, the survivors' save was $jit_step"
  pass "host 1 frozen 4 s (dead-after 1.5 s): survivors saved step $jit_step, the thawed side stopped at <= $isolated_steps and wrote nothing, rejoined the current incarnation, weights identical"
}

# use_node_local_disks [LAUNCHER-ARGS...]: each host its own checkpoint
# directory ($TB/h<i>/ck) instead of the shared one; local_launch HOST VAR
# then starts a host's launcher on it.
use_node_local_disks() {
  COMMON=(--nproc 2 --nnodes 2 --coordinator h0:29500 --run-id faults --dead-after-ms 1500
          --exit-timeout-ms 5000 --max-restarts 6 "$@")
  CK="$TB/h0/ck"   # check_result looks for temporaries on host 0's disk
}
local_launch() {
  tb_launch "$1" "$2" "$TB/h$1" "${COMMON[@]}" --node-rank "$1" --checkpoint-dir "$TB/h$1/ck" \
    --memory-dir "${MEMORY:-$TB/h$1/mem}" -- "${ARGS[@]}" --output out.json
}

node_local() {
  use_node_local_disks
  local_launch 0 L0
  local_launch 1 L1
  tb_wait_event "$E1" "e['event']=='first_step'" 60
  kill -TERM "$(pgrep -P "$L1" -f grace-train | head -1)"
  tb_wait_event "$E0" "e['event']=='committed'" 30
  local saved
  saved=$(first_event "$E0" "e['event']=='committed'" step)
  tb_wait_event "$E1" "e['event']=='fetched' and e['step']==$saved" 30
  # Then host 1 is lost and comes back with an empty disk.
  tb_wait_event "$E1" "e['event']=='first_step' and e['incarnation']>=1" 60
  tb_kill_host 1
  wait "$L1" 2>/dev/null || true
  rm -rf "$TB/h1/ck" "$TB/h1/mem"
  tb_wait_event "$E0" "e['event']=='agreed' and e['kind']=='jit'" 30
  local jit_id jit
  jit_id=$(first_event "$E0" "e['event']=='agreed' and e['kind']=='jit'" id)
  jit=$(first_event "$E0" "e['event']=='agreed' and e['kind']=='jit'" step)
  tb_wait_event "$E0" "e['event']=='committed' and e['id']==$jit_id" 30
  relaunch_and_finish local_launch
  [ "$(count_events "$E1" "e['event']=='fetched' and e['step']==$jit")" -ge 1 ] || fail "host 1 did not fetch the just-in-time save $jit"
  local restores
  restores=$(cat "$E0" "$E1" | grep '"event":"restored"' | "$PY" -c 'import json,sys
by = {}
for l in sys.stdin:
    e = json.loads(l); by.setdefault(e["incarnation"], set()).add(e["step"])
print(" ".join("%d:%s" % (i, sorted(s)) for i, s in sorted(by.items())) if all(len(s) == 1 for s in by.values()) else "MIXED %s" % by)')
  case "$restores" in MIXED*) fail "ranks of one incarnation restored different steps: $restores";; esac
  pass "node-local directories: host 1 fetched the preemption save ($saved) and, relaunched with an empty disk, the just-in-time save ($jit); every incarnation restored one step ($restores); weights identical"
}

node_local_sharded() {
  ARGS+=(--shard-optimizer --save-every 100)
  use_node_local_disks --node-local-checkpoints
  local_launch 0 L0
  local_launch 1 L1
  tb_wait_event "$E1" "e['event']=='first_step'" 60
  # Both nodes committed their parts of the periodic save at step 100; a few
  # steps later (replicas trail by up to two steps: a loss right after the
  # commit, under load, has no replica newer than it and falls back to the
  # durable step 100 instead of saving just in time).
  tb_wait_event "$E1" "e['event']=='committed_local' and e['step']==100" 60
  sleep 0.3
  tb_kill_host 1
  wait "$L1" 2>/dev/null || true
  rm -rf "$TB/h1/ck" "$TB/h1/mem"   # the host's disk and memory are lost with it
  tb_wait_event "$E0" "e['event']=='agreed' and e['kind']=='jit'" 30
  local jit_id jit r s
  jit_id=$(first_event "$E0" "e['event']=='agreed' and e['kind']=='jit'" id)
  jit=$(first_event "$E0" "e['event']=='agreed' and e['kind']=='jit'" step)
  tb_wait_event "$E0" "e['event']=='committed' and e['id']==$jit_id" 30
  s="$TB/h0/ck/step-$(printf %010d "$jit")"
  for r in 2 3; do   # rank r's part is rank-<r+1>-of-00004 (numbered from 1, as safetensors shards are)
    grep -q "writing rank $r's part of step $jit from the replica" "$TB/h0/log.txt" ||
      fail "rank $r's part was not written from its replica on host 0"
    [ -f "$s/rank-0000$((r + 1))-of-00004.safetensors" ] || fail "host 0 does not hold rank $r's part of step $jit: $(ls "$s")"
  done
  relaunch_and_finish local_launch
  [ "$(count_events "$E1" "e['event']=='leveled' and e['step']==$jit")" -ge 1 ] ||
    fail "host 1 did not level its empty directory to the just-in-time step $jit"
  for r in 2 3; do
    grep -q "step $jit: fetched rank-0000$((r + 1))-of-00004.safetensors" "$TB/h1/log.txt" ||
      fail "host 1 did not fetch rank $r's part of step $jit from host 0"
  done
  local restores
  restores=$(cat "$E0" "$E1" | grep '"event":"restored"' | "$PY" -c 'import json,sys
print(" ".join(sorted({str(json.loads(l)["step"]) for l in sys.stdin})))')
  [ "$restores" = "$jit" ] || fail "ranks restored steps $restores; every rank should resume at the just-in-time step $jit"
  pass "node-local sharded state: host 1 lost with its disk, its parts of step $jit written from replicas on host 0, fetched back by the relaunched host 1, every rank resumed there, weights identical"
}

# No survivor can save just in time: host 1 frozen first (it holds the
# replicas of host 0's parts), then host 0's workers killed, then host 1
# lost with its disk and its memory.
lose_every_replica() {
  tb_freeze_host 1
  local w
  for w in $(pgrep -P "$L0" -f grace-train); do kill -KILL "$w"; done
  tb_kill_host 1
  wait "$L1" 2>/dev/null || true
  rm -rf "$TB/h1/ck" "$TB/h1/mem"
}

newest_valid() { # newest_valid DIR: the newest valid step in a checkpoint directory
  "$GRACE_CKPT" list "$1" --json | "$PY" -c 'import json,sys; print(max(c["step"] for c in json.load(sys.stdin) if c["valid"]))'
}

node_local_memory() {
  ARGS+=(--shard-optimizer --save-every 100)
  use_node_local_disks --node-local-checkpoints
  local_launch 0 L0
  local_launch 1 L1
  # Host 0's holders (ranks 0 and 1) mirrored host 1's parts (ranks 2 and 3)
  # of a periodic save.
  local end=$((SECONDS + 60)) mirrored=""
  while [ -z "$mirrored" ]; do
    [ $SECONDS -lt $end ] || { tail -n 20 "$TB"/h*/log.txt; fail "host 0 never mirrored host 1's parts"; }
    sleep 0.1
    mirrored=$(events "$E0" "e['event']=='replica_mirrored'" | "$PY" -c 'import json,sys
by = {}
for l in sys.stdin:
    e = json.loads(l); by.setdefault(e["step"], set()).add(e["source_rank"])
both = [s for s, r in by.items() if r == {2, 3}]
print(max(both) if both else "")')
  done
  lose_every_replica
  local newest
  newest=$(newest_valid "$TB/h0/ck")
  sleep 1
  relaunch_and_finish local_launch
  [ "$(count_events "$E0" "e['event']=='agreed' and e['kind']=='jit'")" -eq 0 ] ||
    fail "a just-in-time save was made: the scenario needs none to be possible"
  local restores r
  restores=$(cat "$E0" "$E1" | grep '"event":"restored"' | "$PY" -c 'import json,sys
print(" ".join(sorted({str(json.loads(l)["step"]) for l in sys.stdin})))')
  [ "$restores" = "$newest" ] ||
    fail "ranks restored steps '$restores'; every rank should resume at step $newest, the newest periodic save"
  for r in 2 3; do
    grep -q "step $newest: took rank-0000$((r + 1))-of-00004.safetensors from this node's memory" "$TB/h0/log.txt" ||
      { grep "step $newest" "$TB/h0/log.txt" | tail -5; fail "host 0 did not adopt rank $r's part of step $newest from its memory"; }
    grep -q "step $newest: fetched rank-0000$((r + 1))-of-00004.safetensors" "$TB/h1/log.txt" ||
      fail "host 1 did not fetch rank $r's part of step $newest from host 0"
  done
  pass "node-local sharded state, no just-in-time save possible: host 1 lost with its disk, its parts of step $newest (mirrored in host 0's memory at step $mirrored) adopted by host 0 and fetched back, every rank resumed there, weights identical"
}

node_local_no_memory() {
  ARGS+=(--shard-optimizer --save-every 100)
  use_node_local_disks --node-local-checkpoints --max-rendezvous-failures 2 --coordinator-wait-ms 3000
  MEMORY=off
  local_launch 0 L0
  local_launch 1 L1
  tb_wait_event "$E1" "e['event']=='committed_local' and e['step']==100" 60
  lose_every_replica
  local newest
  newest=$(newest_valid "$TB/h0/ck")
  tb_link 1 up
  local_launch 1 L1
  tb_wait_pid "$L0" rc0
  tb_wait_pid "$L1" rc1
  [ "$rc0" -eq 44 ] || { tail -n 30 "$TB"/h*/log.txt; fail "host 0's launcher exited $rc0, expected 44 (nothing restorable)"; }
  # Host 1 stops with 44 too when its own streak ends first, or with 42 when
  # it finds node 0's coordination service gone first.
  [ "$rc1" -eq 42 ] || [ "$rc1" -eq 44 ] || fail "host 1's launcher exited $rc1, expected 42 or 44"
  grep -q "exit 44: .*could not be brought level (no checkpoint has every part on some node" "$TB/h0/log.txt" ||
    { tail -n 5 "$TB/h0/log.txt"; fail "host 0's exit does not name the failed leveling"; }
  [ "$(newest_valid "$TB/h0/ck")" = "$newest" ] || fail "host 0's newest valid step changed from $newest"
  [ -z "$("$GRACE_CKPT" list "$TB/h0/ck" --json | "$PY" -c 'import json,sys; print(" ".join(str(c["step"]) for c in json.load(sys.stdin) if c.get("set_aside")))')" ] ||
    fail "a step was set aside on host 0: kept for a node that may come back"
  grep -Eq "exit (42: .*this node's checkpoints|44: .*the node-local checkpoints) could not be brought level" "$TB/h1/log.txt" ||
    { tail -n 3 "$TB/h1/log.txt"; fail "host 1's exit does not name the failed leveling"; }
  pass "node-local sharded state without memory mirrors, no just-in-time save possible: host 0 stopped with 44 and host 1 with $rc1, both naming the failed leveling, host 0's step $newest untouched"
}

coordinator_lost() {
  # Node 0 hosts the coordination service (the embedded default, no etcd):
  # losing it ends the job cleanly on host 1 (exit 42, the reason named, no
  # hang, nothing written), the previous checkpoint stays valid, and the
  # relaunched job resumes there.
  ARGS+=(--save-every 50)
  COMMON+=(--coordinator-wait-ms 8000)
  launch 0 L0
  launch 1 L1
  tb_wait_event "$E0" "e['event']=='committed_local' and e['step']>=100" 60
  local t0=$SECONDS before saved
  tb_kill_host 0
  saved=$("$GRACE_CKPT" list "$CK" --json | "$PY" -c 'import json,sys; print(max(c["step"] for c in json.load(sys.stdin) if c["valid"]))')
  before=$(count_events "$E1" "e['event'] in ('committed_local','snapshot_done')")
  tb_wait_pid "$L1" rc1
  echo "host 1's launcher ended $((SECONDS - t0)) s after host 0 was lost (dead-after 1.5 s, --coordinator-wait-ms 8000)"
  [ "$rc1" -eq 42 ] || { tail -n 20 "$TB/h1/log.txt"; fail "host 1's launcher: exit $rc1, expected 42 (restart the job)"; }
  grep -q "the coordination service at 192.0.2.1:29500 (node 0) is gone" "$TB/h1/log.txt" ||
    { tail -n 5 "$TB/h1/log.txt"; fail "host 1's launcher must say the coordination service is gone"; }
  grep -q "resumes from the newest committed checkpoint, step $saved" "$TB/h1/log.txt" ||
    { tail -n 3 "$TB/h1/log.txt"; fail "host 1's launcher must name the checkpoint the job resumes from ($saved)"; }
  [ "$(count_events "$E1" "e['event'] in ('committed_local','snapshot_done')")" -eq "$before" ] ||
    fail "host 1 wrote a checkpoint without the coordination service"
  "$GRACE_CKPT" verify "$CK/step-$(printf %010d "$saved")" >/dev/null || fail "checkpoint $saved damaged by the loss"
  # The scheduler relaunches the job: both hosts resume from that step.
  tb_link 0 up
  launch 0 L0
  launch 1 L1
  tb_wait_pid "$L0" rc0
  tb_wait_pid "$L1" rc1
  [ "$rc0" -eq 0 ] && [ "$rc1" -eq 0 ] || { tail -n 30 "$TB"/h*/log.txt; fail "relaunched: exit $rc0 and $rc1"; }
  check_result
  local restored
  restored=$(first_event "$E1" "e['event']=='restored'" step)
  [ "$restored" = "$saved" ] || fail "the relaunched job restored step $restored, the newest committed was $saved"
  pass "coordinator's host lost: host 1 stopped with 42 naming step $saved, nothing written, relaunch resumed there, weights identical"
}

"$SCENARIO"
