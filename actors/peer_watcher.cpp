#include "actors/peer_watcher.hpp"

#include "messages/convert.hpp"
#include "runtime/control.hpp"
#include "runtime/events.hpp"

#include <caf/actor_system.hpp>
#include <caf/system_messages.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>
#include <caf/typed_response_promise.hpp>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>

namespace grace {

namespace {

struct peer_watcher_state {
  static inline const char* name = "peer_watcher";
  coordinator_actor coord;
  std::shared_ptr<control_block> ctl;
  peer_watcher_config cfg;
  std::shared_ptr<spdlog::logger> log;
  bool joined = false;
};

using self_ptr = peer_watcher_actor::stateful_pointer<peer_watcher_state>;

void lose(self_ptr self, loss_info l) {
  auto& st = self->state;
  st.ctl->post_loss(l);
  st.ctl->abort();
}

/// A checkpoint order: hand it to the trainer, then acknowledge what can be
/// acknowledged without it (see the protocol in runtime/agreement.hpp).
void on_order(self_ptr self, const checkpoint_order& o) {
  auto& st = self->state;
  auto progress = st.ctl->post_order(o);
  if (o.agreed) return;
  if (o.kind != checkpoint_kind::jit) {
    auto earliest = std::max(o.step, progress.started);
    self->send(st.coord, make<proto::Ack>([&](auto b) {
                 b.setAgreementId(o.id);
                 b.setRank(st.cfg.rank);
                 b.setEarliestStep(earliest);
               }));
    return;
  }
  // A peer is gone. A trainer inside a step has its collective aborted and
  // acknowledges its completed step once the step has failed (or, if the
  // step got everything it needed, completed). A trainer outside a step
  // (at a boundary, restoring, in its rendezvous) cannot start one any more
  // (Dekker), so its completed step is final: acknowledge it now.
  if (progress.idle()) {
    self->send(st.coord, make<proto::Ack>([&](auto b) {
                 b.setAgreementId(o.id);
                 b.setRank(st.cfg.rank);
                 b.setEarliestStep(progress.completed);
               }));
    st.ctl->post_acked_for_trainer(o.id);
  }
  st.ctl->abort();
}

/// Joins through the coordinator; the answer goes back to the trainer
/// (session::impl::join). Once accepted, heartbeats start and requests wait
/// as long as the service's verdict wait.
caf::result<msg<proto::Welcome>> on_join(self_ptr self, msg<proto::Join>& m) {
  auto& st = self->state;
  auto rp = self->make_response_promise<msg<proto::Welcome>>();
  self->request(st.coord, st.cfg.request_timeout, std::move(m))
      .then(
          [self, rp](msg<proto::Welcome>& w) mutable {
            auto r = decode(w);
            if (r && r->get().getAccepted() && !self->state.joined) {
              self->state.joined = true;
              if (auto ms = r->get().getVerdictWaitMs())
                self->state.cfg.request_timeout = std::chrono::milliseconds(ms);
              self->send(self, tick_atom::value);
            }
            rp.deliver(std::move(w));
          },
          [self, rp](caf::error& e) mutable {
            auto why = "join failed: " + self->system().render(e);
            rp.deliver(make<proto::Welcome>([&](auto b) {
              b.setAccepted(false);
              b.setReason(why);
            }));
          });
  return rp;
}

/// A notice from the signal watcher (or session::notify): claimed at the
/// trainer's current step. The claim leaves first: the log line and the
/// event are not on the path to the agreement.
void on_notice(self_ptr self, msg<proto::Notice>& m) {
  auto& st = self->state;
  auto r = decode(m);
  if (!r) return;
  auto n = r->get();
  uint64_t started = st.ctl->started.load();
  auto claim = make<proto::Claim>([&](auto b) {
    b.setNotice(n);
    b.setStartedStep(started);
  });
  self->request(st.coord, st.cfg.request_timeout, std::move(claim))
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
            lose(self, {loss_kind::coordinator_lost, 0, 0, "coordination service unreachable while claiming a notice"});
          });
  st.log->info("termination notice ({}): claiming at step {}", str(n.getDetail()), started);
  emit_event("notice", {{"source", static_cast<int>(n.getSource())},
                        {"detail", str(n.getDetail())},
                        {"deadline_ns", n.getDeadlineNs()},
                        {"received_ns", n.getReceivedNs()},
                        {"step", started}});
}

void on_tick(self_ptr self) {
  auto& st = self->state;
  self->send(st.coord, make<proto::Heartbeat>([&](auto b) {
               b.setRank(st.cfg.rank);
               b.setIncarnation(st.cfg.incarnation);
               b.setCompletedStep(st.ctl->completed.load(std::memory_order_relaxed));
               b.setLastStepNs(st.ctl->last_step_ns.load(std::memory_order_relaxed));
               b.setLastSaveNs(st.ctl->last_save_ns.load(std::memory_order_relaxed));
             }));
  self->delayed_send(self, st.cfg.heartbeat, tick_atom::value);
}

/// The message table: what comes from the coordinator is handed to the
/// trainer through the control block (post, then abort where a collective
/// may wait on a peer that is gone).
peer_watcher_actor::behavior_type peer_watcher(self_ptr self, coordinator_actor coord,
                                               std::shared_ptr<control_block> control, peer_watcher_config cfg) {
  auto& st = self->state;
  st.coord = coord;
  st.ctl = std::move(control);
  st.cfg = std::move(cfg);
  st.log = st.cfg.log ? st.cfg.log : spdlog::default_logger();
  self->monitor(coord);
  self->set_down_handler([self](caf::down_msg& dm) {
    self->state.log->error("coordination service lost ({}): stopping", self->system().render(dm.reason));
    emit_event("coordinator_lost", {});
    lose(self, {loss_kind::coordinator_lost, 0, 0, "coordination service lost"});
  });
  return {
      [self](join_atom, msg<proto::Join>& m) { return on_join(self, m); },
      [self](msg<proto::Notice>& m) { on_notice(self, m); },
      [self](msg<proto::CheckpointAt>& m) {
        if (auto r = decode(m)) {
          auto c = r->get();
          on_order(self, checkpoint_order{c.getAgreementId(), c.getStep(), from_wire(c.getKind()), c.getAgreed(),
                                          c.getSaver(), c.getExitAfter(), c.getDeadlineNs()});
        }
      },
      [self](msg<proto::Committed>& m) {
        if (auto r = decode(m))
          self->state.ctl->post_commit({r->get().getAgreementId(), r->get().getStep(), r->get().getExitAfter()});
      },
      [self](msg<proto::PeerLost>& m) {
        if (auto r = decode(m))
          lose(self, {from_wire(r->get().getReason()), r->get().getRank(), r->get().getLastStep(),
                      str(r->get().getDetail())});
      },
      [self](msg<proto::ClusterError>& m) {
        if (auto r = decode(m)) {
          self->state.ctl->post_failure({r->get().getOriginRank(), r->get().getStep(), str(r->get().getMessage())});
          self->state.ctl->abort();
        }
      },
      [self](msg<proto::DeadlineUpdate>& m) {
        if (auto r = decode(m)) self->state.ctl->post_deadline(r->get().getDeadlineNs());
      },
      [self](tick_atom) { on_tick(self); },
  };
}

}  // namespace

peer_watcher_actor spawn_peer_watcher(caf::actor_system& sys, coordinator_actor coord,
                                      std::shared_ptr<control_block> control, peer_watcher_config cfg) {
  return sys.spawn(peer_watcher, std::move(coord), std::move(control), std::move(cfg));
}

}  // namespace grace
