#!/usr/bin/env bash
# Grace's main job on this machine: 4 workers train; one gets a SIGTERM part
# way; all save at the agreed step and exit; the launcher restarts them; they
# resume from the checkpoint and finish; the final weights are compared with
# those of an uninterrupted run.
set -euo pipefail
cd "$(dirname "$0")/.."
B=$(cd "${GRACE_BUILD:-build}" && pwd)  # absolute: the runs below work inside $OUT
STEPS=${STEPS:-600}
NPROC=${NPROC:-4}
ARGS=(--steps "$STEPS" --hidden 128,128 --input-dim 64 --batch 256 --step-delay-ms 4)
OUT=${OUT:-demo-run}
rm -rf "$OUT" && mkdir -p "$OUT"
PY=/usr/bin/python3; [ -x $PY ] || PY=python3

echo "==> 1/2 uninterrupted reference run ($NPROC workers, $STEPS steps)"
(cd "$OUT" && mkdir -p ref && cd ref && "$B/grace-launch" --quiet --nproc "$NPROC" --checkpoint-dir ck -- \
   "$B/grace-train" "${ARGS[@]}" --output out.json >log.txt 2>&1) || { cat "$OUT/ref/log.txt"; exit 1; }

echo "==> 2/2 the same run, with a SIGTERM to one worker part way"
mkdir -p "$OUT/run"
(cd "$OUT/run" && GRACE_EVENTS_FILE=$PWD/events.jsonl exec "$B/grace-launch" --nproc "$NPROC" --checkpoint-dir ck -- \
   "$B/grace-train" "${ARGS[@]}" --output out.json >log.txt 2>&1) &
L=$!
for _ in $(seq 1 100); do grep -q first_step "$OUT/run/events.jsonl" 2>/dev/null && break; sleep 0.05; done
sleep 1.5
victim=$(pgrep -P $L -f grace-train | shuf -n1)
victim_rank=$(tr '\0' '\n' < "/proc/$victim/environ" 2>/dev/null | sed -n 's/^GRACE_RANK=//p')
echo "    sending SIGTERM to worker pid $victim (rank ${victim_rank:-?})"
kill -TERM "$victim"
set +e; wait $L; rc=$?; set -e
grep -E "^\[grace-launch\]" "$OUT/run/log.txt" | sed 's/^/    /'
echo
"$PY" - "$OUT" "$rc" <<'PYEOF'
import json, sys
out, rc = sys.argv[1], int(sys.argv[2])
ev = [json.loads(l) for l in open(f"{out}/run/events.jsonl")]
def first(name, **kw):
    for e in ev:
        if e["event"] == name and all(e.get(k) == v for k, v in kw.items()):
            return e
t0 = min(e["t_ns"] for e in ev)
ms = lambda e: (e["t_ns"] - t0) / 1e6
notice, agreed = first("notice"), first("agreed")
committed = first("committed", incarnation=0)
exits = [e for e in ev if e["event"] == "exit" and e["incarnation"] == 0]
restored = first("restored")
resumed = first("first_step", incarnation=1)
ref = json.load(open(f"{out}/ref/out.json"))
run = json.load(open(f"{out}/run/out.json"))
print("What happened:")
print(f"  {ms(notice):8.1f} ms  rank {notice['rank']} received a termination notice ({notice['detail']}) at step {notice['step']}")
print(f"  {ms(agreed):8.1f} ms  all {run['world_size']} workers agreed to stop after step {agreed['step']} "
      f"({(agreed['t_ns']-notice['t_ns'])/1e6:.2f} ms after the notice)")
print(f"  {ms(committed):8.1f} ms  checkpoint step {committed['step']} committed")
print(f"  {ms(max(exits, key=lambda e: e['t_ns'])):8.1f} ms  every worker exited with code 42 (restart me)")
print(f"  {ms(restored):8.1f} ms  restarted workers restored step {restored['step']}")
print(f"  {ms(resumed):8.1f} ms  training resumed at step {resumed['step']} "
      f"({(resumed['t_ns']-max(exits, key=lambda e: e['t_ns'])['t_ns'])/1e6:.0f} ms after the last exit)")
same = ref["weights_checksum"] == run["weights_checksum"]
print()
print(f"Launcher exit code: {rc}; steps run: {run['steps_done']} of {run['steps']}")
print(f"Final weights {run['weights_checksum']} vs uninterrupted {ref['weights_checksum']}: "
      + ("IDENTICAL (bit for bit)" if same else "DIFFERENT"))
sys.exit(0 if same and rc == 0 else 1)
PYEOF
