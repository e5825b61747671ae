# Shared helpers for the integration tests: real processes on loopback.
# Needs GRACE_LAUNCH, GRACE_TRAIN, GRACE_CKPT (set by CTest).
set -euo pipefail
: "${GRACE_LAUNCH:?}" "${GRACE_TRAIN:?}" "${GRACE_CKPT:?}"
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3

WORK=$(mktemp -d /tmp/grace-it.XXXXXX)
PIDS=()   # every process a test started (track_pid), killed with its descendants on exit
track_pid() { PIDS+=("$1"); }
kill_tree() { # kill_tree PID: SIGKILL, children first; the parent is stopped first so a
  local p=$1 c  # launcher cannot start replacements for the children killed under it
  kill -STOP "$p" 2>/dev/null || true
  for c in $(pgrep -P "$p" 2>/dev/null); do kill_tree "$c"; done
  kill -KILL "$p" 2>/dev/null || true
  kill -CONT "$p" 2>/dev/null || true
}
cleanup() {
  local rc=$? p
  for p in "${PIDS[@]}"; do kill_tree "$p"; done
  if [ $rc -eq 0 ]; then rm -rf "$WORK"; else echo "(kept $WORK for inspection)"; fi
}
trap cleanup EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }
pass() { echo "ok: $*"; }

# tmpfs_unavailable: why a small tmpfs cannot be mounted here, or nothing
# when it can (a probe mount, unmounted at once). A test that needs one asks
# before its first check: a mount that fails after the probe succeeded is a
# failure of the test, never a skip.
tmpfs_unavailable() {
  local p="$WORK/.tmpfs-probe" err
  [ "$(id -u)" -eq 0 ] || { echo "not root (a tmpfs mount needs root)"; return 0; }
  command -v mount >/dev/null || { echo "no 'mount' command"; return 0; }
  mkdir -p "$p"
  if ! err=$(mount -t tmpfs -o size=64k tmpfs "$p" 2>&1); then
    rmdir "$p"
    echo "mount -t tmpfs failed: $err"
    return 0
  fi
  umount "$p" || fail "the probe tmpfs at $p was mounted but cannot be unmounted"
  rmdir "$p"
}

json() { # json FILE KEY
  "$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"
}

# events FILE FILTER-EXPR: prints matching events (python expression on e).
# A reader that stops after the first line (`| ... readline()`) must not
# fail the pipeline: with PYTHONUNBUFFERED set, the next print hit a closed
# pipe (BrokenPipeError, and pipefail made the test fail).
events() {
  "$PY" - "$1" "$2" <<'PYEOF'
import json, os, sys
try:
    for line in open(sys.argv[1]):
        try: e = json.loads(line)
        except Exception: continue
        if eval(sys.argv[2], {}, {"e": e}): print(json.dumps(e))
    sys.stdout.flush()
except BrokenPipeError:
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
PYEOF
}

count_events() { events "$1" "$2" | wc -l; }

# reference NPROC ARGS...: checksum of an uninterrupted run of grace-train.
# One run per configuration for the whole suite: cached in GRACE_REF_CACHE
# (CTest sets it in the build tree; default: this test's $WORK), keyed by
# NPROC, ARGS and the binaries' identity, so a rebuild computes it anew.
# --step-delay-ms only sleeps (the weights do not depend on it): dropped
# from the key and from the run. Tests side by side share it under a lock.
reference() {
  local nproc=$1; shift
  local args=() key dir cache=${GRACE_REF_CACHE:-$WORK}
  while [ $# -gt 0 ]; do
    case "$1" in
      --step-delay-ms) shift 2 ;;
      --step-delay-ms=*) shift ;;
      *) args+=("$1"); shift ;;
    esac
  done
  key=$( { echo "$nproc ${args[*]}"; stat -Lc '%s %Y' "$GRACE_TRAIN" "$GRACE_LAUNCH"; } | md5sum | cut -c1-12)
  dir="$cache/ref-$key"
  mkdir -p "$cache"
  (
    flock 9
    if [ ! -f "$dir/out.json" ]; then
      rm -rf "$dir" && mkdir -p "$dir"
      (cd "$dir" && "$GRACE_LAUNCH" --quiet --nproc "$nproc" --checkpoint-dir ck -- \
          "$GRACE_TRAIN" --device cpu --output out.json.part "${args[@]}" >log.txt 2>&1) ||
        { cat "$dir/log.txt" >&2; exit 1; }
      rm -rf "$dir/ck"
      mv "$dir/out.json.part" "$dir/out.json"
    fi
  ) 9>"$cache/ref-$key.lock" || fail "reference run failed ($nproc workers: ${args[*]})"
  json "$dir/out.json" weights_checksum
}

