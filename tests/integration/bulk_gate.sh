#!/usr/bin/env bash
# The bulk channel's gate under attack, real processes: two launchers on
# loopback (a node each, a shared checkpoint directory, one secret) train
# while hostile clients (tests/integration/bulk_gate.py) hit node 0's
# checkpoint server: 60 silent connections from one address, 8 clients
# sending a byte a second, random bytes, another job's secret, a valid
# handshake replayed. A worker of node 1 gets a SIGTERM meanwhile, so both
# launchers ask each other's checkpoint servers before their next group.
# The job must finish with exit 0, no member lost beyond the one notice,
# weights identical to the uninterrupted run, and node 0's log must name
# the refusals.
source "$(dirname "$0")/lib.sh"
STEPS=400   # the job outlives the attacks (about 5 s) with seconds to spare
ARGS=(--device cpu --steps $STEPS --step-delay-ms 20 --save-every 20)
REF=$(reference 4 "${ARGS[@]}")
PORT=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
D="$WORK/gate"
mkdir -p "$D"
cd "$D"
export GRACE_EVENTS_FILE="$D/events.jsonl"
export GRACE_TOKEN=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
for n in 0 1; do
  "$GRACE_LAUNCH" --nproc 2 --nnodes 2 --node-rank $n --coordinator 127.0.0.1:$PORT --run-id gate --checkpoint-dir ck \
    -- "$GRACE_TRAIN" "${ARGS[@]}" --output out$n.json > n$n.log 2>&1 &
  eval "N$n=\$!"
  track_pid $!
done
wait_for_training "$D" 4
EP=$(events "$D/events.jsonl" "e['event']=='checkpoint_server' and e['node']==0" | "$PY" -c 'import json,sys; print(json.loads(sys.stdin.readline())["endpoint"])')
[ -n "$EP" ] || fail "node 0 announced no checkpoint server"
"$PY" "$(dirname "$0")/bulk_gate.py" "$EP" "$GRACE_TOKEN" > attacks.txt 2>&1 &
ATTACK=$!
track_pid $ATTACK
sleep 1
wait_for_save "$D" 60
kill -TERM "$(workers_of "$N1" | head -1)"
set +e; wait $ATTACK; arc=$?; wait $N0; rc0=$?; wait $N1; rc1=$?; set -e
cat attacks.txt
[ $arc -eq 0 ] || fail "an attack did not get the answer it must get"
[ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] || { tail -20 n0.log n1.log; fail "launchers exited $rc0 and $rc1"; }
[ "$(grep -c "restart 1/" n0.log)" -eq 1 ] && ! grep -q "restart 2/" n0.log || { tail -20 n0.log; fail "node 0 must restart exactly once (for the notice)"; }
[ "$(json out0.json weights_checksum)" = "$REF" ] || fail "weights differ from the uninterrupted run"
[ "$(json out0.json steps_done)" -eq $STEPS ] || fail "steps_done"
for why in "too many handshakes in progress from 127.0.0.2" "no hello" "not a Grace bulk channel hello" "wrong job token"; do
  grep -q "checkpoint server: a connection was refused: $why" n0.log || fail "node 0's log does not name the refusal '$why'"
done
pass "checkpoint server under attack: every attack refused and named, one restart (the notice), weights identical"
