#!/usr/bin/env bash
# TLS between a job's processes (--tls-cert/--tls-key/--tls-ca), with
# certificates this test makes with the `openssl` command:
#  - bad files are a clear error (exit 2) naming the file and the fault;
#  - two launchers (two nodes on loopback) train over mutual TLS: the port
#    speaks TLS, a SIGTERM on node 1 is agreed, saved and restarted across
#    both nodes, and the weights equal an uninterrupted run's;
#  - while it trains, clients without a certificate, with one of another CA
#    (TLS 1.2 and 1.3), a plain CAF client, and the plain-TCP BASP header
#    announcing 4 GiB (which stalls a plain coordination service) are all
#    turned away without costing the job a member; a client with a valid
#    certificate still needs the job's secret.
source "$(dirname "$0")/lib.sh"
: "${GRACE_HOSTILE:?}"
command -v openssl > /dev/null || fail "the openssl command is missing (apt-get install openssl)"

C=$WORK/certs
mkdir -p "$C"
ca() { openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$C/$1.key" \
         -out "$C/$1.pem" -days 2 -subj "/CN=$1" 2> "$C/$1.log"; }
leaf() { # leaf NAME CA [extra x509 options]
  local n=$1 a=$2; shift 2
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$C/$n.key" -out "$C/$n.csr" \
    -subj "/CN=$n" 2> "$C/$n.log" &&
    openssl x509 -req -in "$C/$n.csr" -CA "$C/$a.pem" -CAkey "$C/$a.key" -CAcreateserial -out "$C/$n.pem" -days 2 \
      "$@" 2>> "$C/$n.log"
}
ca ca && ca rogue-ca && leaf node ca && leaf rogue rogue-ca || fail "openssl could not make the test certificates"
printf 'extendedKeyUsage=serverAuth\n' > "$C/server-only.ext"
leaf server-only ca -extfile "$C/server-only.ext" || fail "openssl: server-only certificate"
openssl pkey -in "$C/node.key" -aes256 -passout pass:secret -out "$C/encrypted.key" 2> /dev/null || fail "openssl: encrypted key"
cp "$C/node.key" "$C/open.key"
chmod 600 "$C"/*.key
chmod 644 "$C/open.key"
echo "not a certificate" > "$C/garbage.pem"

# Bad files: exit 2 at once, naming what is wrong.
bad() { # bad EXPECTED-TEXT LAUNCH-ARGS...
  local want=$1 out rc
  shift
  set +e
  out=$(timeout 20 "$GRACE_LAUNCH" --nproc 1 "$@" -- "$GRACE_TRAIN" --device cpu --steps 1 2>&1)
  rc=$?
  set -e
  [ $rc -eq 2 ] || { echo "$out"; fail "launch with $* exited $rc, expected 2"; }
  grep -q -- "$want" <<< "$out" || { echo "$out"; fail "launch with $*: the error must say [$want]"; }
}
T=(--tls-cert "$C/node.pem" --tls-key "$C/node.key" --tls-ca "$C/ca.pem")
bad "missing: --tls-key, --tls-ca" --tls-cert "$C/node.pem"
bad "chmod 600" --tls-cert "$C/node.pem" --tls-key "$C/open.key" --tls-ca "$C/ca.pem"
bad "rogue.pem is not valid under --tls-ca" --tls-cert "$C/rogue.pem" --tls-key "$C/rogue.key" --tls-ca "$C/ca.pem"
bad "is not the private key of" --tls-cert "$C/node.pem" --tls-key "$C/rogue.key" --tls-ca "$C/ca.pem"
bad "holds no PEM certificate" --tls-cert "$C/garbage.pem" --tls-key "$C/node.key" --tls-ca "$C/ca.pem"
bad "holds no PEM CA certificate" --tls-cert "$C/node.pem" --tls-key "$C/node.key" --tls-ca "$C/garbage.pem"
bad "not an unencrypted PEM private key" --tls-cert "$C/node.pem" --tls-key "$C/encrypted.key" --tls-ca "$C/ca.pem"
bad "TLS client use" --tls-cert "$C/server-only.pem" --tls-key "$C/server-only.key" --tls-ca "$C/ca.pem"
bad "missing.pem: No such file" --tls-cert "$C/missing.pem" --tls-key "$C/node.key" --tls-ca "$C/ca.pem"
pass "bad certificate, key and CA files: exit 2 naming the file and the fault"

# Two nodes over TLS.
STEPS=1000
ARGS=(--device cpu --steps $STEPS --step-delay-ms 15 --save-every 50)
REF=$(reference 4 "${ARGS[@]}")
PORT=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
D="$WORK/tls"
mkdir -p "$D"
cd "$D"
export GRACE_EVENTS_FILE="$D/events.jsonl"
GRACE_TOKEN=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
export GRACE_TOKEN
for n in 0 1; do
  "$GRACE_LAUNCH" --nproc 2 --nnodes 2 --node-rank $n --coordinator 127.0.0.1:$PORT --run-id tls --checkpoint-dir ck \
    "${T[@]}" -- "$GRACE_TRAIN" "${ARGS[@]}" --output out$n.json > n$n.log 2>&1 &
  track_pid $!
  eval "N$n=$!"
done
wait_for_training "$D" 4

out=$(echo | timeout 10 openssl s_client -connect 127.0.0.1:$PORT -CAfile "$C/ca.pem" -cert "$C/node.pem" \
        -key "$C/node.key" 2>&1) || true
grep -q "Verify return code: 0 (ok)" <<< "$out" || { echo "$out"; fail "the coordination port does not speak TLS with the job's CA"; }
pass "the coordination service on port $PORT speaks TLS with a certificate of the job's CA"

# Turned away: no certificate, another CA's, in TLS 1.2 and 1.3.
for v in -tls1_2 -tls1_3; do
  echo | timeout 10 openssl s_client $v -connect 127.0.0.1:$PORT -CAfile "$C/ca.pem" > "$D/s_client-none$v.log" 2>&1 || true
  echo | timeout 10 openssl s_client $v -connect 127.0.0.1:$PORT -CAfile "$C/ca.pem" -cert "$C/rogue.pem" \
    -key "$C/rogue.key" > "$D/s_client-rogue$v.log" 2>&1 || true
done
sleep 1
! grep -q "lost at step" n0.log || { grep "lost at step" n0.log; fail "a refused TLS handshake cost the job its members"; }
# Plain TCP: the BASP handshake header announcing a 4 GiB payload.
"$PY" - "$PORT" <<'PYEOF' || fail "the plain-TCP sender itself failed"
import socket, struct, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
try:
    # operation 0 (server handshake), payload length, operation data, source, destination
    s.sendall(bytes([0, 0, 0, 0]) + struct.pack(">IQQQ", 0xFFFFFFF0, 7, 0, 0))
    time.sleep(1)
except OSError:
    pass
s.close()
PYEOF
export GRACE_HOSTILE_CONNECT_MS=2000
rc=0
out=$("$GRACE_HOSTILE" 127.0.0.1 "$PORT" 4 join 2>&1) || rc=$?
[ $rc -eq 2 ] || { echo "$out"; fail "a plain CAF client must not connect (exit $rc)"; }
grep -q "it may require TLS" <<< "$out" || fail "a plain client's error must point at TLS: $out"
rc=0
out=$(GRACE_TLS_CERT=$C/rogue.pem GRACE_TLS_KEY=$C/rogue.key GRACE_TLS_CA=$C/rogue-ca.pem \
        "$GRACE_HOSTILE" 127.0.0.1 "$PORT" 4 join 2>&1) || rc=$?
[ $rc -eq 2 ] || { echo "$out"; fail "a client of another CA must not connect (exit $rc)"; }
grep -q "the TLS handshake failed" <<< "$out" || fail "a refused TLS client's error must say so: $out"
out=$(GRACE_TLS_CERT=$C/node.pem GRACE_TLS_KEY=$C/node.key GRACE_TLS_CA=$C/ca.pem \
        "$GRACE_HOSTILE" 127.0.0.1 "$PORT" 4 join 2>&1) || { echo "$out"; fail "a valid certificate with a wrong secret was not refused"; }
pass "no certificate, another CA's (TLS 1.2 and 1.3), a plain client and a 4 GiB BASP header: turned away; a valid certificate still needs the secret"
! grep -q "lost at step" n0.log || { grep "lost at step" n0.log; fail "a turned-away client cost the job a member"; }

wait_for_save "$D" 300
kill -TERM "$(workers_of "$N1" | head -1)"
set +e; wait "$N0"; rc0=$?; wait "$N1"; rc1=$?; set -e
[ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] || { tail -20 n0.log n1.log; fail "launchers exited $rc0 and $rc1"; }
[ "$(json ck/grace-exit.json restarts)" -eq 1 ] || { tail -30 n0.log; fail "expected exactly one restart (the SIGTERM)"; }
! grep -q "lost at step" n0.log || { grep "lost at step" n0.log; fail "a member was lost"; }
[ "$(json out0.json weights_checksum)" = "$REF" ] || fail "weights differ from the uninterrupted run"
[ "$(json out0.json steps_done)" -eq $STEPS ] || fail "steps_done"
[ "$(json out0.json step_index_sum)" -eq $((STEPS * (STEPS + 1) / 2)) ] || fail "a step ran twice or never"
grep -q "without TLS" n0.log && fail "a TLS launcher must not warn about plain text"
pass "two nodes over TLS: SIGTERM on node 1, one restart, weights identical to the uninterrupted run"
