#!/usr/bin/env bash
# Two launchers on this machine, both on loopback (addresses are the same
# for both nodes here; tests/netns runs nodes on separate addresses):
# node 0 hosts the coordination service; a SIGTERM to a worker on node 1
# makes every node's group save, exit and restart; the run finishes with the
# weights of an uninterrupted 4-worker run.
source "$(dirname "$0")/lib.sh"
STEPS=200
ARGS=(--device cpu --steps $STEPS --step-delay-ms 8 --save-every 10)
REF=$(reference 4 "${ARGS[@]}")
PORT=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
D="$WORK/mn"
mkdir -p "$D"
cd "$D"
export GRACE_EVENTS_FILE="$D/events.jsonl"
export GRACE_TOKEN=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')   # several nodes share one secret
"$GRACE_LAUNCH" --nproc 2 --nnodes 2 --node-rank 0 --coordinator 127.0.0.1:$PORT --run-id mn --checkpoint-dir ck \
  -- "$GRACE_TRAIN" "${ARGS[@]}" --output out.json >n0.log 2>&1 &
N0=$!
track_pid $N0
"$GRACE_LAUNCH" --nproc 2 --nnodes 2 --node-rank 1 --coordinator 127.0.0.1:$PORT --run-id mn --checkpoint-dir ck \
  -- "$GRACE_TRAIN" "${ARGS[@]}" --output out1.json >n1.log 2>&1 &
N1=$!
track_pid $N1
wait_for_training "$D" 4
wait_for_save "$D" 40
kill -TERM "$(workers_of "$N1" | head -1)"
set +e; wait $N0; rc0=$?; wait $N1; rc1=$?; set -e
[ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] || { tail -20 n0.log n1.log; fail "launchers exited $rc0 and $rc1"; }
grep -q "restart 1/" n0.log && grep -q "restart 1/" n1.log || fail "both nodes must restart their group"
[ "$(json out.json weights_checksum)" = "$REF" ] || fail "weights differ from the uninterrupted run"
[ "$(json out.json steps_done)" -eq $STEPS ] || fail "steps_done"
pass "two launchers: notice on node 1, both groups restarted, weights identical"

# Sharded state with node-local checkpoint directories (each node its own)
# not declared: one committer could never see the other node's parts, so
# every rank stops at attach with the same clear error (exit 2 on both
# nodes, no restart) instead of training on while every save fails.
D2="$WORK/mn-local"
mkdir -p "$D2"
cd "$D2"
PORT2=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
SH=(--device cpu --steps 50 --step-delay-ms 8 --save-every 10 --shard-optimizer)
for n in 0 1; do
  "$GRACE_LAUNCH" --nproc 2 --nnodes 2 --node-rank $n --coordinator 127.0.0.1:$PORT2 --run-id mnl --checkpoint-dir ck$n \
    --max-restarts 2 -- "$GRACE_TRAIN" "${SH[@]}" --output out$n.json >n$n.log 2>&1 &
  eval "L$n=\$!"
  track_pid $! 
  sleep 0.3
done
set +e; wait $L0; rc0=$?; wait $L1; rc1=$?; set -e
[ $rc0 -eq 2 ] && [ $rc1 -eq 2 ] || { tail -5 n0.log n1.log; fail "node-local sharded: launchers exited $rc0 and $rc1, want 2 and 2"; }
for n in 0 1; do
  grep -q "say so with grace-launch --node-local-checkpoints" n$n.log || fail "node $n: no clear error"
  ! grep -q "restart 1/" n$n.log || fail "node $n restarted its group"
  [ -z "$(ls -A ck$n | grep -E '^(step-|\.parts-|\.grace-shared-dir)' || true)" ] || fail "node $n: files left in ck$n: $(ls -A ck$n)"
done
grep -q "rank(s) 2, 3 (node 1)" n0.log || fail "the error does not name node 1's ranks"
pass "sharded state on node-local directories: both nodes stop at attach with a clear error (exit 2)"

