#!/usr/bin/env bash
# Prometheus metrics and the goodput account, checked by a real Prometheus
# server (Debian's `prometheus`, on loopback) that scrapes a running job
# through a SIGKILL and a restart; its answers must match what the test
# itself saw and caused (one worker killed, so one member lost, one restart,
# one just-in-time agreement, each worker restoring once; the checkpoints
# left on disk, all kept; the steps in out.json), never the events file the
# same processes wrote.
# Then the account across runs: a preempted run and its relaunch add up in
# grace-goodput.json and grace-exit.json.
source "$(dirname "$0")/lib.sh"
command -v prometheus >/dev/null || { echo "skipped: prometheus is not installed (apt-get install prometheus)"; exit 77; }

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
MP=$(free_port)
PP=$(free_port)
PROM="$WORK/prom"
mkdir -p "$PROM"
cat >"$PROM/prometheus.yml" <<YML
global: {scrape_interval: 500ms, scrape_timeout: 400ms, evaluation_interval: 10s}
scrape_configs:
  - job_name: grace
    static_configs: [{targets: ['127.0.0.1:$MP']}]
YML
prometheus --config.file="$PROM/prometheus.yml" --storage.tsdb.path="$PROM/data" \
  --web.listen-address="127.0.0.1:$PP" >"$PROM/log.txt" 2>&1 &
track_pid $!
disown

# query EXPR: the sum of an instant query's values (0 when empty).
query() {
  "$PY" - "$PP" "$1" <<'PYEOF'
import json, sys, urllib.parse, urllib.request
url = "http://127.0.0.1:%s/api/v1/query?%s" % (sys.argv[1], urllib.parse.urlencode({"query": sys.argv[2]}))
r = json.load(urllib.request.urlopen(url, timeout=10))
assert r["status"] == "success", r
print(sum(float(x["value"][1]) for x in r["data"]["result"]))
PYEOF
}
ready=0
for _ in $(seq 1 300); do
  "$PY" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PP/-/ready', timeout=1)" 2>/dev/null && { ready=1; break; }
  sleep 0.1
done
[ $ready -eq 1 ] || { tail -20 "$PROM/log.txt"; fail "prometheus did not start"; }

STEPS=240
# Every checkpoint stays on disk (--keep, --keep-checkpoints): the saves
# and their bytes are counted from the files.
ARGS=(--steps $STEPS --step-delay-ms 25 --save-every 40 --keep 1000 --keep-checkpoints)
REF=$(reference 2 "${ARGS[@]}")
D="$WORK/job"
start_job "$D" 2 --metrics-port "$MP" --metrics-linger-ms 3000 -- "${ARGS[@]}"
wait_for_training "$D" 2
wait_for_save "$D" 80
kill -KILL "$(workers_of "$JOB_PID" | sort | sed -n 2p)"
wait_job
check_finished "$D" $STEPS "$REF"
grep -q "metrics on http://127.0.0.1:$MP/metrics" "$D/log.txt" || fail "the launcher must say where its metrics are"

