#!/usr/bin/env bash
# `cmake --install` into a staging root, then the out-of-tree example
# (examples/embed) configured with find_package(Grace) against it and
# built; a pkg-config build of the same source; one preemption round trip
# with the installed grace-launch: exit 0, one restart, the final weights
# identical to an uninterrupted run.
source "$(dirname "$0")/lib.sh"
: "${GRACE_SOURCE_DIR:?}"
BUILD=$(dirname "$GRACE_LAUNCH")
ROOT=$WORK/root   # DESTDIR: nothing is written outside the test's folder
DESTDIR=$ROOT cmake --install "$BUILD" > "$WORK/install.log" 2>&1 || { tail -20 "$WORK/install.log"; fail "cmake --install failed"; }
P=$ROOT$(sed -n 's/^CMAKE_INSTALL_PREFIX:PATH=//p' "$BUILD/CMakeCache.txt")
for f in bin/grace-launch bin/grace-train bin/grace-ckpt bin/grace-chaos lib/libgrace.a lib/libgrace_base.a lib/libgrace_checkpoint.a lib/libgrace_ops.a \
         lib/libgrace_messages.a include/grace/actors/session.hpp include/grace/runtime/checkpoint/checkpoint.hpp include/grace/messages/grace.capnp.h \
         lib/cmake/Grace/GraceConfig.cmake lib/cmake/Grace/GraceTargets.cmake lib/pkgconfig/grace.pc; do
  [ -e "$P/$f" ] || fail "cmake --install did not install $f"
done
pass "installed: programs, libraries, headers, the CMake package and grace.pc"

# The Python module, when this build made it: the installed copy imports
# from the installed tree alone (PYTHONPATH only, nothing from build/).
PYDIR=$(sed -n 's/^GRACE_PYTHON_INSTALL_DIR:PATH=//p' "$BUILD/CMakeCache.txt")
if [ -n "$PYDIR" ] && [ -e "$BUILD/python/grace/__init__.py" ]; then
  [ -e "$ROOT$PYDIR/grace/__init__.py" ] || fail "cmake --install did not install the Python package under $PYDIR"
  where=$(cd "$WORK" && PYTHONPATH="$ROOT$PYDIR" /usr/bin/python3 -c 'import grace, grace._grace; print(grace._grace.__file__)') ||
    fail "the installed Python module does not import"
  case "$where" in "$ROOT$PYDIR"/grace/_grace*) ;; *) fail "import grace found $where, not the installed copy" ;; esac
  pass "installed Python module imports from $PYDIR"
else
  echo "note: this build has no Python module; its install is not checked"
fi

cmake -S "$GRACE_SOURCE_DIR/examples/embed" -B "$WORK/embed" -DCMAKE_PREFIX_PATH="$P" > "$WORK/embed.log" 2>&1 &&
  cmake --build "$WORK/embed" -j2 >> "$WORK/embed.log" 2>&1 || { tail -30 "$WORK/embed.log"; fail "the example did not build with find_package(Grace)"; }
pass "examples/embed built with find_package(Grace) -> Grace::grace"

flags=$(PKG_CONFIG_PATH="$P/lib/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$ROOT" pkg-config --cflags --libs grace) ||
  fail "pkg-config does not find grace.pc"
# shellcheck disable=SC2086
g++ -std=c++17 -O1 "$GRACE_SOURCE_DIR/examples/embed/embed_train.cpp" -o "$WORK/embed-pc" $flags 2> "$WORK/pc.log" ||
  { tail -20 "$WORK/pc.log"; fail "the example did not build with pkg-config --cflags --libs grace"; }
pass "examples/embed built with pkg-config"

TRAIN=$WORK/embed/embed-train
"$TRAIN" 0 2>/dev/null && fail "embed-train 0 must be a usage error"
ref=$("$P/bin/grace-launch" --quiet --nproc 2 --checkpoint-dir "$WORK/ref" -- "$TRAIN" 300 2>&1 | sed -n 's/.*checksum //p')
[ -n "$ref" ] || fail "the uninterrupted run printed no checksum"
D=$WORK/preempt
mkdir -p "$D"
GRACE_EVENTS_FILE="$D/events.jsonl" "$P/bin/grace-launch" --nproc 2 --checkpoint-dir "$D/ck" -- "$TRAIN" 300 > "$D/log.txt" 2>&1 &
JOB_PID=$!
track_pid "$JOB_PID"
wait_for_save "$D" 50
kill -TERM "$(pgrep -P "$JOB_PID" -f embed-train | head -1)"
wait_job
[ "$JOB_RC" -eq 0 ] || { tail -20 "$D/log.txt"; fail "preempted run: launcher exit $JOB_RC"; }
[ "$(json "$D/ck/grace-exit.json" restarts)" -eq 1 ] || fail "preempted run: expected one restart"
got=$(sed -n 's/.*checksum //p' "$D/log.txt")
[ "$got" = "$ref" ] || fail "preempted run: checksum $got, uninterrupted $ref"
pass "installed grace-launch + embed-train: a SIGTERM, one restart, checksum $got identical to the uninterrupted run"
