#include "actors/launcher_parts.hpp"

#include "runtime/base/events.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/checkpoint/node_local_sync.hpp"

#include <caf/actor_system.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <filesystem>
#include <sys/stat.h>
#include <unistd.h>

namespace grace::launch {

/// Registers this node's checkpoint server with the coordinator (empty
/// `endpoint`: only asks) and returns the other nodes' servers.
std::optional<std::vector<std::string>> checkpoint_peers(caf::actor_system& sys, coordinator_launcher& coord,
                                                         const launch_options& o, const std::string& endpoint) {
  return ask_checkpoint_peers(sys, coord, o.node_rank, endpoint, std::chrono::seconds(2));
}

/// Node-local checkpoint directories: before a group starts, copy the newest
/// committed checkpoint a peer has and this node lacks, so every rank
/// restores the same step (runtime/checkpoint/checkpoint_fetch.hpp). A peer that does not
/// answer is skipped; with a shared directory nothing is ever newer.
/// This node's server is registered again on the way (a service elected
/// since this node last registered would not know it).
void launcher::fetch_newer_checkpoint() {
  auto& sys = rt_->sys();
  std::vector<peer_checkpoints> peers;
  for (auto& ep : checkpoint_peers(sys, svc_.coord, o_, own_checkpoint_endpoint()).value_or(std::vector<std::string>{}))
    if (auto steps = list_remote(ep, token_, std::chrono::seconds(2))) peers.push_back({ep, *steps});
  const uint64_t local = local_store().newest_valid_step();
  auto plan = plan_fetch(local, peers);
  if (!plan) return;
  auto t0 = mono_ns();
  auto r = fetch_remote(plan->endpoint, token_, plan->step, o_.checkpoint_dir, std::chrono::seconds(30), true,
                        ckpt_key_ ? &*ckpt_key_ : nullptr);
  if (!r) {
    say("could not fetch checkpoint step " + std::to_string(plan->step) + ": " + r.err().message);
    return;
  }
  auto ns = mono_ns() - t0;
  say("fetched checkpoint step " + std::to_string(plan->step) + " from " + plan->endpoint + " (" + std::to_string(*r) +
      " bytes in " + std::to_string(ns / 1000000) + " ms; newest here was " + std::to_string(local) + ")");
  emit_event("fetched", {{"step", plan->step}, {"from", plan->endpoint}, {"bytes", *r}, {"ns", ns}});
}

std::string launcher::own_checkpoint_endpoint() const {
  return node_.ckpt_server ? node_.ckpt_server->endpoint() : std::string();
}

/// Several nodes: the node relay, before any worker starts.
status launcher::start_relay() {
  if (o_.nnodes <= 1) return {};
  node_relay_config rc;
  rc.node = o_.node_rank;
  rc.nproc = o_.nproc;
  rc.on_own_rank_lost = [v = group_.verdicts](uint32_t rank, uint32_t inc, const std::string& why) { v->push(rank, inc, why); };
  node_.relay = spawn_node_relay(rt_->sys(), rc);
  auto p = publish_node_relay(rt_->sys(), node_.relay);
  if (!p) return p.err();
  node_.relay_port = *p;
  return {};
}

/// The relay's messages to the service come from this process: the
/// service accepts them once this launcher registered (or hosts it).
void launcher::tell_relay_coordinator() {
  if (!node_.relay) return;
  caf::scoped_actor self{rt_->sys()};
  self->send(node_.relay, coord_atom::value, caf::actor_cast<caf::actor>(svc_.coord));
}

void launcher::tell_relay_incarnation() {
  if (!node_.relay) return;
  caf::scoped_actor self{rt_->sys()};
  self->send(node_.relay, incarnation_atom::value, shape_.incarnation, static_cast<uint32_t>(rank_of(0)));
}

/// --node-local-checkpoints: the directory this node's replica holders
/// mirror their sources' parts into (runtime/checkpoint/replica.hpp), created for the
/// workers; removed when the job finished.
void launcher::setup_memory_dir() {
  if (!o_.node_local_checkpoints || o_.memory_dir == "off") return;
  std::string dir = o_.memory_dir;
  std::error_code ec;
  if (dir.empty()) {
    if (!std::filesystem::is_directory("/dev/shm", ec)) return;
    dir = "/dev/shm/grace-" + o_.run_id + "-node" + std::to_string(o_.node_rank);
  }
  std::filesystem::create_directories(dir, ec);
  // In a directory every local user can write (/dev/shm), a name another
  // user made first (or a symbolic link to elsewhere) is not ours to use.
  struct stat st {};
  if (!ec && (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid()))
    ec = std::make_error_code(std::errc::permission_denied);
  if (!ec) std::filesystem::permissions(dir, std::filesystem::perms::owner_all, ec);
  if (ec) {
    say("not mirroring replicas in memory: " + dir + " is not a directory of this user's (" + ec.message() +
        "); give --memory-dir");
    return;
  }
  node_.memory_dir = dir;
}

void launcher::start_checkpoint_server() {
  node_.sync = o_.nnodes > 1 && !o_.checkpoint_dir.empty();
  if (!node_.sync) return;
  setup_memory_dir();
  auto s = checkpoint_server::start(o_.checkpoint_dir, ep_.adv.address, token_, std::chrono::seconds(10), node_.memory_dir,
                                    ckpt_key_);
  if (!s) {
    say("not serving this node's checkpoints to peers: " + s.err().message);
    return;
  }
  node_.ckpt_server = std::move(s.value());
  emit_event("checkpoint_server", {{"node", o_.node_rank}, {"endpoint", node_.ckpt_server->endpoint()}});
  checkpoint_peers(rt_->sys(), svc_.coord, o_, node_.ckpt_server->endpoint());
}

/// --node-local-checkpoints: this node's directory brought level with its
/// peers' before the group starts (runtime/checkpoint/node_local_sync.hpp).
void launcher::level_checkpoints() {
  level_config c;
  c.dir = o_.checkpoint_dir;
  c.token = token_;
  // Without the service's answer the peers are unknown: nothing heard from
  // them clears a problem found earlier (an empty list would, vacuously).
  auto peers = checkpoint_peers(rt_->sys(), svc_.coord, o_, own_checkpoint_endpoint());
  c.peers = peers.value_or(std::vector<std::string>{});
  for (int i = 0; i < o_.nproc; ++i) c.ranks.push_back(static_cast<uint32_t>(rank_of(i)));
  c.world = shape_.world;
  c.memory_dir = node_.memory_dir;
  c.key = ckpt_key_;
  auto t0 = mono_ns();
  auto r = level_node_local(c, [this](const std::string& l) { say(l); });
  node_.level_problem = level_problem_after(node_.level_problem, !r, r ? std::string() : r.err().message,
                                       r && r->heard_every_peer && peers);
  if (!r) {
    say("node-local checkpoints not brought level: " + r.err().message);
    return;
  }
  if (r->step)
    emit_event("leveled",
               {{"step", r->step}, {"ns", mono_ns() - t0}, {"peers", static_cast<int64_t>(c.peers.size())}});
}

}  // namespace grace::launch
