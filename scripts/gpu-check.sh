#!/usr/bin/env bash
# gpu-check.sh: on a node with NVIDIA GPUs, runs in one command what this
# project could never run on its GPU-less machines (docs/GPU.md, "What was
# run, and what was not"):
#   - every test of grace_gpu_tests (CTest's gpu.* names), the NCCL ones
#     only with two GPUs or more, and tests/gpu/device_logic.sh;
#   - grace-train --device cuda end to end through grace-launch: SIGTERM a
#     worker (agreed save, restore), SIGKILL a worker (just-in-time save,
#     needs two GPUs: one worker per GPU, and a survivor to save), each
#     finishing bit-identical to an uninterrupted run on the same GPUs; and a
#     checkpoint saved on the device restored with --device cpu and back.
# One verdict line per check (PASS name / FAIL name: why / SKIP name: why),
# then a summary. Exit 0: every check that ran passed; 1: a failure; 77: no
# NVIDIA GPU or driver here (nothing to check).
#
#   GRACE_BUILD=build scripts/gpu-check.sh    # a build configured with -DGRACE_CUDA=ON
#
# Missing targets are built incrementally (GRACE_BUILD_JOBS, default nproc).
# Logs of every check stay in the directory named at the end when one fails.
set -euo pipefail
shopt -s inherit_errexit

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# ---- a GPU? (before anything is built or started) ------------------------
# nvidia-smi -L lists one "GPU i: ..." line per device; CUDA_VISIBLE_DEVICES
# narrows what the workers see.
gpus=0
smi_says=""
if command -v nvidia-smi >/dev/null 2>&1; then
  smi_says=$(nvidia-smi -L 2>&1 || true)
  gpus=$(grep -c '^GPU ' <<<"$smi_says" || true)
elif [ -e /proc/driver/nvidia/version ] || [ -e /dev/nvidiactl ]; then
  nodes=(/dev/nvidia[0-9]*)
  [ -e "${nodes[0]}" ] && gpus=${#nodes[@]}
  smi_says="no nvidia-smi; $gpus /dev/nvidiaN device nodes"
fi
if [ -n "${CUDA_VISIBLE_DEVICES+x}" ]; then
  IFS=, read -r -a visible <<<"$CUDA_VISIBLE_DEVICES"
  [ "${#visible[@]}" -lt "$gpus" ] && gpus=${#visible[@]}
fi
if [ "$gpus" -eq 0 ]; then
  why="no NVIDIA driver (no nvidia-smi, /proc/driver/nvidia/version or /dev/nvidiactl)"
  [ -n "$smi_says" ] && why="nvidia-smi -L lists no GPU ($(head -1 <<<"$smi_says"))"
  [ -n "${CUDA_VISIBLE_DEVICES+x}" ] && why="$why, CUDA_VISIBLE_DEVICES='$CUDA_VISIBLE_DEVICES'"
  echo "gpu-check: no GPU to check on this node: $why"
  exit 77
fi

# ---- the build -----------------------------------------------------------
BUILD=${GRACE_BUILD:-$ROOT/build}
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  echo "gpu-check: $BUILD is not a configured build; run: cmake -S $ROOT -B $BUILD -DGRACE_CUDA=ON (or set GRACE_BUILD)" >&2
  exit 1
fi
BUILD=$(cd "$BUILD" && pwd)
targets=$(cmake --build "$BUILD" --target help 2>/dev/null || true)
if ! grep -q 'grace-train-cuda' <<<"$targets"; then
  echo "gpu-check: $BUILD has no CUDA backend (grace-train-cuda); reconfigure with -DGRACE_CUDA=ON (docs/GPU.md, Building)" >&2
  exit 1
fi
GPU_TESTS=$BUILD/runtime/train/cuda/grace_gpu_tests
export GRACE_LAUNCH=$BUILD/grace-launch GRACE_TRAIN=$BUILD/grace-train GRACE_CKPT=$BUILD/grace-ckpt

# lib.sh: WORK, track_pid/kill_tree and the EXIT trap that kills every
# tracked process, the run/event helpers. A signal ends the script through
# that trap too.
# shellcheck source=SCRIPTDIR/../tests/integration/lib.sh
source "$ROOT/tests/integration/lib.sh"
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM
mkdir -p "$WORK/logs"

passed=0 failed=0 skipped=0
verdict() { # verdict PASS|FAIL|SKIP NAME [WHY]
  case $1 in
    PASS) passed=$((passed + 1)); echo "PASS $2" ;;
    FAIL) failed=$((failed + 1)); echo "FAIL $2: $3" ;;
    SKIP) skipped=$((skipped + 1)); echo "SKIP $2: $3" ;;
  esac
}

