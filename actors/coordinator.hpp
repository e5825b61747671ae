#pragma once
/// The coordination service: membership, key-value store, barriers, the
/// preemption claim, step agreement, error broadcast and failure verdicts.
/// One per job; reachable across nodes through CAF's io middleman.
/// The logic lives in runtime/agreement and runtime/membership.

#include "actors/caf_types.hpp"
#include "runtime/coordination/elastic.hpp"
#include "runtime/base/error.hpp"

#include <caf/fwd.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace spdlog {
class logger;
}

namespace grace {

/// The coordination service's interface, by kind of sender. The service
/// still checks every sender at run time (coordinator_senders.cpp: a remote
/// process may send anything); these handles make our own code say who it
/// is: a worker holds a coordinator_member and cannot send a launcher's
/// message, a launcher or relay holds a coordinator_launcher.
///
/// Anyone: a notice (Claim) and an operator's status question.
using coordinator_common =
    caf::typed_actor<caf::replies_to<msg<proto::Claim>>::with<msg<proto::ClaimReply>>,
                     caf::replies_to<msg<proto::StatusQuery>>::with<msg<proto::StatusReply>>>;

/// A worker (its peer watcher and session).
using coordinator_member = coordinator_common::extend<
    caf::replies_to<msg<proto::Join>>::with<msg<proto::Welcome>>,
    caf::replies_to<msg<proto::KvSet>>::with<msg<proto::KvReply>>,
    caf::replies_to<msg<proto::KvGet>>::with<msg<proto::KvReply>>,
    caf::replies_to<msg<proto::Barrier>>::with<msg<proto::BarrierReply>>, caf::reacts_to<msg<proto::Ack>>,
    caf::reacts_to<msg<proto::Heartbeat>>, caf::reacts_to<msg<proto::CheckpointSaved>>,
    caf::reacts_to<msg<proto::ProposeFinal>>, caf::reacts_to<msg<proto::ErrorReport>>,
    caf::reacts_to<msg<proto::Recovered>>, caf::replies_to<msg<proto::Leave>>::with<bool>,
    caf::replies_to<msg<proto::CommitCheck>>::with<msg<proto::CommitCheckReply>>>;

/// Only a launcher's messages (and its node relay's, in the same process).
using coordinator_launcher_only = caf::typed_actor<
    caf::replies_to<msg<proto::LauncherRegister>>::with<msg<proto::LauncherRegisterReply>>,
    caf::reacts_to<msg<proto::WorkerExited>>,
    caf::replies_to<msg<proto::CheckpointPeers>>::with<msg<proto::CheckpointPeersReply>>,
    caf::replies_to<msg<proto::IncarnationQuery>>::with<msg<proto::IncarnationReply>>,
    caf::replies_to<msg<proto::GroupPlanRequest>>::with<msg<proto::GroupPlan>>,
    caf::replies_to<msg<proto::ResizeQuery>>::with<msg<proto::ResizeReply>>,
    caf::replies_to<msg<proto::OwedQuery>>::with<msg<proto::OwedReply>>, caf::reacts_to<msg<proto::RelayRegister>>,
    caf::reacts_to<msg<proto::HeartbeatBatch>>, caf::reacts_to<msg<proto::AckBatch>>>;

/// A launcher or a node relay.
using coordinator_launcher = coordinator_common::extend_with<coordinator_launcher_only>;

/// The service's own timers (from_self).
using coordinator_timers =
    caf::typed_actor<caf::reacts_to<rescue_atom, uint64_t>, caf::reacts_to<cutoff_atom, uint64_t>,
                     caf::reacts_to<tick_atom>, caf::reacts_to<kv_timeout_atom, uint64_t>,
                     caf::reacts_to<takeover_atom, uint64_t>>;

/// The whole service: what its host spawns and publishes.
using coordinator_actor = coordinator_member::extend_with<coordinator_launcher_only, coordinator_timers>;

/// Many fields for a reason: the service's settings and its host's hooks,
/// fixed at spawn; its state lives in coordinator_state (coordinator_parts.hpp).
struct coordinator_config {
  uint32_t world_size = 1;
  std::string run_id = "local";
  std::string token;
  uint32_t incarnation = 0;
  std::chrono::milliseconds heartbeat_check{250};
  std::chrono::milliseconds dead_after{5000};
  std::chrono::milliseconds hung_after{0};
  /// CAF's connection timeout on the members' side (system_options): how
  /// long a member takes to notice this service is gone. With dead_after
  /// and heartbeat_check it makes the verdict wait announced in Welcome.
  std::chrono::milliseconds connection_timeout{5000};
  std::shared_ptr<spdlog::logger> log;
  /// A successor service (etcd failover, runtime/coordination/leader_rules.hpp): its
  /// agreement ids start here, above every id of its predecessors.
  uint64_t first_agreement_id = 0;
  /// Take over the running group of `incarnation`: its survivors rejoin,
  /// then one just-in-time round saves them (runtime/coordination/agreement.hpp,
  /// "Takeover"). The takeover ends when every rank rejoined, or every rank
  /// but those of `lost_leader_node` rejoined, or once every rank of this
  /// node and of each launcher registered here rejoined (not before
  /// `takeover_min`, so the other launchers can register), and at the
  /// latest after `takeover_window`; ranks not back by then are lost
  /// (runtime/coordination/leader_rules.hpp, takeover_outcome).
  bool takeover = false;
  std::chrono::milliseconds takeover_window{1500};
  std::chrono::milliseconds takeover_min{200};
  /// The node whose launcher hosted the service before this one (its lease
  /// ran out); -1 when not known.
  int32_t lost_leader_node = -1;
  /// The node of the launcher hosting this service and its workers per
  /// node (a takeover expects their ranks; that node registers no launcher).
  int32_t own_node = 0;
  int32_t nproc = 0;
  /// The host's hook for failure verdicts: called (on the coordinator's
  /// actor thread) once for each member declared dead or hung - connection
  /// lost or heartbeat silence - but never for a member that left on
  /// purpose. grace-launch uses it to SIGKILL its own declared-dead worker
  /// at once (a frozen process would otherwise hold the restart until the
  /// exit timeout). `pid`: the process that joined as the rank (0 if it
  /// never joined), so a replacement started meanwhile is not the one
  /// killed. Must not block.
  std::function<void(uint32_t rank, uint32_t incarnation, uint32_t pid, const std::string& why)> on_member_lost;
  /// The host's hook for progress: called (on the actor thread) for every
  /// heartbeat accepted from a member, with its last completed step and the
  /// duration of that step. grace-launch's metrics and goodput account use
  /// it. Must not block.
  std::function<void(uint32_t rank, uint64_t completed, int64_t last_step_ns)> on_progress;
  /// The etcd backend's fence (runtime/coordination/leader_campaign.hpp, lease_holds):
  /// asked before each decision; once it says no, the service decides
  /// nothing more (a claim is answered "not won") and stops, so a host
  /// thawed after its lease ran out cannot agree a save with its own ranks
  /// in the moment before its elector deposes it. May block briefly.
  std::function<bool()> lease_holds;
  /// Elastic jobs (`grace-launch --nnodes MIN:MAX`, runtime/coordination/elastic.hpp):
  /// the service decides each incarnation's group from the launchers that
  /// ask for it (GroupPlanRequest); `world_size` is then the current
  /// plan's, and a rank's node is its slot's. Off while max_nodes is 0.
  uint32_t min_nodes = 0;
  uint32_t max_nodes = 0;
  std::chrono::milliseconds elastic_wait{30000};
  /// A successor's (takeover) plan of the group it takes over.
  std::optional<group_plan> plan;
  /// Recovery in place (runtime/coordination/agreement.hpp): on when the
  /// host can replace a lost worker (grace-launch --recovery in-place) and
  /// every member said it can re-form its collectives. A replacement that
  /// has not joined `replace_timeout` after the loss ends the recovery in
  /// the just-in-time save and restart.
  bool recovery_in_place = false;
  std::chrono::milliseconds replace_timeout{10000};
};

coordinator_actor spawn_coordinator(caf::actor_system& sys, coordinator_config cfg);

/// Publishes the coordination service on ip:port: over TLS when the system
/// was started with certificates (runtime/net/tls.hpp), plain TCP otherwise.
/// Returns the bound port.
result<uint16_t> publish_coordinator(caf::actor_system& sys, const coordinator_actor& coord, uint16_t port,
                                     const std::string& ip);
/// Closes what publish_coordinator opened (the port stops accepting).
void unpublish_coordinator(caf::actor_system& sys, const coordinator_actor& coord, uint16_t port);

/// A launcher on node > 0 registers its process as that node's launcher
/// with the job's secret and the node count it was given (`--nnodes N`:
/// min = max = N; elastic: MIN:MAX): the coordination service then accepts
/// the launcher-only messages (a forwarded notice, a worker's exit, the
/// checkpoint server) from it. The error says why it was refused (another
/// secret, a node that does not fit, another --nnodes than the job's).
status register_launcher(caf::actor_system& sys, const coordinator_launcher& coord, int32_t node_rank, int32_t nproc,
                         const std::string& token, int32_t min_nodes, int32_t max_nodes);

/// A launcher's questions to the service, one blocking request each;
/// nothing when no answer came within `timeout`.
///   ask_incarnation       its incarnation; with `set`, moved there first (the host launcher only)
///   ask_checkpoint_peers  registers `endpoint` for `node` (empty: only asks), the other nodes' servers
///   ask_resized           elastic: whether `incarnation` ended to take in a waiting node
///   ask_owed              elastic, once finished: the nodes not yet told ("1,3")
std::optional<uint32_t> ask_incarnation(caf::actor_system& sys, const coordinator_launcher& coord,
                                        std::optional<uint32_t> set, std::chrono::milliseconds timeout);
std::optional<std::vector<std::string>> ask_checkpoint_peers(caf::actor_system& sys, const coordinator_launcher& coord,
                                                             int32_t node, const std::string& endpoint,
                                                             std::chrono::milliseconds timeout);
std::optional<bool> ask_resized(caf::actor_system& sys, const coordinator_launcher& coord, uint32_t incarnation,
                                std::chrono::milliseconds timeout);
std::optional<std::string> ask_owed(caf::actor_system& sys, const coordinator_launcher& coord,
                                    std::chrono::milliseconds timeout);
/// A launcher tells the service its worker of (rank, incarnation) exited
/// with `code` (128 + signal when killed) before leaving on purpose.
void tell_worker_exited(caf::actor_system& sys, const coordinator_launcher& coord, uint32_t rank,
                        uint32_t incarnation, int32_t code);

/// Connects to a published coordinator (over TLS when the system has
/// certificates), retrying until `timeout` (it may still be starting). The
/// error names the address and CAF's reason.
result<coordinator_actor> connect_coordinator(caf::actor_system& sys, const std::string& host, uint16_t port,
                                              std::chrono::milliseconds timeout);

}  // namespace grace
