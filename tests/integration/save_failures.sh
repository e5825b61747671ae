#!/usr/bin/env bash
# Saves that fail on a full file system: a periodic save's failure is a
# warning (training goes on, the save is retried with backoff and succeeds
# once there is room again, made by freeing space or, when allowed, by
# removing older checkpoints); a preemption save that cannot be written is
# a clear error and the previous checkpoint stays intact.
# Every part needs a small tmpfs (root): the probe runs before anything
# else, so Skipped (77) means no check ran; a mount that fails after the
# probe succeeded is a failure.
source "$(dirname "$0")/lib.sh"
why=$(tmpfs_unavailable)
[ -z "$why" ] || { echo "skipped: cannot mount a small tmpfs here ($why); every part of this test needs one"; exit 77; }
ARGS=(--device cpu --hidden 256 --step-delay-ms 10)
REF=$(reference 1 "${ARGS[@]}" --steps 500)

# mount_small DIR SIZE: a tmpfs of SIZE at DIR, unmounted when the test ends
MOUNTS=()
mount_small() {
  local err
  mkdir -p "$1"
  err=$(mount -t tmpfs -o "size=$2" tmpfs "$1" 2>&1) ||
    fail "mount of a $2 tmpfs at $1 failed although the probe mount succeeded: $err"
  MOUNTS+=("$1")
}
unmount_all() { for m in "${MOUNTS[@]}"; do umount "$m" 2>/dev/null || true; done; }
# Processes first (they hold files on the mounts), then the mounts, then
# lib.sh's cleanup with this test's exit status.
trap 'rc=$?; for p in "${PIDS[@]}"; do kill_tree "$p"; done; unmount_all; (exit $rc); cleanup' EXIT
# fill DIR: one file taking every free byte of DIR's file system
fill() { dd if=/dev/zero of="$1/filler" bs=4k 2>/dev/null || true; }
# train DIR ARGS...: grace-train alone (local mode) in the background, events in DIR
train() {
  local d=$1; shift
  GRACE_EVENTS_FILE="$d/events.jsonl" "$GRACE_TRAIN" "${ARGS[@]}" --checkpoint-dir "$d/ck" --output "$d/out.json" \
    "$@" > "$d/log.txt" 2>&1 &
  JOB_PID=$!
  track_pid "$JOB_PID"
}

# 1. The disk fills up during training: the periodic save fails, training
# goes on, retries back off; space is freed and the next retry commits.
D="$WORK/freed"
mount_small "$D/ck" 2m
train "$D" --steps 500 --save-every 20 --keep 2
wait_for_save "$D" 20
fill "$D/ck"
wait_for_event "$D" "e['event']=='save_retry' and e['failures']>=2" 30
kill -0 "$JOB_PID" 2>/dev/null || fail "freed: training stopped after a failed periodic save"
retry_t=$(events "$D/events.jsonl" "e['event']=='save_retry'" | tail -1 | "$PY" -c 'import json,sys; print(json.loads(sys.stdin.readline())["t_ns"])')
rm -f "$D/ck/filler"
wait_for_event "$D" "e['event']=='committed_local' and e.get('kind')=='periodic' and e['t_ns']>$retry_t" 30
wait_job
[ "$JOB_RC" -eq 0 ] || { tail -20 "$D/log.txt"; fail "freed: expected exit 0, got $JOB_RC"; }
[ "$(json "$D/out.json" weights_checksum)" = "$REF" ] || fail "freed: weights differ from the uninterrupted run"
grep -q "training goes on, next attempt in" "$D/log.txt" || fail "freed: no warning for the failed periodic save"
grep -q "periodic checkpoints resumed" "$D/log.txt" || fail "freed: no word that periodic saves resumed"
pass "disk full during training: $(count_events "$D/events.jsonl" "e['event']=='save_retry'") failed attempts, training went on, the save after freeing space committed, weights identical"

