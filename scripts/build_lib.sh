# Sourced by the build scripts (setup.sh, sanitize.sh, fuzz.sh, dev.sh): how
# a build directory is configured and built, in one place.
#
# Ninja when it is installed (scripts/setup.sh installs it): it schedules
# every target's translation units in one graph, while the Makefile
# generator's top level builds the targets given to `--target` one after the
# other, leaving a core idle whenever a target has one unit left (each
# program is one). A directory already configured with another generator
# keeps it (CMake refuses to switch).
#
# Unity builds (GRACE_UNITY=ON, the default for the scripts' one-shot builds):
# CMake compiles each target's sources in batches, so the CAF, spdlog and
# JSON headers and the CAF templates that every actor instantiates are
# compiled once a batch instead of once a file. dev.sh turns it off: an
# edit then rebuilds one file, not its batch.

# grace_generator_args DIR: prints the -G option for a new DIR (none for a
# DIR configured before, which keeps its generator).
grace_generator_args() {
  [ -f "$1/CMakeCache.txt" ] && return 0
  command -v ninja >/dev/null && echo "-G Ninja"
  return 0
}

# grace_configure DIR LOG CMAKE-ARGS...: configures DIR (output in LOG).
grace_configure() {
  local dir=$1 log=$2; shift 2
  # shellcheck disable=SC2046
  cmake -S . -B "$dir" $(grace_generator_args "$dir") -DCMAKE_UNITY_BUILD="${GRACE_UNITY:-ON}" "$@" >"$log" 2>&1 \
    || { cat "$log"; return 1; }
}

# grace_build DIR LOG [TARGET...]: builds DIR (-j2; all targets without
# TARGET), output in LOG; on failure prints the first errors.
grace_build() {
  local dir=$1 log=$2; shift 2
  local targets=()
  [ $# -gt 0 ] && targets=(--target "$@")
  cmake --build "$dir" -j "${GRACE_JOBS:-2}" "${targets[@]}" >"$log" 2>&1 \
    || { grep -E "error|Error" -A5 "$log" | head -60; echo "build failed: see $log"; return 1; }
}