untrack() { # untrack PID: a reaped child is no longer killed at exit (its pid may be reused)
  local keep=() p
  for p in "${PIDS[@]}"; do [ "$p" = "$1" ] || keep+=("$p"); done
  PIDS=("${keep[@]}")
}

# run_check NAME SECONDS CMD...: CMD (a function or a program) in a subshell
# of its own, output in $WORK/logs/NAME.log; it and everything it started
# are killed when it ends, when the script ends, or after SECONDS. Sets RC.
run_check() {
  local name=$1 secs=$2 pid wd
  shift 2
  (
    PIDS=()
    trap 'for p in "${PIDS[@]}"; do kill_tree "$p"; done' EXIT
    trap 'exit 143' TERM
    trap 'exit 130' INT
    "$@"
  ) >"$WORK/logs/$name.log" 2>&1 &
  pid=$!
  track_pid "$pid"
  # The watchdog kills only a child of this script that is still running.
  (
    sleep "$secs"
    if [ "$(ps -o ppid= -p "$pid" 2>/dev/null | tr -d ' ')" = "$$" ]; then
      echo "gpu-check: still running after $secs s: killed" >>"$WORK/logs/$name.log"
      kill_tree "$pid"
    fi
  ) &
  wd=$!
  track_pid "$wd"
  RC=0
  { wait "$pid" || RC=$?; } 2>/dev/null  # (bash would print "Killed" for a check the watchdog ended)
  kill_tree "$wd"
  { wait "$wd" || true; } 2>/dev/null
  untrack "$pid"
  untrack "$wd"
}

# why NAME: the reason a failed check gave (lib.sh's "FAIL: ...", else its last line).
why() {
  local log="$WORK/logs/$1.log" line
  line=$(grep -h '^FAIL: ' "$log" | tail -1 | cut -c7-) || true
  [ -n "$line" ] || line=$(grep -v '^\s*$' "$log" | tail -1) || true
  echo "${line:-exit $RC, no output} (log: $log)"
}

RC=0
run_check build 3600 cmake --build "$BUILD" -j "${GRACE_BUILD_JOBS:-$(nproc)}" \
  --target grace_gpu_tests grace-train grace-train-cuda grace-launch grace-ckpt
if [ "$RC" -ne 0 ]; then
  verdict FAIL build "$(why build)"
  echo "gpu-check: the build failed; nothing was checked"
  exit 1
fi

echo "gpu-check: $gpus GPU(s) visible; build $BUILD"

