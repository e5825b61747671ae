#include "actors/coordinator.hpp"

#include "actors/node_relay.hpp"
#include "actors/peer_watcher.hpp"
#include "messages/convert.hpp"
#include "runtime/agreement.hpp"
#include "runtime/deadline.hpp"
#include "runtime/events.hpp"
#include "runtime/job_token.hpp"
#include "runtime/leadership.hpp"
#include "runtime/membership.hpp"
#include "runtime/net_address.hpp"
#include "runtime/rendezvous_table.hpp"
#include "runtime/tcp.hpp"

#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/system_messages.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>
#include <caf/typed_response_promise.hpp>
#include <caf/function_view.hpp>
#include <caf/io/middleman.hpp>
#include <caf/openssl/manager.hpp>
#include <caf/openssl/publish.hpp>
#include <caf/openssl/remote_actor.hpp>

#include <algorithm>
#include <thread>

#include <unistd.h>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <map>
#include <set>

namespace grace {

namespace {

using kv_promise = caf::typed_response_promise<msg<proto::KvReply>>;
using barrier_promise = caf::typed_response_promise<msg<proto::BarrierReply>>;
using plan_promise = caf::typed_response_promise<msg<proto::GroupPlan>>;

struct coordinator_state {
  static inline const char* name = "coordinator";
  coordinator_config cfg;
  std::unique_ptr<agreement> agree;
  std::unique_ptr<membership> members;
  std::map<uint32_t, peer_watcher_actor> workers;
  std::map<caf::actor_addr, uint32_t> ranks;
  std::map<int32_t, std::string> ckpt_servers;  ///< node -> its launcher's checkpoint server
  /// Node relays (actors/node_relay.hpp): node -> the relay its launcher
  /// hosts; orders for that node's ranks go to it once.
  std::map<int32_t, node_relay_actor> relays;
  int32_t relay_nproc = 0;       ///< workers per node, as the relays said
  std::set<uint32_t> relayed;    ///< members that joined through their node's relay
  uint32_t node_local = 0;       ///< node-local checkpoint directories: ranks per node (the members' Join)
  /// Launchers on node > 0 that registered with the secret: their process
  /// -> (node rank, workers per node).
  std::map<caf::node_id, std::pair<int32_t, int32_t>> launchers;
  std::set<uint32_t> left;
  std::set<uint32_t> lost;       ///< declared lost in this incarnation
  std::set<uint32_t> refused;    ///< refused (restartable) in this incarnation: their exit is expected
  /// Member messages refused because they did not come from the process
  /// that joined as their rank (from_member), and the senders already
  /// logged (one line per sender).
  uint64_t forged = 0;
  std::set<std::string> forged_from;
  int64_t rescue_armed_for = 0;  ///< the deadline (wall ns) the rescue timer is armed for
  uint64_t rescue_gen = 0;       ///< tags the armed timers; older ones are ignored
  int64_t rescue_cutoff_ns = 0;
  int64_t last_saved_ns = 0;                   ///< snapshot + write of the newest agreement save reported
  bool fenced = false;                         ///< lease lapsed (cfg.lease_holds): decides nothing more
  bool takeover = false;                       ///< survivors of a predecessor service may rejoin
  int64_t takeover_since_ns = 0;
  uint64_t takeover_gen = 0;
  rendezvous_table table;                      ///< keys and barriers (runtime/rendezvous_table)
  std::map<uint64_t, kv_promise> get_waiters;  ///< table waiter id -> the get's promise
  std::map<uint64_t, barrier_promise> barrier_waiters;
  uint64_t next_waiter = 0;
  /// Elastic jobs: who forms each incarnation's group, the launchers
  /// waiting for a plan, and the incarnations ended by a growth.
  std::unique_ptr<group_planner> planner;
  struct plan_waiter {
    int32_t node;
    std::string host;
    uint32_t from;
    plan_promise promise;
  };
  std::vector<plan_waiter> plan_waiters;
  std::set<uint32_t> grown;
  std::set<int32_t> told_finished;  ///< nodes answered `finished` (a job that ended without them)
  int64_t plan_said_ns = 0;  ///< the last "waiting for nodes" line
  std::shared_ptr<spdlog::logger> log;
};

using coordinator_ptr = coordinator_actor::stateful_pointer<coordinator_state>;

/// The actor system's clock, not the wall clock: under the deterministic
/// test scheduler failure verdicts follow simulated time.
int64_t now_ns(coordinator_ptr self) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(self->clock().now().time_since_epoch()).count();
}

msg<proto::KvReply> kv_reply(bool ok, const std::vector<uint8_t>* value, const std::string& err) {
  return make<proto::KvReply>([&](auto b) {
    b.setOk(ok);
    if (value) b.setValue(as_data(*value));
    b.setError(err);
  });
}

msg<proto::BarrierReply> barrier_reply(bool ok, const std::string& err) {
  return make<proto::BarrierReply>([&](auto b) {
    b.setOk(ok);
    b.setError(err);
  });
}

msg<proto::Welcome> refuse(const std::string& reason, bool restartable = false) {
  return make<proto::Welcome>([&](auto b) {
    b.setAccepted(false);
    b.setReason(reason);
    b.setRestartable(restartable);
  });
}

/// How long a member may wait for this service's decision after a failure:
/// a silent member is declared dead after dead_after (noticed at the next
/// check), and this service's own loss shows within the connection timeout.
uint32_t verdict_wait_ms(const coordinator_config& c) {
  return static_cast<uint32_t>((c.dead_after + c.heartbeat_check + c.connection_timeout).count());
}

/// A refusal only for now, naming the current incarnation: the worker exits
/// with the restart code and its launcher restarts the group in the
/// incarnation it then asks for (it may have counted on its own while away);
/// a join for current + 1 waits for the old group instead.
msg<proto::Welcome> refuse_for_now(const std::string& reason, uint32_t current) {
  return make<proto::Welcome>([&](auto b) {
    b.setAccepted(false);
    b.setReason(reason);
    b.setRestartable(true);
    b.setIncarnation(current);
  });
}

void deliver(coordinator_ptr self, const std::vector<rendezvous_table::reply>& replies);

/// "; rank 2's part from its replica" for a just-in-time round from copies.
std::string replica_ranks(const std::vector<uint32_t>& ranks) {
  std::string s;
  for (auto r : ranks) s += "; rank " + std::to_string(r) + "'s part from its replica";
  return s;
}

/// Elastic jobs: the current incarnation's group, if it is formed.
const group_plan* current_plan(coordinator_ptr self) {
  auto& st = self->state;
  if (!st.planner || !st.planner->current() || st.planner->incarnation() != st.cfg.incarnation) return nullptr;
  return &*st.planner->current();
}

void reset_incarnation(coordinator_ptr self, uint32_t incarnation) {
  auto& st = self->state;
  st.cfg.incarnation = incarnation;
  if (st.planner) {
    // The group of an elastic job forms once its plan is decided (no
    // member can join before: its launcher waits for the plan).
    st.planner->enter(incarnation, now_ns(self));
    st.plan_said_ns = now_ns(self);  // "forming the group" is said after 5 s of waiting
    auto plan = current_plan(self);
    st.cfg.world_size = plan ? plan->world_size() : 0;
  }
  st.agree = std::make_unique<agreement>(st.cfg.world_size, st.cfg.first_agreement_id);
  st.takeover = false;
  ++st.takeover_gen;
  membership_config mc;
  mc.dead_after_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(st.cfg.dead_after).count();
  mc.hung_after_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(st.cfg.hung_after).count();
  // A tick this late means this process was frozen: the members' silence
  // meanwhile is ours (a thawed service would otherwise declare everyone,
  // its own node's workers included, dead at once).
  mc.check_interval_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(st.cfg.heartbeat_check).count();
  mc.stall_after_ns = std::max(mc.dead_after_ns / 2, 3 * mc.check_interval_ns);
  st.members = std::make_unique<membership>(mc);
  for (auto& [rank, w] : st.workers) self->demonitor(w.address());
  st.workers.clear();
  st.ranks.clear();
  st.relayed.clear();
  st.left.clear();
  st.lost.clear();
  st.refused.clear();
  st.rescue_armed_for = 0;
  ++st.rescue_gen;
  deliver(self, st.table.reset("the group restarted (new incarnation)"));
  set_event_identity(launcher_rank, incarnation);
}

void arm_rescue(coordinator_ptr self);
std::optional<msg<proto::ClaimReply>> carry_out(coordinator_ptr self, const actions& acts);
void advance_plan(coordinator_ptr self);

/// The node `rank` runs on in this incarnation: its slot's in an elastic
/// job (runtime/elastic.hpp), else rank / workers per node (`nproc`).
std::optional<int32_t> node_of_rank(coordinator_ptr self, uint32_t rank, int32_t nproc) {
  auto& st = self->state;
  if (st.planner) {
    auto plan = current_plan(self);
    return plan ? plan->node_of_rank(rank) : std::nullopt;
  }
  if (nproc <= 0) return std::nullopt;
  return static_cast<int32_t>(rank / static_cast<uint32_t>(nproc));
}

/// The node whose relay carries orders for `rank`, if it has one.
std::optional<int32_t> relay_node(coordinator_ptr self, uint32_t rank) {
  auto& st = self->state;
  if (st.relays.empty() || st.relay_nproc <= 0 || !st.relayed.count(rank)) return std::nullopt;
  auto node = node_of_rank(self, rank, st.relay_nproc);
  if (!node || !st.relays.count(*node)) return std::nullopt;
  return node;
}

/// coordinator_config::lease_holds: true once this service lost its lease.
/// It then stops; its members rejoin the successor elected through etcd.
bool fenced(coordinator_ptr self) {
  auto& st = self->state;
  if (st.fenced) return true;
  if (!st.cfg.lease_holds || st.cfg.lease_holds()) return false;
  st.fenced = true;
  st.log->warn("the leader lease lapsed (this host was frozen or cut off from etcd): this service decides nothing "
               "more and stops");
  emit_event("coordinator_fenced", {{"incarnation", st.cfg.incarnation}});
  self->quit(caf::exit_reason::user_shutdown);
  return true;
}

/// Carries out the state machine's actions; returns the claim reply if any.
std::optional<msg<proto::ClaimReply>> dispatch(coordinator_ptr self, const actions& acts) {
  if (!acts.empty() && fenced(self))
    return make<proto::ClaimReply>([](auto b) {
      b.setWon(false);
      b.setHolder(launcher_rank);
    });
  auto reply = carry_out(self, acts);
  arm_rescue(self);
  return reply;
}

/// Node-local directories: each node's checkpoint server, indexed by the
/// node the agreement counts (rank / ranks per node): the node rank, or in
/// an elastic job the slot ("" where unknown).
std::vector<std::string> servers_by_slot(coordinator_ptr self) {
  auto& st = self->state;
  std::vector<std::string> out;
  if (auto plan = current_plan(self)) {
    for (auto node : plan->nodes) {
      auto it = st.ckpt_servers.find(node);
      out.push_back(it == st.ckpt_servers.end() ? std::string() : it->second);
    }
    return out;
  }
  if (st.ckpt_servers.empty() || st.ckpt_servers.rbegin()->first < 0) return out;
  out.resize(static_cast<size_t>(st.ckpt_servers.rbegin()->first) + 1);
  for (auto& [node, ep] : st.ckpt_servers)
    if (node >= 0) out[static_cast<size_t>(node)] = ep;
  return out;
}

std::optional<msg<proto::ClaimReply>> carry_out(coordinator_ptr self, const actions& acts) {
  auto& st = self->state;
  std::optional<msg<proto::ClaimReply>> reply;
  auto to_all = [&](auto m) {
    std::set<int32_t> nodes;  // once per node with a relay, directly to the others; returns those nodes
    for (auto r : st.agree->live()) {
      if (auto n = relay_node(self, r)) {
        nodes.insert(*n);
        continue;
      }
      auto it = st.workers.find(r);
      if (it != st.workers.end()) self->send(it->second, m);
    }
    for (auto n : nodes) self->send(st.relays[n], m);
    return nodes;
  };
  auto to_one = [&](uint32_t rank, auto m) {  // directly, also to a relayed member
    auto it = st.workers.find(rank);
    if (it != st.workers.end()) self->send(it->second, std::move(m));
  };
  for (auto& a : acts) {
    using ty = agreement_action::type;
    // Proposals and agreements leave before their log line and event (a
    // write(2) each): the members wait for them.
    switch (a.what) {
      case ty::claim_reply:
        reply = make<proto::ClaimReply>([&](auto b) {
          b.setWon(a.won);
          b.setHolder(a.holder);
          b.setAgreementId(a.id);
        });
        break;
      case ty::propose:
      case ty::agreed: {
        bool agreed = a.what == ty::agreed;
        to_all(make<proto::CheckpointAt>([&](auto b) {
          b.setAgreementId(a.id);
          b.setStep(a.step);
          b.setKind(to_wire(a.kind));
          b.setAgreed(agreed);
          b.setSaver(a.saver);
          b.setDeadlineNs(a.deadline_ns);
          b.setExitAfter(a.exit_after);
          b.setAllSave(a.all_save);
          b.setFromKept(a.from_kept);
          auto fr = b.initFromReplica(static_cast<unsigned>(a.from_replica.size()));
          for (unsigned i = 0; i < a.from_replica.size(); ++i) fr.set(i, a.from_replica[i]);
        }));
        st.log->info(
            "{} {} checkpoint #{} at step {}{}", agreed ? "agreed" : "proposing", to_string(a.kind), a.id, a.step,
            agreed ? fmt::format(" (saver rank {}, {}{})", a.saver, a.exit_after ? "then exit" : "then keep training",
                                 a.from_kept ? ", from kept copies" + replica_ranks(a.from_replica) : std::string())
                   : std::string(" or later"));
        emit_event(agreed ? "agreed" : "proposed",
                   {{"id", a.id}, {"step", a.step}, {"kind", to_string(a.kind)}, {"saver", a.saver}});
        break;
      }
      case ty::committed:
        // Logged first: not on the latency path, and a worker hosting the
        // coordinator may _Exit as soon as it sees the commit.
        st.log->info("checkpoint #{} at step {} committed{}", a.id, a.step,
                     a.exit_after ? ": workers exit for restart" : ": training continues");
        emit_event("committed", {{"id", a.id}, {"step", a.step}});
        to_all(make<proto::Committed>([&](auto b) {
          b.setAgreementId(a.id);
          b.setStep(a.step);
          b.setExitAfter(a.exit_after);
        }));
        break;
      case ty::peer_lost: {
        st.log->warn("rank {} lost at step {}: {}", a.rank, a.step, a.message);
        emit_event("peer_lost",
                   {{"lost_rank", a.rank}, {"step", a.step}, {"why", a.message}, {"verdict", to_string(a.reason)}});
        auto m = make<proto::PeerLost>([&](auto b) {
          b.setRank(a.rank);
          b.setLastStep(a.step);
          b.setDetail(a.message);
          b.setReason(to_wire(a.reason));
          b.setIncarnation(st.cfg.incarnation);
        });
        auto reached = to_all(m);
        // The lost rank's own node hears it even with no live member left
        // there (a frozen or cut-off host that comes back): its launcher
        // stops that worker at once instead of after the worker's waits.
        if (auto n = relay_node(self, a.rank); n && !reached.count(*n)) self->send(st.relays[*n], m);
        break;
      }
      case ty::cluster_error:
        st.log->error("cluster error from rank {} at step {}: {}", a.rank, a.step, a.message);
        emit_event("cluster_error", {{"origin", a.rank}, {"step", a.step}, {"message", a.message}});
        to_all(make<proto::ClusterError>([&](auto b) {
          b.setOriginRank(a.rank);
          b.setStep(a.step);
          b.setMessage(a.message);
        }));
        break;
      case ty::commit_parts:
        st.log->info("every part of checkpoint #{} at step {} is durable: rank {} commits them", a.id, a.step, a.rank);
        emit_event("parts_durable", {{"id", a.id}, {"step", a.step}, {"committer", a.rank}});
        to_one(a.rank, make<proto::CommitParts>([&](auto b) {
                 b.setAgreementId(a.id);
                 b.setStep(a.step);
                 if (!st.node_local || st.ckpt_servers.empty()) return;
                 auto servers = servers_by_slot(self);
                 auto sv = b.initServers(static_cast<unsigned>(servers.size()));
                 for (unsigned i = 0; i < servers.size(); ++i) sv.set(i, servers[i]);
               }));
        break;
      case ty::deadline_update:
        to_one(a.rank, make<proto::DeadlineUpdate>([&](auto b) {
                 b.setAgreementId(a.id);
                 b.setDeadlineNs(a.deadline_ns);
               }));
        break;
    }
  }
  return reply;
}

/// Keeps a rescue timer armed while a round with a grace-period deadline is
/// unsettled (see runtime/agreement.hpp, "A save that respects its deadline").
void arm_rescue(coordinator_ptr self) {
  auto& st = self->state;
  if (!st.agree->needs_rescue()) {
    st.rescue_armed_for = 0;
    return;
  }
  const int64_t deadline = st.agree->deadline_ns();
  if (st.rescue_armed_for == deadline) return;
  st.rescue_armed_for = deadline;
  auto t = rescue_margins(st.members->slowest_step_ns(), std::max(st.members->slowest_save_ns(), st.last_saved_ns));
  st.rescue_cutoff_ns = t.cutoff_ns;
  const int64_t delay = std::max<int64_t>(0, deadline - t.rescue_ns - wall_ns());
  st.log->info("deadline in {} ms: a round still open {} ms before it is rescued (cutoff {} ms later)",
               (deadline - wall_ns()) / 1000000, t.rescue_ns / 1000000, t.cutoff_ns / 1000000);
  self->delayed_send(self, std::chrono::nanoseconds(delay), rescue_atom::value, ++st.rescue_gen);
}

/// Tells the host (grace-launch) about a failure verdict.
void report_to_host(coordinator_ptr self, uint32_t rank, const std::string& why) {
  auto& st = self->state;
  if (!st.cfg.on_member_lost) return;
  try {
    st.cfg.on_member_lost(rank, st.cfg.incarnation, why);
  } catch (const std::exception& e) {
    st.log->error("member-lost hook threw: {}", e.what());
  }
}

/// Answers table waiters (gets and barriers) by their ids.
void deliver(coordinator_ptr self, const std::vector<rendezvous_table::reply>& replies) {
  if (!replies.empty() && fenced(self)) return;
  auto& st = self->state;
  for (auto& r : replies) {
    if (auto it = st.get_waiters.find(r.waiter); it != st.get_waiters.end()) {
      it->second.deliver(kv_reply(r.ok, r.ok ? &r.value : nullptr, r.error));
      st.get_waiters.erase(it);
    } else if (auto bt = st.barrier_waiters.find(r.waiter); bt != st.barrier_waiters.end()) {
      bt->second.deliver(barrier_reply(r.ok, r.error));
      st.barrier_waiters.erase(bt);
    }
  }
}

/// A lost member breaks this incarnation's group: rendezvous keys and
/// barriers still pending can never complete, so they fail now rather than
/// at their timeouts (the members then wait for the just-in-time round).
void fail_pending(coordinator_ptr self, const std::string& why) { deliver(self, self->state.table.break_group(why)); }

/// `completed`: the member's last completed step as heard (heartbeats).
/// `kill_on_host`: tell the rank's launcher to kill it (not for a member
/// refused at its join, which exits with the restart code by itself).
void member_lost(coordinator_ptr self, uint32_t rank, loss_reason reason, const std::string& why, uint64_t completed,
                 bool kill_on_host = true) {
  auto& st = self->state;
  if (st.left.count(rank) || st.lost.count(rank)) return;
  st.lost.insert(rank);
  st.members->remove(rank);
  auto it = st.workers.find(rank);
  if (it != st.workers.end()) {
    st.ranks.erase(caf::actor_cast<caf::actor_addr>(it->second));
    self->demonitor(it->second.address());
  }
  if (kill_on_host) report_to_host(self, rank, why);
  dispatch(self, st.agree->on_member_lost(rank, completed, reason, why));
  fail_pending(self, "rank " + std::to_string(rank) + " lost");
}

/// Logs a refused message or join once per sending process (an attacker or
/// a misconfigured node may send thousands); every one is counted.
void note_refusal(coordinator_ptr self, const std::string& what, const std::string& why) {
  auto& st = self->state;
  ++st.forged;
  auto sender = self->current_sender();
  auto who = sender ? "node " + caf::to_string(sender->node()) : std::string("an anonymous sender");
  if (st.forged_from.insert(who).second)
    st.log->warn("refused {} from {}: {} (further refusals from it are counted, not logged)", what, who, why);
}

/// A survivor's rejoin after the service moved: only while this service
/// takes over its incarnation, once per rank.
std::optional<msg<proto::Welcome>> rejoin_refusal(coordinator_ptr self, proto::Join::Reader j) {
  auto& st = self->state;
  const auto inc = std::to_string(j.getIncarnation());
  if (!st.takeover || j.getIncarnation() != st.cfg.incarnation)
    return refuse_for_now("no takeover of incarnation " + inc + " here (current " +
                              std::to_string(st.cfg.incarnation) + ", takeover " + (st.takeover ? "open" : "closed") +
                              ")",
                          st.cfg.incarnation);
  if (st.workers.count(j.getRank()) || st.lost.count(j.getRank()))
    return refuse_for_now("rank " + std::to_string(j.getRank()) + " already rejoined or lost in incarnation " + inc,
                          st.cfg.incarnation);
  return std::nullopt;
}

/// An elastic job's join goes only into the group of the current
/// incarnation, once it formed, with that group's world size; anything
/// else is refused for now (a worker of another group restarts).
std::optional<msg<proto::Welcome>> elastic_join_refusal(coordinator_ptr self, proto::Join::Reader j) {
  auto& st = self->state;
  const auto inc = std::to_string(st.cfg.incarnation);
  if (j.getIncarnation() != st.cfg.incarnation)
    return refuse_for_now("incarnation " + std::to_string(j.getIncarnation()) + " != current " + inc,
                          st.cfg.incarnation);
  if (!current_plan(self)) return refuse_for_now("the group of incarnation " + inc + " is not formed yet", st.cfg.incarnation);
  if (j.getWorldSize() != st.cfg.world_size)
    return refuse_for_now("world size " + std::to_string(j.getWorldSize()) + " != the " +
                              std::to_string(st.cfg.world_size) + " of incarnation " + inc + "'s group",
                          st.cfg.incarnation);
  return std::nullopt;
}

/// Every check a join must pass before it becomes a member; the refusal,
/// if any. May advance the incarnation (the first join of the next group).
std::optional<msg<proto::Welcome>> join_refusal(coordinator_ptr self, proto::Join::Reader j) {
  auto& st = self->state;
  if (j.getProtocolVersion() != proto::PROTOCOL_VERSION)
    return refuse("protocol version " + std::to_string(j.getProtocolVersion()) + " != coordinator's " +
                  std::to_string(proto::PROTOCOL_VERSION));
  if (!constant_time_equal(str(j.getToken()), st.cfg.token)) return refuse("wrong job token");
  if (st.planner)
    if (auto why = elastic_join_refusal(self, j)) return why;
  if (j.getWorldSize() != st.cfg.world_size)
    return refuse("world size " + std::to_string(j.getWorldSize()) + " != job's " + std::to_string(st.cfg.world_size));
  if (j.getRank() >= st.cfg.world_size) return refuse("rank " + std::to_string(j.getRank()) + " out of range");
  if (str(j.getRunId()) != st.cfg.run_id)
    return refuse("run id '" + str(j.getRunId()) + "' != job's '" + st.cfg.run_id + "'");
  if (j.getRejoin()) return rejoin_refusal(self, j);
  // Launchers on other nodes restart their groups on their own: the first
  // join of a newer incarnation, once the old group is gone, advances it.
  if (j.getIncarnation() == st.cfg.incarnation + 1 && !st.workers.empty() && st.agree->live().empty()) {
    st.log->info("advancing to incarnation {} (first join of the new group)", j.getIncarnation());
    reset_incarnation(self, j.getIncarnation());
  }
  if (j.getIncarnation() != st.cfg.incarnation)
    return refuse_for_now(
        "incarnation " + std::to_string(j.getIncarnation()) + " != current " + std::to_string(st.cfg.incarnation),
        st.cfg.incarnation);
  auto rank = j.getRank();
  if (st.workers.count(rank) || st.left.count(rank))
    return refuse_for_now(
        "duplicate rank " + std::to_string(rank) + " in incarnation " + std::to_string(st.cfg.incarnation),
        st.cfg.incarnation);
  if (!st.workers.empty() && j.getNodeLocal() != st.node_local)
    return refuse("rank " + std::to_string(rank) + " has " +
                  (j.getNodeLocal() ? "node-local checkpoint directories" : "a shared checkpoint directory") +
                  ", the members joined before " + (st.node_local ? "node-local ones" : "a shared one") +
                  ": every member of a job must see the same layout");
  if (!st.workers.empty() && j.getSharded() != st.agree->parts())
    return refuse(std::string("rank ") + std::to_string(rank) + (j.getSharded() ? " holds" : " does not hold") +
                  " sharded state, the members joined before " + (j.getSharded() ? "do not" : "do") +
                  ": every member of a job must register the same tensors");
  if (auto why = st.agree->join_refusal(rank, j.getCompletedStep())) {
    st.log->warn("rank {} refused: {}", rank, *why);
    st.refused.insert(rank);
    if (st.agree->refusal_ends_group(j.getCompletedStep()))
      member_lost(self, rank, loss_reason::dead, "not level: " + *why, j.getCompletedStep(), false);
    return refuse_for_now(*why, st.cfg.incarnation);
  }
  return std::nullopt;
}

/// Ends the takeover: ranks that did not rejoin are lost, and the
/// survivors' just-in-time round starts (runtime/agreement.hpp, "Takeover").
void end_takeover(coordinator_ptr self, const std::string& why) {
  auto& st = self->state;
  st.takeover = false;
  ++st.takeover_gen;
  const auto waited_ms = (now_ns(self) - st.takeover_since_ns) / 1000000;
  st.log->info("takeover of incarnation {} ends ({}): {}/{} ranks rejoined after {} ms", st.cfg.incarnation, why,
               st.workers.size(), st.cfg.world_size, waited_ms);
  emit_event("takeover_end", {{"rejoined", st.workers.size()}, {"why", why}, {"waited_ms", waited_ms}});
  for (uint32_t r = 0; r < st.cfg.world_size; ++r)
    if (!st.workers.count(r))
      member_lost(self, r, loss_reason::dead,
                  "dead: did not rejoin the successor coordination service within " + std::to_string(waited_ms) +
                      " ms",
                  0);
  dispatch(self, st.agree->end_takeover());
}

/// After each rejoin, registration and takeover timer: ends the takeover
/// once nobody more is to be waited for (runtime/leadership.hpp,
/// takeover_outcome).
void check_takeover(coordinator_ptr self) {
  auto& st = self->state;
  if (!st.takeover) return;
  takeover_progress p;
  p.world_size = st.cfg.world_size;
  p.nproc = static_cast<uint32_t>(std::max(st.cfg.nproc, 0));
  // The rule counts nodes as rank / nproc: an elastic group's slots.
  auto place = [&](int32_t node) -> int32_t {
    auto plan = current_plan(self);
    if (!plan) return node;
    auto slot = plan->slot_of(node);
    return slot ? static_cast<int32_t>(*slot) : -1;
  };
  p.own_node = place(st.cfg.own_node);
  p.lost_leader = st.cfg.lost_leader_node >= 0 ? place(st.cfg.lost_leader_node) : -1;
  for (auto& [node_id, l] : st.launchers)
    if (auto n = place(l.first); n >= 0) p.registered.insert(n);
  p.rejoined_count = static_cast<uint32_t>(st.workers.size());
  p.age_ns = now_ns(self) - st.takeover_since_ns;
  p.min_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(st.cfg.takeover_min).count();
  p.window_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(st.cfg.takeover_window).count();
  const auto end = takeover_outcome(p, [&](uint32_t r) { return st.workers.count(r) > 0; });
  if (end != takeover_end::wait) end_takeover(self, to_string(end));
}

msg<proto::Welcome> on_join(coordinator_ptr self, msg<proto::Join>& m) {
  auto& st = self->state;
  auto r = decode(m);
  if (!r) return refuse(r.err().message);
  auto j = r->get();
  if (auto refusal = join_refusal(self, j)) {
    // Refusals only for now (a stale incarnation) are routine during restarts.
    if (auto w = decode(*refusal); w && !w->get().getRestartable())
      note_refusal(self, "a join as rank " + std::to_string(j.getRank()), str(w->get().getReason()));
    return *refusal;
  }
  auto sender = self->current_sender();
  if (!sender) return refuse("join without a sender to reply to");
  auto rank = j.getRank();
  auto handle = caf::actor_cast<peer_watcher_actor>(sender);
  if (st.workers.empty()) {
    st.agree->set_parts(j.getSharded());
    st.node_local = j.getNodeLocal();
    st.agree->set_node_local(st.node_local);
  }
  st.workers.emplace(rank, handle);
  st.ranks.emplace(caf::actor_cast<caf::actor_addr>(sender), rank);
  if (j.getRelayed()) st.relayed.insert(rank);
  self->monitor(handle);
  st.members->add(rank, now_ns(self), j.getCompletedStep());
  st.log->info("rank {} joined (pid {} on {}, step {}), {}/{} members", rank, j.getPid(), str(j.getHost()),
               j.getCompletedStep(), st.workers.size(), st.cfg.world_size);
  auto prefix = st.cfg.run_id + "/" + std::to_string(st.cfg.incarnation) + "/";
  auto welcome = make<proto::Welcome>([&](auto b) {
    b.setAccepted(true);
    b.setRank(rank);
    b.setWorldSize(st.cfg.world_size);
    b.setRunId(st.cfg.run_id);
    b.setIncarnation(st.cfg.incarnation);
    b.setRendezvousPrefix(prefix);
    b.setVerdictWaitMs(verdict_wait_ms(st.cfg));
  });
  if (j.getRejoin()) {
    dispatch(self, st.agree->on_rejoin(rank, j.getCompletedStep()));
    emit_event("rejoined", {{"rejoined_rank", rank}, {"step", j.getCompletedStep()}});
    check_takeover(self);
  } else {
    dispatch(self, st.agree->on_join(rank, j.getCompletedStep()));
  }
  return welcome;
}

/// A message naming a member's rank is accepted only from the process (CAF
/// node) that joined as that rank in this incarnation: a process that can
/// reach the port without having joined, or a worker of an older
/// incarnation, cannot speak for a member. A refusal changes nothing; it is
/// counted, and logged once per sender.
bool from_member(coordinator_ptr self, uint32_t rank, const char* what) {
  auto& st = self->state;
  auto it = st.workers.find(rank);
  auto sender = self->current_sender();
  if (it != st.workers.end() && sender && sender->node() == it->second.node()) return true;
  note_refusal(self, std::string(what) + " for rank " + std::to_string(rank),
         "not the process that joined as rank " + std::to_string(rank) + " in incarnation " +
             std::to_string(st.cfg.incarnation));
  return false;
}

/// The committer's fence (proto::CommitCheck): yes only to the process that
/// joined as the rank, in this incarnation, while nobody declared it lost.
/// A thawed or reconnected committer that still holds an old commit order
/// hears no and leaves the parts uncommitted (their round is settled
/// without it).
msg<proto::CommitCheckReply> on_commit_check(coordinator_ptr self, msg<proto::CommitCheck>& m) {
  auto& st = self->state;
  auto reply = [](bool ok, const std::string& why) {
    return make<proto::CommitCheckReply>([&](auto b) {
      b.setOk(ok);
      b.setReason(why);
    });
  };
  auto r = decode(m);
  if (!r) return reply(false, r.err().message);
  auto c = r->get();
  const auto rank = c.getRank();
  if (c.getIncarnation() != st.cfg.incarnation)
    return reply(false, "incarnation " + std::to_string(c.getIncarnation()) + " is over (current " +
                            std::to_string(st.cfg.incarnation) + ")");
  if (st.lost.count(rank) || st.left.count(rank))
    return reply(false, "rank " + std::to_string(rank) + " was declared lost in incarnation " +
                            std::to_string(st.cfg.incarnation));
  if (!from_member(self, rank, "a commit check")) return reply(false, "not the member that joined as this rank");
  if (fenced(self)) return reply(false, "this coordination service lost its leader lease");
  return reply(true, "");
}

/// Key-value and barrier requests serve the collectives' rendezvous of
/// joined members: from a process where no member of this incarnation runs
/// (or an anonymous sender) they are refused, so nobody outside the job can
/// plant or read the addresses the ranks connect to.
bool from_member_process(coordinator_ptr self, const char* what) {
  auto& st = self->state;
  if (auto sender = self->current_sender())
    for (auto& [rank, w] : st.workers)
      if (w.node() == sender->node()) return true;
  note_refusal(self, what, "no member of incarnation " + std::to_string(st.cfg.incarnation) + " runs there");
  return false;
}

/// Messages only a launcher sends (a forwarded notice, a worker's exit, the
/// incarnation, the checkpoint server) are accepted from the coordinator's
/// own process (node 0's launcher, or the chief hosting it in-process) and
/// from a process registered as the launcher of a node; `node`, when given,
/// must be the registered launcher's own node.
bool from_launcher(coordinator_ptr self, const char* what, std::optional<int32_t> node = std::nullopt) {
  auto& st = self->state;
  auto sender = self->current_sender();
  if (sender && sender->node() == self->node()) return true;
  if (sender)
    if (auto it = st.launchers.find(sender->node()); it != st.launchers.end()) {
      if (!node || *node == it->second.first) return true;
      note_refusal(self, what, "the launcher of node " + std::to_string(it->second.first) + " spoke for node " +
                                   std::to_string(*node));
      return false;
    }
  note_refusal(self, what, "not a launcher of the job");
  return false;
}

/// The node a rank runs on, as the registered launcher of the sender says
/// (nothing for the coordinator's own process, which is trusted).
std::optional<int32_t> node_of(coordinator_ptr self, uint32_t rank) {
  auto sender = self->current_sender();
  if (!sender) return std::nullopt;
  auto it = self->state.launchers.find(sender->node());
  if (it == self->state.launchers.end() || it->second.second <= 0) return std::nullopt;
  return node_of_rank(self, rank, it->second.second);
}

/// Timers are the actor's own delayed messages; from anyone else they are
/// refused (a forged tick would multiply the timers, a forged rescue would
/// start one).
bool from_self(coordinator_ptr self, const char* what) {
  if (self->current_sender() == self->ctrl()) return true;
  note_refusal(self, what, "timers come from the coordination service itself");
  return false;
}

/// A launcher or relay of `node` with `nproc` workers belongs to this job:
/// its ranks lie inside the world, or (elastic) it is one of max_nodes
/// nodes of the job's workers per node.
bool node_fits(coordinator_ptr self, int32_t node, int32_t nproc) {
  auto& st = self->state;
  if (node < 0 || nproc <= 0) return false;
  if (st.planner) return static_cast<uint32_t>(node) < st.cfg.max_nodes && nproc == st.cfg.nproc;
  return static_cast<uint64_t>(node) * static_cast<uint64_t>(nproc) < st.cfg.world_size;
}

/// "3" or "2:4", as --nnodes spells it.
std::string node_count(int64_t lo, int64_t hi) {
  return lo == hi ? std::to_string(hi) : std::to_string(lo) + ":" + std::to_string(hi);
}

/// Why a launcher told `--nnodes lo:hi` does not belong to this job's node
/// count, if it does not.
std::optional<std::string> other_node_count(coordinator_ptr self, int32_t lo, int32_t hi) {
  auto& st = self->state;
  int64_t job_lo = st.cfg.min_nodes, job_hi = st.cfg.max_nodes;
  if (!st.planner) job_lo = job_hi = st.cfg.nproc > 0 ? st.cfg.world_size / static_cast<uint32_t>(st.cfg.nproc) : hi;
  if (lo == job_lo && hi == job_hi) return std::nullopt;
  return "it was given --nnodes " + node_count(lo, hi) + ", the job's is --nnodes " + node_count(job_lo, job_hi) +
         ": give every launcher the same --nnodes";
}

std::string on_launcher(coordinator_ptr self, int32_t node, int32_t nproc, const std::string& token, int32_t lo,
                        int32_t hi) {
  auto& st = self->state;
  auto sender = self->current_sender();
  std::string why;
  if (!constant_time_equal(token, st.cfg.token))
    why = "wrong job token";
  else if (!sender)
    why = "no sender";
  else if (auto other = other_node_count(self, lo, hi))
    why = *other;
  else if (node < 0 || node == st.cfg.own_node || !node_fits(self, node, nproc))
    why = "node " + std::to_string(node) + " with " + std::to_string(nproc) + " workers does not fit " +
          (st.planner ? "an elastic job of at most " + std::to_string(st.cfg.max_nodes) + " nodes of " +
                            std::to_string(st.cfg.nproc) + " workers"
                      : "a world of " + std::to_string(st.cfg.world_size));
  if (!why.empty()) {
    note_refusal(self, "a launcher registration for node " + std::to_string(node), why);
    return why;
  }
  for (auto it = st.launchers.begin(); it != st.launchers.end();)  // a restarted launcher replaces its old process
    it = it->second.first == node && it->first != sender->node() ? st.launchers.erase(it) : std::next(it);
  if (st.launchers.emplace(sender->node(), std::make_pair(node, nproc)).second)
    st.log->info("launcher of node {} registered", node);
  check_takeover(self);
  return {};
}

msg<proto::ClaimReply> on_claim(coordinator_ptr self, msg<proto::Claim>& m) {
  auto& st = self->state;
  auto r = decode(m);
  if (!r)
    return make<proto::ClaimReply>([&](auto b) {
      b.setWon(false);
      b.setHolder(launcher_rank);
    });
  auto n = r->get().getNotice();
  // The launchers' own notices (forwarded SIGTERM) carry launcher_rank.
  if (n.getRank() == launcher_rank ? !from_launcher(self, "a launcher's notice")
                                   : !from_member(self, n.getRank(), "a claim"))
    return make<proto::ClaimReply>([&](auto b) {
      b.setWon(false);
      b.setHolder(launcher_rank);
    });
  emit_event("claim", {{"by", n.getRank()},
                       {"source", static_cast<int>(n.getSource())},
                       {"deadline_ns", n.getDeadlineNs()},
                       {"detail", str(n.getDetail())}});
  auto reply = *dispatch(self, st.agree->on_claim(n.getRank(), r->get().getStartedStep(), n.getDeadlineNs()));
  auto rr = decode(reply);
  if (rr && rr->get().getWon())
    st.log->info("notice from {} ({}) claimed: {}",
                 n.getRank() == launcher_rank ? std::string("launcher") : "rank " + std::to_string(n.getRank()),
                 str(n.getDetail()), n.getDeadlineNs() ? "with a deadline" : "no grace period");
  else
    st.log->info("notice from rank {} deferred to the holder", n.getRank());
  return reply;
}

msg<proto::KvReply> on_kv_set(coordinator_ptr self, msg<proto::KvSet>& m) {
  if (!from_member_process(self, "a key-value set")) return kv_reply(false, nullptr, "refused: not a member");
  auto r = decode(m);
  if (!r) return kv_reply(false, nullptr, r.err().message);
  auto res = self->state.table.set(str(r->get().getKey()), bytes(r->get().getValue()));
  deliver(self, res.woken);
  return kv_reply(res.ok, nullptr, res.error);
}

/// Answered at once (found, or failed), or when the key is set, the group
/// breaks or the get's own timeout passes.
caf::result<msg<proto::KvReply>> on_kv_get(coordinator_ptr self, msg<proto::KvGet>& m) {
  auto& st = self->state;
  if (!from_member_process(self, "a key-value get")) return kv_reply(false, nullptr, "refused: not a member");
  auto r = decode(m);
  if (!r) return kv_reply(false, nullptr, r.err().message);
  auto timeout = r->get().getTimeoutMs();
  auto id = st.next_waiter++;
  auto res = st.table.get(str(r->get().getKey()), id, timeout > 0);
  using ty = rendezvous_table::get_result::type;
  if (res.what == ty::found) return kv_reply(true, &res.value, "");
  if (res.what == ty::failed) return kv_reply(false, nullptr, res.error);
  auto rp = self->make_response_promise<msg<proto::KvReply>>();
  st.get_waiters.emplace(id, rp);
  self->delayed_send(self, std::chrono::milliseconds(timeout), kv_timeout_atom::value, id);
  return rp;
}

caf::result<msg<proto::BarrierReply>> on_barrier(coordinator_ptr self, msg<proto::Barrier>& m) {
  auto& st = self->state;
  auto r = decode(m);
  if (!r) return barrier_reply(false, r.err().message);
  if (!from_member(self, r->get().getRank(), "a barrier")) return barrier_reply(false, "refused: not that member");
  auto id = st.next_waiter++;
  auto res = st.table.arrive(str(r->get().getName()), r->get().getRank(), r->get().getCount(), id);
  if (!res.pending) return barrier_reply(res.ok, res.error);
  auto rp = self->make_response_promise<msg<proto::BarrierReply>>();
  st.barrier_waiters.emplace(id, rp);
  deliver(self, res.released);  // may include this arrival (the last one)
  return rp;
}

void on_saved(coordinator_ptr self, msg<proto::CheckpointSaved>& m) {
  auto r = decode(m);
  if (!r) return;
  auto s = r->get();
  if (!from_member(self, s.getRank(), "a save report")) return;
  emit_event("saved", {{"by", s.getRank()},
                       {"step", s.getStep()},
                       {"part", s.getPart()},
                       {"ok", s.getOk()},
                       {"bytes", s.getBytes()},
                       {"snapshot_ns", s.getSnapshotNs()},
                       {"write_ns", s.getWriteNs()}});
  if (s.getOk()) self->state.last_saved_ns = s.getSnapshotNs() + s.getWriteNs();
  dispatch(self,
           self->state.agree->on_saved(s.getRank(), s.getAgreementId(), s.getStep(), s.getOk(), str(s.getError()),
                                       s.getPart()));
}

void on_error_report(coordinator_ptr self, msg<proto::ErrorReport>& m) {
  auto r = decode(m);
  if (!r) return;
  auto e = r->get();
  if (!from_member(self, e.getRank(), "an error report")) return;
  dispatch(self, self->state.agree->on_error(e.getRank(), e.getStep(),
                                             "rank " + std::to_string(e.getRank()) + " at step " +
                                                 std::to_string(e.getStep()) + ": " + str(e.getMessage())));
}

/// A request: the worker waits for the answer before it exits, so its
/// connection loss that follows is never taken for a failure.
bool on_leave(coordinator_ptr self, msg<proto::Leave>& m) {
  auto& st = self->state;
  auto r = decode(m);
  if (!r) return false;
  auto rank = r->get().getRank();
  if (!st.workers.count(rank) || !from_member(self, rank, "a leave")) return false;
  st.left.insert(rank);
  st.members->remove(rank);
  dispatch(self, st.agree->on_leave(rank, r->get().getExitCode()));
  if (r->get().getExitCode() != 0) fail_pending(self, "rank " + std::to_string(rank) + " left");
  return true;
}

/// The launcher saw a worker process exit before it left on purpose: a
/// verdict as certain as a lost connection, and sometimes the only one (a
/// worker that died before it joined).
void on_exited(coordinator_ptr self, uint32_t rank, uint32_t incarnation, int32_t code) {
  auto& st = self->state;
  // An exit of an earlier group changes nothing (in an elastic job its rank
  // may be another node's now).
  if (incarnation != st.cfg.incarnation || rank >= st.cfg.world_size) return;
  if (!from_launcher(self, "a worker-exit report", node_of(self, rank))) return;
  if (st.refused.count(rank) && !st.workers.count(rank)) return;  // told to restart: its exit is expected
  member_lost(self, rank, loss_reason::dead,
              code > 128 ? "dead: killed by signal " + std::to_string(code - 128)
                         : "dead: exited with code " + std::to_string(code) + " without leaving",
              st.members->completed(rank));
}

void on_rescue(coordinator_ptr self, uint64_t gen) {
  auto& st = self->state;
  if (gen != st.rescue_gen) return;
  // Members silent for a third of dead-after are most likely frozen: the
  // rescue does not wait for them (the cutoff would, briefly).
  st.members->observe(now_ns(self));  // a timer fired late by a freeze of this process
  auto silent = st.members->silent(now_ns(self),
                                   std::chrono::duration_cast<std::chrono::nanoseconds>(st.cfg.dead_after).count() / 3);
  auto acts = st.agree->on_rescue(silent);
  if (!acts.empty()) {
    st.log->warn("deadline near and the round is not committed: rescuing it with a just-in-time save");
    emit_event("rescue", {{"deadline_ns", st.agree->deadline_ns()}});
  }
  dispatch(self, acts);
  self->delayed_send(self, std::chrono::nanoseconds(st.rescue_cutoff_ns), cutoff_atom::value, gen);
}

void on_cutoff(coordinator_ptr self, uint64_t gen) {
  auto& st = self->state;
  if (gen != st.rescue_gen) return;
  auto acts = st.agree->on_cutoff();
  if (!acts.empty()) st.log->warn("rescue cutoff: agreeing among the acknowledgements received");
  dispatch(self, acts);
}

/// Heartbeat silence and hangs, checked every heartbeat_check.
void on_tick(coordinator_ptr self) {
  auto& st = self->state;
  auto verdicts = st.members->check(now_ns(self));
  if (auto stall = st.members->last_stall_ns())
    st.log->warn("this coordination service did not run for {} ms (its process stalled): that time is not counted "
                 "as the members' heartbeat silence",
                 stall / 1'000'000);
  for (auto& v : verdicts) {
    if (v.what == verdict::slow) {
      st.log->warn("rank {} is slow: {}", v.rank, v.detail);
      emit_event("slow", {{"slow_rank", v.rank}, {"detail", v.detail}});
      continue;
    }
    std::string why = std::string(to_string(v.what)) + ": " + v.detail;
    member_lost(self, v.rank, v.what == verdict::hung ? loss_reason::hung : loss_reason::dead, why, v.completed);
  }
  advance_plan(self);  // the elastic wait, and a growth claim that did not win yet
  self->delayed_send(self, st.cfg.heartbeat_check, tick_atom::value);
}

uint32_t on_incarnation(coordinator_ptr self, uint32_t incarnation) {
  auto sender = self->current_sender();
  if (!sender || sender->node() != self->node()) {  // anonymous messages may come from anywhere
    note_refusal(self, "an incarnation change", "only node 0's launcher moves the incarnation");
    return self->state.cfg.incarnation;
  }
  if (incarnation == self->state.cfg.incarnation && !self->state.workers.empty())
    return incarnation;  // already advanced by an early join
  self->state.log->info("new incarnation {}", incarnation);
  reset_incarnation(self, incarnation);
  advance_plan(self);
  return incarnation;
}

/// Registers a node's checkpoint server and answers the others'. In an
/// elastic job only the current group's: a node left out of it (its host
/// lost) holds nothing the group needs (its parts were written from
/// replicas by the survivors), and asking a gone host costs a timeout
/// before every group.
std::string on_ckpt_peer(coordinator_ptr self, int32_t node, const std::string& endpoint) {
  auto& servers = self->state.ckpt_servers;
  if (!from_launcher(self, "a checkpoint server registration", node)) return {};
  if (!endpoint.empty()) servers[node] = endpoint;
  auto plan = current_plan(self);
  std::string others;
  for (auto& [n, ep] : servers)
    if (n != node && (!plan || plan->has(n))) others += ep + "\n";
  return others;
}

void on_down(coordinator_ptr self, caf::down_msg& dm) {
  auto& st = self->state;
  for (auto r = st.relays.begin(); r != st.relays.end(); ++r)
    if (r->second.address() == dm.source) {
      st.log->warn("node {}'s relay is gone: its workers' orders go to them directly", r->first);
      if (st.planner) st.planner->forget(r->first);  // its launcher with it: not counted for a group
      st.relays.erase(r);
      return;
    }
  auto it = st.ranks.find(dm.source);
  if (it == st.ranks.end()) return;
  auto rank = it->second;
  st.ranks.erase(it);
  member_lost(self, rank, loss_reason::dead, "dead: connection lost (" + self->system().render(dm.reason) + ")",
              st.members->completed(rank));
}

/// A node relay registers, from its launcher's process (registered for
/// that node, or this service's own).
void on_relay(coordinator_ptr self, int32_t node, int32_t nproc) {
  auto& st = self->state;
  auto sender = self->current_sender();
  if (!sender || !from_launcher(self, "a relay registration", node)) return;
  if ((st.relay_nproc > 0 && nproc != st.relay_nproc) || !node_fits(self, node, nproc)) {
    note_refusal(self, "a relay registration for node " + std::to_string(node), "it does not fit the job");
    return;
  }
  auto relay = caf::actor_cast<node_relay_actor>(sender);
  st.relay_nproc = nproc;
  if (auto old = st.relays.find(node); old != st.relays.end()) self->demonitor(old->second.address());
  st.relays[node] = relay;
  self->monitor(relay);
  st.log->info("node {}'s relay registered: its {} workers' orders, heartbeats and acknowledgements go through it",
               node, nproc);
}

/// A batch is accepted only from the relay registered for its node, and
/// only for that node's ranks.
bool from_relay(coordinator_ptr self, int32_t node, const char* what) {
  auto& st = self->state;
  auto sender = self->current_sender();
  auto it = st.relays.find(node);
  if (sender && it != st.relays.end() && sender == it->second.address()) return true;
  note_refusal(self, what, "not the relay registered for node " + std::to_string(node));
  return false;
}

bool rank_of_node(coordinator_ptr self, uint32_t rank, int32_t node) {
  auto& st = self->state;
  return node_of_rank(self, rank, st.relay_nproc) == node && st.workers.count(rank);
}

void accept_heartbeat(coordinator_ptr self, proto::Heartbeat::Reader h) {
  auto& st = self->state;
  st.members->heartbeat(h.getRank(), now_ns(self), h.getCompletedStep(), h.getLastStepNs(), h.getLastSaveNs());
  if (st.cfg.on_progress) st.cfg.on_progress(h.getRank(), h.getCompletedStep(), h.getLastStepNs());
}

void on_heartbeat_batch(coordinator_ptr self, msg<proto::HeartbeatBatch>& m) {
  auto r = decode(m);
  if (!r || !from_relay(self, r->get().getNode(), "a heartbeat batch")) return;
  for (auto h : r->get().getBeats())
    if (h.getIncarnation() == self->state.cfg.incarnation && rank_of_node(self, h.getRank(), r->get().getNode()))
      accept_heartbeat(self, h);
}

void on_ack_batch(coordinator_ptr self, msg<proto::AckBatch>& m) {
  auto r = decode(m);
  if (!r || !from_relay(self, r->get().getNode(), "an acknowledgement batch")) return;
  actions acts;
  for (auto a : r->get().getAcks())
    if (rank_of_node(self, a.getRank(), r->get().getNode())) {
      auto more = self->state.agree->on_ack(a.getRank(), a.getAgreementId(), a.getEarliestStep(), copies_of(a));
      acts.insert(acts.end(), more.begin(), more.end());
    }
  dispatch(self, acts);
}

// ------------------------------------------------- elastic groups (runtime/elastic.hpp)

msg<proto::GroupPlan> plan_message(proto::PlanStatus status, uint32_t incarnation, const group_plan* p,
                                   const std::string& reason = "") {
  return make<proto::GroupPlan>([&](auto b) {
    b.setStatus(status);
    b.setIncarnation(incarnation);
    b.setReason(reason);
    if (!p) return;
    auto nodes = b.initNodes(static_cast<unsigned>(p->nodes.size()));
    auto hosts = b.initHosts(static_cast<unsigned>(p->hosts.size()));
    for (unsigned i = 0; i < p->nodes.size(); ++i) nodes.set(i, p->nodes[i]);
    for (unsigned i = 0; i < p->hosts.size(); ++i) hosts.set(i, p->hosts[i]);
    b.setWorkersPerNode(p->nproc);
  });
}

/// The answer to the launcher of `node` asking for a group from incarnation
/// `from` on, on the wire; nothing while the planner says wait.
std::optional<msg<proto::GroupPlan>> plan_reply(coordinator_ptr self, int32_t node, const std::string& host, uint32_t from) {
  using reply = group_planner::reply;
  auto& st = self->state;
  auto plan = current_plan(self);
  if (st.agree->phase() == agreement_phase::finishing && !(plan && plan->has(node))) {
    st.told_finished.insert(node);
    return plan_message(proto::PlanStatus::FINISHED, st.cfg.incarnation, nullptr,
                        "the job finished without this node (its last group's workers left with exit code 0)");
  }
  auto a = st.planner->ask(node, host, from);
  if (a.what == reply::plan) return plan_message(proto::PlanStatus::PLAN, a.incarnation, &a.plan);
  if (a.what == reply::wait) return std::nullopt;
  self->state.log->info("node {} asked to take part after the group of incarnation {} formed without it: it joins "
                        "the next group",
                        node, a.incarnation);
  return plan_message(proto::PlanStatus::EXCLUDED, a.incarnation, nullptr,
                      "the group of incarnation " + std::to_string(a.incarnation) + " formed without node " +
                          std::to_string(node));
}

/// A newcomer waits while the group is smaller than MAX: this service
/// claims an agreed save as a notice would (every worker then exits for a
/// restart, and the next plan has the newcomer). A claim that does not win
/// (a round is on) is tried again at the next check; that round may end
/// the group first, which serves as well.
void grow_if_due(coordinator_ptr self) {
  auto& st = self->state;
  if (!st.planner || !st.planner->growth_due() || st.grown.count(st.cfg.incarnation) || fenced(self)) return;
  auto acts = st.agree->on_claim(launcher_rank, 0, 0);
  const bool won = std::any_of(acts.begin(), acts.end(), [](const agreement_action& a) {
    return a.what == agreement_action::type::claim_reply && a.won;
  });
  if (!won) return;
  st.grown.insert(st.cfg.incarnation);
  std::string waiting;
  for (auto& [node, host] : st.planner->waiting())
    if (!st.planner->current()->has(node)) waiting += (waiting.empty() ? "" : ", ") + std::to_string(node);
  st.log->info("node(s) {} wait to join the group of {}: it saves at an agreed step and restarts with them", waiting,
               st.planner->current()->describe());
  emit_event("grow", {{"incarnation", st.cfg.incarnation}, {"waiting", waiting}});
  dispatch(self, acts);
}

/// Decides the current plan when a rule is met, answers the launchers it
/// settles, and claims a growth when one is due.
void advance_plan(coordinator_ptr self) {
  auto& st = self->state;
  if (!st.planner) return;
  if (auto p = st.planner->decide(now_ns(self))) {
    st.cfg.world_size = p->world_size();
    st.agree = std::make_unique<agreement>(st.cfg.world_size, st.cfg.first_agreement_id);
    st.log->info("the group of incarnation {}: {}", p->incarnation, p->describe());
    nlohmann::json nodes = p->nodes;
    emit_event("group_formed", {{"incarnation", p->incarnation}, {"nodes", nodes}, {"world_size", p->world_size()}});
  } else if (!st.planner->current() && now_ns(self) - st.plan_said_ns > 5'000'000'000) {
    st.plan_said_ns = now_ns(self);
    st.log->info("forming the group of incarnation {}: {}", st.cfg.incarnation, st.planner->progress());
  }
  for (auto it = st.plan_waiters.begin(); it != st.plan_waiters.end();) {
    auto reply = plan_reply(self, it->node, it->host, it->from);
    if (!reply) {
      ++it;
      continue;
    }
    it->promise.deliver(std::move(*reply));
    it = st.plan_waiters.erase(it);
  }
  grow_if_due(self);
}

caf::result<msg<proto::GroupPlan>> on_plan_request(coordinator_ptr self, msg<proto::GroupPlanRequest>& m) {
  auto& st = self->state;
  auto refused = [&](const std::string& why) {
    return plan_message(proto::PlanStatus::REFUSED, st.cfg.incarnation, nullptr, why);
  };
  auto r = decode(m);
  if (!r) return refused(r.err().message);
  auto q = r->get();
  const int32_t node = q.getNode();
  if (!st.planner) return refused("this job is not elastic: give every launcher the same --nnodes MIN:MAX");
  if (!from_launcher(self, "a group plan request", node)) return refused("not the launcher of node " + std::to_string(node));
  if (node < 0 || static_cast<uint32_t>(node) >= st.cfg.max_nodes)
    return refused("node " + std::to_string(node) + " does not fit a job of at most " +
                   std::to_string(st.cfg.max_nodes) + " nodes");
  const auto host = str(q.getHost());
  auto reply = plan_reply(self, node, host, q.getFromIncarnation());
  if (!reply) {
    advance_plan(self);  // this request may complete the group
    reply = plan_reply(self, node, host, q.getFromIncarnation());
  }
  grow_if_due(self);
  if (reply) return std::move(*reply);
  // A launcher asks again when its request timed out: only its newest waits.
  st.plan_waiters.erase(std::remove_if(st.plan_waiters.begin(), st.plan_waiters.end(),
                                       [&](const auto& w) { return w.node == node; }),
                        st.plan_waiters.end());
  auto rp = self->make_response_promise<msg<proto::GroupPlan>>();
  st.plan_waiters.push_back({node, host, q.getFromIncarnation(), rp});
  return rp;
}

/// Elastic jobs, once they finished: the registered nodes not in the last
/// group that have not heard it ("1,3").
std::string owed_finish(coordinator_ptr self) {
  auto& st = self->state;
  auto plan = current_plan(self);
  std::set<int32_t> owed;
  for (auto& [id, l] : st.launchers)
    if (!(plan && plan->has(l.first)) && !st.told_finished.count(l.first)) owed.insert(l.first);
  std::string out;
  for (auto n : owed) out += (out.empty() ? "" : ",") + std::to_string(n);
  return out;
}

void start_takeover(coordinator_ptr self) {
  auto& st = self->state;
  st.takeover = true;
  st.takeover_since_ns = now_ns(self);
  const auto gen = ++st.takeover_gen;
  st.log->info("taking over incarnation {} (agreement ids from {}): waiting up to {} ms for its survivors to rejoin",
               st.cfg.incarnation, st.cfg.first_agreement_id, st.cfg.takeover_window.count());
  emit_event("takeover", {{"first_id", st.cfg.first_agreement_id}, {"window_ms", st.cfg.takeover_window.count()}});
  self->delayed_send(self, st.cfg.takeover_min, takeover_atom::value, gen);
  self->delayed_send(self, st.cfg.takeover_window, takeover_atom::value, gen);
}

/// The message table: each handler is a function above.
coordinator_actor::behavior_type coordinator(coordinator_ptr self, coordinator_config cfg) {
  auto& st = self->state;
  st.cfg = cfg;
  st.log = cfg.log ? cfg.log : spdlog::default_logger();
  if (cfg.max_nodes > 0) {
    planner_config pc;
    pc.min_nodes = cfg.min_nodes;
    pc.max_nodes = cfg.max_nodes;
    pc.nproc = static_cast<uint32_t>(std::max(cfg.nproc, 1));
    pc.wait_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(cfg.elastic_wait).count();
    st.planner = std::make_unique<group_planner>(pc);
    if (cfg.plan) {
      st.planner->adopt(*cfg.plan);
      st.cfg.world_size = cfg.plan->world_size();
    }
  }
  rendezvous_table::limits lim;
  // A barrier waiting for more members could never complete.
  lim.barrier_count = st.planner ? st.cfg.max_nodes * static_cast<uint32_t>(std::max(cfg.nproc, 1)) : cfg.world_size;
  st.table = rendezvous_table(lim);
  reset_incarnation(self, cfg.incarnation);
  if (cfg.takeover) start_takeover(self);
  self->set_down_handler([self](caf::down_msg& dm) { on_down(self, dm); });
  self->send(self, tick_atom::value);
  return {
      [self](msg<proto::Join>& m) { return on_join(self, m); },
      [self](msg<proto::Claim>& m) { return on_claim(self, m); },
      [self](msg<proto::KvSet>& m) { return on_kv_set(self, m); },
      [self](msg<proto::KvGet>& m) { return on_kv_get(self, m); },
      [self](kv_timeout_atom, uint64_t id) {
        if (!from_self(self, "a key-value timeout")) return;
        if (auto r = self->state.table.expire(id)) deliver(self, {*r});
      },
      [self](msg<proto::Barrier>& m) { return on_barrier(self, m); },
      [self](msg<proto::Ack>& m) {
        if (auto r = decode(m); r && from_member(self, r->get().getRank(), "an acknowledgement"))
          dispatch(self, self->state.agree->on_ack(r->get().getRank(), r->get().getAgreementId(),
                                                   r->get().getEarliestStep(), copies_of(r->get())));
      },
      [self](msg<proto::Heartbeat>& m) {
        auto r = decode(m);
        if (!r || r->get().getIncarnation() != self->state.cfg.incarnation) return;
        auto h = r->get();
        if (!from_member(self, h.getRank(), "a heartbeat")) return;
        accept_heartbeat(self, h);
      },
      [self](msg<proto::CheckpointSaved>& m) { on_saved(self, m); },
      [self](msg<proto::ProposeFinal>& m) {
        if (auto r = decode(m); r && from_member(self, r->get().getRank(), "a final-save proposal"))
          dispatch(self, self->state.agree->on_propose_final(r->get().getRank(), r->get().getStartedStep()));
      },
      [self](msg<proto::ErrorReport>& m) { on_error_report(self, m); },
      [self](msg<proto::Leave>& m) { return on_leave(self, m); },
      [self](exited_atom, uint32_t rank, uint32_t inc, int32_t code) { on_exited(self, rank, inc, code); },
      [self](rescue_atom, uint64_t gen) {
        if (from_self(self, "a rescue timer")) on_rescue(self, gen);
      },
      [self](cutoff_atom, uint64_t gen) {
        if (from_self(self, "a cutoff timer")) on_cutoff(self, gen);
      },
      [self](launcher_atom, int32_t node, int32_t nproc, const std::string& token, int32_t lo, int32_t hi) {
        return on_launcher(self, node, nproc, token, lo, hi);
      },
      [self](incarnation_atom, uint32_t inc) { return on_incarnation(self, inc); },
      [self](current_atom) { return self->state.cfg.incarnation; },
      [self](ckpt_peer_atom, int32_t node, const std::string& ep) { return on_ckpt_peer(self, node, ep); },
      [self](status_atom) {
        auto& st = self->state;
        return fmt::format("incarnation {}, {} members, phase {}, {} forged messages refused", st.cfg.incarnation,
                           st.workers.size(), to_string(st.agree->phase()), st.forged);
      },
      [self](tick_atom) {
        if (from_self(self, "a heartbeat-check timer")) on_tick(self);
      },
      [self](relay_atom, int32_t node, int32_t nproc) { on_relay(self, node, nproc); },
      [self](msg<proto::HeartbeatBatch>& m) { on_heartbeat_batch(self, m); },
      [self](msg<proto::AckBatch>& m) { on_ack_batch(self, m); },
      [self](msg<proto::CommitCheck>& m) { return on_commit_check(self, m); },
      [self](msg<proto::GroupPlanRequest>& m) { return on_plan_request(self, m); },
      [self](owed_atom) { return from_launcher(self, "a question about nodes owed an answer") ? owed_finish(self) : ""; },
      [self](resize_atom, uint32_t inc) {
        return from_launcher(self, "a membership-change question") && self->state.grown.count(inc) > 0;
      },
      [self](takeover_atom, uint64_t gen) {
        if (from_self(self, "a takeover timer") && gen == self->state.takeover_gen) check_takeover(self);
      },
  };
}

}  // namespace