# start_job DIR NPROC [LAUNCH-ARGS --] TRAIN-ARGS...: starts the launcher in the background, sets JOB_PID
start_job() {
  local dir=$1 nproc=$2; shift 2
  local largs=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do largs+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  mkdir -p "$dir"
  (cd "$dir" && GRACE_EVENTS_FILE="$dir/events.jsonl" exec "$GRACE_LAUNCH" --nproc "$nproc" \
      --checkpoint-dir ck "${largs[@]}" -- "$GRACE_TRAIN" --device cpu --output out.json "$@" >log.txt 2>&1) &
  JOB_PID=$!
  track_pid "$JOB_PID"
}

# await_events FILES-OR-DIR EXPR [COUNT] [SECONDS] [PID]: until COUNT (1)
# events matching the python expression on e are in the files (a directory
# means DIR/events.jsonl); status 1 after SECONDS (60), 2 once PID is gone.
# One polling process (wait_events.py), not an interpreter every 50 ms.
LIB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
await_events() {
  local files=$1 expr=$2 count=${3:-1} secs=${4:-60} pid=${5:-0}
  [ -d "$files" ] && files="$files/events.jsonl"
  # shellcheck disable=SC2086
  "$PY" "$LIB_DIR/wait_events.py" --expr "$expr" --count "$count" --timeout "$secs" --pid "$pid" $files
}

# wait_for_event DIR FILTER-EXPR [SECONDS]: until an event matching the
# python expression on e is in DIR/events.jsonl (default: up to 60 s).
wait_for_event() {
  local dir=$1 expr=$2 max=${3:-60}
  await_events "$dir" "$expr" 1 "$max" && return 0
  tail -20 "$dir/log.txt" 2>/dev/null
  fail "no event matching [$expr] within $max s"
}

# wait_for_save DIR STEP: until a checkpoint of step >= STEP was committed
# (positions a fault at a known point of the run).
wait_for_save() { wait_for_event "$1" "e['event']=='committed_local' and e['step']>=$2"; }

wait_job() { # wait_job -> sets JOB_RC
  set +e
  wait "$JOB_PID"
  JOB_RC=$?
  set -e
}

workers_of() { pgrep -P "$1" -f grace-train || true; }

# wait_for_training DIR N: until N workers run and have joined (events)
wait_for_training() {
  local dir=$1 n=$2
  # up to 60 s on a loaded machine
  await_events "$dir" "e['event']=='first_step'" "$n" 60 && return 0
  cat "$dir/log.txt"
  fail "workers did not start training"
}

check_finished() { # check_finished DIR STEPS REF
  local dir=$1 steps=$2 ref=$3
  [ "$JOB_RC" -eq 0 ] || { tail -30 "$dir/log.txt"; fail "$dir: launcher exit $JOB_RC, expected 0"; }
  [ "$(json "$dir/out.json" steps_done)" -eq "$steps" ] || fail "$dir: steps_done != $steps"
  [ "$(json "$dir/out.json" step_index_sum)" -eq $((steps * (steps + 1) / 2)) ] || fail "$dir: a step ran twice or never"
  [ "$(json "$dir/out.json" weights_checksum)" = "$ref" ] || fail "$dir: final weights differ from the uninterrupted run"
  [ -z "$(find "$dir/ck" -maxdepth 1 -name '.tmp-*')" ] || fail "$dir: temporary directory left behind"
}
