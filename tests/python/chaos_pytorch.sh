#!/usr/bin/env bash
# grace-chaos drives the PyTorch trainer as it drives grace-train: a trainer
# command after `--`, two scripted schedules that between them name every
# worker-level fault kind grace-chaos has (tests/chaos/schedules/pytorch*.json;
# the host kinds, host_lost, host_partition and host_freeze, need the
# multi-host test bed: tests/chaos/hosts.sh), every invariant checked.
#  1. pytorch.json: the coordination service killed, a full disk across a
#     periodic save, the newest checkpoint flipped, truncated and deleted, a
#     stale temporary planted: every invariant PASS, bit_identical included,
#     with two prefetching DataLoader workers per rank
#     (grace.data.ResumableLoader: no sample skipped or repeated).
#  2. pytorch-standby.json under grace-launch --standby: notices (one, two at
#     once, the launcher's), a SIGKILL and a pause of a worker, the restarts
#     on warm spares; then a step error ends the job (exit 3, bit_identical
#     SKIP: there are no final weights).
# Every scheduled fault must be injected (skipped or not reached: FAIL), and
# the two runs together must inject every kind grace-chaos knows but the
# host kinds, so a new kind fails here until a schedule names it.
source "$(dirname "$0")/lib.sh"
: "${GRACE_CHAOS:?}"
# fs_full mounts a tmpfs on the checkpoint directory: mount(2) needs root.
[ "$(id -u)" -eq 0 ] || { echo "SKIP: fs_full needs root (a tmpfs on the checkpoint directory); CI runs as root"; exit 77; }
SCHEDULES="$GRACE_SOURCE_DIR/tests/chaos/schedules"
COMMON=(--workers 4 --steps 80 --save-every 10 --step-delay-ms 10 --timeout-s 400 --cache-dir "$WORK/cache"
        --launcher "$GRACE_LAUNCH" --ckpt-tool "$GRACE_CKPT")

# check_run OUT SKIPPED-VERDICTS: every fault injected, every verdict PASS
# but those named (which must be SKIP); prints the kinds injected.
check_run() {
  "$PY" - "$1/report.json" "$2" <<'PYEOF'
import json, sys
r = json.load(open(sys.argv[1]))
skipped = set(filter(None, sys.argv[2].split(",")))
bad = ["#%d %s %s (%s)" % (f["index"], f["spec"]["fault"], f["status"], f["detail"])
       for f in r["faults"] if f["status"] != "injected"]
if bad:
    print("not injected: " + "; ".join(bad))
    sys.exit(1)
for v in r["verdicts"]:
    want = "SKIP" if v["name"] in skipped else "PASS"
    if v["status"] != want:
        print("%s is %s, want %s: %s" % (v["name"], v["status"], want, v["detail"]))
        sys.exit(1)
print(" ".join(f["spec"]["fault"] for f in r["faults"]))
PYEOF
}

OUT="$WORK/chaos"
mkdir -p "$OUT"
set +e
"$GRACE_CHAOS" "${COMMON[@]}" --schedule "$SCHEDULES/pytorch.json" --out "$OUT" \
  -- "${TRAINER[@]}" --loader-workers 2 >"$OUT/chaos.log" 2>&1
rc=$?
set -e
sed -n '/^faults:/,$p' "$OUT/chaos.log"
[ $rc -eq 0 ] || fail "grace-chaos with the PyTorch trainer: exit $rc"
kinds1=$(check_run "$OUT" "") || fail "grace-chaos with the PyTorch trainer: $kinds1"
# Not asserted: the disk is full for save_every + 3 steps of the harness's
# step estimate, and a job slowed down meanwhile may save after it.
full=$(count_events "$OUT/run/events.jsonl" "e['event']=='save_failed'")
pass "grace-chaos -- python3 examples/pytorch_train.py --loader-workers 2: all $(wc -w <<<"$kinds1") faults injected ($kinds1; $full save(s) failed on the full disk), every invariant PASS"

OUT="$WORK/chaos-standby"
mkdir -p "$OUT"
set +e
"$GRACE_CHAOS" "${COMMON[@]}" --schedule "$SCHEDULES/pytorch-standby.json" --out "$OUT" \
  --launcher-arg=--standby --launcher-arg=--standby-delay-ms=0 -- "${TRAINER[@]}" >"$OUT/chaos.log" 2>&1
rc=$?
set -e
sed -n '/^faults:/,$p' "$OUT/chaos.log"
[ $rc -eq 0 ] || fail "grace-chaos --launcher-arg=--standby with the PyTorch trainer: exit $rc"
kinds2=$(check_run "$OUT" bit_identical) || fail "grace-chaos --standby with the PyTorch trainer: $kinds2"
n=$(count_events "$OUT/run/events.jsonl" "e['event']=='standby_released'")
[ "$n" -ge 1 ] || fail "--standby: no restart ran on a spare"
pass "grace-chaos with --standby: all $(wc -w <<<"$kinds2") faults injected ($kinds2), every invariant PASS (bit_identical SKIP after the step error), $n worker(s) of restarted groups were warm spares"

# Every kind grace-chaos knows (it names them when a schedule has an unknown one).
echo '[{"at_step": 1, "fault": "?"}]' >"$WORK/unknown.json"
known=$({ "$GRACE_CHAOS" --schedule "$WORK/unknown.json" --print-schedule 2>&1 || true; } |
  sed -n 's/.*(known: \(.*\))$/\1/p')
[ -n "$known" ] || fail "could not read grace-chaos's fault kinds"
missing=$("$PY" - "$known" "$kinds1 $kinds2" <<'PYEOF'
import sys
known = {k.strip() for k in sys.argv[1].split(",")}
worker_kinds = {k for k in known if not k.startswith("host_")}  # host kinds: tests/chaos/hosts.sh
print(" ".join(sorted(worker_kinds - set(sys.argv[2].split()))))
PYEOF
)
[ -z "$missing" ] || fail "kinds never injected against the PyTorch trainer: $missing"
pass "every worker-level fault kind of grace-chaos injected against the PyTorch trainer (the host kinds: tests/chaos/hosts.sh)"