coordinator_actor spawn_coordinator(caf::actor_system& sys, coordinator_config cfg) {
  return sys.spawn(coordinator, std::move(cfg));
}

namespace {
/// A plain TCP connect bounded by `t`: CAF's remote_actor blocks for the
/// kernel's SYN retries (a minute or more) when the host is gone, so it is
/// only called once the port has answered.
status probe_port(const std::string& host, uint16_t port, std::chrono::milliseconds t) {
  auto ip = resolve_ipv4(host);
  if (!ip) return ip.err();
  auto fd = tcp::connect_to(*ip + ":" + std::to_string(port), t);
  if (!fd) return fd.err();
  ::close(*fd);
  return {};
}
}  // namespace

result<uint16_t> publish_coordinator(caf::actor_system& sys, const coordinator_actor& coord, uint16_t port,
                                     const std::string& ip) {
  auto p = sys.has_openssl_manager() ? caf::openssl::publish(coord, port, ip.c_str(), true)
                                     : sys.middleman().publish(coord, port, ip.c_str(), true);
  if (!p)
    return error{errc::invalid_input, "cannot host the coordination service on " + ip + ":" + std::to_string(port) +
                                          ": " + sys.render(p.error())};
  return *p;
}

void unpublish_coordinator(caf::actor_system& sys, const coordinator_actor& coord, uint16_t port) {
  caf::expected<void> r;
  if (sys.has_openssl_manager()) {
    // caf::openssl::unpublish does not compile in 0.17 (it names an atom
    // constant of a later version); this is what it means to do.
    auto f = caf::make_function_view(sys.openssl_manager().actor_handle(), caf::duration{std::chrono::seconds(2)});
    r = f(caf::unpublish_atom::value, coord.address(), port);
  } else {
    r = sys.middleman().unpublish(coord, port);
  }
  if (!r) spdlog::debug("unpublish the coordination service: {}", sys.render(r.error()));
}

