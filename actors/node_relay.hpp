#pragma once
/// Aggregation per host (multi-node jobs): one node relay in each launcher
/// sits between the node's workers and the coordination service, so the
/// service handles messages per node instead of per worker.
///
/// - Down: the service sends each proposal, agreed step, commit, lost peer
///   and cluster error once to each node's relay, which hands it to the
///   node's workers of the current incarnation (it keeps the service as the
///   sender's node in mind: workers accept these from their relay).
///   A verdict on one of the node's own ranks also goes to its launcher
///   (`on_own_rank_lost`), which kills that worker: a host that froze or
///   was cut off past dead-after learns it was declared dead as soon as it
///   runs again, instead of its workers waiting out their own deadlines.
/// - Up: the workers' heartbeats leave as one `HeartbeatBatch` per heartbeat
///   interval, and the peer watchers' acknowledgements of a proposal as one
///   `AckBatch` once all of them acknowledged (a millisecond after the first
///   at the latest). Claims, joins, the rendezvous, save reports and Leave
///   still go to the service directly.
///
/// The service accepts a batch only from the relay registered for that node
/// by the node's registered launcher (a relay lives in the launcher's
/// process), and only for that node's ranks: the launcher already speaks
/// for its node (it reports its workers' exits). What to batch and when to
/// flush is runtime/relay_batches.hpp.

#include "actors/coordinator.hpp"

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include <chrono>
#include <functional>
#include <string>
#include <memory>

namespace grace {

using node_relay_actor = caf::typed_actor<
    caf::replies_to<relay_atom, uint32_t, uint32_t>::with<bool>, caf::reacts_to<msg<proto::Heartbeat>>,
    caf::reacts_to<msg<proto::Ack>>, caf::reacts_to<msg<proto::CheckpointAt>>, caf::reacts_to<msg<proto::Committed>>,
    caf::reacts_to<msg<proto::PeerLost>>, caf::reacts_to<msg<proto::ClusterError>>,
    caf::reacts_to<msg<proto::DeadlineUpdate>>, caf::reacts_to<msg<proto::Recover>>,
    caf::reacts_to<incarnation_atom, uint32_t, uint32_t>,
    caf::reacts_to<coord_atom, caf::actor>, caf::reacts_to<tick_atom>, caf::reacts_to<flush_atom, uint64_t>>;

struct node_relay_config {
  int32_t node = 0;   ///< the node rank (batches name it)
  int32_t nproc = 1;
  /// One of this node's ranks declared lost by the service in the relay's
  /// current incarnation (rank, incarnation, why): the launcher kills that
  /// worker. Called on the relay's thread.
  std::function<void(uint32_t, uint32_t, const std::string&)> on_own_rank_lost;
  std::chrono::milliseconds heartbeat{200};
  std::chrono::microseconds ack_flush{1000};
  std::shared_ptr<spdlog::logger> log;
};

node_relay_actor spawn_node_relay(caf::actor_system& sys, node_relay_config cfg);

/// Publishes a relay for the node's workers on 127.0.0.1 (over TLS when the
/// system has certificates, like the coordination service); the port.
result<uint16_t> publish_node_relay(caf::actor_system& sys, const node_relay_actor& relay);

/// A worker's connection to its node's relay ("127.0.0.1:port").
result<node_relay_actor> connect_node_relay(caf::actor_system& sys, const std::string& where,
                                            std::chrono::milliseconds timeout);

}  // namespace grace
