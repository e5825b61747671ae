#pragma once
/// A worker's link to the coordination service: forwards claims, receives
/// checkpoint orders, commits, lost peers and cluster errors and hands them to
/// the trainer through the control block (one atomic flag on the fast path);
/// acknowledges proposals without involving the trainer; sends heartbeats.

#include "actors/coordinator_ref.hpp"
#include "actors/node_relay.hpp"
#include "runtime/coordination/agreement.hpp"

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include <memory>

namespace grace {

class control_block;

using peer_watcher_actor =
    caf::typed_actor<caf::reacts_to<msg<proto::CheckpointAt>>, caf::reacts_to<msg<proto::Committed>>,
                     caf::reacts_to<msg<proto::PeerLost>>, caf::reacts_to<msg<proto::ClusterError>>,
                     caf::reacts_to<msg<proto::DeadlineUpdate>>, caf::reacts_to<msg<proto::Notice>>,
                     caf::reacts_to<msg<proto::CommitParts>>, caf::reacts_to<msg<proto::Recover>>,
                     caf::replies_to<join_atom, msg<proto::Join>>::with<msg<proto::Welcome>>,
                     caf::reacts_to<tick_atom>, caf::reacts_to<follow_atom>,
                     caf::reacts_to<moved_atom, caf::actor, uint64_t, std::string>>;

struct peer_watcher_config {
  uint32_t rank = 0;
  uint32_t incarnation = 0;
  std::chrono::milliseconds heartbeat{200};
  std::chrono::milliseconds request_timeout{10000};
  std::shared_ptr<spdlog::logger> log;
  /// etcd failover (runtime/coordination/leader_rules.hpp): the file in which this node's
  /// launcher keeps the service's location ("address:port epoch node"), the
  /// epoch of the service joined, and how long to look for a successor
  /// after losing it. Without a file a lost service is final.
  std::string coordinator_file;
  uint64_t epoch = 0;
  std::chrono::milliseconds failover_wait{0};
  std::chrono::milliseconds follow_poll{25};  ///< a read of a small file: cheap, and on the failover path
  /// Sharded state: the service says every part of (agreement id, step) is
  /// durable and this worker commits them (handed to its checkpoint writer).
  /// (agreement id, step, node-local: each node's checkpoint server)
  std::function<void(uint64_t, uint64_t, std::vector<std::string>)> on_commit_parts;
  /// Sharded state with replicas: the kept copies and the replica this
  /// worker reports in a just-in-time acknowledgement, frozen from then on
  /// (runtime/checkpoint/replica.hpp). Unset: nothing to report.
  std::function<replica_report()> freeze_copies;
  /// This node's relay (multi-node jobs, GRACE_RELAY): heartbeats and
  /// acknowledgements go through it, and orders come from it. None: the
  /// watcher talks to the service directly.
  node_relay_actor relay;
};

/// `coord` is shared with the worker's other actors and its trainer; the
/// watcher swaps it when the service moves.
peer_watcher_actor spawn_peer_watcher(caf::actor_system& sys, std::shared_ptr<coordinator_ref> coord,
                                      std::shared_ptr<control_block> control, peer_watcher_config cfg);

}  // namespace grace
