# Sourced by scripts/sanitize.sh (address) and scripts/fuzz.sh: one clang
# build with ASan + UBSan and libFuzzer's coverage instrumentation
# (fuzzer-no-link) serves both the AddressSanitizer test run and the fuzz
# harnesses, so CI compiles the CAF-heavy library once for the two instead
# of twice. The coverage counters cost the tests little; programs that are
# not fuzz harnesses link without libFuzzer's main.
# -O1, as ASan's documentation advises: UBSan's checks make -O2 compile much
# longer, and this build is one of CI's longest stages.
source scripts/build_lib.sh
ASAN_DIR=build-fuzz
ASAN_CXX=${FUZZ_CXX:-clang++-14}
ASAN_CC=${FUZZ_CC:-clang-14}
ASAN_FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"

# asan_configure: configures $ASAN_DIR (a no-op when it already is).
asan_configure() {
  command -v "$ASAN_CXX" >/dev/null || {
    echo "$ASAN_CXX not found (apt-get install clang-14 libclang-rt-14-dev)" >&2; return 2; }
  echo "==> configuring $ASAN_DIR ($ASAN_CXX, $ASAN_FLAGS -O1)"
  grace_configure "$ASAN_DIR" "$ASAN_DIR.configure.log" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DGRACE_CUDA=OFF -DGRACE_PYTHON=OFF -DGRACE_FUZZ=ON \
    -DCMAKE_C_COMPILER="$ASAN_CC" -DCMAKE_CXX_COMPILER="$ASAN_CXX" \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g -DNDEBUG" \
    -DCMAKE_CXX_FLAGS="$ASAN_FLAGS" -DCMAKE_C_FLAGS="$ASAN_FLAGS" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined"
}

# asan_build TARGET...: builds the targets in $ASAN_DIR (-j2).
asan_build() {
  echo "==> building $* in $ASAN_DIR (-j2)"
  grace_build "$ASAN_DIR" "$ASAN_DIR.build.log" "$@"
}
