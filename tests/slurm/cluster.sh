# A one-node SLURM cluster for a test (Debian slurm-wlm 22.05 + munge),
# sourced after tests/integration/lib.sh. Everything lives under $WORK/slurm:
# its own munged (own key and socket), slurm.conf with its own ports and
# state/spool/log/pid paths, SlurmUser=root, proctrack/linuxproc, task/none,
# select/cons_tres. Client commands find it through SLURM_CONF.
#
# The daemons are stopped on every exit path (EXIT trap) by their pid files;
# a run killed with SIGKILL (a ctest timeout) cannot trap, so sl_start first
# stops daemons a killed earlier run of this test left (their command lines
# name a /tmp/grace-it.* directory, which nothing else uses).
# Without root or the packages, tests print "skipped: ..." and exit 77.

SL=""
SL_SKIP=77

sl_skip() { echo "skipped: $*"; trap - EXIT; rm -rf "$WORK"; exit "$SL_SKIP"; }

sl_free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

sl_reap_stale() {
  local pid
  for pid in $(pgrep -f '^(slurmctld|slurmd|/usr/sbin/slurmctld|/usr/sbin/slurmd) -f /tmp/grace-it\.' || true) \
             $(pgrep -f '^(munged|/usr/sbin/munged) --socket=/tmp/grace-it\.' || true); do
    kill -KILL "$pid" 2>/dev/null || true
  done
}

sl_start() {
  local b
  for b in munged slurmctld slurmd sbatch scontrol scancel; do
    command -v "$b" >/dev/null || sl_skip "$b not found: SLURM tests need slurm-wlm and munge (scripts/setup.sh installs them)"
  done
  [ "$(id -u)" -eq 0 ] || sl_skip "starting slurmctld/slurmd as SlurmUser=root needs root (CI runs as root)"
  id munge >/dev/null 2>&1 || sl_skip "no 'munge' user (the munge package creates it)"
  sl_reap_stale
  SL="$WORK/slurm"
  trap 'sl_rc=$?; sl_stop; (exit $sl_rc); cleanup' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  chmod 755 "$WORK"   # munged (user munge) must reach its socket directory
  mkdir -p "$SL/munge" "$SL/state" "$SL/spool" "$SL/log"
  chmod 755 "$SL"
  dd if=/dev/urandom of="$SL/munge/munge.key" bs=1024 count=1 status=none
  chown -R munge:munge "$SL/munge"
  chmod 755 "$SL/munge"
  chmod 400 "$SL/munge/munge.key"
  setpriv --reuid=munge --regid=munge --clear-groups munged --socket="$SL/munge/munge.sock" \
    --key-file="$SL/munge/munge.key" --pid-file="$SL/munge/munged.pid" --log-file="$SL/munge/munged.log" \
    --seed-file="$SL/munge/munged.seed" || { cat "$SL/munge/munged.log"; fail "munged did not start"; }
  sl_write_conf
  export SLURM_CONF="$SL/slurm.conf"
  slurmctld -f "$SLURM_CONF" || { cat "$SL/log/slurmctld.log"; fail "slurmctld did not start"; }
  slurmd -f "$SLURM_CONF" || { cat "$SL/log/slurmd.log"; fail "slurmd did not start"; }
  local i
  for i in $(seq 1 100); do
    sinfo -h -o %t 2>/dev/null | grep -x idle >/dev/null && return 0
    sleep 0.2
  done
  sinfo; tail -n 20 "$SL/log/slurmctld.log" "$SL/log/slurmd.log"
  fail "the SLURM node did not become idle"
}

sl_write_conf() {
  local host
  host=$(hostname -s)
  cat >"$SL/slurm.conf" <<CONF
ClusterName=gracetest
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$(sl_free_port)
SlurmdPort=$(sl_free_port)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SL/munge/munge.sock
StateSaveLocation=$SL/state
SlurmdSpoolDir=$SL/spool
SlurmctldPidFile=$SL/slurmctld.pid
SlurmdPidFile=$SL/slurmd.pid
SlurmctldLogFile=$SL/log/slurmctld.log
SlurmdLogFile=$SL/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
JobRequeue=1
SchedulerType=sched/builtin
InactiveLimit=0
KillWait=5
MinJobAge=600
NodeName=$host CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
}

# Stops the daemons by their pid files (TERM, then KILL after 10 s).
sl_stop() {
  [ -n "$SL" ] || return 0
  if [ -n "${SLURM_CONF:-}" ]; then
    scancel --full --signal=KILL $(squeue -h -o %i 2>/dev/null) 2>/dev/null || true
  fi
  local f pids=()
  for f in "$SL/slurmd.pid" "$SL/slurmctld.pid" "$SL/munge/munged.pid"; do
    [ -f "$f" ] && pids+=("$(cat "$f")")
  done
  [ ${#pids[@]} -gt 0 ] && kill -TERM "${pids[@]}" 2>/dev/null || true
  local i p alive
  for i in $(seq 1 100); do
    alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive -eq 0 ] && break
    sleep 0.1
  done
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  SL=""
}

sl_state() { scontrol show job "$1" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'; }

# sl_wait_state JOB STATE-REGEX SECONDS
sl_wait_state() {
  local end=$((SECONDS + $3)) s
  while [ $SECONDS -lt "$end" ]; do
    s=$(sl_state "$1")
    echo "$s" | grep -E "^($2)$" >/dev/null && return 0
    sleep 0.2
  done
  scontrol show job "$1"
  fail "job $1 did not reach state $2 within $3 s (now ${s:-unknown})"
}
