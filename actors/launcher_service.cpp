#include "actors/launcher_parts.hpp"

#include "runtime/base/atomic_file.hpp"
#include "runtime/base/events.hpp"
#include "runtime/coordination/cluster_config.hpp"
#include "runtime/base/exit_codes.hpp"

#include <caf/actor_system.hpp>
#include <caf/after.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <caf/system_messages.hpp>
#include <spdlog/spdlog.h>
#include <algorithm>
#include <filesystem>
#include <poll.h>
#include <unistd.h>

namespace grace::launch {

/// The coordinator's current incarnation, asked by a launcher on node > 0
/// before it starts a group. Reconnects once if the old connection is gone
/// (a partition, a restart of this host). Nothing if it cannot be reached.
std::optional<uint32_t> current_incarnation(caf::actor_system& sys, coordinator_launcher& coord,
                                            const std::function<result<coordinator_launcher>()>& reconnect) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto out = ask_incarnation(sys, coord, std::nullopt, std::chrono::seconds(2));
    if (out || attempt == 1) return out;
    auto h = reconnect();
    if (!h) return std::nullopt;
    coord = *h;
  }
  return std::nullopt;
}

/// Node > 0: connects to the coordination service and registers this
/// process as the node's launcher (coordinator.hpp, register_launcher).
result<coordinator_launcher> launcher::connect_as_launcher(std::chrono::milliseconds timeout) {
  auto& sys = rt_->sys();
  auto h = connect_coordinator(sys, svc_.host, svc_.port, timeout);
  if (!h) return h.err();
  if (auto st = register_launcher(sys, *h, o_.node_rank, o_.nproc, token_, o_.elastic() ? o_.min_nodes : o_.nnodes,
                                  o_.nnodes);
      !st)
    return st.err();
  svc_.coord = *h;
  tell_relay_coordinator();
  // Whichever service this is (a successor elected since), it learns where
  // this node's checkpoints are served.
  if (node_.ckpt_server) checkpoint_peers(sys, svc_.coord, o_, node_.ckpt_server->endpoint());
  return svc_.coord;
}

status launcher::host_or_join_coordinator() {
  system_options so;
  so.tls = tls_;
  rt_ = std::make_unique<actor_runtime>(so);
  if (auto st = start_relay(); !st) return st;
  if (!o_.etcd.empty()) return start_election();
  if (o_.node_rank != 0) {
    auto h = connect_as_launcher(std::chrono::seconds(60));
    if (!h) return h.err();
    svc_.coord = *h;
    return {};
  }
  if (auto st = host_service(false, 0); !st) return st;
  if (auto w = plaintext_warning(ep_.listen_ip, tls_.any())) say(*w);
  return {};
}

coordinator_config launcher::service_config(bool takeover, uint64_t epoch) {
  coordinator_config cc;
  cc.world_size = shape_.world;
  cc.run_id = o_.run_id;
  cc.token = token_;
  cc.incarnation = shape_.incarnation;
  cc.dead_after = o_.dead_after;
  cc.hung_after = o_.hang_after;
  cc.connection_timeout = system_options{}.connection_timeout;
  cc.recovery_in_place = o_.in_place;
  cc.replace_timeout = o_.replace_timeout;
  // Member-lost verdicts come back here, so a worker the coordinator has
  // declared dead (frozen, hung) is killed at once instead of holding the
  // restart until --exit-timeout-ms.
  cc.on_member_lost = [v = group_.verdicts](uint32_t rank, uint32_t inc, uint32_t pid, const std::string& why) {
    v->push(rank, inc, why, pid);
  };
  // Heartbeats feed the metrics and the goodput account.
  cc.on_progress = [m = monitor_](uint32_t rank, uint64_t completed, int64_t last_step_ns) {
    m->progress(rank, completed, last_step_ns);
  };
  // A successor's ids lie above every id of its predecessors (epochs only grow).
  cc.first_agreement_id = epoch * 1'000'000;
  cc.takeover = takeover;
  cc.takeover_window = o_.takeover_window;
  // The node whose lease ran out: its ranks need not be waited for once
  // every other rank is back.
  if (takeover && svc_.leader_node != o_.node_rank) cc.lost_leader_node = svc_.leader_node;
  cc.own_node = o_.node_rank;
  cc.nproc = o_.nproc;
  if (svc_.elector) cc.lease_holds = lease_check();
  if (planned()) {
    cc.min_nodes = static_cast<uint32_t>(o_.elastic() ? o_.min_nodes : o_.nnodes);
    cc.max_nodes = static_cast<uint32_t>(o_.nnodes);
    cc.elastic_wait = o_.elastic_wait;
    if (takeover) cc.plan = shape_.plan;  // the group it takes over
  }
  return cc;
}

