#!/usr/bin/env bash
# Two hosts (network namespaces, 192.0.2.1 and 192.0.2.2; host 1 also on a
# second network host 0 cannot reach) x 2 workers: one grace-launch per host,
# exactly as on two machines, the coordinator given by name (h0); host 1's
# launcher takes its settings from a torchrun-style environment instead of
# flags (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK, TORCHELASTIC_RUN_ID).
# - they train to the end in one incarnation with the weights of an
#   uninterrupted run: each host's Gloo pairs are bound to its cluster
#   address, the one the other host can reach;
# - an address that is not the host's, or an interface it lacks: a one-line
#   error naming it, exit 2;
# - an address the peers cannot reach (host 0 advertising one only it can
#   route to): the group fails its rendezvous N times in a row and the
#   launchers stop with exit 44 saying why, instead of restarting forever.
source "$(dirname "$0")/../integration/lib.sh"
source "$(dirname "$0")/testbed.sh"
tb_init 2
STEPS=120
ARGS=(--device cpu --steps $STEPS --step-delay-ms 5)
REF=$(reference 4 "${ARGS[@]}")
CK="$TB/shared/ck"
COMMON=(--nproc 2 --nnodes 2 --coordinator h0:29400 --run-id two --checkpoint-dir "$CK")

tb_launch 0 L0 "$TB/h0" "${COMMON[@]}" --node-rank 0 -- "${ARGS[@]}" --output out.json
TB_ENV=(MASTER_ADDR=h0 MASTER_PORT=29400 WORLD_SIZE=2 RANK=1 TORCHELASTIC_RUN_ID=two)
tb_launch 1 L1 "$TB/h1" --nproc 2 --checkpoint-dir "$CK" -- "${ARGS[@]}" --output out.json
TB_ENV=()
tb_wait_pid "$L0" rc0
tb_wait_pid "$L1" rc1
[ "$rc0" -eq 0 ] && [ "$rc1" -eq 0 ] || { tail -n 20 "$TB"/h*/log.txt; fail "launchers exited $rc0 and $rc1"; }
grep -q "this node advertises 192.0.2.1 (eth0) from route to the coordinator 192.0.2.1" "$TB/h0/log.txt" \
  || { cat "$TB/h0/log.txt"; fail "host 0 must advertise its cluster address"; }
grep -q "this node advertises 192.0.2.2 (eth0) from route to the coordinator 192.0.2.1" "$TB/h1/log.txt" \
  || { cat "$TB/h1/log.txt"; fail "host 1 (two interfaces) must advertise the one facing the coordinator"; }
grep -q "from the torchrun environment: nodes 2 (WORLD_SIZE), node rank 1 (RANK), coordinator h0:29400 (MASTER_ADDR:MASTER_PORT), run id two (TORCHELASTIC_RUN_ID)" "$TB/h1/log.txt" \
  || { head -3 "$TB/h1/log.txt"; fail "host 1's launcher must say it used the torchrun environment"; }
[ "$(json "$TB/h0/out.json" steps_done)" -eq $STEPS ] || fail "steps_done"
[ "$(json "$TB/h0/out.json" step_index_sum)" -eq $((STEPS * (STEPS + 1) / 2)) ] || fail "a step ran twice or never"
[ "$(json "$TB/h0/out.json" weights_checksum)" = "$REF" ] || fail "weights differ from the uninterrupted run"
[ "$(count_events "$TB/h1/events.jsonl" "e['event']=='first_step'")" -eq 2 ] || fail "host 1's workers did not train"
[ "$(count_events "$TB/h0/events.jsonl" "e['event']=='group_started'")" -eq 1 ] || fail "host 0 restarted its group"
pass "two hosts x 2 workers, coordinator by name, host 1 configured by torchrun variables: finished in one incarnation, weights identical"