# Counters and gauges as Prometheus stored them (max over the run: the
# series end when the launcher stops serving).
last() { query "sum(max_over_time(${1}[10m]))"; }
same() { # same WHAT PROMQL EXPECTED WHY
  local got
  got=$(last "$2")
  "$PY" -c "import sys; sys.exit(0 if abs(float('$got') - float('$3')) < 1e-9 else 1)" ||
    fail "$1: prometheus says $got, expected $3 ($4)"
  pass "$1: $got ($4)"
}
# What the test saw: the checkpoints on disk (step directories; their
# kinds as grace-ckpt reads them from the files) and their bytes, and the
# steps out.json counts.
steps_on_disk() { find "$D/ck" -mindepth 1 -maxdepth 1 -type d -regextype posix-extended -regex '.*/step-[0-9]{10}' "$@"; }
on_disk=$(steps_on_disk | wc -l)
jit_on_disk=$("$GRACE_CKPT" list "$D/ck" | awk '$2 == "jit"' | wc -l)
bytes=$(steps_on_disk -exec find {} -type f -printf '%s\n' \; | awk '{s += $1} END {print s + 0}')
done_steps=$(json "$D/out.json" steps_done)
[ "$jit_on_disk" -eq 1 ] || { "$GRACE_CKPT" list "$D/ck"; fail "one just-in-time checkpoint expected on disk after one SIGKILL, found $jit_on_disk"; }
same "committed saves" 'grace_saves_total{outcome="committed"}' "$on_disk" "checkpoints on disk"
same "saved bytes" grace_save_bytes_total "$bytes" "bytes of the checkpoints on disk"
same "members lost" grace_members_lost_total 1 "the test SIGKILLed one worker"
same "agreements" 'grace_agreements_total{kind="jit"}' 1 "the SIGKILL's just-in-time save, on disk"
same "all agreements" grace_agreements_total 1 "no notice was sent: the just-in-time one only"
same "restarts" 'grace_restarts_total{reason="member_lost"}' 1 "the one the SIGKILL caused"
same "all restarts" grace_restarts_total 1 "the one the SIGKILL caused"
same "restores" grace_restores_total 2 "both workers of the restarted group, once"
steps=$(query 'max(max_over_time(grace_completed_step[10m]))')
[ "${steps%.*}" -eq "$done_steps" ] || fail "grace_completed_step: prometheus says $steps, out.json says $done_steps steps"
pass "completed step $steps (out.json: $done_steps)"
lost=$(last grace_steps_lost_total)
"$PY" -c "import sys; sys.exit(0 if float('$lost') <= 1 else 1)" || fail "a SIGKILL must lose at most one step, prometheus says $lost"
[ "$(last grace_step_duration_seconds_count)" != "0" ] || fail "no step-time samples"
ratio=$(last grace_goodput_ratio)
"$PY" -c "import sys; sys.exit(0 if 0.2 < float('$ratio') < 1 else 1)" || fail "goodput ratio $ratio out of (0.2, 1)"
pass "goodput ratio $ratio, steps lost $lost"

# The account in grace-exit.json: two incarnations, one fault, and the
# parts add up to the wall time.
"$PY" - "$D/ck/grace-exit.json" <<'PYEOF' || fail "goodput account in grace-exit.json"
import json, sys
g = json.load(open(sys.argv[1]))["goodput"]
assert g["incarnations"] == 2 and g["faults"] == 1 and g["runs"] == 1, g
parts = g["productive_s"] + sum(g["lost_s"].values())
assert abs(parts - g["wall_s"]) < 1e-6 * max(1, g["wall_s"]), (parts, g["wall_s"])
assert g["lost_s"]["restart"] > 0 and g["lost_s"]["restore"] > 0 and g["lost_s"]["detection"] >= 0, g
PYEOF
grep -q "goodput [0-9.]*%" "$D/log.txt" || fail "the launcher must print the goodput at the end"
pass "goodput account in grace-exit.json adds up"

# Across runs: preempted (exit 42), relaunched to the end.
D2="$WORK/runs"
start_job "$D2" 2 -- "${ARGS[@]}"
wait_for_training "$D2" 2
wait_for_save "$D2" 40
kill -TERM "$JOB_PID"
wait_job
[ "$JOB_RC" -eq 42 ] || fail "preempted run: exit $JOB_RC, expected 42"
first=$(json "$D2/ck/grace-goodput.json" job | "$PY" -c 'import ast,sys; print(ast.literal_eval(sys.stdin.read())["wall_s"])')
start_job "$D2" 2 -- "${ARGS[@]}"
wait_job
check_finished "$D2" $STEPS "$REF"
"$PY" - "$D2/ck/grace-exit.json" "$D2/ck/grace-goodput.json" "$first" <<'PYEOF' || fail "account across runs"
import json, sys
exit_g = json.load(open(sys.argv[1]))["goodput"]
saved = json.load(open(sys.argv[2]))
assert exit_g["runs"] == 2 and saved["job"]["runs"] == 2, (exit_g, saved)
assert saved["previous"]["runs"] == 1 and abs(saved["previous"]["wall_s"] - float(sys.argv[3])) < 1e-6, saved
assert exit_g["wall_s"] > float(sys.argv[3]) and exit_g["lost_s"]["restore"] > 0, exit_g
PYEOF
pass "the account spans the preempted run and its relaunch"

# A port already taken is a clear error before anything starts.
D3="$WORK/busy"
mkdir -p "$D3"
set +e
(cd "$D3" && "$GRACE_LAUNCH" --nproc 1 --metrics-port "$PP" -- "$GRACE_TRAIN" --steps 5 >log.txt 2>&1)
rc=$?
set -e
[ $rc -eq 2 ] || fail "a busy metrics port: exit $rc, expected 2"
grep -q "cannot serve metrics on 127.0.0.1:$PP" "$D3/log.txt" || { cat "$D3/log.txt"; fail "no clear error for a busy metrics port"; }
pass "a busy metrics port is refused with exit 2"
