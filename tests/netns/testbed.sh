# A multi-host test bed on one machine, sourced by the tests in this
# directory (after tests/integration/lib.sh).
#
# tb_init K makes K "hosts": network namespaces gtb<pid>-h<i>, each with
#   eth0  192.0.2.<i+1>/24    on bridge gtb<pid>b  (all hosts: the cluster network)
#   eth1  198.51.100.<i+1>/24 on bridge gtb<pid>c  (hosts 1..K-1 only: a second
#         network host 0 is not on, so a host has two interfaces and one of its
#         addresses is unreachable from node 0)
#   lo (host 0's also holds 169.254.77.1/32: an address of host 0 that no other
#   host has a route to), and names h0..h<K-1> in its own /etc/hosts (ip netns exec mounts
#   /etc/netns/<ns>/hosts). Documentation prefixes (TEST-NET-1, TEST-NET-2), no
#   address on the bridges and no ARP answered there by the machine's own
#   namespace (which may hold one of these addresses itself), no default route:
#   nothing leaves the machine.
# Directories: $TB/h<i> per host (node-local), $TB/shared (as NFS would be).
#
# Cleanup on every exit path (EXIT trap; INT/TERM exit through it): every
# process inside our namespaces (ip netns pids), the namespaces, the bridges,
# /etc/netns/<ns>. A run killed with SIGKILL (a ctest timeout) cannot trap:
# the next tb_init removes test beds whose creating shell is gone.
#
# Where namespaces cannot be made (not root, no CAP_NET_ADMIN, no iproute2),
# tb_init prints "skipped: ..." and exits 77, which CTest reports as Skipped.
# Once the namespace probe succeeded, any later step of building the bed
# (a bridge, a link) that fails is a failure, never a skip.

