# Helpers for the PyTorch trainer's process tests: grace-launch --nproc 4 runs
# examples/pytorch_train.py with Debian's /usr/bin/python3. Builds on
# tests/integration/lib.sh (work dir, fail/pass, events, json, wait_job).
# Needs GRACE_LAUNCH, GRACE_CKPT, GRACE_SOURCE_DIR, GRACE_PYTHONPATH (CTest).
: "${GRACE_SOURCE_DIR:?}" "${GRACE_PYTHONPATH:?}"
export GRACE_TRAIN=${GRACE_TRAIN:-unused}
source "$GRACE_SOURCE_DIR/tests/integration/lib.sh"
export PYTHONPATH=$GRACE_PYTHONPATH
# One intra-op thread per worker: the tests run 4 workers on 2 cores, and
# torch's default (a thread per core, OpenMP threads that spin while they
# wait) had every worker's threads compete with the others' for nothing.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
"$PY" -c 'import torch' 2>/dev/null || { echo "SKIP: python3-torch is not installed (apt-get install python3-torch)"; exit 77; }
"$PY" -c 'import grace' || fail "cannot import grace from $GRACE_PYTHONPATH"
TRAINER=("$PY" "$GRACE_SOURCE_DIR/examples/pytorch_train.py")

# py_reference DIR NPROC ARGS...: an uninterrupted run into DIR.
py_reference() {
  local dir=$1 nproc=$2; shift 2
  mkdir -p "$dir"
  "$GRACE_LAUNCH" --quiet --nproc "$nproc" --checkpoint-dir "$dir/ck" -- \
    "${TRAINER[@]}" --output "$dir/out.json" "$@" >"$dir/log.txt" 2>&1 || { tail -30 "$dir/log.txt"; fail "reference run failed"; }
}

# start_py_job DIR NPROC [LAUNCH-ARGS --] TRAIN-ARGS...: in the background, sets JOB_PID.
start_py_job() {
  local dir=$1 nproc=$2; shift 2
  local largs=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do largs+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  mkdir -p "$dir"
  GRACE_EVENTS_FILE="$dir/events.jsonl" "$GRACE_LAUNCH" --nproc "$nproc" --checkpoint-dir "$dir/ck" "${largs[@]}" -- \
    "${TRAINER[@]}" --output "$dir/out.json" "$@" >>"$dir/log.txt" 2>&1 &
  JOB_PID=$!
}

# wait_event DIR EXPR [WHAT]: until an event matches EXPR (python on e); up to 120 s.
wait_event() {
  local dir=$1 expr=$2 what=${3:-$2} rc=0
  await_events "$dir" "$expr" 1 120 "$JOB_PID" || rc=$?
  [ $rc -eq 0 ] && return 0
  tail -30 "$dir/log.txt"
  [ $rc -eq 2 ] && fail "job ended while waiting for: $what"
  fail "timed out waiting for: $what"
}

# wait_saved DIR STEP: the chief committed a periodic checkpoint at STEP or later (incarnation 0).
wait_saved() {
  wait_event "$1" "e['event']=='committed_local' and e['incarnation']==0 and e['step']>=$2" "a checkpoint at step >= $2"
}

# pid_of DIR RANK [INCARNATION]: the worker's pid, from its first_step event.
pid_of() {
  events "$1/events.jsonl" "e['event']=='first_step' and e['rank']==$2 and e['incarnation']==${3:-0}" |
    "$PY" -c 'import json,sys; print(json.loads(sys.stdin.readline())["pid"])'
}

first_step_of() { # first_step_of DIR EVENT [KIND]: "step" of the first EVENT (of kind KIND)
  events "$1/events.jsonl" "e['event']=='$2'${3:+ and e.get('kind')=='$3'}" |
    "$PY" -c 'import json,sys; print(json.loads(sys.stdin.readline())["step"])'
}

# same_as_reference REF DIR STEPS: launcher exit 0, every tensor byte-identical, steps exactly once.
same_as_reference() {
  local ref=$1 dir=$2 steps=$3
  [ "$JOB_RC" -eq 0 ] || { tail -30 "$dir/log.txt"; fail "$dir: launcher exit $JOB_RC, expected 0"; }
  [ -z "$(find "$dir/ck" -maxdepth 1 -name '.tmp-*')" ] || fail "$dir: temporary directory left behind"
  "$PY" "$GRACE_SOURCE_DIR/tests/python/compare_runs.py" "$ref" "$dir" "$steps" || fail "$dir: not the uninterrupted run's state"
}
