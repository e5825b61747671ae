#!/usr/bin/env bash
# A hostile process on the network against a running job (loopback): bytes
# that are not CAF's protocol, connections held open without a word, a join
# with a wrong secret, and messages forged for member ranks from a process
# that never joined (acks, heartbeat, save report, error, leave, final-save
# proposal, claim, rendezvous key-value and barrier requests), the launchers'
# messages (a worker's exit, a launcher's notice, the incarnation, a
# checkpoint server, a launcher registration with a wrong secret) and the
# service's own timers; then a worker of the previous incarnation of a
# 4-worker job (stale join, acks, save reports, heartbeat). The job must
# finish with exit 0, every step once, weights bit-identical to an
# undisturbed run, no agreement started by a forgery, and the coordination
# service's log must name the refusals.
source "$(dirname "$0")/lib.sh"
: "${GRACE_HOSTILE:?}"

STEPS=300
ARGS=(--steps $STEPS --step-delay-ms 20 --save-every 100)
REF=$(reference 2 "${ARGS[@]}")
D="$WORK/job"
start_job "$D" 2 -- "${ARGS[@]}"
wait_for_training "$D" 2
PORT=$(sed -n 's/.*coordination service on 127\.0\.0\.1:\([0-9]*\),.*/\1/p' "$D/log.txt" | head -1)
[ -n "$PORT" ] || fail "no coordination service port in the launcher's log"

# Garbage: random bytes, headers that announce a huge payload but are not a
# valid handshake, then silence. Not sent: a well-formed BASP handshake header
# announcing a 4 GiB payload, which CAF 0.17 allocates (the coordinator's
# process stalls for seconds; docs/SECURITY.md, "Known gaps").
"$PY" - "$PORT" <<'PYEOF' || fail "the garbage sender itself failed"
import os, socket, struct, sys, time
port = int(sys.argv[1])
def conn():
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.settimeout(2)
    return s
for i in range(40):
    s = conn()
    try:
        junk = bytearray(os.urandom(64 + 97 * i))
        junk[0] |= 0x10   # no BASP operation code (0-6) first
        s.sendall(bytes(junk))
    except OSError:
        pass  # the service may close on the first bad byte: that is fine
    s.close()
for length in (0xFFFFFFFF, 0x7FFFFFFF, 1 << 20):
    s = conn()
    try:
        # a client handshake must name no actors: source actor 1 makes it invalid
        s.sendall(bytes([1, 0, 0, 0]) + struct.pack(">IQQQ", length, 7, 1, 0))
    except OSError:
        pass
    s.close()
held = [conn() for _ in range(20)]   # open, never a byte, for 3 s
time.sleep(3)
for s in held:
    s.close()
PYEOF
pass "garbage and silent connections sent to port $PORT"

out=$("$GRACE_HOSTILE" 127.0.0.1 "$PORT" 2 join) || { echo "$out"; fail "a join with a wrong secret was not refused"; }
grep -q "refused join:.*secret\|refused join:.*token" <<< "$out" || fail "the refusal must name the secret: $out"
out=$("$GRACE_HOSTILE" 127.0.0.1 "$PORT" 2 forge) || { echo "$out"; fail "a forged message got through"; }
[ "$(grep -c '^refused' <<< "$out")" -eq 11 ] || fail "expected 11 refused requests: $out"
pass "a wrong secret and forged member messages refused"

wait_job
check_finished "$D" $STEPS "$REF"
E="$D/events.jsonl"
[ "$(count_events "$E" "e['event'] in ('claim','agreed','peer_lost','cluster_error')")" -eq 0 ] ||
  fail "a forgery started something: $(events "$E" "e['event'] in ('claim','agreed','peer_lost','cluster_error')")"
[ "$(count_events "$E" "e['event']=='restored'")" -eq 0 ] || fail "the job restarted"
# Logged once per sending process (the rest are counted): the wrong
# secret, and the first forgery with its reason.
grep -q "refused a join as rank 1 from node .*: wrong job token" "$D/log.txt" || fail "the log must name the refused join"
grep -q "refused an acknowledgement for rank 0 from node .*: not the process that joined as rank 0" "$D/log.txt" ||
  fail "the log must say why the forged messages were refused"
pass "the job finished undisturbed (exit 0, every step once, weights identical, no agreement, no restart)"

# A worker of the previous incarnation: a 4-worker job restarts once (a
# SIGTERM to one worker), then a process holding the job's secret and run id
# (read from a worker, as a leftover worker would have them) joins as rank 1
# in the old incarnation and sends rank 1's acknowledgements, save reports
# and a heartbeat of the old incarnation.
ARGS4=(--steps 400 --step-delay-ms 15 --save-every 50)
REF4=$(reference 4 "${ARGS4[@]}")
D4="$WORK/stale"
start_job "$D4" 4 -- "${ARGS4[@]}"
wait_for_training "$D4" 4
wait_for_save "$D4" 50
kill -TERM "$(workers_of "$JOB_PID" | head -1)"
# the new group's four members stepping
await_events "$D4" "e['event']=='first_step' and e['incarnation']==1" 4 60 ||
  { tail -20 "$D4/log.txt"; fail "the group did not restart into incarnation 1"; }
PORT4=$(sed -n 's/.*coordination service on 127\.0\.0\.1:\([0-9]*\),.*/\1/p' "$D4/log.txt" | head -1)
W=$(workers_of "$JOB_PID" | head -1)
secret=$(tr '\0' '\n' < "/proc/$W/environ" | sed -n 's/^GRACE_TOKEN=//p')
run_id=$(tr '\0' '\n' < "/proc/$W/environ" | sed -n 's/^GRACE_RUN_ID=//p')
[ -n "$secret" ] && [ -n "$run_id" ] || fail "no GRACE_TOKEN/GRACE_RUN_ID in worker $W's environment"
out=$(GRACE_TOKEN=$secret GRACE_RUN_ID=$run_id "$GRACE_HOSTILE" 127.0.0.1 "$PORT4" 4 stale) ||
  { echo "$out"; fail "the stale worker got through"; }
grep -q "refused stale join: incarnation 0 != current 1" <<< "$out" || fail "the stale join must be refused naming the incarnation: $out"
wait_job
check_finished "$D4" 400 "$REF4"
[ "$(json "$D4/ck/grace-exit.json" restarts)" -eq 1 ] || fail "expected exactly the SIGTERM's restart"
[ "$(count_events "$D4/events.jsonl" "e['event'] in ('peer_lost','cluster_error')")" -eq 0 ] ||
  fail "a stale message cost a member: $(events "$D4/events.jsonl" "e['event'] in ('peer_lost','cluster_error')")"
grep -q "refused an acknowledgement for rank 1 from node .*: not the process that joined as rank 1 in incarnation 1" \
  "$D4/log.txt" || fail "the log must name the stale acknowledgement"
pass "a worker of the previous incarnation: its join refused, its acks, saves and heartbeat ignored; 4 workers finished bit-identical after one restart"
