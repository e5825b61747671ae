#!/usr/bin/env bash
# The job's secret: one node makes a random 128-bit one for its workers
# (never logged); an empty or short GRACE_TOKEN, a token file others can
# read, and several nodes without a shared secret are refused with exit 2;
# a node with another secret is refused by the coordination service.
source "$(dirname "$0")/lib.sh"
unset GRACE_TOKEN

# token_of DIR: the GRACE_TOKEN a worker saw (the worker is `env`)
token_of() { sed -n 's/^GRACE_TOKEN=//p' "$1/log.txt"; }
for i in 1 2; do
  mkdir -p "$WORK/env$i"
  (cd "$WORK/env$i" && "$GRACE_LAUNCH" --nproc 1 --run-id same -- env > log.txt 2>&1) || fail "launch $i of env failed"
done
t1=$(token_of "$WORK/env1")
t2=$(token_of "$WORK/env2")
[[ "$t1" =~ ^[0-9a-f]{32}$ ]] || fail "the default secret is not 128 random bits in hex: '$t1'"
[ "$t1" != "$t2" ] || fail "two launches with the same run id got the same secret"
[ "$(grep -c "$t1" "$WORK/env1/log.txt")" -eq 1 ] || fail "the secret appears in grace-launch's own output"
pass "one node: a random 128-bit secret per launch, not derived from the run id, not logged"

# expect_refusal PATTERN CMD...: exit 2 and PATTERN in the output
expect_refusal() {
  local pat=$1 out rc; shift
  set +e
  out=$("$@" 2>&1); rc=$?
  set -e
  [ "$rc" -eq 2 ] && grep -q -- "$pat" <<< "$out" || fail "expected exit 2 and '$pat' from: $*; got $rc: $out"
}
expect_refusal "empty" env GRACE_TOKEN= "$GRACE_LAUNCH" --nproc 1 -- true
expect_refusal "at least 16" env GRACE_TOKEN=tok-abc "$GRACE_LAUNCH" --nproc 1 -- true
F=$WORK/token
od -An -tx1 -N16 /dev/urandom | tr -d ' \n' > "$F"
chmod 644 "$F"
expect_refusal "chmod 600" "$GRACE_LAUNCH" --nproc 1 --token-file "$F" -- true
expect_refusal "several nodes need" "$GRACE_LAUNCH" --nproc 1 --nnodes 2 --node-rank 0 --run-id x \
  --coordinator 127.0.0.1:1 -- true
pass "empty and short secrets, a token file others can read, several nodes without a secret: exit 2 with the reason"

# Node 1 with another secret: the coordination service refuses its
# workers' joins, and they stop with a clear reason instead of training.
chmod 600 "$F"
PORT=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
D=$WORK/wrong
mkdir -p "$D"
(cd "$D" && "$GRACE_LAUNCH" --nproc 1 --nnodes 2 --node-rank 0 --coordinator 127.0.0.1:$PORT --run-id w \
   --token-file "$F" --checkpoint-dir ck0 -- "$GRACE_TRAIN" --device cpu --steps 50 > n0.log 2>&1) &
N0=$!
track_pid $N0
set +e
(cd "$D" && timeout 60 env GRACE_TOKEN=ffffffffffffffffffffffffffffffff "$GRACE_LAUNCH" --nproc 1 --nnodes 2 \
   --node-rank 1 --coordinator 127.0.0.1:$PORT --run-id w --max-restarts 0 --checkpoint-dir ck1 \
   -- "$GRACE_TRAIN" --device cpu --steps 50 > n1.log 2>&1)
rc=$?
set -e
grep -q "wrong job token" "$D/n1.log" || { cat "$D/n1.log"; fail "node 1 with another secret: no 'wrong job token'"; }
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "node 1 with another secret exited $rc"
grep -q "$(cat "$F")" "$D/n0.log" "$D/n1.log" && fail "a secret appears in a log"
pass "a node with another secret: its workers are refused ('wrong job token'), node 1 exits $rc"
