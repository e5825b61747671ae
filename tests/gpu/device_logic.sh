#!/usr/bin/env bash
# The GPU tests' device logic, checked without a GPU: GRACE_CUDA_PROBE makes
# the probe report no driver, a driver that fails, or devices, and the
# outcome must be Skipped (exit 77) only for the first.
#   device_logic.sh GRACE_GPU_TESTS GRACE_TRAIN
set -uo pipefail
tests=$1 train=$2
one="mlp_cuda matches the CPU mlp over 20 steps"
fail() { echo "FAIL: $*" >&2; exit 1; }

run() { # run PROBE -> rc of one GPU test case under CTest's skip convention
  GRACE_SKIP_EXIT=77 GRACE_CUDA_PROBE=$1 "$tests" "$one" >"$out" 2>&1
}
out=$(mktemp); trap 'rm -f "$out"' EXIT

run none; rc=$?
[ $rc -eq 77 ] || { cat "$out"; fail "no driver: exit $rc, expected 77 (Skipped)"; }
grep -q "skipped: no CUDA device" "$out" || { cat "$out"; fail "no driver: the skip must say why"; }
echo "ok: no driver -> Skipped, saying why"

run driver-error; rc=$?
[ $rc -ne 0 ] && [ $rc -ne 77 ] || { cat "$out"; fail "a driver whose probe fails: exit $rc, expected a failure"; }
grep -q "CUDA cannot start" "$out" || { cat "$out"; fail "a failing driver must be named"; }
echo "ok: a driver that fails -> Failed (exit $rc), not Skipped"

if [ ! -e /proc/driver/nvidia/version ] && [ ! -e /dev/nvidiactl ]; then
  # A device reported where none exists: the test runs and its CUDA calls
  # fail, so it must fail, never skip or pass.
  run devices:1; rc=$?
  [ $rc -ne 0 ] && [ $rc -ne 77 ] || { cat "$out"; fail "a reported device without a GPU: exit $rc, expected a failure"; }
  echo "ok: a reported device without a GPU -> Failed (exit $rc)"
fi

# The trainer: --device cuda without a driver is a usage error (2), on any node.
GRACE_CUDA_PROBE=none "$train" --steps 5 --device cuda >"$out" 2>&1; rc=$?
[ $rc -eq 2 ] || { cat "$out"; fail "grace-train --device cuda without a driver: exit $rc, expected 2"; }
grep -q "no NVIDIA driver" "$out" || { cat "$out"; fail "grace-train must say there is no driver"; }
echo "ok: grace-train --device cuda without a driver -> exit 2"
