#!/usr/bin/env bash
# grace-chaos on the multi-host test bed (--hosts: three network-namespace
# hosts of two workers, one grace-launch each):
#   1. the scripted schedules/hosts.json (hosts lost, cut off, frozen past
#      and within dead-after, a host lost with a worker of another killed
#      2 ms later): every fault injected, every invariant PASS, including
#      no_split_brain;
#   2. a random schedule of host and worker faults (fixed seed): PASS;
#   3. a broken-on-purpose trainer (no just-in-time save) under a host loss:
#      the harness must catch it (work_lost FAIL, exit 1); the loss comes 70
#      steps before the first periodic save, so a late injection on a loaded
#      machine cannot land just after that save and hide the lost work;
#   4. --etcd --node-local with schedules/hosts-etcd.json: the coordination
#      host (whichever launcher etcd elected) cut off, lost with its disk
#      and frozen past its lease, each time a successor takes over;
#      replacement hosts start with empty checkpoint directories and fetch
#      the newest checkpoint. Not run, saying so, only where etcd is not
#      installed at all; installed (the etcd-server package or an etcd
#      binary) it must run, and an incomplete install is a failure;
#   5. --elastic 2 with schedules/hosts-elastic.json: a host gone past the
#      elastic wait (the group trains on with two hosts and grows when it
#      is back), a worker of the smaller group killed, a host cut off past
#      the wait; the reference changes size at the same steps.
# Root only (network namespaces); elsewhere "skipped: ..." and exit 77.
# A part that grace-chaos reports as not done (a fault skipped or not
# reached, an invariant SKIP where the schedule should exercise it) fails.
# Env: GRACE_CHAOS GRACE_LAUNCH GRACE_TRAIN GRACE_CKPT (set by CTest).
set -u
: "${GRACE_CHAOS:?set GRACE_CHAOS to the grace-chaos binary}"
HERE=$(cd "$(dirname "$0")" && pwd)
skip() { echo "skipped: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "the multi-host test bed makes network namespaces, which needs root (CI runs as root)"
command -v ip >/dev/null || skip "no 'ip' command (iproute2)"
probe="gchprobe$$"
ip netns add "$probe" 2>/dev/null || skip "cannot create a network namespace here (ip netns add failed)"
ip netns del "$probe"

# The etcd part: decided before any run. Installed means it runs; what it
# needs missing from an install is a failure of the test, not a skip.
etcd_installed=0
dpkg -s etcd-server >/dev/null 2>&1 && etcd_installed=1
command -v etcd >/dev/null && etcd_installed=1
if [ $etcd_installed -eq 1 ]; then
  for b in etcd etcdctl; do
    command -v "$b" >/dev/null ||
      { echo "hosts: FAIL: etcd is installed but '$b' is not on PATH (Debian etcd-server, etcd-client): the etcd part cannot run"; exit 1; }
  done
fi

OUT=${CHAOS_OUT:-$(mktemp -d /tmp/grace-chaos-hosts.XXXXXX)}
BED=(--hosts 3 --workers 2 --step-delay-ms 10 --trainer-arg=--batch=96 --cache-dir "$OUT/cache" --timeout-s 240)
failed=0
report() { sed -n '/^faults:/,/^RESULT/p' "$1"; }

# verdict LOG NAME: the status of invariant NAME in a grace-chaos log.
verdict() { awk -v n="$2" '$2 == n {print $1; exit}' "$1"; }

# run_expect_pass NAME [--may-skip INVARIANT]... ARGS...: grace-chaos passes
# with every fault injected and every invariant checked (PASS), except the
# invariants named as ones this schedule need not exercise.
run_expect_pass() {
  local name=$1; shift
  local may_skip=" "
  while [ "${1:-}" = --may-skip ]; do may_skip+="$2 "; shift 2; done
  "$GRACE_CHAOS" "${BED[@]}" "$@" --out "$OUT/$name" > "$OUT/$name.log" 2>&1
  local rc=$?
  if [ $rc -ne 0 ]; then
    echo "$name: FAIL (grace-chaos exit $rc)"; report "$OUT/$name.log"; failed=1; return
  fi
  if sed -n '/^faults:/,/^invariants:/p' "$OUT/$name.log" | grep -qE ' (skipped|not reached) '; then
    echo "$name: FAIL: a fault was not injected, so the run proves nothing"; report "$OUT/$name.log"; failed=1; return
  fi
  local skipped inv
  skipped=$(sed -n '/^invariants:/,/^RESULT/p' "$OUT/$name.log" | awk '$1 == "SKIP" {print $2}')
  for inv in $skipped; do
    case "$may_skip" in *" $inv "*) continue ;; esac
    echo "$name: FAIL: grace-chaos skipped the invariant $inv, so the run proves nothing about it"
    report "$OUT/$name.log"; failed=1; return
  done
  echo "$name: PASS ($(grep -c ' injected ' "$OUT/$name.log") faults injected)"
}

run_expect_pass scripted --steps 400 --schedule "$HERE/schedules/hosts.json"
[ "$(verdict "$OUT/scripted.log" no_split_brain)" = PASS ] || { echo "scripted: no_split_brain was not checked"; failed=1; }
# Seed 4 cuts off or freezes no host past dead-after: nothing to split.
run_expect_pass random --may-skip no_split_brain --steps 400 --seed 4 --faults 3

cat > "$OUT/lost.json" <<'JSON'
[{"at_step": 30, "fault": "host_lost", "host": 2, "duration_ms": 300}]
JSON
if ! "$GRACE_TRAIN" --help | grep -q -- --broken-no-jit-save; then
  echo "mutant under a host loss: not run (grace-train built without the test seam, -DGRACE_MUTANTS=OFF)"
else
  "$GRACE_CHAOS" "${BED[@]}" --steps 200 --save-every 100 --schedule "$OUT/lost.json" \
    --mutant-arg=--broken-no-jit-save --out "$OUT/mutant" > "$OUT/mutant.log" 2>&1
  rc=$?
  if [ $rc -eq 1 ] && [ "$(verdict "$OUT/mutant.log" work_lost)" = FAIL ]; then
    echo "mutant (no just-in-time save) under a host loss: caught (work_lost FAIL)"
  else
    echo "mutant: FAIL: expected exit 1 with work_lost FAIL, got exit $rc"; report "$OUT/mutant.log"; failed=1
  fi
fi
if [ $etcd_installed -eq 1 ]; then
  run_expect_pass etcd --steps 460 --etcd --node-local --schedule "$HERE/schedules/hosts-etcd.json"
  [ "$(verdict "$OUT/etcd.log" no_split_brain)" = PASS ] || { echo "etcd: no_split_brain was not checked"; failed=1; }
  grep -q "fetched checkpoint step" "$OUT"/etcd/run/h*/launch-*.log ||
    { echo "etcd: FAIL: no replacement host fetched a checkpoint from a peer"; failed=1; }
else
  echo "etcd: not run: etcd is not installed (Debian etcd-server, etcd-client); the other parts ran"
fi
run_expect_pass elastic --steps 800 --elastic 2 --elastic-wait-ms 2000 --schedule "$HERE/schedules/hosts-elastic.json"
grep -q "running the reference with the run's size changes (.*4 workers" "$OUT/elastic.log" ||
  { echo "elastic: FAIL: the job never trained on fewer hosts"; failed=1; }
echo "hosts: output in $OUT"
[ "$failed" = 0 ] && echo "hosts: PASS" || echo "hosts: FAIL"
exit $failed