# ---- grace_gpu_tests, one check per test case ----------------------------
# Catch test specs treat , [ ] * ~ \ specially: escape them to name one test.
catch_spec() {
  local s=$1
  s=${s//\\/\\\\}
  s=${s//,/\\,}
  s=${s//\[/\\[}
  s=${s//\]/\\]}
  s=${s//\*/\\*}
  s=${s//\~/\\~}
  printf '%s' "$s"
}
in_list() { # in_list WORD LIST...: WORD is one of LIST
  local w=$1 x
  shift
  for x in "$@"; do [ "$x" = "$w" ] && return 0; done
  return 1
}
catch_test() { GRACE_SKIP_EXIT=77 "$GPU_TESTS" "$(catch_spec "$1")"; }

mapfile -t all_tests < <("$GPU_TESTS" --list-test-names-only | grep -v '^\s*$')
mapfile -t nccl_tests < <("$GPU_TESTS" --list-test-names-only '[nccl]' | grep -v '^\s*$')
[ "${#all_tests[@]}" -gt 0 ] || { verdict FAIL gpu.list "$GPU_TESTS lists no tests"; }
ran=(gpu.device_logic)
for t in "${all_tests[@]}"; do
  name="gpu.$t"
  ran+=("$name")
  if [ "$gpus" -lt 2 ] && in_list "$t" "${nccl_tests[@]}"; then
    verdict SKIP "$name" "needs 2 GPUs, $gpus visible"
    continue
  fi
  log_name=${name//[^A-Za-z0-9._-]/_}
  run_check "$log_name" 300 catch_test "$t"
  case $RC in
    0) verdict PASS "$name" ;;
    77) verdict FAIL "$name" "skipped on a node with $gpus GPU(s): $(grep -h '^skipped: ' "$WORK/logs/$log_name.log" | head -1 || true)" ;;
    *) verdict FAIL "$name" "exit $RC: $(why "$log_name")" ;;
  esac
done

run_check gpu.device_logic 120 bash "$ROOT/tests/gpu/device_logic.sh" "$GPU_TESTS" "$GRACE_TRAIN"
if [ "$RC" -eq 0 ]; then verdict PASS gpu.device_logic; else verdict FAIL gpu.device_logic "$(why gpu.device_logic)"; fi

# Every gpu.* test CTest knows is one of the above (a new one must be added here).
while IFS= read -r name; do
  in_list "$name" "${ran[@]}" || verdict FAIL "$name" "registered in CTest ($BUILD) but not run by this script"
done < <(ctest --test-dir "$BUILD" -N -R '^gpu\.' | sed -n 's/^ *Test *#[0-9]*: //p')

# ---- grace-train --device cuda through grace-launch ----------------------
NPROC=$((gpus < 4 ? gpus : 4))  # one worker per GPU: NCCL refuses two ranks on one device
ARGS=(--device cuda --steps 100 --step-delay-ms 10 --save-every 10)

on_cuda() { # on_cuda DIR N: the log shows at least N workers that chose a CUDA device
  local n
  n=$(grep -c 'device: cuda' "$1/log.txt" || true)
  [ "$n" -ge "$2" ] || { tail -20 "$1/log.txt"; fail "$1: $n of $2 workers logged 'device: cuda'"; }
}
first_step_of() { # first_step_of DIR EXPR: the step of the first event matching EXPR
  events "$1/events.jsonl" "$2" | "$PY" -c 'import json,sys; print(json.loads(sys.stdin.readline())["step"])'
}

sigterm_check() {
  local ref D=$WORK/sigterm victim agreed restored
  ref=$(reference "$NPROC" "${ARGS[@]}")
  start_job "$D" "$NPROC" -- "${ARGS[@]}"
  wait_for_training "$D" "$NPROC"
  on_cuda "$D" "$NPROC"
  wait_for_save "$D" 30
  victim=$(workers_of "$JOB_PID" | sort | tail -1)
  [ -n "$victim" ] || fail "no worker to send SIGTERM to"
  kill -TERM "$victim"
  wait_job
  check_finished "$D" 100 "$ref"
  [ "$(json "$D/ck/grace-exit.json" restarts)" -eq 1 ] || fail "expected one restart"
  agreed=$(first_step_of "$D" "e['event']=='agreed'") || fail "no agreed save"
  restored=$(first_step_of "$D" "e['event']=='restored'") || fail "nothing restored"
  [ "$agreed" = "$restored" ] || fail "agreed step $agreed but restored $restored"
  echo "SIGTERM to pid $victim: agreed save at step $agreed restored, weights $ref as uninterrupted"
}

sigkill_check() {
  local ref D=$WORK/sigkill jit restored
  ref=$(reference "$NPROC" "${ARGS[@]}")
  start_job "$D" "$NPROC" -- "${ARGS[@]}"
  wait_for_training "$D" "$NPROC"
  on_cuda "$D" "$NPROC"
  wait_for_save "$D" 30
  kill -KILL "$(workers_of "$JOB_PID" | sort | tail -1)"
  wait_job
  check_finished "$D" 100 "$ref"
  jit=$(first_step_of "$D" "e['event']=='agreed' and e['kind']=='jit'") || fail "no just-in-time save"
  restored=$(first_step_of "$D" "e['event']=='restored'") || fail "nothing restored"
  [ "$jit" = "$restored" ] || fail "just-in-time save at step $jit but restored $restored"
  echo "SIGKILL: just-in-time save at step $jit restored, weights $ref as uninterrupted"
}

roundtrip_check() {
  local D=$WORK/roundtrip on_device on_cpu back
  mkdir -p "$D"
  leg() { # leg DEVICE STEPS [RESTORED-STEP]: one run in D, resuming from its checkpoints; its checksum
    local dev=$1 steps=$2 out="$D/out-$1-$2.json" rc=0
    (cd "$D" && GRACE_EVENTS_FILE="$D/events.jsonl" "$GRACE_LAUNCH" --quiet --nproc 1 --checkpoint-dir ck -- \
      "$GRACE_TRAIN" --device "$dev" --steps "$steps" --save-every 10 --output "$out" >>log.txt 2>&1) || rc=$?
    [ "$rc" -eq 0 ] || { tail -20 "$D/log.txt" >&2; fail "--device $dev --steps $steps: launcher exit $rc"; }
    local chose
    chose=$(grep -h 'device: ' "$D/log.txt" | tail -1) || true
    [[ $chose == *"device: $dev"* ]] || fail "--device $dev did not run on $dev: $chose"
    [ "$(json "$out" steps_done)" -eq "$steps" ] || fail "--device $dev --steps $steps: steps_done differs"
    if [ $# -ge 3 ]; then
      [ "$(events "$D/events.jsonl" "e['event']=='restored'" | tail -1 | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["step"])')" = "$3" ] \
        || fail "--device $dev --steps $steps: did not restore step $3"
    fi
    json "$out" weights_checksum
  }
  on_device=$(leg cuda 20)
  back=$(leg cpu 20 20)
  [ "$back" = "$on_device" ] || fail "the device's checkpoint of step 20 restored on the CPU: weights $back, saved $on_device"
  on_cpu=$(leg cpu 30 20)
  back=$(leg cuda 30 30)
  [ "$back" = "$on_cpu" ] || fail "the CPU's checkpoint of step 30 restored on the device: weights $back, saved $on_cpu"
  leg cuda 40 30 >/dev/null
  echo "step 20 saved on the device restores on the CPU bit for bit, step 30 saved on the CPU on the device; training goes on"
}

run_check e2e.cuda_sigterm_agreed_save 150 sigterm_check
if [ "$RC" -eq 0 ]; then verdict PASS e2e.cuda_sigterm_agreed_save; else verdict FAIL e2e.cuda_sigterm_agreed_save "$(why e2e.cuda_sigterm_agreed_save)"; fi

if [ "$NPROC" -ge 2 ]; then
  run_check e2e.cuda_sigkill_jit_save 150 sigkill_check
  if [ "$RC" -eq 0 ]; then verdict PASS e2e.cuda_sigkill_jit_save; else verdict FAIL e2e.cuda_sigkill_jit_save "$(why e2e.cuda_sigkill_jit_save)"; fi
else
  verdict SKIP e2e.cuda_sigkill_jit_save "needs 2 GPUs (a surviving worker makes the just-in-time save), $gpus visible"
fi

run_check e2e.cuda_cpu_checkpoint_roundtrip 150 roundtrip_check
if [ "$RC" -eq 0 ]; then verdict PASS e2e.cuda_cpu_checkpoint_roundtrip; else verdict FAIL e2e.cuda_cpu_checkpoint_roundtrip "$(why e2e.cuda_cpu_checkpoint_roundtrip)"; fi

echo "gpu-check: $passed passed, $failed failed, $skipped skipped ($gpus GPU(s), $NPROC worker(s) per run)"
[ "$failed" -eq 0 ] || exit 1