/// The hosted service's fence (coordinator_config::lease_holds). Its wait
/// covers the elector's renewal try at its slowest (each etcd endpoint
/// timing out on connect and on read), so the check reports the outcome
/// and never gives up while the elector still leads.
std::function<bool()> launcher::lease_check() const {
  const auto limit = std::chrono::milliseconds(2000 * (1 + std::count(o_.etcd.begin(), o_.etcd.end(), ',')) + 1000);
  return [w = std::weak_ptr<leader_campaign>(svc_.elector), limit] {
    auto e = w.lock();
    return e && e->lease_holds(limit);
  };
}

/// Spawns and publishes the coordination service on this node.
status launcher::host_service(bool takeover, uint64_t epoch) {
  auto& sys = rt_->sys();
  auto coord = spawn_coordinator(sys, service_config(takeover, epoch));
  auto p = publish_coordinator(sys, coord, svc_.elector ? o_.coordinator_port : svc_.port, ep_.listen_ip);
  if (!p) {
    caf::anon_send_exit(coord, caf::exit_reason::user_shutdown);
    return p.err();
  }
  {
    std::lock_guard<std::mutex> g(svc_.hosted_m);
    svc_.hosted = coord;
    svc_.hosted_port = *p;
  }
  svc_.coord = coord;
  svc_.port = *p;
  tell_relay_coordinator();
  return {};
}

/// Closes the coordination service's port and stops it, waiting (at most
/// 2 s) until it is down: its state holds the workers' remote handles, and
/// an actor system destroyed while it still ran could leave it and CAF's
/// connection broker referring to each other, never freed.
void launcher::stop_coordinator() {
  auto& sys = rt_->sys();
  coordinator_actor hosted;
  uint16_t port;
  {
    std::lock_guard<std::mutex> g(svc_.hosted_m);
    hosted = std::exchange(svc_.hosted, coordinator_actor{});
    port = svc_.hosted_port;
  }
  if (!hosted) return;  // fenced by the elector already
  caf::scoped_actor self{sys};
  self->monitor(hosted);
  unpublish_coordinator(sys, hosted, port);
  self->send_exit(hosted, caf::exit_reason::user_shutdown);
  self->receive([](const caf::down_msg&) {},
                caf::after(std::chrono::seconds(2)) >>
                    [] { spdlog::warn("grace-launch: the coordination service did not stop within 2 s"); });
}

/// How long a worker looks for a successor after losing the service: etcd
/// drops the lost leader's lease within its TTL (and may first elect a
/// leader of its own), a follower campaigns within a poll, and the successor
/// waits up to the takeover window for the survivors.
std::chrono::milliseconds launcher::failover_wait() const {
  return std::chrono::milliseconds(2000 * o_.etcd_ttl_seconds + 2000) + o_.takeover_window;
}

/// Starts the election and waits until a leader is known (this launcher or
/// another it reached), at most --coordinator-wait-ms.
status launcher::start_election() {
  svc_.coordinator_file = (std::filesystem::temp_directory_path() /
                       ("grace-" + o_.run_id + "-node" + std::to_string(o_.node_rank) + "-" +
                        std::to_string(::getpid()) + ".coordinator"))
                          .string();
  elector_config ec;
  ec.endpoints = o_.etcd;
  ec.key = "/grace/" + o_.run_id + "/coordinator";
  ec.endpoint = ep_.adv.address + ":" + std::to_string(o_.coordinator_port);
  ec.node = static_cast<uint32_t>(o_.node_rank);
  ec.ttl_seconds = o_.etcd_ttl_seconds;
  // A replacement launcher joining a job in progress leaves the first
  // campaign after its leader's loss to the running group's launchers.
  ec.newcomer_defer = std::chrono::milliseconds(1000 * o_.etcd_ttl_seconds + 2000);
  // ... also when it starts after that leader's lease already ran out.
  ec.job_key = "/grace/" + o_.run_id + "/job";
  auto e = leader_campaign::create(ec, [this] { fence_service(); });
  if (!e) return error{errc::invalid_input, "--etcd: " + e.err().message};
  svc_.elector = std::move(*e);
  svc_.elector->start();
  const auto deadline = std::chrono::steady_clock::now() + o_.coordinator_wait;
  while (!svc_.leading && !svc_.coord) {
    if (std::chrono::steady_clock::now() > deadline)
      return error{errc::disconnected, "no coordination service was elected through etcd (" + o_.etcd + ") within " +
                                           std::to_string(o_.coordinator_wait.count()) + " ms"};
    pollfd p{svc_.elector->fd(), POLLIN, 0};
    ::poll(&p, 1, 200);
    take_leadership_events();
  }
  return {};
}

