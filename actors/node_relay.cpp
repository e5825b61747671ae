#include "actors/node_relay.hpp"

#include "actors/peer_watcher.hpp"
#include "actors/convert.hpp"
#include "runtime/coordination/cluster_config.hpp"
#include "runtime/coordination/relay_batches.hpp"

#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/io/middleman.hpp>
#include <caf/openssl/publish.hpp>
#include <caf/openssl/remote_actor.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/system_messages.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <spdlog/spdlog.h>

#include <map>

namespace grace {

namespace {

struct node_relay_state {
  static inline const char* name = "node_relay";
  node_relay_config cfg;
  std::shared_ptr<spdlog::logger> log;
  coordinator_launcher coord;                      ///< the service (none until the launcher says)
  std::map<uint32_t, peer_watcher_actor> workers;  ///< local watchers of the current incarnation
  std::map<caf::actor_addr, uint32_t> ranks;
  relay_batches batches;
  uint32_t first_rank = 0;  ///< this node's first rank in the current group (an elastic job's slot * nproc)
  uint64_t flush_gen = 0;
};

using relay_ptr = node_relay_actor::stateful_pointer<node_relay_state>;

/// The service's orders reach the relay from the service only.
bool from_service(relay_ptr self) {
  auto sender = self->current_sender();
  return sender && self->state.coord && sender->node() == self->state.coord.node();
}

template <class M>
void fan_out(relay_ptr self, M& m) {
  if (!from_service(self)) return;
  for (auto& [rank, w] : self->state.workers) self->send(w, m);
}

/// A verdict on one of this node's ranks, in the current incarnation:
/// its launcher stops that worker.
void note_own_loss(relay_ptr self, msg<proto::PeerLost>& m) {
  auto& st = self->state;
  if (!st.cfg.on_own_rank_lost || !from_service(self)) return;
  auto r = decode(m);
  if (!r) return;
  auto p = r->get();
  if (p.getRank() < st.first_rank || p.getRank() - st.first_rank >= static_cast<uint32_t>(st.cfg.nproc)) return;
  if (p.getIncarnation() != st.batches.incarnation()) return;
  st.cfg.on_own_rank_lost(p.getRank(), p.getIncarnation(), str(p.getDetail()));
}

void send_acks(relay_ptr self, const std::vector<relay_ack>& acks) {
  auto& st = self->state;
  if (acks.empty() || !st.coord) return;
  self->send(st.coord, make<proto::AckBatch>([&](auto b) {
               b.setNode(st.cfg.node);
               auto list = b.initAcks(static_cast<unsigned>(acks.size()));
               for (size_t i = 0; i < acks.size(); ++i) {
                 list[i].setAgreementId(acks[i].id);
                 list[i].setRank(acks[i].rank);
                 list[i].setEarliestStep(acks[i].earliest);
                 set_copies(list[i], acks[i].copies);
               }
             }));
}

void on_ack(relay_ptr self, msg<proto::Ack>& m) {
  auto& st = self->state;
  auto r = decode(m);
  if (!r) return;
  auto a = r->get();
  auto sender = self->current_sender();
  auto it = sender ? st.ranks.find(caf::actor_cast<caf::actor_addr>(sender)) : st.ranks.end();
  if (it == st.ranks.end() || it->second != a.getRank()) return;  // only a worker for itself
  std::vector<relay_ack> older;
  bool first = !st.batches.acks_pending();
  auto out = st.batches.ack({a.getAgreementId(), a.getRank(), a.getEarliestStep(), copies_of(a)}, &older);
  send_acks(self, older);
  if (out == relay_batches::ack_outcome::complete) {
    ++st.flush_gen;
    send_acks(self, st.batches.take_acks());
  } else if (out == relay_batches::ack_outcome::pending && (first || !older.empty())) {
    self->delayed_send(self, st.cfg.ack_flush, flush_atom::value, ++st.flush_gen);
  }
}

void on_heartbeat(relay_ptr self, msg<proto::Heartbeat>& m) {
  auto& st = self->state;
  auto r = decode(m);
  if (!r) return;
  auto h = r->get();
  auto sender = self->current_sender();
  auto it = sender ? st.ranks.find(caf::actor_cast<caf::actor_addr>(sender)) : st.ranks.end();
  if (it == st.ranks.end() || it->second != h.getRank()) return;
  st.batches.beat({h.getRank(), h.getIncarnation(), h.getCompletedStep(), h.getLastStepNs(), h.getLastSaveNs()});
}

void on_tick(relay_ptr self) {
  auto& st = self->state;
  self->delayed_send(self, st.cfg.heartbeat, tick_atom::value);
  auto beats = st.batches.take_beats();
  if (beats.empty() || !st.coord) return;
  self->send(st.coord, make<proto::HeartbeatBatch>([&](auto b) {
               b.setNode(st.cfg.node);
               auto list = b.initBeats(static_cast<unsigned>(beats.size()));
               for (size_t i = 0; i < beats.size(); ++i) {
                 list[i].setRank(beats[i].rank);
                 list[i].setIncarnation(beats[i].incarnation);
                 list[i].setCompletedStep(beats[i].completed);
                 list[i].setLastStepNs(beats[i].last_step_ns);
                 list[i].setLastSaveNs(beats[i].last_save_ns);
               }
             }));
}

bool on_register(relay_ptr self, uint32_t rank, uint32_t incarnation) {
  auto& st = self->state;
  auto sender = self->current_sender();
  if (!sender || !st.batches.add_member(rank, incarnation)) return false;
  auto w = caf::actor_cast<peer_watcher_actor>(sender);
  if (auto old = st.workers.find(rank); old != st.workers.end()) st.ranks.erase(old->second.address());
  st.workers[rank] = w;
  st.ranks[w.address()] = rank;
  self->monitor(w);
  return true;
}

void on_incarnation(relay_ptr self, uint32_t incarnation, uint32_t first_rank) {
  auto& st = self->state;
  st.first_rank = first_rank;
  if (incarnation == st.batches.incarnation()) return;
  send_acks(self, st.batches.take_acks());
  st.batches.set_incarnation(incarnation);
  for (auto& [rank, w] : st.workers) self->demonitor(w.address());
  st.workers.clear();
  st.ranks.clear();
}

/// The service to talk to (at start, and after a failover): the relay
/// registers with it, from the launcher's process.
void on_coordinator(relay_ptr self, caf::actor& coord) {
  auto& st = self->state;
  st.coord = caf::actor_cast<coordinator_launcher>(coord);
  if (!st.coord) return;
  self->send(st.coord, make<proto::RelayRegister>([&](auto b) {
               b.setNode(st.cfg.node);
               b.setWorkersPerNode(st.cfg.nproc);
             }));
}

node_relay_actor::behavior_type node_relay(relay_ptr self, node_relay_config cfg) {
  auto& st = self->state;
  st.cfg = std::move(cfg);
  st.log = st.cfg.log ? st.cfg.log : spdlog::default_logger();
  st.first_rank = static_cast<uint32_t>(std::max(st.cfg.node, 0) * std::max(st.cfg.nproc, 0));
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& st = self->state;
    auto it = st.ranks.find(dm.source);
    if (it == st.ranks.end()) return;
    st.batches.remove_member(it->second);
    st.workers.erase(it->second);
    st.ranks.erase(it);
  });
  self->send(self, tick_atom::value);
  return {
      [self](relay_atom, uint32_t rank, uint32_t incarnation) { return on_register(self, rank, incarnation); },
      [self](msg<proto::Heartbeat>& m) { on_heartbeat(self, m); },
      [self](msg<proto::Ack>& m) { on_ack(self, m); },
      [self](msg<proto::CheckpointAt>& m) { fan_out(self, m); },
      [self](msg<proto::Committed>& m) { fan_out(self, m); },
      [self](msg<proto::PeerLost>& m) {
        note_own_loss(self, m);
        fan_out(self, m);
      },
      [self](msg<proto::ClusterError>& m) { fan_out(self, m); },
      [self](msg<proto::DeadlineUpdate>& m) { fan_out(self, m); },
      [self](msg<proto::Recover>& m) { fan_out(self, m); },
      [self](incarnation_atom, uint32_t inc, uint32_t first_rank) {
        if (self->current_sender() && self->current_sender()->node() == self->node())
          on_incarnation(self, inc, first_rank);
      },
      [self](coord_atom, caf::actor& coord) {
        if (self->current_sender() && self->current_sender()->node() == self->node()) on_coordinator(self, coord);
      },
      [self](tick_atom) {
        if (self->current_sender() == self->ctrl()) on_tick(self);
      },
      [self](flush_atom, uint64_t gen) {
        auto& st = self->state;
        if (self->current_sender() != self->ctrl() || gen != st.flush_gen) return;
        send_acks(self, st.batches.take_acks());
      },
  };
}

}  // namespace

