#include "actors/launcher_parts.hpp"

#include "runtime/base/events.hpp"
#include "runtime/base/exit_codes.hpp"
#include "runtime/checkpoint/checkpoint.hpp"

#include <caf/actor_system.hpp>
#include <caf/scoped_actor.hpp>
#include <nlohmann/json.hpp>
#include <poll.h>

namespace grace::launch {

/// One ask for the plan of the first group this node may join from
/// incarnation `from` on. The service holds the request until that plan is
/// decided; nothing when no answer came within a second (asked again).
std::optional<msg<proto::GroupPlan>> launcher::request_plan(uint32_t from) {
  std::optional<msg<proto::GroupPlan>> out;
  caf::scoped_actor self{rt_->sys()};
  self->request(svc_.coord, std::chrono::seconds(1), make<proto::GroupPlanRequest>([&](auto b) {
                  b.setNode(o_.node_rank);
                  b.setFromIncarnation(from);
                  b.setHost(ep_.adv.address);
                }))
      .receive([&](msg<proto::GroupPlan>& m) { out = std::move(m); }, [](caf::error&) {});
  return out;
}

/// This node's group: its slot, the world and the incarnation.
void launcher::adopt_plan(proto::GroupPlan::Reader p) {
  group_plan g;
  g.incarnation = p.getIncarnation();
  g.nproc = p.getWorkersPerNode();
  for (auto n : p.getNodes()) g.nodes.push_back(n);
  for (auto h : p.getHosts()) g.hosts.push_back(str(h));
  shape_.slot = g.slot_of(o_.node_rank).value_or(0);
  shape_.world = g.world_size();
  shape_.incarnation = g.incarnation;
  say("the group of incarnation " + std::to_string(shape_.incarnation) + ": " + g.describe() + "; this node is slot " +
      std::to_string(shape_.slot) + " (ranks " + std::to_string(rank_of(0)) + "-" + std::to_string(rank_of(o_.nproc - 1)) +
      ")");
  shape_.plan = std::move(g);
  emit_event("group_plan", {{"incarnation", shape_.incarnation}, {"slot", shape_.slot}, {"world_size", shape_.world},
                            {"nodes", nlohmann::json(shape_.plan->nodes)}, {"master_addr", torchrun_shape().master_addr}});
}

/// A reply to a plan request: adopted (nullopt with `from` unchanged), the
/// next incarnation to ask for (excluded: `from` moves on), or the decision
/// to stop.
std::optional<launcher_decision> launcher::take_plan(const msg<proto::GroupPlan>& m, uint32_t& from,
                                                     bool& said_excluded) {
  auto r = decode(m);
  if (!r) return launcher_decision{false, true, exit_code::usage, "group plan: " + r.err().message};
  auto p = r->get();
  const auto why = str(p.getReason());
  bool has_node = false;
  for (auto n : p.getNodes()) has_node |= n == o_.node_rank;
  switch (p.getStatus()) {
    case proto::PlanStatus::PLAN:
      if (!has_node || p.getWorkersPerNode() != static_cast<uint32_t>(o_.nproc) ||
          p.getHosts().size() != p.getNodes().size())
        return launcher_decision{false, true, exit_code::usage,
                                 "the coordination service sent a group plan without this node or for another "
                                 "number of workers per node (protocol error)"};
      adopt_plan(p);
      return std::nullopt;
    case proto::PlanStatus::EXCLUDED:
      from = p.getIncarnation() + 1;
      if (!std::exchange(said_excluded, true))
        say(why + ": this node waits for the next group (a group smaller than " + std::to_string(o_.nnodes) +
            " nodes saves at an agreed step and restarts with it)");
      return std::nullopt;
    case proto::PlanStatus::FINISHED:
      return launcher_decision{false, true, exit_code::success, "nothing to join: " + why};
    default:
      return launcher_decision{false, true, exit_code::usage,
                               "the coordination service refused this node's place in a group: " + why};
  }
}

/// Elastic jobs, before each group: asks until the service decides a group
/// that has this node (a node excluded from a group formed without it asks
/// for the next: the group grows at its next agreed save). Stops on a
/// signal, when the service is gone for --coordinator-wait-ms, or after
/// --join-timeout-ms without a group.
std::optional<launcher_decision> launcher::await_plan() {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  auto heard = t0, probed = t0;
  uint32_t from = shape_.incarnation;
  bool said_wait = false, said_excluded = false;
  shape_.plan.reset();
  while (!shape_.plan) {
    if (svc_.elector) take_leadership_events();
    if (svc_.finished_elsewhere) return finished_elsewhere();
    if (auto sig = stop_signal())
      return launcher_decision{false, true, o_.restart_code,
                               "received " + *sig + " while waiting for its group (no worker was running here)"};
    const auto now = clock::now();
    if (auto reply = request_plan(from)) {
      heard = now;
      if (auto stop = take_plan(*reply, from, said_excluded)) return stop;
      continue;
    }
    // Held by the service, or the service is gone: probe it now and then.
    if (!hosts_service() && now - probed > std::chrono::seconds(3)) {
      probed = now;
      if (current_incarnation(rt_->sys(), svc_.coord, [this] { return connect_as_launcher(std::chrono::seconds(2)); }))
        heard = clock::now();
    }
    if (!hosts_service() && now - heard > o_.coordinator_wait)
      return coordinator_gone(svc_.host + ":" + std::to_string(svc_.port),
                              std::chrono::duration_cast<std::chrono::milliseconds>(now - heard).count(),
                              o_.checkpoint_dir.empty() ? 0 : local_store().newest_valid_step(),
                              o_.restart_code, "", node_.level_problem);
    if (now - t0 > o_.join_timeout)
      return launcher_decision{false, true, exit_code::no_progress,
                               "no group with this node formed within --join-timeout-ms (" +
                                   std::to_string(o_.join_timeout.count()) + " ms): fewer than " +
                                   std::to_string(o_.elastic() ? o_.min_nodes : o_.nnodes) + " nodes were ready"};
    if (!std::exchange(said_wait, true))
      say("waiting for the group of incarnation " + std::to_string(from) + " or later: " +
          (o_.elastic() ? std::to_string(o_.min_nodes) + " to " + std::to_string(o_.nnodes) +
                              " nodes; the coordination service waits up to " +
                              std::to_string(o_.elastic_wait.count()) + " ms for missing ones"
                        : "all " + std::to_string(o_.nnodes) + " nodes"));
  }
  return std::nullopt;
}

/// Elastic jobs: whether the group that just ended was ended by the
/// service to take in a waiting node (not a failure).
bool launcher::ended_for_growth() {
  return ask_resized(rt_->sys(), svc_.coord, shape_.incarnation, std::chrono::seconds(2)).value_or(false);
}

/// Elastic jobs that finished while a node of theirs was away (cut off,
/// frozen, or restarting): the service stays up until each such node has
/// asked for its next group and heard that the job finished (it then
/// exits 0 instead of waiting for a service that is gone), at most
/// --coordinator-wait-ms (the time such a node itself waits for the
/// service). A node lost for good costs the job's end that wait.
void launcher::await_stragglers() {
  auto owed = [this] { return ask_owed(rt_->sys(), svc_.coord, std::chrono::seconds(2)).value_or(""); };

  auto nodes = owed();
  if (nodes.empty()) return;
  say("the job finished without node(s) " + nodes + ": keeping the coordination service up for at most " +
      std::to_string(o_.coordinator_wait.count() / 1000) + " s so they hear it (--coordinator-wait-ms)");
  const auto until = std::chrono::steady_clock::now() + o_.coordinator_wait;
  while (!nodes.empty() && std::chrono::steady_clock::now() < until && !stop_signal()) {
    pollfd p{sfd_, POLLIN, 0};
    ::poll(&p, 1, 200);
    nodes = owed();
  }
  if (!nodes.empty()) say("node(s) " + nodes + " did not come back before the job's end");
}

torchrun_group launcher::torchrun_shape() const {
  if (shape_.plan) return {shape_.plan->hosts.empty() ? svc_.host : shape_.plan->hosts.front(), shape_.world, shape_.slot,
                     static_cast<uint32_t>(shape_.plan->nodes.size())};
  return {svc_.host, shape_.world, static_cast<uint32_t>(o_.node_rank), static_cast<uint32_t>(o_.nnodes)};
}

}  // namespace grace::launch
