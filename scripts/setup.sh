#!/usr/bin/env bash
# Installs Grace's Debian packages (idempotent) and builds it into ./build.
#   bash scripts/setup.sh            # install + configure + build
#   GRACE_CUDA=OFF bash scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake pkg-config
  ninja-build                # the build tool the scripts use (scripts/build_lib.sh says why)
  libcaf-dev                 # C++ Actor Framework 0.17 (core + io + openssl)
  libssl-dev openssl         # --tls-*: certificate checks; tests make certificates with `openssl`
  capnproto libcapnp-dev     # Cap'n Proto: the protocol
  libspdlog-dev libfmt-dev   # logging
  catch2                     # tests
  libgloo-dev                # CPU collectives
  libopenblas-dev            # BLAS ~10x faster than the reference one
  libxxhash-dev              # checkpoint checksums
  nlohmann-json3-dev         # manifests, safetensors headers, TF_CONFIG
  libcli11-dev               # command lines
  prometheus-cpp-dev         # grace-launch --metrics-port (Prometheus text format over HTTP)
  prometheus                 # tests/integration/metrics.sh scrapes a job with a real Prometheus server
  python3 python3-numpy      # the format check reads checkpoints with numpy only
  python3-dev pybind11-dev python3-pybind11  # the Python module `grace` (-DGRACE_PYTHON=AUTO builds it)
  python3-torch              # the PyTorch trainer, its tests and the torch baselines (Debian's 1.13)
  gnuplot-nox                # grace-chaos timeline pictures
  procps psmisc              # pgrep/pkill in the integration tests
  iproute2                   # tests/netns: hosts as network namespaces (ip netns, veth, bridge)
  slurm-wlm munge            # tests/slurm: a real one-node SLURM (slurmctld, slurmd, munged)
  etcd-server etcd-client    # grace-launch --etcd: coordinator failover; tests/netns/failover.sh runs a 3-member etcd
  clang-14 libclang-rt-14-dev  # scripts/fuzz.sh: libFuzzer harnesses with ASan + UBSan
  fio                        # bench/run: the disk's floor for rows 3 (O_DIRECT, a sweep of request sizes and queue depths)
)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "==> installing: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

source scripts/build_lib.sh
echo "==> configuring"
grace_configure build build-configure.log -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGRACE_CUDA="${GRACE_CUDA:-AUTO}"
grep -E "^-- Grace" build-configure.log || true
echo "==> building (-j2; a unity build: a clean build takes about 5 minutes on 2 cores)"
grace_build build build.log
grep -E "warning:" build.log | sort -u | head -20 || true
echo "==> built: build/grace-launch build/grace-train build/grace-ckpt, build/python/grace (PYTHONPATH=build/python /usr/bin/python3)"