node_relay_actor spawn_node_relay(caf::actor_system& sys, node_relay_config cfg) {
  return sys.spawn(node_relay, std::move(cfg));
}

result<uint16_t> publish_node_relay(caf::actor_system& sys, const node_relay_actor& relay) {
  auto p = sys.has_openssl_manager() ? caf::openssl::publish(relay, 0, "127.0.0.1", true)
                                     : sys.middleman().publish(relay, 0, "127.0.0.1", true);
  if (!p) return error{errc::failed, "cannot publish the node relay on 127.0.0.1: " + sys.render(p.error())};
  return *p;
}

result<node_relay_actor> connect_node_relay(caf::actor_system& sys, const std::string& where,
                                            std::chrono::milliseconds timeout) {
  auto hp = parse_host_port(where);
  if (!hp) return error{errc::invalid_input, "GRACE_RELAY: " + hp.err().message};
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    auto h = sys.has_openssl_manager() ? caf::openssl::remote_actor<node_relay_actor>(sys, hp->first, hp->second)
                                       : sys.middleman().remote_actor<node_relay_actor>(hp->first, hp->second);
    if (h) return *h;
    if (std::chrono::steady_clock::now() > deadline)
      return error{errc::disconnected, "cannot reach this node's relay at " + where + ": " + sys.render(h.error())};
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace grace
