#!/usr/bin/env bash
# What the memory mirrors of replicas cost (runtime/checkpoint/replica.hpp, grace-launch
# --memory-dir): the same sharded job on node-local disks, two launchers of
# two workers on loopback, with the mirrors on and off (the baseline),
# interleaved, REPS times each. Prints one table: the training time (rank
# 0's first step to its finish) of each variant and their ratio, and what
# one mirror took (bytes, milliseconds; the replica_mirrored events).
#
#   bash bench/mirror_cost.sh                 # REPS=2 STEPS=60 SAVE_EVERY=10 HIDDEN="2048 2048"
#   REPS=3 HIDDEN="4096 4096" bash bench/mirror_cost.sh
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${GRACE_BUILD_DIR:-$ROOT/build}
REPS=${REPS:-2}
STEPS=${STEPS:-60}
SAVE_EVERY=${SAVE_EVERY:-10}
HIDDEN=${HIDDEN:-"2048 2048"}
PY=/usr/bin/python3
WORK=$(mktemp -d "${TMPDIR:-/tmp}/grace-mirror-bench.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
for b in grace-launch grace-train; do
  [ -x "$BUILD/$b" ] || { echo "mirror_cost.sh: $BUILD/$b not built (bash scripts/setup.sh)" >&2; exit 2; }
done

# run VARIANT REP: one job; prints "VARIANT train_s mirrors bytes_median ms_median"
run() {
  local variant=$1 d="$WORK/$1-$2" port n pids=()
  mkdir -p "$d"
  port=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  for n in 0 1; do
    local mem=off
    [ "$variant" = on ] && mem="$d/mem$n"
    # shellcheck disable=SC2086
    GRACE_TOKEN=mirror-bench-0123456789 GRACE_EVENTS_FILE="$d/events.jsonl" "$BUILD/grace-launch" --nproc 2 --nnodes 2 --node-rank $n \
      --coordinator 127.0.0.1:$port --run-id "mirror-bench-$2" --checkpoint-dir "$d/ck$n" \
      --node-local-checkpoints --memory-dir "$mem" -- "$BUILD/grace-train" --device cpu --steps "$STEPS" \
      --save-every "$SAVE_EVERY" --shard-optimizer --hidden $HIDDEN --batch 16 --output "$d/out$n.json" \
      > "$d/n$n.log" 2>&1 &
    pids+=($!)
    sleep 0.3
  done
  for n in 0 1; do wait "${pids[$n]}" || { tail -n 20 "$d/n$n.log" >&2; echo "mirror_cost.sh: node $n failed" >&2; exit 1; }; done
  "$PY" - "$d/events.jsonl" "$variant" <<'PYEOF'
import json, statistics, sys
ev = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
r0 = [e for e in ev if e.get("rank") == 0]
start = next(e["t_ns"] - e.get("ns", 0) for e in r0 if e["event"] == "first_step")
end = next(e["t_ns"] for e in r0 if e["event"] == "finished")
m = [e for e in ev if e["event"] == "replica_mirrored"]
med = lambda v: statistics.median(v) if v else 0
print(sys.argv[2], (end - start) / 1e9, len(m), med([e["bytes"] for e in m]), med([e["ns"] / 1e6 for e in m]))
PYEOF
}

echo "[mirror_cost] $REPS reps x (off, on): 2 nodes x 2 workers, --shard-optimizer --hidden $HIDDEN, $STEPS steps, a save every $SAVE_EVERY" >&2
results=()
for rep in $(seq 1 "$REPS"); do
  for v in off on; do
    results+=("$(run "$v" "$rep")")
    echo "[mirror_cost] rep $rep $v: ${results[-1]}" >&2
  done
done
printf '%s\n' "${results[@]}" | "$PY" -c '
import statistics, sys
rows = [l.split() for l in sys.stdin if l.strip()]
t = {v: statistics.median(float(r[1]) for r in rows if r[0] == v) for v in ("off", "on")}
on = [r for r in rows if r[0] == "on"]
mirrors = sum(int(r[2]) for r in on)
size = statistics.median(float(r[3]) for r in on) / 2**20
ms = statistics.median(float(r[4]) for r in on)
print("| variant | training time (median) | vs off |")
print("|---|---|---|")
print("| mirrors off (baseline) | %.2f s | 1.00x |" % t["off"])
print("| mirrors on | %.2f s | %.3fx |" % (t["on"], t["on"] / t["off"]))
print()
print("%d mirrors written in the \"on\" runs; per mirror (median): %.1f MiB in %.1f ms" % (mirrors, size, ms))
'