status register_launcher(caf::actor_system& sys, const coordinator_actor& coord, int32_t node_rank, int32_t nproc,
                         const std::string& token, int32_t min_nodes, int32_t max_nodes) {
  std::string why = "no answer within 10 s";
  caf::scoped_actor self{sys};
  self->request(coord, std::chrono::seconds(10), launcher_atom::value, node_rank, nproc, token, min_nodes, max_nodes)
      .receive([&](std::string& r) { why = std::move(r); }, [&](caf::error& e) { why = sys.render(e); });
  if (why.empty()) return {};
  return error{errc::invalid_input, "the coordination service refused this launcher: " + why};
}

result<coordinator_actor> connect_coordinator(caf::actor_system& sys, const std::string& host, uint16_t port,
                                              std::chrono::milliseconds timeout) {
  using clock = std::chrono::steady_clock;
  auto deadline = clock::now() + timeout;
  auto where = host + ":" + std::to_string(port);
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now());
    auto probe = probe_port(host, port, std::clamp(left, std::chrono::milliseconds(100), std::chrono::milliseconds(2000)));
    std::string why;
    if (probe) {
      auto h = sys.has_openssl_manager() ? caf::openssl::remote_actor<coordinator_actor>(sys, host, port)
                                         : sys.middleman().remote_actor<coordinator_actor>(host, port);
      if (h) return *h;
      why = sys.render(h.error());
      // Which of the two a refused TLS handshake gives depends on timing.
      if (h.error() == caf::sec::disconnect_during_handshake || h.error() == caf::sec::connection_timeout)
        why += sys.has_openssl_manager()
                   ? " (the TLS handshake failed or stalled: the service has no TLS, or its certificate and this "
                     "one are not signed by each other's --tls-ca)"
                   : " (no handshake from the service: it may require TLS, --tls-cert/--tls-key/--tls-ca)";
    } else {
      why = probe.err().message;
    }
    if (clock::now() > deadline)
      return error{errc::disconnected, "cannot reach the coordination service at " + where + ": " + why};
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace grace
