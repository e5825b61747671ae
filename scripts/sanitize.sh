#!/usr/bin/env bash
# Builds Grace with a sanitizer into its own folder and runs the unit, actor
# and integration tests under it.
#   bash scripts/sanitize.sh thread     # ThreadSanitizer        -> build-tsan/
#   bash scripts/sanitize.sh address    # AddressSanitizer+UBSan (clang) -> build-fuzz/
# Every unit, actor and fuzz-replay test runs under both. Of the tests with
# real processes, each sanitizer runs the ones whose code nothing else
# under it reaches (the launcher, relays, checkpoint servers and every
# thread of a real worker only run in real processes):
#   thread:  multinode (two launchers: relays, checkpoint servers, node-local
#            leveling and fetches), hard_failure (the unsharded
#            just-in-time save, a frozen worker, a step error), standby (the
#            spare pool and its release), metrics (the exposer and the job
#            monitor's threads). Not sharded: at 195 s it was TSan's
#            longest test; its threads (replica keepers, bulk transfers) run
#            under TSan in the unit tests (test_replica, test_bulk_channel),
#            sharded saves across nodes in multinode, and ASan runs sharded
#            in real processes;
#   address: the ones that feed hostile or damaged input to real processes:
#            hostile (forged messages), tls (handshakes), bad_input (command
#            lines and files), save_failures (failing disks), token, sharded
#            (damaged parts, resharded restores), step_error.
# The other process tests (notices, restarts, grace periods, chaos runs,
# network namespaces, SLURM, Python) go through the code these do, at native
# speed in the README suite; their deadlines assume native speed, and under
# a sanitizer every step is 5-20x slower. Not built here: the protocol
# model (pure code, millions of states), the GPU tests (no CUDA), the
# install test (an uninstrumented program cannot link instrumented
# libraries).
# Suppressions (third-party internals only, each justified there):
# scripts/sanitizers/tsan.supp, lsan.supp. A report from Grace's own code
# aborts the process, which fails its test.
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:-}
supp=$PWD/scripts/sanitizers
source scripts/build_lib.sh
# Only what the selected tests run (not the model tests, benchmarks or the
# CUDA trainer): each sanitizer build is a full CAF build, the heaviest part.
# (grace-chaos is not among them: only the chaos tests, left out, run it.)
targets="grace_unit_tests grace_actor_tests grace-launch grace-train grace-ckpt grace-hostile"
for f in messages safetensors manifest config checkpoint coordinator gate; do targets="$targets fuzz_replay_$f"; done
case "$kind" in
  thread)
    # -O1 (ThreadSanitizer's documentation: -O1 or -O2): the CAF-heavy
    # batches compile about a third faster than at -O2, and the tests it
    # runs stay well within their deadlines.
    dir=build-tsan; flags="-fsanitize=thread"
    echo "==> configuring $dir ($flags -O1)"
    grace_configure "$dir" "$dir.configure.log" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGRACE_CUDA=OFF -DGRACE_PYTHON=OFF \
      -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g -DNDEBUG" \
      -DCMAKE_CXX_FLAGS="$flags -fno-omit-frame-pointer" -DCMAKE_C_FLAGS="$flags -fno-omit-frame-pointer" \
      -DCMAKE_EXE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags"
    echo "==> building $targets in $dir (-j2)"
    # shellcheck disable=SC2086
    grace_build "$dir" "$dir.build.log" $targets ;;
  # ASan + UBSan: clang's build that scripts/fuzz.sh fuzzes from as well.
  address)
    source "$supp/asan_build.sh"
    dir=$ASAN_DIR
    asan_configure
    # shellcheck disable=SC2086
    asan_build $targets ;;
  *) echo "usage: $0 thread|address" >&2; exit 2 ;;
esac
export TSAN_OPTIONS="suppressions=$supp/tsan.supp halt_on_error=1 second_deadlock_stack=1 history_size=4"
export ASAN_OPTIONS="detect_leaks=1 abort_on_error=1 detect_stack_use_after_return=0"
export LSAN_OPTIONS="suppressions=$supp/lsan.supp"
export UBSAN_OPTIONS="print_stacktrace=1 halt_on_error=1"
echo "==> running the unit, actor and integration tests under the $kind sanitizer"
# A sanitizer report aborts the process, and the test fails with it.
# The model tests' binary is not built here: CTest lists it as a
# placeholder (grace_model_tests_NOT_BUILT), which the selection leaves out.
# Unit and actor tests side by side (-j2); the process tests after them.
ctest --test-dir "$dir" --output-on-failure -L "unit|actor" -LE python -E "_NOT_BUILT" -j2
case "$kind" in
  thread) processes="multinode|hard_failure|standby|metrics" ;;
  address) processes="hostile|tls|bad_input|save_failures|token|sharded|step_error" ;;
esac
ctest --test-dir "$dir" --output-on-failure -R "^integration\.($processes)\$" -j2