void launcher::set_location(const coordinator_location& where) {
  auto hp = parse_host_port(where.endpoint);
  if (hp) {
    svc_.host = hp->first;
    svc_.port = hp->second;
  }
  // For this node's workers: those running rejoin the successor, new ones
  // start with it. Written whole, then renamed: a reader sees one line.
  auto st = write_file_atomically(svc_.coordinator_file, where.to_line() + "\n");
  if (!st) say(st.err().message);
}

/// The elector found the job finished while this node was away (its last
/// leader marked it so and released its key): nothing is left to join.
launcher_decision launcher::finished_elsewhere() const {
  return launcher_decision{false, true, exit_code::success, "nothing to join: " + *svc_.finished_elsewhere};
}

void launcher::take_leadership_events() {
  for (auto& e : svc_.elector->take()) {
    using ty = leadership_event::type;
    switch (e.what) {
      case ty::elected: on_elected(e.where); break;
      case ty::following: on_following(e.where); break;
      case ty::deposed:
        svc_.leading = false;
        say("no longer hosting the coordination service: " + e.detail + " (closed at once, so a successor cannot "
            "overlap with it)");
        emit_event("coordinator_deposed", {{"epoch", e.where.epoch}});
        break;
      case ty::unreachable: say("etcd does not answer: " + e.detail); break;
      case ty::finished:
        svc_.finished_elsewhere = e.detail;
        emit_event("job_finished_elsewhere", {{"epoch", e.where.epoch}});
        break;
    }
  }
}

/// This launcher leads: it hosts the service, taking the running group
/// over when it has one (its predecessor was lost).
void launcher::on_elected(const coordinator_location& where) {
  svc_.leading = true;
  const bool takeover = group_.running;
  say("elected through etcd to host the coordination service on " + where.endpoint + " (epoch " +
      std::to_string(where.epoch) + ")" +
      (takeover ? ", taking over incarnation " + std::to_string(shape_.incarnation) : std::string()));
  emit_event("coordinator_elected", {{"epoch", where.epoch}, {"takeover", takeover}, {"endpoint", where.endpoint}});
  auto hosted = host_service(takeover, where.epoch);
  svc_.leader_node = static_cast<int32_t>(where.node);
  if (!hosted) {
    say("cannot host the coordination service: " + hosted.err().message);
    return;
  }
  if (auto w = plaintext_warning(ep_.listen_ip, tls_.any()); w && !svc_.warned_plaintext) {
    svc_.warned_plaintext = true;
    say(*w);
  }
  set_location(where);
  if (node_.ckpt_server) checkpoint_peers(rt_->sys(), svc_.coord, o_, node_.ckpt_server->endpoint());
}

/// Another launcher leads (a newer epoch than the last seen): the workers
/// are told first (they rejoin on their own), then this launcher registers.
void launcher::on_following(const coordinator_location& where) {
  svc_.leading = false;
  say("following the coordination service on " + where.endpoint + " (epoch " + std::to_string(where.epoch) +
      ", node " + std::to_string(where.node) + ")");
  emit_event("coordinator_following", {{"epoch", where.epoch}, {"endpoint", where.endpoint}, {"node", where.node}});
  svc_.leader_node = static_cast<int32_t>(where.node);
  set_location(where);
  auto h = connect_as_launcher(std::chrono::seconds(3));
  if (!h) {
    say("cannot register with it yet: " + h.err().message);
    return;
  }
  svc_.coord = *h;
}

/// The elector's depose hook (its own thread): the service stops deciding
/// now, before etcd may elect a successor.
void launcher::fence_service() {
  std::lock_guard<std::mutex> g(svc_.hosted_m);
  if (!svc_.hosted) return;
  unpublish_coordinator(rt_->sys(), svc_.hosted, svc_.hosted_port);
  caf::anon_send_exit(svc_.hosted, caf::exit_reason::kill);
  svc_.hosted = coordinator_actor{};
}

}  // namespace grace::launch