# Declared (--node-local-checkpoints): every node commits its own parts with
# the global manifest; a SIGTERM on node 1 restarts both groups, which
# restore the agreed step from their own disks (node 1 fetching the part
# with the replicated tensors) and finish bit-identical to the uninterrupted
# sharded run; each node's directory holds its own parts of the last step.
NL_BASE=(--device cpu --step-delay-ms 8 --save-every 10 --shard-optimizer --keep-checkpoints)
NL=(--steps 120 "${NL_BASE[@]}")
REF_NL=$(reference 4 "${NL[@]}")  # before GRACE_EVENTS_FILE: its events are not the job's
REF_NL130=$(reference 4 --steps 130 "${NL_BASE[@]}")
# launch_node_local DIR RUN_ID TRAIN-ARGS...: two launchers with a directory
# each, in DIR (its events file the job's); their pids in NODE0 and NODE1.
# Node 1's workers also get NODE1_ARGS.
NODE1_ARGS=()
launch_node_local() {
  mkdir -p "$1"
  cd "$1"
  export GRACE_EVENTS_FILE="$1/events.jsonl"
  local port run=$2
  shift 2
  port=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  for n in 0 1; do
    local extra=()
    [ $n -eq 0 ] || extra=("${NODE1_ARGS[@]}")
    "$GRACE_LAUNCH" --nproc 2 --nnodes 2 --node-rank $n --coordinator 127.0.0.1:$port --run-id "$run" --checkpoint-dir ck$n --memory-dir mem$n \
      --node-local-checkpoints -- "$GRACE_TRAIN" "$@" "${extra[@]}" --output out$n.json >n$n.log 2>&1 &
    eval "NODE$n=\$!"
    track_pid $!
    sleep 0.3
  done
}
start_node_local() { # start_node_local DIR RUN_ID: the 120-step run, once it trains and saved step 40
  launch_node_local "$1" "$2" "${NL[@]}"
  wait_for_training "$1" 4
  wait_for_save "$1" 40
}
D3="$WORK/mn-nl"
start_node_local "$D3" mnnl
kill -TERM "$(workers_of "$NODE1" | head -1)"
set +e; wait $NODE0; rc0=$?; wait $NODE1; rc1=$?; set -e
[ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] || { tail -20 n0.log n1.log; fail "node-local sharded: launchers exited $rc0 and $rc1"; }
grep -q "restart 1/" n0.log && grep -q "restart 1/" n1.log || fail "node-local sharded: both nodes must restart"
[ "$(json out0.json weights_checksum)" = "$REF_NL" ] || fail "node-local sharded: weights differ from the uninterrupted run"
[ "$(json out0.json steps_done)" -eq 120 ] || fail "node-local sharded: steps_done"
for n in 0 1; do
  "$GRACE_CKPT" verify ck$n | grep "parts held elsewhere not checked here" >/dev/null || fail "node $n: not a node-local step"
done
s0=$(ls ck0 | grep '^step-' | tail -1)
[ -f "ck0/$s0/rank-00001-of-00004.safetensors" ] && [ ! -f "ck0/$s0/rank-00003-of-00004.safetensors" ] ||
  fail "node 0 must hold its own parts only: $(ls ck0/$s0)"
[ -f "ck1/$s0/rank-00003-of-00004.safetensors" ] || fail "node 1 must hold its parts of $s0"
grep -q "fetched rank-00001-of-00004.safetensors" n1.log || fail "node 1 did not fetch the part with the replicated tensors"
pass "node-local sharded state: per-node commits, a restart from each node's own disk, weights identical"

