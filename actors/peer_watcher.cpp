#include "actors/peer_watcher.hpp"

#include "actors/convert.hpp"
#include "runtime/coordination/cluster_config.hpp"
#include "runtime/worker/control_block.hpp"
#include "runtime/base/events.hpp"
#include "runtime/coordination/leader_rules.hpp"

#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/system_messages.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>
#include <caf/typed_response_promise.hpp>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <fstream>

namespace grace {

namespace {

/// Where the watcher stands with the service (etcd failover only leaves
/// `steady`): the service was lost or superseded and a successor is awaited,
/// or a connection to the successor is being made.
enum class follow_phase : uint8_t { steady, moving, connecting };

struct peer_watcher_state {
  static inline const char* name = "peer_watcher";
  std::shared_ptr<coordinator_ref> coord;
  coordinator_member current;  ///< the service joined (and monitored)
  std::shared_ptr<control_block> ctl;
  peer_watcher_config cfg;
  std::shared_ptr<spdlog::logger> log;
  bool joined = false;
  std::optional<msg<proto::Join>> join;  ///< the accepted join: a rejoin repeats it
  follow_phase phase = follow_phase::steady;
  std::chrono::steady_clock::time_point move_deadline;
  bool gave_up = false;
};

using watcher_ptr = peer_watcher_actor::stateful_pointer<peer_watcher_state>;

bool failover(watcher_ptr self) { return !self->state.cfg.coordinator_file.empty(); }

void lose(watcher_ptr self, loss_info l) {
  auto& st = self->state;
  st.ctl->post_loss(l);
  st.ctl->abort();
}

/// With failover, messages from a service that is no longer the one joined
/// (a predecessor that was superseded) are dropped.
bool from_current(watcher_ptr self) {
  auto& st = self->state;
  auto sender = self->current_sender();
  return !failover(self) || !sender || !st.current || sender->node() == st.current.node() ||
         (st.cfg.relay && sender->node() == st.cfg.relay.node());
}

/// An acknowledgement: through the node's relay if there is one.
void send_ack(watcher_ptr self, uint64_t id, uint64_t earliest, const replica_report& copies = {}) {
  auto& st = self->state;
  auto m = make<proto::Ack>([&](auto b) {
    b.setAgreementId(id);
    b.setRank(st.cfg.rank);
    b.setEarliestStep(earliest);
    set_copies(b, copies);
  });
  if (st.cfg.relay)
    self->send(st.cfg.relay, std::move(m));
  else
    self->send(st.current, std::move(m));
}

/// A checkpoint order: hand it to the trainer, then acknowledge what can be
/// acknowledged without it (see the protocol in runtime/coordination/agreement.hpp).
void on_order(watcher_ptr self, const checkpoint_order& o) {
  auto& st = self->state;
  auto progress = st.ctl->post_order(o);
  if (o.agreed) return;
  if (o.kind != checkpoint_kind::jit) {
    send_ack(self, o.id, std::max(o.step, progress.started));
    return;
  }
  // A peer is gone. A trainer inside a step has its collective aborted and
  // acknowledges its completed step once the step has failed (or, if the
  // step got everything it needed, completed). A trainer outside a step
  // (at a boundary, restoring, in its rendezvous) cannot start one any more
  // (Dekker), so its completed step is final: acknowledge it now.
  if (progress.idle()) {
    send_ack(self, o.id, progress.completed, st.cfg.freeze_copies ? st.cfg.freeze_copies() : replica_report{});
    st.ctl->post_acked_for_trainer(o.id);
  }
  st.ctl->abort();
}

/// Joins through the coordinator; the answer goes back to the trainer
/// (session::impl::join). Once accepted, heartbeats start and requests wait
/// as long as the service's verdict wait.
void join_service(watcher_ptr self, msg<proto::Join> m, caf::typed_response_promise<msg<proto::Welcome>> rp);

/// With a node relay, the watcher registers with it first (so the relay
/// knows it before any order for it can come), then joins; a relay that
/// refuses or does not answer is done without.
caf::result<msg<proto::Welcome>> on_join(watcher_ptr self, msg<proto::Join>& m) {
  auto& st = self->state;
  auto rp = self->make_response_promise<msg<proto::Welcome>>();
  if (!st.cfg.relay) {
    join_service(self, std::move(m), rp);
    return rp;
  }
  self->request(st.cfg.relay, std::chrono::seconds(5), relay_atom::value, st.cfg.rank, st.cfg.incarnation)
      .then(
          [self, m, rp](bool ok) mutable {
            if (!ok) {
              self->state.log->warn("this node's relay refused rank {}: talking to the service directly",
                                    self->state.cfg.rank);
              self->state.cfg.relay = node_relay_actor{};
            }
            join_service(self, std::move(m), rp);
          },
          [self, m, rp](caf::error& e) mutable {
            self->state.log->warn("this node's relay did not answer ({}): talking to the service directly",
                                  self->system().render(e));
            self->state.cfg.relay = node_relay_actor{};
            join_service(self, std::move(m), rp);
          });
  return rp;
}

/// The join as sent, with whether this watcher goes through a relay.
msg<proto::Join> with_relay_flag(const msg<proto::Join>& m, bool relayed, bool rejoin, uint64_t completed) {
  auto old = decode(m);
  if (!old) return m;  // the coordinator names what is wrong with it
  return edited<proto::Join>(old->get(), [&](auto b) {
    if (rejoin) b.setCompletedStep(completed);
    b.setRejoin(rejoin);
    b.setRelayed(relayed);
  });
}

void join_service(watcher_ptr self, msg<proto::Join> m, caf::typed_response_promise<msg<proto::Welcome>> rp) {
  auto& st = self->state;
  if (st.cfg.relay) m = with_relay_flag(m, true, false, 0);
  auto sent = m;
  self->request(st.current, st.cfg.request_timeout, std::move(m))
      .then(
          [self, rp, sent](msg<proto::Welcome>& w) mutable {
            auto r = decode(w);
            if (r && r->get().getAccepted() && !self->state.joined) {
              self->state.joined = true;
              self->state.join = sent;
              if (auto ms = r->get().getVerdictWaitMs())
                self->state.cfg.request_timeout = std::chrono::milliseconds(ms);
              self->send(self, tick_atom::value);
            }
            rp.deliver(std::move(w));
          },
          // No answer (a timeout, the service gone) is not a refusal: the
          // error reaches attach(), which fails as a failed rendezvous (45,
          // restartable within the launcher's limit), never as bad input.
          [rp](caf::error& e) mutable { rp.deliver(std::move(e)); });
}

// ------------------------------------------------------------------ failover

/// The service is gone or superseded: the trainer waits for the successor's
/// verdict (its collectives, which may wait on ranks of the lost host, are
/// aborted), and the watcher looks for the successor until the deadline.
void begin_move(watcher_ptr self, const std::string& why) {
  auto& st = self->state;
  if (st.phase != follow_phase::steady || st.gave_up) return;
  st.phase = follow_phase::moving;
  st.move_deadline = std::chrono::steady_clock::now() + st.cfg.failover_wait;
  st.log->warn("coordination service (epoch {}) {}: waiting up to {} ms for its successor", st.cfg.epoch, why,
               st.cfg.failover_wait.count());
  emit_event("coordinator_moving", {{"epoch", st.cfg.epoch}, {"why", why}});
  lose(self, {loss_kind::coordinator_moving, 0, 0,
              "the coordination service " + why + " and no successor took the group over"});
}

void give_up(watcher_ptr self, const std::string& why) {
  auto& st = self->state;
  st.gave_up = true;
  st.phase = follow_phase::steady;
  st.log->error("coordination service lost: {}", why);
  emit_event("coordinator_lost", {{"why", why}});
  lose(self, {loss_kind::coordinator_lost, 0, 0, why});
}

/// The location this node's launcher last wrote, if it parses.
std::optional<coordinator_location> read_location(const std::string& file) {
  std::ifstream in(file);
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  auto loc = coordinator_location::parse(line);
  if (!loc) return std::nullopt;
  return *loc;
}

/// Connects to the successor on a helper of its own (a connect blocks for
/// up to seconds); the outcome comes back as a moved_atom message.
void start_connect(watcher_ptr self, const coordinator_location& loc) {
  auto& st = self->state;
  auto hp = parse_host_port(loc.endpoint);
  if (!hp) return;
  st.phase = follow_phase::connecting;
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(st.move_deadline - std::chrono::steady_clock::now());
  auto timeout = std::clamp(left, std::chrono::milliseconds(100), std::chrono::milliseconds(3000));
  auto me = caf::actor_cast<caf::actor>(self);
  self->spawn<caf::detached>(
      [me, host = hp->first, port = hp->second, epoch = loc.epoch, timeout](caf::event_based_actor* helper) {
        auto h = connect_coordinator(helper->system(), host, port, timeout);
        if (h)
          helper->send(me, moved_atom::value, caf::actor_cast<caf::actor>(*h), epoch, std::string());
        else
          helper->send(me, moved_atom::value, caf::actor{}, epoch, h.err().message);
      });
}

/// Rejoins the successor as a survivor of this incarnation, with the step
/// the trainer completed (runtime/coordination/agreement.hpp, "Takeover").
void rejoin(watcher_ptr self) {
  auto& st = self->state;
  auto m = with_relay_flag(*st.join, static_cast<bool>(st.cfg.relay), true, st.ctl->completed.load());
  self->request(st.current, st.cfg.request_timeout, std::move(m))
      .then(
          [self](msg<proto::Welcome>& w) {
            auto& st = self->state;
            auto r = decode(w);
            if (!r || !r->get().getAccepted())
              return give_up(self, "the successor coordination service refused the rejoin: " +
                                       (r ? str(r->get().getReason()) : r.err().message));
            st.phase = follow_phase::steady;
            if (auto ms = r->get().getVerdictWaitMs()) st.cfg.request_timeout = std::chrono::milliseconds(ms);
            st.log->info("rejoined the successor coordination service (epoch {})", st.cfg.epoch);
            emit_event("rejoined_successor", {{"epoch", st.cfg.epoch}});
          },
          [self](caf::error& e) {
            give_up(self, "the successor coordination service did not answer the rejoin: " +
                              self->system().render(e));
          });
}

void on_moved(watcher_ptr self, caf::actor& handle, uint64_t epoch, const std::string& why) {
  auto& st = self->state;
  if (st.phase != follow_phase::connecting || st.gave_up) return;
  if (!handle) {
    st.log->warn("successor coordination service (epoch {}) not reached yet: {}", epoch, why);
    st.phase = follow_phase::moving;  // the next poll tries again, until the deadline
    return;
  }
  st.current = caf::actor_cast<coordinator_member>(handle);
  st.coord->set(st.current);
  st.cfg.epoch = epoch;
  self->monitor(st.current);
  rejoin(self);
}

/// Every follow_poll with failover: a location with a newer epoch means the
/// service moved (possibly before its loss shows on the connection).
void on_follow(watcher_ptr self) {
  auto& st = self->state;
  if (st.gave_up) return;
  self->delayed_send(self, st.cfg.follow_poll, follow_atom::value);
  if (!st.joined) return;
  if (st.phase != follow_phase::connecting) {
    auto loc = read_location(st.cfg.coordinator_file);
    if (loc && loc->epoch > st.cfg.epoch) {
      begin_move(self, "was superseded (a successor with epoch " + std::to_string(loc->epoch) + ")");
      start_connect(self, *loc);
      return;
    }
  }
  if (st.phase != follow_phase::steady && std::chrono::steady_clock::now() > st.move_deadline)
    give_up(self, "no successor coordination service took the group over within " +
                      std::to_string(st.cfg.failover_wait.count()) + " ms");
}

void on_down(watcher_ptr self, caf::down_msg& dm) {
  auto& st = self->state;
  if (st.cfg.relay && dm.source == st.cfg.relay.address()) {
    st.log->warn("this node's relay is gone: talking to the service directly");
    st.cfg.relay = node_relay_actor{};
    return;
  }
  if (dm.source != st.current.address()) return;  // a superseded service
  if (failover(self) && st.joined) return begin_move(self, "was lost (" + self->system().render(dm.reason) + ")");
  st.log->error("coordination service lost ({}): stopping", self->system().render(dm.reason));
  emit_event("coordinator_lost", {});
  lose(self, {loss_kind::coordinator_lost, 0, 0, "coordination service lost"});
}

// -------------------------------------------------------------------- notices

/// A notice from the signal watcher (or session::notify): claimed at the
/// trainer's current step. The claim leaves first: the log line and the
/// event are not on the path to the agreement.
void on_notice(watcher_ptr self, msg<proto::Notice>& m) {
  auto& st = self->state;
  auto r = decode(m);
  if (!r) return;
  auto n = r->get();
  uint64_t started = st.ctl->started.load();
  auto claim = make<proto::Claim>([&](auto b) {
    b.setNotice(n);
    b.setStartedStep(started);
  });
  self->request(st.current, st.cfg.request_timeout, std::move(claim))
      .then(
          [self](msg<proto::ClaimReply>& rep) {
            auto r = decode(rep);
            if (!r) return;
            if (r->get().getWon())
              self->state.log->info("claim won (agreement #{})", r->get().getAgreementId());
            else
              self->state.log->info("claim taken by {}: deferring", r->get().getHolder());
          },
          [self](caf::error& e) {
            self->state.log->error("claim failed: {}", self->system().render(e));
            // With failover the successor's round saves and stops the group,
            // which is what the notice asks for.
            if (failover(self)) return begin_move(self, "did not answer a claim");
            lose(self, {loss_kind::coordinator_lost, 0, 0, "coordination service unreachable while claiming a notice"});
          });
  st.log->info("termination notice ({}): claiming at step {}", str(n.getDetail()), started);
  emit_event("notice", {{"source", static_cast<int>(n.getSource())},
                        {"detail", str(n.getDetail())},
                        {"deadline_ns", n.getDeadlineNs()},
                        {"received_ns", n.getReceivedNs()},
                        {"step", started}});
}

void on_tick(watcher_ptr self) {
  auto& st = self->state;
  auto hb = make<proto::Heartbeat>([&](auto b) {
    b.setRank(st.cfg.rank);
    b.setIncarnation(st.cfg.incarnation);
    b.setCompletedStep(st.ctl->completed.load(std::memory_order_relaxed));
    b.setLastStepNs(st.ctl->last_step_ns.load(std::memory_order_relaxed));
    b.setLastSaveNs(st.ctl->last_save_ns.load(std::memory_order_relaxed));
  });
  if (st.cfg.relay)
    self->send(st.cfg.relay, std::move(hb));
  else
    self->send(st.current, std::move(hb));
  self->delayed_send(self, st.cfg.heartbeat, tick_atom::value);
}

/// The message table: what comes from the coordinator is handed to the
/// trainer through the control block (post, then abort where a collective
/// may wait on a peer that is gone).
peer_watcher_actor::behavior_type peer_watcher(watcher_ptr self, std::shared_ptr<coordinator_ref> coord,
                                               std::shared_ptr<control_block> control, peer_watcher_config cfg) {
  auto& st = self->state;
  st.coord = std::move(coord);
  st.current = st.coord->get();
  st.ctl = std::move(control);
  st.cfg = std::move(cfg);
  st.log = st.cfg.log ? st.cfg.log : spdlog::default_logger();
  self->monitor(st.current);
  if (st.cfg.relay) self->monitor(st.cfg.relay);
  self->set_down_handler([self](caf::down_msg& dm) { on_down(self, dm); });
  if (failover(self)) self->send(self, follow_atom::value);
  return {
      [self](join_atom, msg<proto::Join>& m) { return on_join(self, m); },
      [self](msg<proto::Notice>& m) { on_notice(self, m); },
      [self](msg<proto::CheckpointAt>& m) {
        if (!from_current(self)) return;
        if (auto r = decode(m)) {
          auto c = r->get();
          checkpoint_order o{c.getAgreementId(), c.getStep(), from_wire(c.getKind()), c.getAgreed(),
                             c.getSaver(),       c.getExitAfter(), c.getDeadlineNs()};
          o.all_save = c.getAllSave();
          o.from_kept = c.getFromKept();
          for (auto r : c.getFromReplica()) o.from_replica.push_back(r);
          on_order(self, o);
        }
      },
      [self](msg<proto::Committed>& m) {
        if (!from_current(self)) return;
        if (auto r = decode(m))
          self->state.ctl->post_commit({r->get().getAgreementId(), r->get().getStep(), r->get().getExitAfter()});
      },
      [self](msg<proto::PeerLost>& m) {
        if (!from_current(self)) return;
        if (auto r = decode(m))
          lose(self, {from_wire(r->get().getReason()), r->get().getRank(), r->get().getLastStep(),
                      str(r->get().getDetail())});
      },
      [self](msg<proto::ClusterError>& m) {
        if (!from_current(self)) return;
        if (auto r = decode(m)) {
          self->state.ctl->post_failure({r->get().getOriginRank(), r->get().getStep(), str(r->get().getMessage())});
          self->state.ctl->abort();
        }
      },
      [self](msg<proto::DeadlineUpdate>& m) {
        if (!from_current(self)) return;
        if (auto r = decode(m)) self->state.ctl->post_deadline(r->get().getDeadlineNs());
      },
      [self](msg<proto::CommitParts>& m) {
        if (!from_current(self) || !self->state.cfg.on_commit_parts) return;
        if (auto r = decode(m)) {
          std::vector<std::string> servers;
          for (auto s : r->get().getServers()) servers.push_back(str(s));
          self->state.cfg.on_commit_parts(r->get().getAgreementId(), r->get().getStep(), std::move(servers));
        }
      },
      [self](msg<proto::Recover>& m) {
        if (!from_current(self)) return;
        if (auto r = decode(m)) {
          auto c = r->get();
          recover_order o{c.getAgreementId(), c.getStep(), c.getDonor(), str(c.getDonorEndpoint()),
                          str(c.getRendezvousPrefix()), {}};
          for (auto x : c.getReplaced()) o.replaced.push_back(x);
          self->state.ctl->post_recover(o);
        }
      },
      [self](tick_atom) { on_tick(self); },
      [self](follow_atom) { on_follow(self); },
      [self](moved_atom, caf::actor& h, uint64_t epoch, const std::string& why) { on_moved(self, h, epoch, why); },
  };
}

}  // namespace

peer_watcher_actor spawn_peer_watcher(caf::actor_system& sys, std::shared_ptr<coordinator_ref> coord,
                                      std::shared_ptr<control_block> control, peer_watcher_config cfg) {
  return sys.spawn(peer_watcher, std::move(coord), std::move(control), std::move(cfg));
}

}  // namespace grace