# 2. --prune-on-save-failure: no space is freed by hand; the retry removes
# every checkpoint but the newest first, and commits.
D="$WORK/pruned"
mount_small "$D/ck" 2m
train "$D" --steps 500 --save-every 20 --keep 3 --prune-on-save-failure
wait_for_save "$D" 60
fill "$D/ck"
wait_for_event "$D" "e['event']=='save_retry'" 30
retry_t=$(events "$D/events.jsonl" "e['event']=='save_retry'" | head -1 | "$PY" -c 'import json,sys; print(json.loads(sys.stdin.readline())["t_ns"])')
wait_for_event "$D" "e['event']=='committed_local' and e.get('kind')=='periodic' and e['t_ns']>$retry_t" 30
grep -q "removed to make room" "$D/log.txt" || fail "pruned: no older checkpoint was removed"
rm -f "$D/ck/filler"   # room for the rest of the run and its final save
wait_job
[ "$JOB_RC" -eq 0 ] || { tail -20 "$D/log.txt"; fail "pruned: expected exit 0, got $JOB_RC"; }
[ "$(json "$D/out.json" weights_checksum)" = "$REF" ] || fail "pruned: weights differ from the uninterrupted run"
pass "disk full with --prune-on-save-failure: older checkpoints removed, the retry committed, weights identical"

# 3. A preemption save on a full disk: a clear error, a non-zero exit that
# is not "restart me", and the previous checkpoint still verifies.
D="$WORK/preempt"
mount_small "$D/ck" 2m
train "$D" --steps 100000 --save-every 20 --keep 2
wait_for_save "$D" 40
fill "$D/ck"
kill -TERM "$JOB_PID"
wait_job
grep -qi "no space left" "$D/log.txt" || { tail -20 "$D/log.txt"; fail "preempt: the full disk was not reported"; }
[ "$JOB_RC" -ne 0 ] && [ "$JOB_RC" -ne 42 ] || fail "preempt: a preemption save that failed exited $JOB_RC"
newest=$("$GRACE_CKPT" list "$D/ck" 2>/dev/null | awk '$1 ~ /^[0-9]+$/ {s=$1} END {print s}')
[ -n "$newest" ] || { "$GRACE_CKPT" list "$D/ck"; fail "preempt: no checkpoint left"; }
"$GRACE_CKPT" verify "$D/ck" --step "$newest" > /dev/null || fail "preempt: the previous checkpoint (step $newest) is damaged"
[ -z "$(find "$D/ck" -maxdepth 1 -name '.tmp-*')" ] || fail "preempt: temporary left after the failed save"
pass "preemption save on a full disk: exit $JOB_RC with the reason, step $newest still verifies"

# 4. The same with --fallback-checkpoint-dir: the preemption save goes to
# the fallback directory (exit 42, restart me), the relaunch restores it
# although the primary is still full, and the run ends bit-identical (its
# end-of-training save also taken by the fallback).
D="$WORK/fallback"
mount_small "$D/ck" 2m
FB=(--fallback-checkpoint-dir "$D/fb")
train "$D" --steps 500 --save-every 20 --keep 2 "${FB[@]}"
wait_for_save "$D" 40
fill "$D/ck"
primary=$("$GRACE_CKPT" list "$D/ck" 2>/dev/null | awk '$1 ~ /^[0-9]+$/ {s=$1} END {print s}')
kill -TERM "$JOB_PID"
wait_job
[ "$JOB_RC" -eq 42 ] || { tail -20 "$D/log.txt"; fail "fallback: the preemption save should have gone to the fallback (exit $JOB_RC)"; }
grep -q "trying the fallback directory" "$D/log.txt" || fail "fallback: no word of the fallback directory"
saved=$("$GRACE_CKPT" list "$D/fb" 2>/dev/null | awk '$1 ~ /^[0-9]+$/ {s=$1} END {print s}')
[ -n "$saved" ] && [ "$saved" -gt "$primary" ] || fail "fallback: expected a checkpoint newer than $primary in the fallback, got '$saved'"
"$GRACE_CKPT" verify "$D/fb" --step "$saved" > /dev/null || fail "fallback: the fallback checkpoint does not verify"
"$GRACE_CKPT" verify "$D/ck" --step "$primary" > /dev/null || fail "fallback: the primary's checkpoint was damaged"
train "$D" --steps 500 --save-every 20 --keep 2 "${FB[@]}"
wait_job
[ "$JOB_RC" -eq 0 ] || { tail -20 "$D/log.txt"; fail "fallback: the relaunch exited $JOB_RC"; }
[ "$(count_events "$D/events.jsonl" "e['event']=='restored' and e['step']==$saved")" -eq 1 ] || fail "fallback: the relaunch did not restore step $saved"
grep -q "restoring step $saved from the fallback directory" "$D/log.txt" || fail "fallback: no word that the restore used the fallback"
[ "$(json "$D/out.json" weights_checksum)" = "$REF" ] || fail "fallback: weights differ from the uninterrupted run"
pass "preemption save on a full disk with a fallback: saved step $saved there (primary newest $primary), restored from it, weights identical"
