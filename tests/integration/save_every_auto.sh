#!/usr/bin/env bash
# --save-every auto: the interval follows Daly's rule for the measured save
# cost and the failure history beside the checkpoints; grace-launch keeps
# that history (one start and one end line per incarnation, a SIGKILLed
# worker's incarnation marked as a failure); bad values are refused.
# The oracle does not take the trainer's word for the cost: the test
# measures the measuring save itself from the events' timestamps (see
# first_interval), checks the reported cost is of that order, and checks the
# interval against Daly's rule for its own measurement.
source "$(dirname "$0")/lib.sh"
# A model of 2.3 MB of state (weights and momentum), small batches: the
# snapshot copy is most of a save's cost, so the test's measurement is one
# of the save and not of the few event writes around it.
ARGS=(--device cpu --step-delay-ms 10 --save-every auto --hidden "512,512" --batch 8)
periodic() { count_events "$1/events.jsonl" "e['event']=='committed_local' and e.get('kind')=='periodic'"; }
# first_interval DIR [INCARNATION]: the first save_interval event, as
# "seconds mtbf_s cost_s measured_s". measured_s is the test's own
# measurement of the save that set it: from the end of the first step
# (event first_step, after which the chief takes the measuring save) to the
# interval's announcement (event save_interval, after the save returned);
# the trainer's stall lies inside that window.
first_interval() {
  "$PY" - "$1/events.jsonl" "${2:-0}" <<'PY'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
inc = int(sys.argv[2])
si = next(e for e in ev if e['event'] == 'save_interval' and e['incarnation'] == inc)
mine = lambda e: e['rank'] == si['rank'] and e['incarnation'] == inc
first = next(e for e in ev if e['event'] == 'first_step' and mine(e))
# The first announced interval knows the cost of the first step's save only.
assert first['step'] == si['step'], (first, si)
print(si['seconds'], si['mtbf_s'], si['cost_s'], (si['t_ns'] - first['t_ns']) / 1e9)
PY
}
# daly SAVE_COST MTBF: Daly's higher-order optimum (Daly 2006), the test's own
daly() {
  "$PY" - "$@" <<'PY'
import math, sys
c, m = map(float, sys.argv[1:])
r = math.sqrt(c / (2 * m))
print(m if c >= 2 * m else math.sqrt(2 * c * m) * (1 + r / 3 + r * r / 9) - c)
PY
}
# check_interval WHAT SECONDS MTBF COST MEASURED: the reported cost fits in
# the window the test measured and is of the same order (at least a tenth of
# it: a few event writes are in the window too), so the interval lies
# between Daly's for a tenth of the measurement and for all of it; and it is
# Daly's exactly for the reported cost and MTBF (the formula).
check_interval() {
  local what=$1 s=$2 m=$3 c=$4 meas=$5 lo hi
  "$PY" -c "import sys; sys.exit(0 if $meas > 0 and $meas / 10 <= $c <= $meas else 1)" ||
    fail "$what: the trainer reports a save cost of $c s; the test measured the save in a window of $meas s"
  lo=$(daly "$("$PY" -c "print($meas / 10)")" "$m")
  hi=$(daly "$meas" "$m")
  "$PY" -c "import sys; sys.exit(0 if $lo <= $s <= $hi else 1)" ||
    fail "$what: interval $s s; Daly's rule for the measured cost $meas s and MTBF $m s allows $lo .. $hi s"
  "$PY" -c "import sys; sys.exit(0 if abs($s - $(daly "$c" "$m")) <= 1e-6 * $s + 1e-9 else 1)" ||
    fail "$what: interval $s s is not Daly's for the reported cost $c s and MTBF $m s"
}

# No history: the prior (1000 h) and a save that costs the trainer about a
# millisecond or less (the write runs in the background) give an interval
# of ten seconds or more, longer than this 3 s run: the measuring save only.
D="$WORK/prior"
start_job "$D" 2 -- "${ARGS[@]}" --steps 300 --mtbf-prior-hours 1000
wait_job
[ "$JOB_RC" -eq 0 ] || { tail -20 "$D/log.txt"; fail "prior: expected exit 0, got $JOB_RC"; }
iv=$(first_interval "$D") || fail "prior: the first save_interval event and its measuring save were not found"
read -r s m c meas <<< "$iv"
check_interval prior "$s" "$m" "$c" "$meas"
"$PY" -c "import sys; sys.exit(0 if 3600000 <= $m < 3600060 else 1)" || fail "prior: MTBF estimate $m s, expected the 1000 h prior"
[ "$(periodic "$D")" -eq 1 ] || fail "prior: expected only the measuring save, got $(periodic "$D") periodic saves"
pass "no failure history: interval $s s (cost $c s, measured $meas s, MTBF $m s = the prior), one periodic save"

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
iv=$(first_interval "$D") || fail "storm: the first save_interval event and its measuring save were not found"
read -r s m c meas <<< "$iv"
check_interval storm "$s" "$m" "$c" "$meas"
"$PY" -c "import sys; sys.exit(0 if 1.0 <= $m < 2.0 else 1)" || fail "storm: MTBF estimate $m s, expected about 1 s"
n=$(periodic "$D")
[ "$n" -ge 10 ] || fail "storm: expected periodic saves every few steps, got $n in 300 steps"
pass "a failure every second in the history: interval $s s (cost $c s, measured $meas s, MTBF $m s), $n periodic saves"

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
iv=$(first_interval "$D" 1) || fail "history: the first save_interval event and its measuring save were not found"
read -r s m c meas <<< "$iv"
"$PY" -c "import sys; sys.exit(0 if $m < 600 else 1)" || fail "history: after a failure the MTBF estimate is $m s"
check_interval history "$s" "$m" "$c" "$meas"
pass "grace-launch recorded a failed and a clean incarnation; the restarted chief estimates MTBF $m s (cost $c s, measured $meas s, interval $s s)"

# Bad values: a clear error, exit 2, nothing started.
set +e
out=$("$GRACE_TRAIN" --device cpu --steps 5 --save-every soon 2>&1); rc=$?
out2=$("$GRACE_TRAIN" --device cpu --steps 5 --save-every auto --mtbf-prior-hours -1 2>&1); rc2=$?
set -e
[ "$rc" -eq 2 ] && grep -q "number of steps or 'auto'" <<< "$out" || fail "--save-every soon: rc $rc: $out"
[ "$rc2" -eq 2 ] && grep -q -- "--mtbf-prior-hours" <<< "$out2" || fail "--mtbf-prior-hours -1: rc $rc2: $out2"
pass "bad --save-every and --mtbf-prior-hours values exit 2 with the reason"
