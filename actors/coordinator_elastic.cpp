/// Elastic groups (runtime/coordination/elastic.hpp): the plan each
/// launcher asks for, and the growth claimed when nodes wait to join.
#include "actors/coordinator_parts.hpp"
#include "actors/convert.hpp"
#include "runtime/base/events.hpp"

#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>

namespace grace::coord {

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
    st.elastic.told_finished.insert(node);
    return plan_message(proto::PlanStatus::FINISHED, st.cfg.incarnation, nullptr,
                        "the job finished without this node (its last group's workers left with exit code 0)");
  }
  auto a = st.elastic.planner->ask(node, host, from);
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
  if (!st.elastic.planner || !st.elastic.planner->growth_due() || st.elastic.grown.count(st.cfg.incarnation) || fenced(self)) return;
  auto acts = st.agree->on_claim(launcher_rank, 0, 0);
  const bool won = std::any_of(acts.begin(), acts.end(), [](const agreement_action& a) {
    return a.what == agreement_action::type::claim_reply && a.won;
  });
  if (!won) return;
  st.elastic.grown.insert(st.cfg.incarnation);
  std::string waiting;
  for (auto& [node, host] : st.elastic.planner->waiting())
    if (!st.elastic.planner->current()->has(node)) waiting += (waiting.empty() ? "" : ", ") + std::to_string(node);
  st.log->info("node(s) {} wait to join the group of {}: it saves at an agreed step and restarts with them", waiting,
               st.elastic.planner->current()->describe());
  emit_event("grow", {{"incarnation", st.cfg.incarnation}, {"waiting", waiting}});
  dispatch(self, acts);
}

/// Decides the current plan when a rule is met, answers the launchers it
/// settles, and claims a growth when one is due.
void advance_plan(coordinator_ptr self) {
  auto& st = self->state;
  if (!st.elastic.planner) return;
  if (auto p = st.elastic.planner->decide(now_ns(self))) {
    st.cfg.world_size = p->world_size();
    st.agree = std::make_unique<agreement>(st.cfg.world_size, st.cfg.first_agreement_id);
    st.log->info("the group of incarnation {}: {}", p->incarnation, p->describe());
    nlohmann::json nodes = p->nodes;
    emit_event("group_formed", {{"incarnation", p->incarnation}, {"nodes", nodes}, {"world_size", p->world_size()}});
  } else if (!st.elastic.planner->current() && now_ns(self) - st.elastic.said_ns > 5'000'000'000) {
    st.elastic.said_ns = now_ns(self);
    st.log->info("forming the group of incarnation {}: {}", st.cfg.incarnation, st.elastic.planner->progress());
  }
  for (auto it = st.elastic.waiters.begin(); it != st.elastic.waiters.end();) {
    auto reply = plan_reply(self, it->node, it->host, it->from);
    if (!reply) {
      ++it;
      continue;
    }
    it->promise.deliver(std::move(*reply));
    it = st.elastic.waiters.erase(it);
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
  if (!st.elastic.planner) return refused("this job is not elastic: give every launcher the same --nnodes MIN:MAX");
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
  st.elastic.waiters.erase(std::remove_if(st.elastic.waiters.begin(), st.elastic.waiters.end(),
                                       [&](const auto& w) { return w.node == node; }),
                        st.elastic.waiters.end());
  auto rp = self->make_response_promise<msg<proto::GroupPlan>>();
  st.elastic.waiters.push_back({node, host, q.getFromIncarnation(), rp});
  return rp;
}

/// Elastic jobs, once they finished: the registered nodes not in the last
/// group that have not heard it ("1,3").
std::string owed_finish(coordinator_ptr self) {
  auto& st = self->state;
  auto plan = current_plan(self);
  std::set<int32_t> owed;
  for (auto& [id, l] : st.peers.launchers)
    if (!(plan && plan->has(l.first)) && !st.elastic.told_finished.count(l.first)) owed.insert(l.first);
  std::string out;
  for (auto n : owed) out += (out.empty() ? "" : ",") + std::to_string(n);
  return out;
}

}  // namespace grace::coord
