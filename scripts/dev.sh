#!/usr/bin/env bash
# The contributor's inner loop: builds what changed and runs the unit, actor
# and protocol-model tests (no real processes), two at a time.
#   bash scripts/dev.sh                 # build-dev/, then the tests
#   bash scripts/dev.sh -R 'gloo_comm'  # extra arguments go to ctest
# build-dev/ is a build of its own without unity batches (an edit rebuilds
# one file, not its batch), with ccache when it is installed. Its first run
# is a full build (a few minutes on 2 cores); after an edit to one source
# file, build and tests take under 3 minutes on 2 cores. The real-process
# tests are the README's full suite (ctest --test-dir build).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/build_lib.sh
dir=build-dev
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
if [ ! -f "$dir/CMakeCache.txt" ]; then
  echo "==> configuring $dir (first run: a full build follows)"
  GRACE_UNITY=OFF grace_configure "$dir" "$dir.configure.log" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DGRACE_CUDA=OFF -DGRACE_PYTHON=OFF "${launcher[@]}"
fi
targets=(grace_unit_tests grace_actor_tests grace_model_tests)
for f in messages safetensors manifest config checkpoint coordinator gate; do targets+=("fuzz_replay_$f"); done
t0=$(date +%s)
echo "==> building ${targets[*]}"
grace_build "$dir" "$dir.build.log" "${targets[@]}"
echo "==> built in $(( $(date +%s) - t0 )) s; unit, actor and model tests"
ctest --test-dir "$dir" -L "unit|actor|model" -LE python -E _NOT_BUILT -j2 --output-on-failure "$@"
