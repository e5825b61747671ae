#!/usr/bin/env bash
# --save-every auto: the interval follows Daly's rule for the measured save
# cost and the failure history beside the checkpoints; grace-launch keeps
# that history (one start and one end line per incarnation, a SIGKILLed
# worker's incarnation marked as a failure); bad values are refused.
source "$(dirname "$0")/lib.sh"
ARGS=(--device cpu --step-delay-ms 10 --save-every auto)
periodic() { count_events "$1/events.jsonl" "e['event']=='committed_local' and e.get('kind')=='periodic'"; }
# first_interval DIR [INCARNATION]: the first save_interval event, as "seconds mtbf_s cost_s"
first_interval() {
  events "$1/events.jsonl" "e['event']=='save_interval' and e['incarnation']==${2:-0}" | head -1 |
    "$PY" -c 'import json,sys; e=json.loads(sys.stdin.readline()); print(e["seconds"], e["mtbf_s"], e["cost_s"])'
}
# daly_ok SECONDS MTBF COST: the interval is Daly's for that cost and MTBF
daly_ok() {
  "$PY" - "$@" <<'PY'
import math, sys
s, m, c = map(float, sys.argv[1:])
r = math.sqrt(c / (2 * m))
want = m if c >= 2 * m else math.sqrt(2 * c * m) * (1 + r / 3 + r * r / 9) - c
sys.exit(0 if abs(s - want) <= 1e-6 * max(want, 1e-9) + 1e-9 else 1)
PY
}

# No history: the prior (1000 h) and a save that costs the trainer well
# under a millisecond (the write runs in the background) give an interval
# of ten seconds or more, longer than this 3 s run: the measuring save only.
D="$WORK/prior"
start_job "$D" 2 -- "${ARGS[@]}" --steps 300 --mtbf-prior-hours 1000
wait_job
[ "$JOB_RC" -eq 0 ] || { tail -20 "$D/log.txt"; fail "prior: expected exit 0, got $JOB_RC"; }
read -r s m c <<< "$(first_interval "$D")"
daly_ok "$s" "$m" "$c" || fail "prior: interval $s s is not Daly's for cost $c s and MTBF $m s"
"$PY" -c "import sys; sys.exit(0 if 3600000 <= $m < 3600060 else 1)" || fail "prior: MTBF estimate $m s, expected the 1000 h prior"
[ "$(periodic "$D")" -eq 1 ] || fail "prior: expected only the measuring save, got $(periodic "$D") periodic saves"
pass "no failure history: interval $s s (cost $c s, MTBF $m s = the prior), one periodic save"

# A history of a failure every second: the interval shrinks to tens of
# milliseconds and periodic saves follow every few steps.
D="$WORK/storm"
mkdir -p "$D/ck"
for i in 1 2 3 4 5 6 7 8; do
  printf '{"start":true,"incarnation":%d}\n{"incarnation":%d,"run_s":1.0,"failure":true}\n' "$i" "$i"
done > "$D/ck/grace-failures.jsonl"
start_job "$D" 2 -- "${ARGS[@]}" --steps 300
wait_job
[ "$JOB_RC" -eq 0 ] || { tail -20 "$D/log.txt"; fail "storm: expected exit 0, got $JOB_RC"; }
read -r s m c <<< "$(first_interval "$D")"
daly_ok "$s" "$m" "$c" || fail "storm: interval $s s is not Daly's for cost $c s and MTBF $m s"
"$PY" -c "import sys; sys.exit(0 if 1.0 <= $m < 2.0 else 1)" || fail "storm: MTBF estimate $m s, expected about 1 s"
n=$(periodic "$D")
[ "$n" -ge 10 ] || fail "storm: expected periodic saves every few steps, got $n in 300 steps"
pass "a failure every second in the history: interval $s s (MTBF $m s), $n periodic saves"

# grace-launch keeps the history: SIGKILL a worker, the group restarts and
# finishes; the file has a failed and a clean incarnation, and the
# restarted chief's MTBF estimate is no longer the prior.
D="$WORK/history"
start_job "$D" 2 -- "${ARGS[@]}" --steps 400
wait_for_training "$D" 2
wait_for_save "$D" 1
sleep 0.5
kill -KILL "$(workers_of "$JOB_PID" | head -1)"
wait_job
[ "$JOB_RC" -eq 0 ] || { tail -20 "$D/log.txt"; fail "history: expected exit 0, got $JOB_RC"; }
"$PY" - "$D/ck/grace-failures.jsonl" <<'PY' || fail "history: wrong grace-failures.jsonl: $(cat "$D/ck/grace-failures.jsonl")"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert [l.get("start", False) for l in lines] == [True, False, True, False], lines
assert lines[1]["incarnation"] == 0 and lines[1]["failure"] is True and lines[1]["run_s"] > 0.5, lines
assert lines[3]["incarnation"] == 1 and lines[3]["failure"] is False and lines[3]["run_s"] > 0, lines
PY
read -r s m c <<< "$(first_interval "$D" 1)"
"$PY" -c "import sys; sys.exit(0 if $m < 600 else 1)" || fail "history: after a failure the MTBF estimate is $m s"
daly_ok "$s" "$m" "$c" || fail "history: interval $s s is not Daly's for cost $c s and MTBF $m s"
pass "grace-launch recorded a failed and a clean incarnation; the restarted chief estimates MTBF $m s"

# Bad values: a clear error, exit 2, nothing started.
set +e
out=$("$GRACE_TRAIN" --device cpu --steps 5 --save-every soon 2>&1); rc=$?
out2=$("$GRACE_TRAIN" --device cpu --steps 5 --save-every auto --mtbf-prior-hours -1 2>&1); rc2=$?
set -e
[ "$rc" -eq 2 ] && grep -q "number of steps or 'auto'" <<< "$out" || fail "--save-every soon: rc $rc: $out"
[ "$rc2" -eq 2 ] && grep -q -- "--mtbf-prior-hours" <<< "$out2" || fail "--mtbf-prior-hours -1: rc $rc2: $out2"
pass "bad --save-every and --mtbf-prior-hours values exit 2 with the reason"
