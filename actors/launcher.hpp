#pragma once
/// grace-launch: hosts the coordination service (it outlives worker
/// restarts), starts the local workers with their GRACE_* environment,
/// restarts the group on the restart code, forwards SIGTERM/SIGINT as a
/// notice, and exits with a code that says why (runtime/base/exit_codes.hpp).

#include "runtime/net/tls.hpp"

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace grace {

/// Many fields for a reason: a bag of settings without behaviour, one per
/// grace-launch flag; nothing here changes while the job runs.
struct launch_options {
  int nproc = 1;  ///< workers on this node
  int nnodes = 1;  ///< nodes in the job; with min_nodes < nnodes the most (elastic)
  /// Elastic jobs (`--nnodes MIN:MAX`, runtime/coordination/elastic.hpp): each
  /// incarnation's group has min_nodes..nnodes nodes, decided by the
  /// coordination service. 0: nnodes (not elastic).
  int min_nodes = 0;
  /// Elastic: how long the service waits for a node of the previous group
  /// (or any node, at the first group) before it forms a smaller group.
  std::chrono::milliseconds elastic_wait{30000};
  /// Elastic: how long a launcher waits for a group that has it (at least
  /// min_nodes ready) before it stops with exit 44.
  std::chrono::milliseconds join_timeout{600000};
  int node_rank = 0;
  std::string coordinator;  ///< host:port (multi-node); default 127.0.0.1, any free port
  std::string token_file;   ///< the job's secret (runtime/net/job_token.hpp); several nodes need it or GRACE_TOKEN
  /// Signed checkpoints (runtime/checkpoint/signing.hpp): a long-lived key,
  /// and --checkpoint-signing auto|job|off.
  std::string checkpoint_key_file;
  std::string checkpoint_signing = "auto";
  tls_files tls;            ///< mutual TLS to the coordination service (runtime/net/tls.hpp); default GRACE_TLS_*
  int max_restarts = 3;
  int restart_code = 42;
  std::string run_id;                             ///< default: random
  std::string checkpoint_dir;                     ///< exported as GRACE_CHECKPOINT_DIR; reason file goes there
  /// Every node's --checkpoint-dir is its own disk (GRACE_NODE_LOCAL_CHECKPOINTS=1):
  /// sharded state is committed per node, and before a group starts each
  /// node brings its directory level with its peers' (runtime/checkpoint/checkpoint_fetch.hpp).
  bool node_local_checkpoints = false;
  /// With node-local checkpoints: where this node's replica holders mirror
  /// their sources' parts, on a memory file system that outlives the
  /// workers (GRACE_MEMORY_DIR; runtime/checkpoint/replica.hpp). Empty: the default,
  /// /dev/shm/grace-<run-id>-node<N>; "off": none.
  std::string memory_dir;
  std::chrono::milliseconds grace_period{0};      ///< deadline carried by a forwarded notice
  std::chrono::milliseconds exit_timeout{15000};  ///< wait for the rest after one exits
  std::chrono::milliseconds dead_after{3000};
  std::chrono::milliseconds hang_after{0};  ///< alive but no progress this long: hung (0: off)
  /// Node > 0: how long the coordination service may stay unreachable after
  /// a group ended before this launcher stops (it cannot go on without it).
  std::chrono::milliseconds coordinator_wait{30000};
  /// The address advertised to peers (--host) or the interface holding it
  /// (--iface); empty: GRACE_HOST, GRACE_SOCKET_IFNAME, GLOO_SOCKET_IFNAME,
  /// else the route to the coordinator (runtime/net/net_address.hpp).
  std::string host;
  std::string iface;
  /// Groups in a row that failed their rendezvous before giving up (exit 44).
  int max_rendezvous_failures = 3;
  /// Serve Prometheus metrics on metrics_host:metrics_port (0: off).
  int metrics_port = 0;
  std::string metrics_host = "127.0.0.1";
  /// After the job ends, go on serving the final metrics this long (a
  /// scraper's last look); a signal ends the wait.
  std::chrono::milliseconds metrics_linger{0};
  /// Warm spares (runtime/worker/standby.hpp): while a group trains, start the
  /// next incarnation's processes up to their first call into Grace, so a
  /// restart skips the program's start (a Python trainer's imports).
  bool standby = false;
  /// How long after a group started its spares start (they must not slow
  /// the group's own start).
  std::chrono::milliseconds standby_delay{3000};
  /// How long a restart waits for a spare still starting before it starts
  /// that worker from scratch.
  std::chrono::milliseconds standby_ready_wait{30000};
  /// Recovery in place (runtime/coordination/agreement.hpp): a worker lost
  /// while the group trains is replaced at once (a spare if one is ready,
  /// else a new process) and the survivors keep training; `false`: every
  /// loss restarts the group. A replacement that has not joined
  /// `replace_timeout` after the loss ends it in a restart.
  bool in_place = false;
  std::chrono::milliseconds replace_timeout{10000};
  /// The optional etcd backend (runtime/coordination/leader_campaign.hpp): the launchers
  /// elect the one hosting the coordination service, and when its host is
  /// lost another takes the running group over. Empty: node 0 hosts it.
  std::string etcd;
  int etcd_ttl_seconds = 2;
  uint16_t coordinator_port = 29400;  ///< with etcd: where the elected launcher hosts the service
  /// With etcd: how long a successor waits for the survivors to rejoin.
  std::chrono::milliseconds takeover_window{1500};
  std::vector<std::string> command;
  bool quiet = false;
  bool elastic() const noexcept { return min_nodes > 0 && min_nodes < nnodes; }
};

/// Runs the job; returns the launcher's exit code.
int run_launcher(const launch_options& opts);

}  // namespace grace
