#pragma once
/// Where a worker learns its cluster: the launcher's GRACE_* variables, a
/// TensorFlow-style TF_CONFIG, or `--workers host:port,... --index i`.

#include "runtime/base/error.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace grace {

/// Many fields for a reason: what a worker learns about its job from its
/// environment, read once at start and then only read.
struct cluster_config {
  uint32_t rank = 0;
  uint32_t world_size = 1;
  uint32_t local_rank = 0;
  std::string coordinator_host;  ///< empty: local mode (one worker, no coordinator)
  uint16_t coordinator_port = 0;
  std::string run_id = "local";
  uint32_t incarnation = 0;
  std::string token;
  std::string source = "default";  ///< "GRACE_*", "TF_CONFIG", "--workers", "default"
  /// The address this worker advertises to its peers (Gloo pairs; NCCL's
  /// interface is `iface`). Empty until attach() chooses it
  /// (runtime/net/net_address.hpp); 127.0.0.1 in local mode.
  std::string host;
  std::string iface;
  std::string host_source;  ///< why this address ("route to the coordinator ...", "GRACE_HOST", ...)
  /// etcd failover (grace-launch --etcd): the file in which the launcher
  /// keeps the coordination service's location (GRACE_COORDINATOR_FILE; it
  /// wins over GRACE_COORDINATOR), that service's epoch, and how long a
  /// worker looks for a successor after losing it (GRACE_FAILOVER_WAIT_MS).
  std::string coordinator_file;
  uint64_t coordinator_epoch = 0;
  uint32_t failover_wait_ms = 0;
  /// This node's relay (GRACE_RELAY, "127.0.0.1:port"; multi-node jobs):
  /// heartbeats and acknowledgements go through it (actors/node_relay.hpp).
  std::string relay;
  /// Elastic jobs (grace-launch --nnodes MIN:MAX): the node ranks of this
  /// incarnation's group in slot order (GRACE_GROUP_NODES, "0,2"): a rank's
  /// node in a checkpoint is its slot; this names the hosts behind them.
  std::string group_nodes;
  /// Sharded state in node-local checkpoint directories, declared by
  /// grace-launch --node-local-checkpoints (GRACE_NODE_LOCAL_CHECKPOINTS=1):
  /// every node commits its own parts (runtime/checkpoint/shared_dir.hpp checks it).
  bool node_local_checkpoints = false;
  /// A directory on the node's memory file system that outlives the
  /// workers (grace-launch --memory-dir, GRACE_MEMORY_DIR): with node-local
  /// sharded checkpoints, replica holders mirror their source's parts there
  /// (runtime/checkpoint/replica.hpp). Empty: none.
  std::string memory_dir;
  /// Whether some worker of a --workers/TF_CONFIG list is not on a
  /// loopback address (its job crosses hosts: it needs a secret).
  bool spans_hosts = false;
  bool is_chief() const noexcept { return rank == 0; }
  bool local_mode() const noexcept { return world_size == 1 && coordinator_host.empty(); }
};

/// Parses "host:port" (IPv4 name or address; port 1..65535).
result<std::pair<std::string, uint16_t>> parse_host_port(const std::string& s);

/// A run id names the job in joins, rendezvous keys, events and manifests:
/// 1 to 256 printable ASCII characters without blanks. `origin` names where
/// it came from in the error.
status check_run_id(const std::string& id, const std::string& origin);

/// Whether `host` names this machine's loopback (127.0.0.0/8, ::1, localhost).
bool is_loopback_host(const std::string& host);

/// How a member started without grace-launch (--workers, TF_CONFIG) got its secret.
enum class secret_mode {
  launcher,       ///< a GRACE_* cluster: the launcher handed it over
  given,          ///< GRACE_TOKEN or a token file
  loopback_only,  ///< none, and every worker is on this machine's loopback
  insecure,       ///< none across hosts, allowed by --insecure / GRACE_INSECURE=1
};
struct secret_inputs {
  std::string token_file;  ///< --token-file (empty: GRACE_TOKEN_FILE, if set)
  bool insecure = false;   ///< --insecure (or GRACE_INSECURE=1)
};
/// Fills `c.token` for a --workers/TF_CONFIG member: GRACE_TOKEN, else the
/// token file. Without either a job across hosts is refused with an error
/// naming both, unless insecure (the caller prints that at every start);
/// a job on loopback addresses alone may run without a secret. `getenv`
/// reads the environment (a parameter for tests).
result<secret_mode> resolve_member_secret(cluster_config& c, const secret_inputs& in,
                                          const char* (*getenv)(const char*));

/// From explicit flags. `workers` is the comma-separated list; index -1 means
/// "not given" (an error when there is more than one worker). The first
/// worker's address hosts the coordination service.
result<cluster_config> cluster_from_workers(const std::string& workers, int index);

/// From a TF_CONFIG JSON document: {"cluster":{"worker":[...]},"task":{"type":"worker","index":i}}.
result<cluster_config> cluster_from_tf_config(const std::string& json);

/// From the environment: GRACE_* (set by grace-launch) first, then TF_CONFIG;
/// neither: one worker in local mode.
result<cluster_config> cluster_from_environment();

}  // namespace grace