TB_SKIP=77
TB_NS=()
TB_PREFIX="gtb$$"
# The hosts of one job share its secret (grace-launch refuses several nodes
# without one).
export GRACE_TOKEN=${GRACE_TOKEN:-$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')}
TB=""

tb_skip() { echo "skipped: $*"; trap - EXIT; rm -rf "$WORK"; exit "$TB_SKIP"; }

tb_ns() { echo "${TB_PREFIX}-h$1"; }
tb_ip() { echo "192.0.2.$(($1 + 1))"; }

# Removes test beds left by shells that no longer exist.
tb_reap_stale() {
  local ns pid
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^gtb[0-9]+-h[0-9]+$' || true); do
    pid=${ns#gtb}; pid=${pid%%-*}
    kill -0 "$pid" 2>/dev/null && continue
    tb_kill_ns "$ns"
    ip netns del "$ns" 2>/dev/null || true
    rm -rf "/etc/netns/$ns"
    ip link del "gtb${pid}b" 2>/dev/null || true
    ip link del "gtb${pid}c" 2>/dev/null || true
  done
}

tb_kill_ns() { # SIGKILL every process in namespace $1
  local pids
  pids=$(ip netns pids "$1" 2>/dev/null || true)
  [ -n "$pids" ] && kill -KILL $pids 2>/dev/null || true
}

tb_cleanup() {
  local ns i
  for ns in "${TB_NS[@]}"; do tb_kill_ns "$ns"; done
  # Killed processes leave the namespace only once reaped by their parents.
  for i in $(seq 1 50); do
    local left=0
    for ns in "${TB_NS[@]}"; do [ -n "$(ip netns pids "$ns" 2>/dev/null)" ] && left=1; done
    [ $left -eq 0 ] && break
    sleep 0.1
  done
  for ns in "${TB_NS[@]}"; do
    ip netns del "$ns" 2>/dev/null || true
    rm -rf "/etc/netns/$ns"
  done
  ip link del "${TB_PREFIX}b" 2>/dev/null || true
  ip link del "${TB_PREFIX}c" 2>/dev/null || true
  TB_NS=()
}

tb_init() { # tb_init K
  local k=$1 i ns
  command -v ip >/dev/null || tb_skip "no 'ip' command (iproute2) to make network namespaces"
  [ "$(id -u)" -eq 0 ] || tb_skip "network namespaces need root (CI runs as root)"
  tb_reap_stale
  ip netns add "${TB_PREFIX}-probe" 2>/dev/null || tb_skip "cannot create a network namespace here (ip netns add failed)"
  ip netns del "${TB_PREFIX}-probe"
  trap 'tb_rc=$?; tb_cleanup; (exit $tb_rc); cleanup' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  TB="$WORK/tb"
  mkdir -p "$TB/shared"
  # The probe above showed namespaces can be made here: a bridge that then
  # cannot be is a broken test bed (a failure), not a missing one (a skip).
  local br
  for br in "${TB_PREFIX}b" "${TB_PREFIX}c"; do
    ip link add "$br" type bridge || fail "cannot create bridge $br although a network namespace could be made (ip link add $br type bridge failed)"
  done
  for br in "${TB_PREFIX}b" "${TB_PREFIX}c"; do
    # The machine's own namespace sits on each bridge (the bridge device)
    # and may itself hold one of the test addresses (this machine kind's
    # eth0 is 192.0.2.2): it must never answer ARP there, or a host's
    # packets for a peer land in the machine's own stack (seen: host 0
    # reached "192.0.2.2" at the bridge's MAC for seconds at a time).
    sysctl -qw "net.ipv4.conf.$br.arp_ignore=8" "net.ipv6.conf.$br.disable_ipv6=1" 2>/dev/null || true
    ip link set "$br" up
  done
  for i in $(seq 0 $((k - 1))); do
    ns=$(tb_ns "$i")
    ip netns add "$ns"
    TB_NS+=("$ns")
    mkdir -p "$TB/h$i" "/etc/netns/$ns"
    tb_link_into "$ns" "${TB_PREFIX}v$i" "${TB_PREFIX}b" eth0 "$(tb_ip "$i")"
    [ "$i" -gt 0 ] && tb_link_into "$ns" "${TB_PREFIX}w$i" "${TB_PREFIX}c" eth1 "198.51.100.$((i + 1))"
    ip -n "$ns" link set lo up
    # Two interfaces per host: answer ARP only on the interface that holds
    # the address asked for, from its own address (no ARP flux between them).
    ip netns exec "$ns" sysctl -qw net.ipv4.conf.all.arp_ignore=1 net.ipv4.conf.all.arp_announce=2 || true
    [ "$i" -eq 0 ] && ip -n "$ns" addr add 169.254.77.1/32 dev lo
    { echo "127.0.0.1 localhost"; for j in $(seq 0 $((k - 1))); do echo "$(tb_ip "$j") h$j"; done; } \
      >"/etc/netns/$ns/hosts"
  done
}

tb_link_into() { # tb_link_into NS HOST-SIDE BRIDGE NAME-INSIDE ADDRESS
  ip link add "$2" type veth peer name "$2p"
  ip link set "$2p" netns "$1"
  ip -n "$1" link set "$2p" name "$4"
  ip -n "$1" addr add "$5/24" dev "$4"
  ip -n "$1" link set "$4" up
  ip link set "$2" master "$3"
  ip link set "$2" up
}

tb_exec() { # tb_exec I CMD...: runs CMD on host I
  local i=$1; shift
  ip netns exec "$(tb_ns "$i")" "$@"
}

# tb_link I up|down: host I's cluster link (a partition when down)
tb_link() { ip link set "${TB_PREFIX}v$1" "$2"; }

# tb_kill_host I: the host is lost: every process on it SIGKILLed, link down
tb_kill_host() {
  tb_link "$1" down
  tb_kill_ns "$(tb_ns "$1")"
}

# tb_freeze_host I / tb_thaw_host I: every process on host I stopped
# (SIGSTOP: a host that hangs, in a long GC pause or a frozen VM) / continued
tb_freeze_host() { tb_signal_ns "$(tb_ns "$1")" STOP; }
tb_thaw_host() { tb_signal_ns "$(tb_ns "$1")" CONT; }
tb_signal_ns() { # tb_signal_ns NS SIGNAL
  local pids
  pids=$(ip netns pids "$1" 2>/dev/null || true)
  [ -n "$pids" ] && kill -"$2" $pids 2>/dev/null || true
}

# tb_launch I VAR DIR LAUNCH-ARGS... -- TRAIN-ARGS...: grace-launch on host I
# in DIR (its events in DIR/events.jsonl, output in DIR/log.txt), as on a
# separate machine, with the variables in TB_ENV (NAME=value ...) added to
# its environment; sets VAR to the launcher's pid.
TB_ENV=()
tb_launch() {
  local i=$1 var=$2 dir=$3; shift 3
  local largs=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do largs+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  mkdir -p "$dir"
  (cd "$dir" && GRACE_EVENTS_FILE="$dir/events.jsonl" exec ip netns exec "$(tb_ns "$i")" \
      env "${TB_ENV[@]}" "$GRACE_LAUNCH" "${largs[@]}" -- "$GRACE_TRAIN" "$@" >>"$dir/log.txt" 2>&1) &
  printf -v "$var" '%s' "$!"
}

# tb_wait_event FILE EXPR [SECONDS]: until an event matching EXPR (python on e)
# is in FILE; fails after SECONDS (default 90).
tb_wait_event() {
  local file=$1 expr=$2 secs=${3:-90}
  await_events "$file" "$expr" 1 "$secs" || fail "no event '$expr' in $file within ${secs}s"
}

# tb_all_events: every host's events, one JSON object a line, in time order.
# tb_field EXPR FIELD: FIELD of the first of them matching EXPR (python on e).
# tb_wait_all EXPR SECONDS: until one of them matches; fails after SECONDS.
tb_all_events() {
  cat "$TB"/h*/events.jsonl | "$PY" -c 'import json,sys
for e in sorted((json.loads(l) for l in sys.stdin if l.startswith("{")), key=lambda e: e["t_ns"]): print(json.dumps(e))'
}
tb_field() {
  tb_all_events | "$PY" -c "import json,sys
m = [e for e in map(json.loads, sys.stdin) if eval(sys.argv[1], {}, {'e': e})]
print(m[0][sys.argv[2]] if m else '')" "$1" "$2"
}
tb_wait_all() {
  await_events "$(printf '%s/events.jsonl ' "$TB"/h*)" "$1" 1 "$2" && return 0
  tail -n 20 "$TB"/h*/log.txt
  fail "no event '$1' within $2 s"
}

# tb_launchers_ok HOST...: waits for each host's launcher (pid in LP[HOST]); fails unless all exit 0.
tb_launchers_ok() {
  local h code
  for h in "$@"; do
    tb_wait_pid "${LP[$h]}" code
    [ "$code" -eq 0 ] || { tail -n 30 "$TB"/h*/log.txt; fail "host $h's launcher exited $code"; }
  done
}

tb_wait_pid() { # tb_wait_pid PID VAR: waits for PID, sets VAR to its exit code
  local rc=0
  wait "$1" || rc=$?
  printf -v "$2" '%s' "$rc"
}

# tb_etcd_start I...: an etcd member on each host I given (client port 2379,
# peer port 2380 on its cluster address, data in $TB/h<I>/etcd), all members
# of one cluster; short raft timers so a lost member is noticed in ~0.5 s.
# tb_etcd_endpoints I...: their client URLs, comma separated. Killed with
# the host (tb_kill_host) and by tb_cleanup like any process in it.
tb_etcd_endpoints() {
  local i out=""
  for i in "$@"; do out+="${out:+,}http://$(tb_ip "$i"):2379"; done
  echo "$out"
}
tb_etcd_start() {
  command -v etcd >/dev/null || tb_skip "no etcd (Debian etcd-server) for the coordination backend"
  local i cluster=""
  for i in "$@"; do cluster+="${cluster:+,}e$i=http://$(tb_ip "$i"):2380"; done
  for i in "$@"; do
    mkdir -p "$TB/h$i"
    tb_exec "$i" etcd --name "e$i" --data-dir "$TB/h$i/etcd" \
      --listen-client-urls "http://$(tb_ip "$i"):2379" --advertise-client-urls "http://$(tb_ip "$i"):2379" \
      --listen-peer-urls "http://$(tb_ip "$i"):2380" --initial-advertise-peer-urls "http://$(tb_ip "$i"):2380" \
      --initial-cluster "$cluster" --initial-cluster-state new --initial-cluster-token "gtb$$" \
      --heartbeat-interval 50 --election-timeout 500 --pre-vote >"$TB/h$i/etcd.log" 2>&1 &
  done
  local end=$((SECONDS + 30))
  until tb_exec "$1" etcdctl --endpoints "$(tb_etcd_endpoints "$@")" --command-timeout=1s endpoint health \
      >/dev/null 2>&1; do
    [ $SECONDS -lt $end ] || { tail -n 5 "$TB"/h*/etcd.log; fail "etcd did not become healthy within 30 s"; }
    sleep 0.2
  done
}