# A damaged part on node 1 (rank 2's of step 120, the newest; parts are
# numbered from 1): the run to step 130 must not mix steps. Rank 2 sets
# step 120 aside on node 1; ranks that restored 120 are refused, which ends
# the group; node 0's leveling then finds no copy of rank 2's part anywhere
# and sets its own step 120 aside. The group that trains restores step 110
# on every rank (the newest whole step) and ends bit-identical.
part="ck1/step-0000000120/rank-00003-of-00004.safetensors"
[ -f "$part" ] || fail "node-local damaged part: no $part to damage: $(ls ck1)"
printf '\x7f' | dd of="$part" bs=1 seek=$(($(stat -c %s "$part") - 2)) conv=notrunc status=none
rm -f events.jsonl out0.json out1.json
launch_node_local "$D3" mnnd --steps 130 "${NL_BASE[@]}"
set +e; wait $NODE0; rc0=$?; wait $NODE1; rc1=$?; set -e
[ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] || { tail -20 n0.log n1.log; fail "node-local damaged part: launchers exited $rc0 and $rc1"; }
[ "$(json out0.json weights_checksum)" = "$REF_NL130" ] || fail "node-local damaged part: weights differ from the uninterrupted run"
[ "$(json out0.json steps_done)" -eq 130 ] || fail "node-local damaged part: steps_done"
ls -d ck1/step-0000000120.corrupt-* >/dev/null 2>&1 || fail "node-local damaged part: node 1 did not set step 120 aside"
ls -d ck0/step-0000000120.corrupt-* >/dev/null 2>&1 || fail "node-local damaged part: node 0 kept a step 120 nobody can complete"
last=$(events events.jsonl "e['event']=='first_step'" | "$PY" -c 'import json,sys; print(json.loads(sys.stdin.readline())["incarnation"])')
back=$(events events.jsonl "e['event']=='restored' and e['incarnation']==$last" | "$PY" -c 'import json,sys
s = [json.loads(l)["step"] for l in sys.stdin]
print(s[0] if len(s) == 4 and len(set(s)) == 1 else "MIXED %s" % s)')
[ "$back" = 110 ] || fail "node-local damaged part: the group that trained restored $back, not step 110 on every rank"
pass "node-local damaged part on node 1: step 120 set aside on both nodes, step $back restored by all, weights identical"

# SIGKILL of a worker on node 1: the survivors save just in time from their
# kept copies, the lost rank's part from its replica on node 0; node 1's
# restart fetches that part from node 0 and the run ends bit-identical.
# When the kill lands while a periodic save of the same step was durable
# but not committed, node 1 takes the lost rank's part (same bytes, checked
# against the manifest) from its own parts directory instead.
D4="$WORK/mn-nl-kill"
start_node_local "$D4" mnnk
kill -KILL "$(workers_of "$NODE1" | sort | head -1)"
set +e; wait $NODE0; rc0=$?; wait $NODE1; rc1=$?; set -e
[ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] || { tail -20 n0.log n1.log; fail "node-local SIGKILL: launchers exited $rc0 and $rc1"; }
[ "$(json out0.json weights_checksum)" = "$REF_NL" ] || fail "node-local SIGKILL: weights differ from the uninterrupted run"
grep -q "from the replica this rank keeps" n0.log || fail "node-local SIGKILL: no part written from a replica on node 0"
grep -Eq "(fetched|took this node's) rank-0000[34]-of-00004.safetensors" n1.log ||
  fail "node-local SIGKILL: node 1 neither fetched nor rolled forward a part of its own ranks"
pass "node-local sharded state: SIGKILL on node 1, its part from the replica on node 0, weights identical"

# SIGKILL of node 1's committer (rank 2, its lowest rank) inside phase 2 of
# a periodic save's commit: node 0 committed its parts of step 30, node 1's
# commit is held back (--commit-delay-ms on node 1 only) and cut by the kill;
# without replicas the survivors stop at the durable step. The restart
# rolls node 1 forward (the step from node 0, its own durable parts from its
# parts directory), every rank restores step 30, bit-identical.
D5="$WORK/mn-nl-commit"
NODE1_ARGS=(--commit-delay-ms 3000 --commit-delay-step 30)
launch_node_local "$D5" mnnc "${NL[@]}" --no-replicas
NODE1_ARGS=()
wait_for_training "$D5" 4
wait_for_event "$D5" "e['event']=='committed_local' and e['step']==30 and e['rank']==0"
kill -KILL "$(events events.jsonl "e['event']=='first_step' and e['rank']==2" | "$PY" -c 'import json,sys; print(json.loads(sys.stdin.readline())["pid"])')"
set +e; wait $NODE0; rc0=$?; wait $NODE1; rc1=$?; set -e
[ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] || { tail -20 n0.log n1.log; fail "node-local commit kill: launchers exited $rc0 and $rc1"; }
[ "$(json out0.json weights_checksum)" = "$REF_NL" ] || fail "node-local commit kill: weights differ from the uninterrupted run"
grep -q "step 30: took this node's rank-0000[34]-of-00004.safetensors from its parts directory" n1.log ||
  fail "node-local commit kill: node 1 did not roll step 30 forward from its durable parts"
[ "$(count_events events.jsonl "e['event']=='restored' and e['incarnation']==1 and e['step']==30")" -eq 4 ] ||
  fail "node-local commit kill: not every rank of the next group restored step 30 ($(events events.jsonl "e['event']=='restored'" | tr '\n' ' '))"
pass "node-local sharded state: SIGKILL of node 1's committer inside the commit of step 30: node 1 rolled forward, every rank restored step 30, weights identical"
