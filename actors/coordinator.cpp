#include "actors/coordinator.hpp"
#include "actors/coordinator_parts.hpp"

#include "actors/node_relay.hpp"
#include "actors/peer_watcher.hpp"
#include "actors/convert.hpp"
#include "runtime/base/posix_file.hpp"
#include "runtime/coordination/admission.hpp"
#include "runtime/coordination/agreement.hpp"
#include "runtime/base/deadline.hpp"
#include "runtime/base/events.hpp"
#include "runtime/net/job_token.hpp"
#include "runtime/coordination/leader_rules.hpp"
#include "runtime/coordination/membership.hpp"
#include "runtime/net/net_address.hpp"
#include "runtime/coordination/rendezvous_table.hpp"
#include "runtime/net/tcp.hpp"

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

namespace coord {


int64_t now_ns(coordinator_ptr self) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(self->clock().now().time_since_epoch()).count();
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
msg<proto::Welcome> refuse_for_now(const std::string& reason, uint32_t current, bool steps_differ = false) {
  return make<proto::Welcome>([&](auto b) {
    b.setAccepted(false);
    b.setReason(reason);
    b.setRestartable(true);
    b.setIncarnation(current);
    b.setStepsDiffer(steps_differ);
  });
}


/// "; rank 2's part from its replica" for a just-in-time round from copies.
std::string replica_ranks(const std::vector<uint32_t>& ranks) {
  std::string s;
  for (auto r : ranks) s += "; rank " + std::to_string(r) + "'s part from its replica";
  return s;
}

/// Elastic jobs: the current incarnation's group, if it is formed.
const group_plan* current_plan(coordinator_ptr self) {
  auto& st = self->state;
  if (!st.elastic.planner || !st.elastic.planner->current() || st.elastic.planner->incarnation() != st.cfg.incarnation) return nullptr;
  return &*st.elastic.planner->current();
}

void reset_incarnation(coordinator_ptr self, uint32_t incarnation) {
  auto& st = self->state;
  st.cfg.incarnation = incarnation;
  if (st.elastic.planner) {
    // The group of an elastic job forms once its plan is decided (no
    // member can join before: its launcher waits for the plan).
    st.elastic.planner->enter(incarnation, now_ns(self));
    st.elastic.said_ns = now_ns(self);  // "forming the group" is said after 5 s of waiting
    auto plan = current_plan(self);
    st.cfg.world_size = plan ? plan->world_size() : 0;
  }
  st.agree = std::make_unique<agreement>(st.cfg.world_size, st.cfg.first_agreement_id);
  st.takeover.open = false;
  ++st.takeover.gen;
  membership_config mc;
  mc.dead_after_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(st.cfg.dead_after).count();
  mc.hung_after_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(st.cfg.hung_after).count();
  // A tick this late means this process was frozen: the members' silence
  // meanwhile is ours (a thawed service would otherwise declare everyone,
  // its own node's workers included, dead at once).
  mc.check_interval_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(st.cfg.heartbeat_check).count();
  mc.stall_after_ns = std::max(mc.dead_after_ns / 2, 3 * mc.check_interval_ns);
  st.members = std::make_unique<membership>(mc);
  for (auto& [rank, w] : st.peers.workers) self->demonitor(w.address());
  st.peers.workers.clear();
  st.peers.ranks.clear();
  st.peers.relayed.clear();
  st.gone.left.clear();
  st.gone.lost.clear();
  st.gone.refused.clear();
  st.rescue.armed_for = 0;
  ++st.rescue.gen;
  deliver(self, st.kv.table.reset("the group restarted (new incarnation)"));
  set_event_identity(launcher_rank, incarnation);
}

void arm_rescue(coordinator_ptr self);
std::optional<msg<proto::ClaimReply>> carry_out(coordinator_ptr self, const actions& acts);

/// The node `rank` runs on in this incarnation: its slot's in an elastic
/// job (runtime/coordination/elastic.hpp), else rank / workers per node (`nproc`).
std::optional<int32_t> node_of_rank(coordinator_ptr self, uint32_t rank, int32_t nproc) {
  auto& st = self->state;
  if (st.elastic.planner) {
    auto plan = current_plan(self);
    return plan ? plan->node_of_rank(rank) : std::nullopt;
  }
  if (nproc <= 0) return std::nullopt;
  return static_cast<int32_t>(rank / static_cast<uint32_t>(nproc));
}

/// The node whose relay carries orders for `rank`, if it has one.
std::optional<int32_t> relay_node(coordinator_ptr self, uint32_t rank) {
  auto& st = self->state;
  if (st.peers.relays.empty() || st.peers.relay_nproc <= 0 || !st.peers.relayed.count(rank)) return std::nullopt;
  auto node = node_of_rank(self, rank, st.peers.relay_nproc);
  if (!node || !st.peers.relays.count(*node)) return std::nullopt;
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

/// Key prefix of this incarnation's rendezvous (the Welcome's).
std::string incarnation_prefix(const coordinator_state& st) {
  return st.cfg.run_id + "/" + std::to_string(st.cfg.incarnation) + "/";
}

/// A member's part in recovery in place: its state server, and whether it
/// can re-form its collectives (one that cannot turns recovery in place off
/// for the incarnation: a loss then restarts the group).
void note_in_place(coordinator_ptr self, uint32_t rank, proto::Join::Reader j) {
  auto& st = self->state;
  if (j.getInPlace()) {
    st.in_place.endpoints[rank] = str(j.getStateEndpoint());
    return;
  }
  if (!st.agree->in_place()) return;
  st.agree->set_in_place(false);
  st.log->info("rank {} cannot recover in place (no reconnect hook, device or sharded state): a loss in incarnation "
               "{} restarts the group",
               rank, st.cfg.incarnation);
}

/// The recover order (runtime/coordination/agreement.hpp, "Recovery in
/// place"): the donor's state server and a fresh rendezvous prefix; the
/// key-value store answers waits again for the re-formed group.
template <class ToAll, class ToOne>
void send_recover(coordinator_ptr self, const agreement_action& a, ToAll& to_all, ToOne& to_one) {
  auto& st = self->state;
  st.kv.table.mend();
  auto it = st.in_place.endpoints.find(a.saver);
  const std::string endpoint = it == st.in_place.endpoints.end() ? std::string() : it->second;
  auto m = make<proto::Recover>([&](auto b) {
    b.setAgreementId(a.id);
    b.setStep(a.step);
    b.setDonor(a.saver);
    b.setDonorEndpoint(endpoint);
    b.setRendezvousPrefix(incarnation_prefix(st) + "r" + std::to_string(a.id) + "/");
    auto rl = b.initReplaced(static_cast<unsigned>(a.replaced.size()));
    for (unsigned i = 0; i < a.replaced.size(); ++i) rl.set(i, a.replaced[i]);
  });
  if (a.to_one)
    to_one(a.rank, std::move(m));
  else
    to_all(std::move(m));
  st.log->info("recovery in place #{}: resume after step {} with rank {}'s state{}", a.id, a.step, a.saver,
               a.to_one ? fmt::format(" (to replacement rank {})", a.rank) : std::string());
  emit_event("recover", {{"id", a.id}, {"step", a.step}, {"donor", a.saver}, {"replaced", a.replaced},
                         {"to", a.to_one ? nlohmann::json(a.rank) : nlohmann::json("all")}});
}

/// The replacement's deadline (coordinator_config::replace_timeout).
void check_replacements(coordinator_ptr self) {
  auto& st = self->state;
  if (!st.in_place.replace_deadline_ns || now_ns(self) < st.in_place.replace_deadline_ns) return;
  st.in_place.replace_deadline_ns = 0;
  auto acts = st.agree->on_replace_timeout();
  if (acts.empty()) return;
  st.log->warn("recovery in place: no replacement joined within {} ms; the survivors save just in time and the "
               "group restarts",
               st.cfg.replace_timeout.count());
  emit_event("recovery_fallback", {{"why", "no replacement in time"}});
  dispatch(self, acts);
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
      auto it = st.peers.workers.find(r);
      if (it != st.peers.workers.end()) self->send(it->second, m);
    }
    for (auto n : nodes) self->send(st.peers.relays[n], m);
    return nodes;
  };
  auto to_one = [&](uint32_t rank, auto m) {  // directly, also to a relayed member
    auto it = st.peers.workers.find(rank);
    if (it != st.peers.workers.end()) self->send(it->second, std::move(m));
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
        if (auto n = relay_node(self, a.rank); n && !reached.count(*n)) self->send(st.peers.relays[*n], m);
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
      case ty::recover: send_recover(self, a, to_all, to_one); break;
      case ty::resumed:
        st.in_place.replace_deadline_ns = 0;
        st.log->info("recovered in place from round #{}: every member holds step {}, training goes on", a.id, a.step);
        emit_event("resumed", {{"id", a.id}, {"step", a.step}, {"replaced", a.replaced}});
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
/// unsettled (see runtime/coordination/agreement.hpp, "A save that respects its deadline").
void arm_rescue(coordinator_ptr self) {
  auto& st = self->state;
  if (!st.agree->needs_rescue()) {
    st.rescue.armed_for = 0;
    return;
  }
  const int64_t deadline = st.agree->deadline_ns();
  if (st.rescue.armed_for == deadline) return;
  st.rescue.armed_for = deadline;
  auto t = rescue_margins(st.members->slowest_step_ns(), std::max(st.members->slowest_save_ns(), st.last_saved_ns));
  st.rescue.cutoff_ns = t.cutoff_ns;
  const int64_t delay = std::max<int64_t>(0, deadline - t.rescue_ns - wall_ns());
  st.log->info("deadline in {} ms: a round still open {} ms before it is rescued (cutoff {} ms later)",
               (deadline - wall_ns()) / 1000000, t.rescue_ns / 1000000, t.cutoff_ns / 1000000);
  self->delayed_send(self, std::chrono::nanoseconds(delay), rescue_atom::value, ++st.rescue.gen);
}

/// Tells the host (grace-launch) about a failure verdict.
void report_to_host(coordinator_ptr self, uint32_t rank, const std::string& why) {
  auto& st = self->state;
  if (!st.cfg.on_member_lost) return;
  try {
    auto pid = st.peers.pids.find(rank);
    st.cfg.on_member_lost(rank, st.cfg.incarnation, pid == st.peers.pids.end() ? 0 : pid->second, why);
  } catch (const std::exception& e) {
    st.log->error("member-lost hook threw: {}", e.what());
  }
}



/// `completed`: the member's last completed step as heard (heartbeats).
/// `kill_on_host`: tell the rank's launcher to kill it (not for a member
/// refused at its join, which exits with the restart code by itself).
void member_lost(coordinator_ptr self, uint32_t rank, loss_reason reason, const std::string& why, uint64_t completed,
                 bool kill_on_host) {
  auto& st = self->state;
  if (st.gone.left.count(rank) || st.gone.lost.count(rank)) return;
  st.gone.lost.insert(rank);
  st.members->remove(rank);
  auto it = st.peers.workers.find(rank);
  if (it != st.peers.workers.end()) {
    st.peers.ranks.erase(caf::actor_cast<caf::actor_addr>(it->second));
    self->demonitor(it->second.address());
  }
  if (kill_on_host) report_to_host(self, rank, why);
  dispatch(self, st.agree->on_member_lost(rank, completed, reason, why));
  fail_pending(self, "rank " + std::to_string(rank) + " lost");
  if (st.agree->awaits_replacement(rank) && !st.in_place.replace_deadline_ns)
    st.in_place.replace_deadline_ns =
        now_ns(self) + std::chrono::duration_cast<std::chrono::nanoseconds>(st.cfg.replace_timeout).count();
}


/// What admit() reads (runtime/coordination/admission.hpp).
admission_state admission_view(coordinator_ptr self) {
  auto& st = self->state;
  admission_state s;
  s.protocol_version = proto::PROTOCOL_VERSION;
  s.token = st.cfg.token;
  s.run_id = st.cfg.run_id;
  s.world_size = st.cfg.world_size;
  s.incarnation = st.cfg.incarnation;
  s.elastic = st.elastic.planner != nullptr;
  s.group_formed = current_plan(self) != nullptr;
  s.takeover = st.takeover.open;
  s.has_members = !st.peers.workers.empty();
  s.group_gone = st.agree->live().empty();
  s.node_local = st.node_local;
  s.sharded = st.agree->parts();
  // A lost rank whose replacement is awaited (recovery in place) is free.
  s.joined = [&st](uint32_t r) { return st.peers.workers.count(r) > 0 && !st.agree->awaits_replacement(r); };
  s.left = [&st](uint32_t r) { return st.gone.left.count(r) > 0; };
  s.lost = [&st](uint32_t r) { return st.gone.lost.count(r) > 0; };
  return s;
}

join_request join_of(proto::Join::Reader j) {
  join_request r;
  r.protocol_version = j.getProtocolVersion();
  r.token = str(j.getToken());
  r.run_id = str(j.getRunId());
  r.rank = j.getRank();
  r.world_size = j.getWorldSize();
  r.incarnation = j.getIncarnation();
  r.rejoin = j.getRejoin();
  r.node_local = j.getNodeLocal();
  r.sharded = j.getSharded();
  return r;
}

/// The admission rules, then (for a first join) the agreement's level
/// check; the refusal, if any. May advance the incarnation (the first join
/// of the next group).
std::optional<msg<proto::Welcome>> join_refusal(coordinator_ptr self, proto::Join::Reader j) {
  auto& st = self->state;
  const auto req = join_of(j);
  auto a = admit(req, admission_view(self));
  if (a.what == admission::verdict::advance) {
    st.log->info("advancing to incarnation {} (first join of the new group)", req.incarnation);
    reset_incarnation(self, req.incarnation);
    a = admit(req, admission_view(self));
  }
  if (a.what == admission::verdict::refuse) return refuse(a.reason);
  if (a.what == admission::verdict::refuse_for_now) return refuse_for_now(a.reason, st.cfg.incarnation);
  if (req.rejoin) return std::nullopt;
  if (j.getReplacement()) {
    if (st.agree->awaits_replacement(req.rank)) return std::nullopt;
    st.gone.refused.insert(req.rank);
    return refuse_for_now("no recovery in place awaits a replacement of rank " + std::to_string(req.rank) +
                              " in incarnation " + std::to_string(st.cfg.incarnation),
                          st.cfg.incarnation);
  }
  if (auto why = st.agree->join_refusal(req.rank, j.getCompletedStep())) {
    st.log->warn("rank {} refused: {}", req.rank, *why);
    st.gone.refused.insert(req.rank);
    if (st.agree->refusal_ends_group(j.getCompletedStep()))
      member_lost(self, req.rank, loss_reason::dead, "not level: " + *why, j.getCompletedStep(), false);
    return refuse_for_now(*why, st.cfg.incarnation, st.agree->restored_differs(j.getCompletedStep()));
  }
  return std::nullopt;
}

/// Ends the takeover: ranks that did not rejoin are lost, and the
/// survivors' just-in-time round starts (runtime/coordination/agreement.hpp, "Takeover").
void end_takeover(coordinator_ptr self, const std::string& why) {
  auto& st = self->state;
  st.takeover.open = false;
  ++st.takeover.gen;
  const auto waited_ms = (now_ns(self) - st.takeover.since_ns) / 1000000;
  st.log->info("takeover of incarnation {} ends ({}): {}/{} ranks rejoined after {} ms", st.cfg.incarnation, why,
               st.peers.workers.size(), st.cfg.world_size, waited_ms);
  emit_event("takeover_end", {{"rejoined", st.peers.workers.size()}, {"why", why}, {"waited_ms", waited_ms}});
  for (uint32_t r = 0; r < st.cfg.world_size; ++r)
    if (!st.peers.workers.count(r))
      member_lost(self, r, loss_reason::dead,
                  "dead: did not rejoin the successor coordination service within " + std::to_string(waited_ms) +
                      " ms",
                  0);
  dispatch(self, st.agree->end_takeover());
}

/// After each rejoin, registration and takeover timer: ends the takeover
/// once nobody more is to be waited for (runtime/coordination/leader_rules.hpp,
/// takeover_outcome).
void check_takeover(coordinator_ptr self) {
  auto& st = self->state;
  if (!st.takeover.open) return;
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
  for (auto& [node_id, l] : st.peers.launchers)
    if (auto n = place(l.first); n >= 0) p.registered.insert(n);
  p.rejoined_count = static_cast<uint32_t>(st.peers.workers.size());
  p.age_ns = now_ns(self) - st.takeover.since_ns;
  p.min_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(st.cfg.takeover_min).count();
  p.window_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(st.cfg.takeover_window).count();
  const auto end = takeover_outcome(p, [&](uint32_t r) { return st.peers.workers.count(r) > 0; });
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
  if (st.peers.workers.empty()) {
    st.agree->set_parts(j.getSharded());
    st.node_local = j.getNodeLocal();
    st.agree->set_node_local(st.node_local);
    st.agree->set_in_place(st.cfg.recovery_in_place && st.peers.relays.empty());
  }
  note_in_place(self, rank, j);
  st.peers.workers[rank] = handle;  // a replacement takes over its lost rank's entry
  st.peers.pids[rank] = j.getPid();
  st.peers.ranks.emplace(caf::actor_cast<caf::actor_addr>(sender), rank);
  if (j.getRelayed()) st.peers.relayed.insert(rank);
  self->monitor(handle);
  st.members->add(rank, now_ns(self), j.getCompletedStep());
  st.log->info("rank {} joined (pid {} on {}, step {}), {}/{} members", rank, j.getPid(), str(j.getHost()),
               j.getCompletedStep(), st.peers.workers.size(), st.cfg.world_size);
  auto prefix = incarnation_prefix(st);
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
  } else if (j.getReplacement()) {
    st.gone.lost.erase(rank);
    st.gone.refused.erase(rank);
    emit_event("replacement_joined", {{"replaced_rank", rank}, {"pid", j.getPid()}});
    dispatch(self, st.agree->on_replacement_join(rank));
  } else {
    dispatch(self, st.agree->on_join(rank, j.getCompletedStep()));
  }
  return welcome;
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
  if (st.gone.lost.count(rank) || st.gone.left.count(rank))
    return reply(false, "rank " + std::to_string(rank) + " was declared lost in incarnation " +
                            std::to_string(st.cfg.incarnation));
  if (!from_member(self, rank, "a commit check")) return reply(false, "not the member that joined as this rank");
  if (fenced(self)) return reply(false, "this coordination service lost its leader lease");
  return reply(true, "");
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
  if (!st.peers.workers.count(rank) || !from_member(self, rank, "a leave")) return false;
  st.gone.left.insert(rank);
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
  if (st.gone.refused.count(rank) && !st.peers.workers.count(rank)) return;  // told to restart: its exit is expected
  member_lost(self, rank, loss_reason::dead,
              code > 128 ? "dead: killed by signal " + std::to_string(code - 128)
                         : "dead: exited with code " + std::to_string(code) + " without leaving",
              st.members->completed(rank));
}

void on_rescue(coordinator_ptr self, uint64_t gen) {
  auto& st = self->state;
  if (gen != st.rescue.gen) return;
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
  self->delayed_send(self, std::chrono::nanoseconds(st.rescue.cutoff_ns), cutoff_atom::value, gen);
}

void on_cutoff(coordinator_ptr self, uint64_t gen) {
  auto& st = self->state;
  if (gen != st.rescue.gen) return;
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
  check_replacements(self);
  self->delayed_send(self, st.cfg.heartbeat_check, tick_atom::value);
}

uint32_t on_incarnation(coordinator_ptr self, uint32_t incarnation) {
  auto sender = self->current_sender();
  if (!sender || sender->node() != self->node()) {  // anonymous messages may come from anywhere
    note_refusal(self, "an incarnation change", "only node 0's launcher moves the incarnation");
    return self->state.cfg.incarnation;
  }
  if (incarnation == self->state.cfg.incarnation && !self->state.peers.workers.empty())
    return incarnation;  // already advanced by an early join
  self->state.log->info("new incarnation {}", incarnation);
  reset_incarnation(self, incarnation);
  advance_plan(self);
  return incarnation;
}

/// The current incarnation, moved first when the host launcher asks to.
msg<proto::IncarnationReply> on_incarnation_query(coordinator_ptr self, const msg<proto::IncarnationQuery>& m) {
  uint32_t inc = self->state.cfg.incarnation;
  if (auto r = decode(m); r && r->get().getSet()) inc = on_incarnation(self, r->get().getIncarnation());
  return make<proto::IncarnationReply>([&](auto b) { b.setIncarnation(inc); });
}

/// Registers a node's checkpoint server and answers the others'. In an
/// elastic job only the current group's: a node left out of it (its host
/// lost) holds nothing the group needs (its parts were written from
/// replicas by the survivors), and asking a gone host costs a timeout
/// before every group.
msg<proto::CheckpointPeersReply> on_checkpoint_peers(coordinator_ptr self, const msg<proto::CheckpointPeers>& m) {
  auto& servers = self->state.ckpt_servers;
  std::vector<std::string> others;
  auto r = decode(m);
  const int32_t node = r ? r->get().getNode() : -1;
  if (r && from_launcher(self, "a checkpoint server registration", node)) {
    if (auto ep = str(r->get().getEndpoint()); !ep.empty()) servers[node] = ep;
    auto plan = current_plan(self);
    for (auto& [n, ep] : servers)
      if (n != node && (!plan || plan->has(n))) others.push_back(ep);
  }
  return make<proto::CheckpointPeersReply>([&](auto b) {
    auto l = b.initEndpoints(static_cast<unsigned>(others.size()));
    for (unsigned i = 0; i < others.size(); ++i) l.set(i, others[i]);
  });
}

void on_down(coordinator_ptr self, caf::down_msg& dm) {
  auto& st = self->state;
  for (auto r = st.peers.relays.begin(); r != st.peers.relays.end(); ++r)
    if (r->second.address() == dm.source) {
      st.log->warn("node {}'s relay is gone: its workers' orders go to them directly", r->first);
      if (st.elastic.planner) st.elastic.planner->forget(r->first);  // its launcher with it: not counted for a group
      st.peers.relays.erase(r);
      return;
    }
  auto it = st.peers.ranks.find(dm.source);
  if (it == st.peers.ranks.end()) return;
  auto rank = it->second;
  st.peers.ranks.erase(it);
  member_lost(self, rank, loss_reason::dead, "dead: connection lost (" + self->system().render(dm.reason) + ")",
              st.members->completed(rank));
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








void start_takeover(coordinator_ptr self) {
  auto& st = self->state;
  st.takeover.open = true;
  st.takeover.since_ns = now_ns(self);
  const auto gen = ++st.takeover.gen;
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
    st.elastic.planner = std::make_unique<group_planner>(pc);
    if (cfg.plan) {
      st.elastic.planner->adopt(*cfg.plan);
      st.cfg.world_size = cfg.plan->world_size();
    }
  }
  rendezvous_table::limits lim;
  // A barrier waiting for more members could never complete.
  lim.barrier_count = st.elastic.planner ? st.cfg.max_nodes * static_cast<uint32_t>(std::max(cfg.nproc, 1)) : cfg.world_size;
  st.kv.table = rendezvous_table(lim);
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
        if (auto r = self->state.kv.table.expire(id)) deliver(self, {*r});
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
      [self](msg<proto::Recovered>& m) {
        if (auto r = decode(m); r && from_member(self, r->get().getRank(), "a recovery report"))
          dispatch(self, self->state.agree->on_recovered(r->get().getRank(), r->get().getAgreementId()));
      },
      [self](msg<proto::Leave>& m) { return on_leave(self, m); },
      [self](msg<proto::WorkerExited>& m) {
        if (auto r = decode(m)) on_exited(self, r->get().getRank(), r->get().getIncarnation(), r->get().getCode());
      },
      [self](rescue_atom, uint64_t gen) {
        if (from_self(self, "a rescue timer")) on_rescue(self, gen);
      },
      [self](cutoff_atom, uint64_t gen) {
        if (from_self(self, "a cutoff timer")) on_cutoff(self, gen);
      },
      [self](msg<proto::LauncherRegister>& m) { return on_launcher_register(self, m); },
      [self](msg<proto::IncarnationQuery>& m) { return on_incarnation_query(self, m); },
      [self](msg<proto::CheckpointPeers>& m) { return on_checkpoint_peers(self, m); },
      [self](msg<proto::StatusQuery>&) {
        auto& st = self->state;
        auto text = fmt::format("incarnation {}, {} members, phase {}, {} forged messages refused",
                                st.cfg.incarnation, st.peers.workers.size(), to_string(st.agree->phase()),
                                st.refusals.count);
        return make<proto::StatusReply>([&](auto b) { b.setText(text); });
      },
      [self](tick_atom) {
        if (from_self(self, "a heartbeat-check timer")) on_tick(self);
      },
      [self](msg<proto::RelayRegister>& m) {
        if (auto r = decode(m)) on_relay(self, r->get().getNode(), r->get().getWorkersPerNode());
      },
      [self](msg<proto::HeartbeatBatch>& m) { on_heartbeat_batch(self, m); },
      [self](msg<proto::AckBatch>& m) { on_ack_batch(self, m); },
      [self](msg<proto::CommitCheck>& m) { return on_commit_check(self, m); },
      [self](msg<proto::GroupPlanRequest>& m) { return on_plan_request(self, m); },
      [self](msg<proto::OwedQuery>&) {
        auto nodes = from_launcher(self, "a question about nodes owed an answer") ? owed_finish(self) : "";
        return make<proto::OwedReply>([&](auto b) { b.setNodes(nodes); });
      },
      [self](msg<proto::ResizeQuery>& m) {
        auto r = decode(m);
        const bool grew = r && from_launcher(self, "a membership-change question") &&
                          self->state.elastic.grown.count(r->get().getIncarnation()) > 0;
        return make<proto::ResizeReply>([&](auto b) { b.setGrew(grew); });
      },
      [self](takeover_atom, uint64_t gen) {
        if (from_self(self, "a takeover timer") && gen == self->state.takeover.gen) check_takeover(self);
      },
  };
}

}  // namespace coord