expect_exit() { # expect_exit CODE PATTERN HOST CMD...
  local code=$1 pattern=$2 host=$3; shift 3
  set +e
  out=$(timeout 60 ip netns exec "$(tb_ns "$host")" "$@" 2>&1)
  local rc=$?
  set -e
  [ $rc -eq "$code" ] || { echo "$out"; fail "'$*': exit $rc, expected $code"; }
  echo "$out" | grep -- "$pattern" >/dev/null || { echo "$out"; fail "'$*': message lacks '$pattern'"; }
  pass "'$*' -> exit $code ($pattern)"
}
N1=(--nproc 1 --nnodes 2 --node-rank 1 --run-id bad)
expect_exit 2 "--host 192.0.2.77 is not an address of this host" 1 \
  "$GRACE_LAUNCH" "${N1[@]}" --coordinator h0:29401 --host 192.0.2.77 -- "$GRACE_TRAIN"
expect_exit 2 "GRACE_SOCKET_IFNAME=ib0: this host has no interface of that name" 1 \
  env GRACE_SOCKET_IFNAME=ib0 "$GRACE_LAUNCH" "${N1[@]}" --coordinator h0:29401 -- "$GRACE_TRAIN"
expect_exit 2 "cannot resolve host 'nosuchhost'" 1 \
  "$GRACE_LAUNCH" "${N1[@]}" --coordinator nosuchhost:29401 -- "$GRACE_TRAIN"
expect_exit 2 "no route from this host to the coordinator 203.0.113.9" 1 \
  "$GRACE_LAUNCH" "${N1[@]}" --coordinator 203.0.113.9:29401 -- "$GRACE_TRAIN"
expect_exit 2 "loopback address 127.0.0.1" 1 \
  "$GRACE_LAUNCH" "${N1[@]}" --coordinator h0:29401 --iface lo -- "$GRACE_TRAIN"

# Host 0's workers advertise 169.254.77.1, which host 1 has no route to
# (Gloo's pair is connected from the higher address to the lower one, so the
# unreachable address is the lower one):
# every group fails its rendezvous; after 2 in a row the launchers stop
# with 44 and say why (node 0 names the address it advertised; Gloo's own
# error on host 1 says "Network is unreachable" without the peer's address).
D="$TB/unreach"
FAST=(--steps 50 --collective-timeout-ms 3000)
BAD=(--nproc 2 --nnodes 2 --coordinator h0:29402 --run-id unreach --checkpoint-dir "$D/ck"
     --max-rendezvous-failures 2 --max-restarts 10 --exit-timeout-ms 3000)
tb_launch 0 U0 "$D/h0" "${BAD[@]}" --node-rank 0 --host 169.254.77.1 -- "${FAST[@]}"
tb_launch 1 U1 "$D/h1" "${BAD[@]}" --node-rank 1 -- "${FAST[@]}"
tb_wait_pid "$U0" urc0
tb_wait_pid "$U1" urc1
[ "$urc0" -eq 44 ] || { tail -n 20 "$D"/h*/log.txt; fail "unreachable peer: node 0 exited $urc0, expected 44"; }
[ "$urc1" -eq 44 ] || { tail -n 20 "$D/h1/log.txt"; fail "unreachable peer: node 1 exited $urc1, expected 44"; }
for h in 0 1; do
  grep -q "exit 44: the group failed its rendezvous 2 times in a row" "$D/h$h/log.txt"     || { cat "$D/h$h/log.txt"; fail "node $h must say why it stopped"; }
done
grep -q "exit 44: .*this node advertises 169.254.77.1 (--host)" "$D/h0/log.txt" \
  || { cat "$D/h0/log.txt"; fail "node 0's reason must name the address it advertised"; }
grep -q "gloo rendezvous failed: .*Network is unreachable" "$D/h1/log.txt" \
  || { cat "$D/h1/log.txt"; fail "host 1's workers must say why their rendezvous failed"; }
[ "$(count_events "$D/h0/events.jsonl" "e['event']=='group_started'")" -eq 2 ] || fail "node 0 must stop after 2 groups"
pass "an address the peers cannot reach: 2 failed rendezvous in a row, both launchers exit 44 naming it"
