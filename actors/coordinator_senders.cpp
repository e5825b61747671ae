/// Who may send what to the coordination service: members, launchers,
/// relays, the service's own timers. A refusal changes nothing; it is
/// counted, and logged once per sender.
#include "actors/coordinator_parts.hpp"
#include "actors/convert.hpp"
#include "runtime/net/job_token.hpp"

#include <caf/actor_cast.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

namespace grace::coord {

/// Logs a refused message or join once per sending process (an attacker or
/// a misconfigured node may send thousands); every one is counted.
void note_refusal(coordinator_ptr self, const std::string& what, const std::string& why) {
  auto& st = self->state;
  ++st.refusals.count;
  auto sender = self->current_sender();
  auto who = sender ? "node " + caf::to_string(sender->node()) : std::string("an anonymous sender");
  if (st.refusals.senders.insert(who).second)
    st.log->warn("refused {} from {}: {} (further refusals from it are counted, not logged)", what, who, why);
}

/// A message naming a member's rank is accepted only from the process (CAF
/// node) that joined as that rank in this incarnation: a process that can
/// reach the port without having joined, or a worker of an older
/// incarnation, cannot speak for a member. A refusal changes nothing; it is
/// counted, and logged once per sender.
bool from_member(coordinator_ptr self, uint32_t rank, const char* what) {
  auto& st = self->state;
  auto it = st.peers.workers.find(rank);
  auto sender = self->current_sender();
  if (it != st.peers.workers.end() && sender && sender->node() == it->second.node()) return true;
  note_refusal(self, std::string(what) + " for rank " + std::to_string(rank),
         "not the process that joined as rank " + std::to_string(rank) + " in incarnation " +
             std::to_string(st.cfg.incarnation));
  return false;
}

/// Key-value and barrier requests serve the collectives' rendezvous of
/// joined members: from a process where no member of this incarnation runs
/// (or an anonymous sender) they are refused, so nobody outside the job can
/// plant or read the addresses the ranks connect to.
bool from_member_process(coordinator_ptr self, const char* what) {
  auto& st = self->state;
  if (auto sender = self->current_sender())
    for (auto& [rank, w] : st.peers.workers)
      if (w.node() == sender->node()) return true;
  note_refusal(self, what, "no member of incarnation " + std::to_string(st.cfg.incarnation) + " runs there");
  return false;
}

/// Messages only a launcher sends (a forwarded notice, a worker's exit, the
/// incarnation, the checkpoint server) are accepted from the coordinator's
/// own process (node 0's launcher, or the chief hosting it in-process) and
/// from a process registered as the launcher of a node; `node`, when given,
/// must be the registered launcher's own node.
bool from_launcher(coordinator_ptr self, const char* what, std::optional<int32_t> node) {
  auto& st = self->state;
  auto sender = self->current_sender();
  if (sender && sender->node() == self->node()) return true;
  if (sender)
    if (auto it = st.peers.launchers.find(sender->node()); it != st.peers.launchers.end()) {
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
  auto it = self->state.peers.launchers.find(sender->node());
  if (it == self->state.peers.launchers.end() || it->second.second <= 0) return std::nullopt;
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
  if (st.elastic.planner) return static_cast<uint32_t>(node) < st.cfg.max_nodes && nproc == st.cfg.nproc;
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
  if (!st.elastic.planner) job_lo = job_hi = st.cfg.nproc > 0 ? st.cfg.world_size / static_cast<uint32_t>(st.cfg.nproc) : hi;
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
          (st.elastic.planner ? "an elastic job of at most " + std::to_string(st.cfg.max_nodes) + " nodes of " +
                            std::to_string(st.cfg.nproc) + " workers"
                      : "a world of " + std::to_string(st.cfg.world_size));
  if (!why.empty()) {
    note_refusal(self, "a launcher registration for node " + std::to_string(node), why);
    return why;
  }
  for (auto it = st.peers.launchers.begin(); it != st.peers.launchers.end();)  // a restarted launcher replaces its old process
    it = it->second.first == node && it->first != sender->node() ? st.peers.launchers.erase(it) : std::next(it);
  if (st.peers.launchers.emplace(sender->node(), std::make_pair(node, nproc)).second)
    st.log->info("launcher of node {} registered", node);
  check_takeover(self);
  return {};
}

msg<proto::LauncherRegisterReply> on_launcher_register(coordinator_ptr self, const msg<proto::LauncherRegister>& m) {
  std::string why = "a malformed registration";
  if (auto r = decode(m)) {
    auto g = r->get();
    why = on_launcher(self, g.getNode(), g.getWorkersPerNode(), str(g.getToken()), g.getMinNodes(), g.getMaxNodes());
  }
  return make<proto::LauncherRegisterReply>([&](auto b) { b.setRefused(why); });
}

/// A node relay registers, from its launcher's process (registered for
/// that node, or this service's own).
void on_relay(coordinator_ptr self, int32_t node, int32_t nproc) {
  auto& st = self->state;
  auto sender = self->current_sender();
  if (!sender || !from_launcher(self, "a relay registration", node)) return;
  if ((st.peers.relay_nproc > 0 && nproc != st.peers.relay_nproc) || !node_fits(self, node, nproc)) {
    note_refusal(self, "a relay registration for node " + std::to_string(node), "it does not fit the job");
    return;
  }
  auto relay = caf::actor_cast<node_relay_actor>(sender);
  st.peers.relay_nproc = nproc;
  if (auto old = st.peers.relays.find(node); old != st.peers.relays.end()) self->demonitor(old->second.address());
  st.peers.relays[node] = relay;
  self->monitor(relay);
  st.log->info("node {}'s relay registered: its {} workers' orders, heartbeats and acknowledgements go through it",
               node, nproc);
}

/// A batch is accepted only from the relay registered for its node, and
/// only for that node's ranks.
bool from_relay(coordinator_ptr self, int32_t node, const char* what) {
  auto& st = self->state;
  auto sender = self->current_sender();
  auto it = st.peers.relays.find(node);
  if (sender && it != st.peers.relays.end() && sender == it->second.address()) return true;
  note_refusal(self, what, "not the relay registered for node " + std::to_string(node));
  return false;
}

bool rank_of_node(coordinator_ptr self, uint32_t rank, int32_t node) {
  auto& st = self->state;
  return node_of_rank(self, rank, st.peers.relay_nproc) == node && st.peers.workers.count(rank);
}

}  // namespace grace::coord