coordinator_actor spawn_coordinator(caf::actor_system& sys, coordinator_config cfg) {
  return sys.spawn(coord::coordinator, std::move(cfg));
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
  fd_guard answered(*fd);  // closed at once: the port answered
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

status register_launcher(caf::actor_system& sys, const coordinator_launcher& coord, int32_t node_rank, int32_t nproc,
                         const std::string& token, int32_t min_nodes, int32_t max_nodes) {
  std::string why = "no answer within 10 s";
  caf::scoped_actor self{sys};
  auto m = make<proto::LauncherRegister>([&](auto b) {
    b.setNode(node_rank);
    b.setWorkersPerNode(nproc);
    b.setToken(token);
    b.setMinNodes(min_nodes);
    b.setMaxNodes(max_nodes);
  });
  self->request(coord, std::chrono::seconds(10), std::move(m))
      .receive(
          [&](msg<proto::LauncherRegisterReply>& r) {
            auto d = decode(r);
            why = d ? str(d->get().getRefused()) : d.err().message;
          },
          [&](caf::error& e) { why = sys.render(e); });
  if (why.empty()) return {};
  return error{errc::invalid_input, "the coordination service refused this launcher: " + why};
}

namespace {
/// One blocking request of `request` to `coord`; `take` reads the decoded
/// reply. False when no (decodable) answer came within `timeout`.
template <class Reply, class Request, class Take>
bool ask(caf::actor_system& sys, const coordinator_launcher& coord, msg<Request> request,
         std::chrono::milliseconds timeout, Take take) {
  bool answered = false;
  caf::scoped_actor self{sys};
  self->request(coord, timeout, std::move(request))
      .receive(
          [&](msg<Reply>& m) {
            if (auto r = decode(m)) {
              take(r->get());
              answered = true;
            }
          },
          [&](caf::error& e) { spdlog::debug("coordination service: {}", sys.render(e)); });
  return answered;
}
}  // namespace

std::optional<uint32_t> ask_incarnation(caf::actor_system& sys, const coordinator_launcher& coord,
                                        std::optional<uint32_t> set, std::chrono::milliseconds timeout) {
  std::optional<uint32_t> out;
  ask<proto::IncarnationReply>(sys, coord, make<proto::IncarnationQuery>([&](auto b) {
                                 b.setSet(set.has_value());
                                 b.setIncarnation(set.value_or(0));
                               }),
                               timeout, [&](auto r) { out = r.getIncarnation(); });
  return out;
}

std::optional<std::vector<std::string>> ask_checkpoint_peers(caf::actor_system& sys, const coordinator_launcher& coord,
                                                             int32_t node, const std::string& endpoint,
                                                             std::chrono::milliseconds timeout) {
  std::optional<std::vector<std::string>> out;
  ask<proto::CheckpointPeersReply>(sys, coord, make<proto::CheckpointPeers>([&](auto b) {
                                     b.setNode(node);
                                     b.setEndpoint(endpoint);
                                   }),
                                   timeout, [&](auto r) {
                                     out.emplace();
                                     for (auto ep : r.getEndpoints()) out->push_back(str(ep));
                                   });
  return out;
}

std::optional<bool> ask_resized(caf::actor_system& sys, const coordinator_launcher& coord, uint32_t incarnation,
                                std::chrono::milliseconds timeout) {
  std::optional<bool> out;
  ask<proto::ResizeReply>(sys, coord, make<proto::ResizeQuery>([&](auto b) { b.setIncarnation(incarnation); }),
                          timeout, [&](auto r) { out = r.getGrew(); });
  return out;
}

std::optional<std::string> ask_owed(caf::actor_system& sys, const coordinator_launcher& coord,
                                    std::chrono::milliseconds timeout) {
  std::optional<std::string> out;
  ask<proto::OwedReply>(sys, coord, make<proto::OwedQuery>([](auto) {}), timeout,
                        [&](auto r) { out = str(r.getNodes()); });
  return out;
}

void tell_worker_exited(caf::actor_system& sys, const coordinator_launcher& coord, uint32_t rank,
                        uint32_t incarnation, int32_t code) {
  caf::scoped_actor self{sys};  // a sender: exits are accepted from a launcher's process only
  self->send(coord, make<proto::WorkerExited>([&](auto b) {
               b.setRank(rank);
               b.setIncarnation(incarnation);
               b.setCode(code);
             }));
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
