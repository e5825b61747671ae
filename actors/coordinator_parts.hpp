#pragma once
/// The coordinator actor's state and the functions its files share. Only
/// actors/coordinator*.cpp include this: the message table and the
/// agreement in coordinator.cpp, who may send what in
/// coordinator_senders.cpp, keys and barriers in coordinator_rendezvous.cpp,
/// elastic group plans in coordinator_elastic.cpp.

#include "actors/coordinator.hpp"
#include "actors/node_relay.hpp"
#include "actors/peer_watcher.hpp"
#include "runtime/coordination/agreement.hpp"
#include "runtime/coordination/elastic.hpp"
#include "runtime/coordination/membership.hpp"
#include "runtime/coordination/rendezvous_table.hpp"

#include <caf/typed_response_promise.hpp>

#include <spdlog/spdlog.h>

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace grace::coord {


using kv_promise = caf::typed_response_promise<msg<proto::KvReply>>;
using barrier_promise = caf::typed_response_promise<msg<proto::BarrierReply>>;
using plan_promise = caf::typed_response_promise<msg<proto::GroupPlan>>;

/// The job's processes as this service knows them: who may speak for whom.
struct job_processes {
  std::map<uint32_t, peer_watcher_actor> workers;  ///< members of this incarnation
  std::map<caf::actor_addr, uint32_t> ranks;       ///< their actors -> rank
  /// Node relays (actors/node_relay.hpp): node -> the relay its launcher
  /// hosts; orders for that node's ranks go to it once.
  std::map<int32_t, node_relay_actor> relays;
  int32_t relay_nproc = 0;     ///< workers per node, as the relays said
  std::set<uint32_t> relayed;  ///< members that joined through their node's relay
  std::map<uint32_t, uint32_t> pids;  ///< rank -> the process id its Join named
  /// Launchers on node > 0 that registered with the secret: their process
  /// -> (node rank, workers per node).
  std::map<caf::node_id, std::pair<int32_t, int32_t>> launchers;
};

/// This incarnation's members that are gone, by how.
struct departures {
  std::set<uint32_t> left;
  std::set<uint32_t> lost;     ///< declared lost
  std::set<uint32_t> refused;  ///< refused (restartable): their exit is expected
};

/// Messages refused because they did not come from the process that may
/// send them (from_member, from_launcher...), and the senders already
/// logged (one line per sender).
struct refusal_count {
  uint64_t count = 0;
  std::set<std::string> senders;
};

/// Keys and barriers (runtime/coordination/rendezvous_table.hpp) and the
/// requests waiting on them.
struct rendezvous_state {
  rendezvous_table table;
  std::map<uint64_t, kv_promise> get_waiters;  ///< table waiter id -> the get's promise
  std::map<uint64_t, barrier_promise> barrier_waiters;
  uint64_t next_waiter = 0;
};

/// The timer that rescues a round with a grace-period deadline.
struct rescue_timer {
  int64_t armed_for = 0;  ///< the deadline (wall ns) it is armed for
  uint64_t gen = 0;       ///< tags the armed timers; older ones are ignored
  int64_t cutoff_ns = 0;
};

/// A successor service taking over its predecessor's incarnation.
struct takeover_state {
  bool open = false;  ///< survivors of a predecessor service may rejoin
  int64_t since_ns = 0;
  uint64_t gen = 0;
};

/// Elastic jobs: who forms each incarnation's group, the launchers waiting
/// for a plan, and the incarnations ended by a growth.
struct elastic_state {
  std::unique_ptr<group_planner> planner;  ///< none: the job is not elastic
  struct waiter {
    int32_t node;
    std::string host;
    uint32_t from;
    plan_promise promise;
  };
  std::vector<waiter> waiters;
  std::set<uint32_t> grown;
  std::set<int32_t> told_finished;  ///< nodes answered `finished` (a job that ended without them)
  int64_t said_ns = 0;              ///< the last "waiting for nodes" line
};

/// Recovery in place: each member's state server, and the deadline for the
/// replacements of the round in flight.
struct in_place_state {
  std::map<uint32_t, std::string> endpoints;  ///< rank -> its state server ("address:port")
  int64_t replace_deadline_ns = 0;            ///< 0: no replacement awaited
};

struct coordinator_state {
  static inline const char* name = "coordinator";
  coordinator_config cfg;
  std::unique_ptr<agreement> agree;
  std::unique_ptr<membership> members;
  job_processes peers;
  departures gone;
  refusal_count refusals;
  rendezvous_state kv;
  rescue_timer rescue;
  takeover_state takeover;
  elastic_state elastic;
  in_place_state in_place;
  std::map<int32_t, std::string> ckpt_servers;  ///< node -> its launcher's checkpoint server
  uint32_t node_local = 0;                      ///< node-local checkpoint directories: ranks per node (the members' Join)
  int64_t last_saved_ns = 0;                    ///< snapshot + write of the newest agreement save reported
  bool fenced = false;                          ///< lease lapsed (cfg.lease_holds): decides nothing more
  std::shared_ptr<spdlog::logger> log;
};

using coordinator_ptr = coordinator_actor::stateful_pointer<coordinator_state>;

// ---- coordinator.cpp
/// The actor system's clock, not the wall clock: under the deterministic
/// test scheduler failure verdicts follow simulated time.
int64_t now_ns(coordinator_ptr self);
/// Elastic jobs: the current incarnation's group, if it is formed.
const group_plan* current_plan(coordinator_ptr self);
/// The node `rank` runs on in this incarnation (see coordinator.cpp).
std::optional<int32_t> node_of_rank(coordinator_ptr self, uint32_t rank, int32_t nproc);
/// True once this service lost its leader lease (it then stops).
bool fenced(coordinator_ptr self);
/// Carries out the agreement's actions; returns the claim reply if any.
std::optional<msg<proto::ClaimReply>> dispatch(coordinator_ptr self, const actions& acts);
/// Ends the takeover once nobody more is to be waited for.
void check_takeover(coordinator_ptr self);
/// `completed`: the member's last completed step as heard (heartbeats).
/// `kill_on_host`: tell the rank's launcher to kill it.
void member_lost(coordinator_ptr self, uint32_t rank, loss_reason reason, const std::string& why, uint64_t completed,
                 bool kill_on_host = true);

// ---- coordinator_senders.cpp: who may send what
void note_refusal(coordinator_ptr self, const std::string& what, const std::string& why);
bool from_member(coordinator_ptr self, uint32_t rank, const char* what);
bool from_member_process(coordinator_ptr self, const char* what);
bool from_launcher(coordinator_ptr self, const char* what, std::optional<int32_t> node = std::nullopt);
std::optional<int32_t> node_of(coordinator_ptr self, uint32_t rank);
bool from_self(coordinator_ptr self, const char* what);
bool from_relay(coordinator_ptr self, int32_t node, const char* what);
bool rank_of_node(coordinator_ptr self, uint32_t rank, int32_t node);
std::string on_launcher(coordinator_ptr self, int32_t node, int32_t nproc, const std::string& token, int32_t lo,
                        int32_t hi);
msg<proto::LauncherRegisterReply> on_launcher_register(coordinator_ptr self, const msg<proto::LauncherRegister>& m);
void on_relay(coordinator_ptr self, int32_t node, int32_t nproc);

// ---- coordinator_rendezvous.cpp: keys and barriers
void deliver(coordinator_ptr self, const std::vector<rendezvous_table::reply>& replies);
void fail_pending(coordinator_ptr self, const std::string& why);
msg<proto::KvReply> on_kv_set(coordinator_ptr self, msg<proto::KvSet>& m);
caf::result<msg<proto::KvReply>> on_kv_get(coordinator_ptr self, msg<proto::KvGet>& m);
caf::result<msg<proto::BarrierReply>> on_barrier(coordinator_ptr self, msg<proto::Barrier>& m);

// ---- coordinator_elastic.cpp: group plans
void advance_plan(coordinator_ptr self);
void grow_if_due(coordinator_ptr self);
caf::result<msg<proto::GroupPlan>> on_plan_request(coordinator_ptr self, msg<proto::GroupPlanRequest>& m);
std::string owed_finish(coordinator_ptr self);

}  // namespace grace::coord
