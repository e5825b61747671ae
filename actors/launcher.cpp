#include "actors/launcher.hpp"

#include "actors/launcher_parts.hpp"
#include "runtime/base/atomic_file.hpp"
#include "runtime/base/events.hpp"
#include "runtime/coordination/cluster_config.hpp"
#include "runtime/coordination/agreement.hpp"
#include "runtime/base/exit_codes.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/checkpoint/save_interval.hpp"
#include "runtime/net/job_token.hpp"

#include <caf/actor_system.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <spdlog/spdlog.h>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <netinet/in.h>
#include <poll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

namespace grace::launch {

namespace {

void write_reason(const launch_options& o, int code, const std::string& reason, int restarts,
                  const goodput_account& job) {
  if (o.checkpoint_dir.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(o.checkpoint_dir, ec);
  const auto path = std::filesystem::path(o.checkpoint_dir) / "grace-exit.json";
  auto st = write_json_atomically(path, {{"exit_code", code},        {"reason", reason},   {"restarts", restarts},
                                         {"node_rank", o.node_rank}, {"run_id", o.run_id}, {"time_ns", wall_ns()},
                                         {"goodput", job.to_json()}});
  if (!st) spdlog::warn("grace-launch: {}", st.err().message);
}

result<endpoints> resolve_endpoints(const launch_options& o, const std::string& coordinator_host) {
  endpoints e;
  auto ip = resolve_ipv4(coordinator_host);
  if (!ip) return error{errc::invalid_input, "--coordinator: " + ip.err().message};
  e.coordinator_ip = *ip;
  auto req = address_request_from_environment(e.coordinator_ip);
  if (!req) return req.err();
  req->iface_flag = o.iface;
  if (!o.host.empty()) {
    auto h = resolve_ipv4(o.host);
    if (!h) return error{errc::invalid_input, "--host: " + h.err().message};
    req->host_flag = *h;
  }
  auto host = probe_host();
  auto adv = choose_advertise_address(*req, host);
  if (!adv) return adv.err();
  e.adv = *adv;
  if (!o.etcd.empty()) {
    e.listen_ip = e.adv.address;  // any launcher may be elected to host the service
  } else if (o.node_rank == 0) {
    auto l = choose_listen_address(e.coordinator_ip, e.adv, host);
    if (!l) return l.err();
    e.listen_ip = *l;
  }
  return e;
}

/// What torchrun exports to its workers, so a script that calls
/// `torch.distributed.init_process_group("gloo")` (env://) runs unchanged
/// under grace-launch. Every incarnation gets its own MASTER_PORT: rank 0's
/// TCPStore of the previous one may still hold its port (TIME_WAIT), and a
/// late straggler must not join the new group. One node: a port the kernel
/// reports free on 127.0.0.1, never the previous one. Several nodes must
/// agree without talking: a port derived from the run id and incarnation
/// (20000-39999) on the address of rank 0's node.
void add_torchrun_environment(std::map<std::string, std::string>& env, const launch_options& o,
                              const torchrun_group& g, int rank, int local_rank, uint32_t incarnation,
                              int restarts) {
  static uint32_t port_incarnation = UINT32_MAX;
  static uint16_t port = 0;
  if (port_incarnation != incarnation) {
    port_incarnation = incarnation;
    uint16_t previous = port;
    if (o.nnodes == 1) {
      for (int attempt = 0; attempt < 8 && (port == previous || port == 0); ++attempt) {
        int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t len = sizeof a;
        if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
            ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
          port = ntohs(a.sin_port);
        if (fd >= 0) ::close(fd);
      }
    } else {
      uint64_t h = 0xcbf29ce484222325ull;
      for (unsigned char c : o.run_id + ":" + std::to_string(incarnation)) h = (h ^ c) * 0x100000001b3ull;
      port = static_cast<uint16_t>(20000 + h % 20000);
    }
  }
  env["RANK"] = env["ROLE_RANK"] = std::to_string(rank);
  env["LOCAL_RANK"] = std::to_string(local_rank);
  env["WORLD_SIZE"] = env["ROLE_WORLD_SIZE"] = std::to_string(g.world);
  env["LOCAL_WORLD_SIZE"] = std::to_string(o.nproc);
  env["GROUP_RANK"] = std::to_string(g.group_rank);
  env["GROUP_WORLD_SIZE"] = std::to_string(g.group_world);
  env["MASTER_ADDR"] = o.nnodes == 1 ? "127.0.0.1" : g.master_addr;
  env["MASTER_PORT"] = std::to_string(port);
  env["TORCHELASTIC_RESTART_COUNT"] = std::to_string(restarts);
  env["TORCHELASTIC_MAX_RESTARTS"] = std::to_string(o.max_restarts);
  env["TORCHELASTIC_RUN_ID"] = o.run_id;
}

/// The checks on the command line that need no network.
status validate(const launch_options& o) {
  if (o.command.empty())
    return error{errc::invalid_input, "no program given (grace-launch --nproc N -- PROGRAM ARGS...)"};
  if (o.nproc < 1 || o.nnodes < 1 || o.node_rank < 0 || o.node_rank >= o.nnodes)
    return error{errc::invalid_input, o.elastic() ? "need --nproc >= 1 and 0 <= --node-rank < MAX (--nnodes MIN:MAX)"
                                                  : "need --nproc >= 1 and 0 <= --node-rank < --nnodes"};
  if (o.min_nodes < 0 || o.min_nodes > o.nnodes)
    return error{errc::invalid_input, "--nnodes MIN:MAX: need 1 <= MIN <= MAX"};
  if (o.nnodes > 1 && o.coordinator.empty() && o.etcd.empty())
    return error{errc::invalid_input,
                 "--nnodes > 1 needs --coordinator host:port (node 0's address) or --etcd (an elected coordinator)"};
  if (o.nnodes > 1 && o.run_id.empty())
    return error{errc::invalid_input, "--nnodes > 1 needs the same --run-id on every node"};
  if (!o.run_id.empty())
    if (auto st = check_run_id(o.run_id, "--run-id"); !st) return st;
  if (o.node_local_checkpoints && o.checkpoint_dir.empty())
    return error{errc::invalid_input, "--node-local-checkpoints needs --checkpoint-dir (this node's own disk)"};
  return {};
}

/// SIGTERM, SIGINT and SIGCHLD, read from a signalfd in the launcher's loop.
int block_launcher_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGCHLD);
  ::sigprocmask(SIG_BLOCK, &set, nullptr);
  return ::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
}

}  // namespace

launcher::~launcher() {
  if (svc_.elector) svc_.elector->stop(false);
  if (node_.relay) caf::anon_send_exit(node_.relay, caf::exit_reason::user_shutdown);
  std::lock_guard<std::mutex> g(svc_.hosted_m);
  if (svc_.hosted) caf::anon_send_exit(svc_.hosted, caf::exit_reason::user_shutdown);
}

void launcher::say(const std::string& line) const {
  if (!o_.quiet) std::fprintf(stderr, "[grace-launch] %s\n", line.c_str());
  emit_event("launcher", {{"message", line}});
}

status launcher::setup_addresses() {
  if (o_.run_id.empty()) {
    auto id = random_hex(6);
    if (!id) return id.err();
    o_.run_id = *id;
  }
  if (!o_.coordinator.empty()) {
    auto hp = parse_host_port(o_.coordinator);
    if (!hp) return error{errc::invalid_input, "--coordinator: " + hp.err().message};
    svc_.host = hp->first;
    svc_.port = hp->second;
  }
  if (!o_.etcd.empty()) {
    // The address advertised is the one that routes to etcd (any launcher
    // may be elected: its peers reach it where they reach etcd).
    auto first = o_.etcd.substr(0, o_.etcd.find(','));
    if (first.rfind("http://", 0) == 0) first = first.substr(7);
    auto hp = parse_host_port(first);
    if (!hp) return error{errc::invalid_input, "--etcd: " + hp.err().message};
    svc_.host = hp->first;
  }
  auto ep = resolve_endpoints(o_, svc_.host);
  if (!ep) return ep.err();
  ep_ = *ep;
  svc_.host = ep_.coordinator_ip;
  shape_.world = o_.elastic() ? 0 : static_cast<uint32_t>(o_.nproc * o_.nnodes);  // elastic: each plan's
  shape_.slot = static_cast<uint32_t>(o_.node_rank);
  auto token = launcher_token(o_.token_file, std::getenv("GRACE_TOKEN"), o_.nnodes);
  if (!token) return token.err();
  token_ = *token;
  if (auto st = choose_signing(); !st) return st;
  tls_ = tls_files_from(o_.tls, [](const char* v) { return std::getenv(v); });
  if (auto st = check_tls_files(tls_); !st) return st.err();
  if (const char* inc = std::getenv("GRACE_INCARNATION")) shape_.incarnation = static_cast<uint32_t>(std::atoi(inc));
  shape_.initial_incarnation = shape_.incarnation;
  return {};
}

/// The job's checkpoint key (--checkpoint-key-file, --checkpoint-signing),
/// said once so a newcomer knows what restores.
status launcher::choose_signing() {
  auto mode = parse_signing_mode(o_.checkpoint_signing, "--checkpoint-signing");
  if (!mode) return mode.err();
  const bool given = !o_.token_file.empty() || std::getenv("GRACE_TOKEN");
  auto key = choose_checkpoint_key(o_.checkpoint_key_file, *mode, token_, given);
  if (!key) return key.err();
  ckpt_key_ = std::move(*key);
  if (ckpt_key_)
    say("checkpoints are signed with key " + ckpt_key_->id + " (" + ckpt_key_->origin +
        "): a step without its signature is never restored");
  return {};
}

/// Before the first event: the monitor picks the events file every process
/// of this launcher appends to, and binds the metrics port.
status launcher::start_monitor() {
  monitor_config mc;
  mc.checkpoint_dir = o_.checkpoint_dir;
  mc.keeps_account = o_.node_rank == 0;
  mc.metrics_host = o_.metrics_host;
  mc.metrics_port = o_.metrics_port;
  mc.run_id = o_.run_id;
  auto m = job_monitor::start(mc);
  if (!m) return m.err();
  monitor_ = std::move(m.value());
  if (!monitor_->url().empty()) say("metrics on " + monitor_->url());
  return {};
}

/// One line for the job's account (node 0's, which sees every member).
void launcher::report_goodput(const goodput_account& a) const {
  if (o_.node_rank == 0) say(describe(a));
}

/// Node 0 moves the coordinator to the group's incarnation; other nodes
/// start theirs in the coordinator's current one (group_policy.hpp). An
/// elastic job's launcher then waits for the plan of a group that has its
/// node; the decision to stop if none comes.
std::optional<launcher_decision> launcher::enter_incarnation() {
  auto& sys = rt_->sys();
  if (svc_.elector) take_leadership_events();
  if (hosts_service()) {
    if (!ask_incarnation(sys, svc_.coord, shape_.incarnation, std::chrono::seconds(10)))
      spdlog::warn("grace-launch: the coordination service did not confirm incarnation {}", shape_.incarnation);
  } else {
    const uint32_t counted = shape_.incarnation;
    shape_.incarnation =
        next_incarnation(shape_.previous_group, shape_.initial_incarnation, current_incarnation(sys, svc_.coord, [this] { return connect_as_launcher(std::chrono::seconds(2)); }));
    if (shape_.incarnation != counted)
      say("starting the group in incarnation " + std::to_string(shape_.incarnation) +
          ", the coordination service's current one");
  }
  if (planned())
    if (auto stop = await_plan()) return stop;
  if (node_.sync && o_.node_local_checkpoints)
    level_checkpoints();
  else if (node_.sync)
    fetch_newer_checkpoint();
  tell_relay_incarnation();
  set_event_identity(launcher_rank, shape_.incarnation);
  return std::nullopt;
}

/// A SIGTERM or SIGINT that arrived while no group runs (SIGCHLDs of
/// workers already reaped are drained).
std::optional<std::string> launcher::stop_signal() {
  signalfd_siginfo si;
  while (::read(sfd_, &si, sizeof(si)) == sizeof(si))
    if (si.ssi_signo != SIGCHLD) return std::string(si.ssi_signo == SIGTERM ? "SIGTERM" : "SIGINT");
  return std::nullopt;
}

/// Node > 0, between groups: waits (--coordinator-wait-ms) until the
/// coordination service answers. Nothing if it does; otherwise the decision
/// to stop (it is gone, or a SIGTERM/SIGINT came while waiting).
std::optional<launcher_decision> launcher::await_coordinator() {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  auto where = [this] {
    return svc_.host + ":" + std::to_string(svc_.port) +
           (svc_.elector ? " (the last one elected through etcd)" : std::string(" (node 0)"));
  };
  auto newest = [&] { return o_.checkpoint_dir.empty() ? 0 : local_store().newest_valid_step(); };
  bool said = false;
  for (;;) {
    if (svc_.elector) take_leadership_events();
    if (svc_.finished_elsewhere) return finished_elsewhere();
    if (hosts_service()) return std::nullopt;
    if (current_incarnation(rt_->sys(), svc_.coord, [this] { return connect_as_launcher(std::chrono::seconds(2)); })) return std::nullopt;
    auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(clock::now() - t0);
    if (waited >= o_.coordinator_wait)
      return coordinator_gone(where(), waited.count(), newest(), o_.restart_code, "", node_.level_problem);
    if (!std::exchange(said, true))
      say("the coordination service at " + where() + " does not answer: waiting up to " +
          std::to_string(o_.coordinator_wait.count() / 1000) + " s for it");
    pollfd p[2] = {{sfd_, POLLIN, 0}, {svc_.elector ? svc_.elector->fd() : -1, POLLIN, 0}};
    if (::poll(p, 2, 500) <= 0 || !(p[0].revents & POLLIN)) continue;
    signalfd_siginfo si;
    while (::read(sfd_, &si, sizeof(si)) == sizeof(si))
      if (si.ssi_signo != SIGCHLD)
        return coordinator_gone(where(), waited.count(), newest(), o_.restart_code,
                                si.ssi_signo == SIGTERM ? "SIGTERM" : "SIGINT", node_.level_problem);
  }
}

/// Keeps the final metrics up for --metrics-linger-ms so a last scrape sees
/// them. SIGCHLDs still queued from the workers' exits are drained and do not
/// end the wait; SIGTERM or SIGINT does.
void launcher::linger_for_scrapes() {
  auto until = std::chrono::steady_clock::now() + o_.metrics_linger;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    if (left.count() <= 0) return;
    pollfd p{sfd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    signalfd_siginfo si;
    while (::read(sfd_, &si, sizeof(si)) == sizeof(si))
      if (si.ssi_signo != SIGCHLD) return;
  }
}

std::map<std::string, std::string> launcher::worker_environment(int rank, int local_rank) const {
  std::map<std::string, std::string> env{
      {"GRACE_RANK", std::to_string(rank)},
      {"GRACE_LOCAL_RANK", std::to_string(local_rank)},
      {"GRACE_WORLD_SIZE", std::to_string(shape_.world)},
      {"GRACE_COORDINATOR", svc_.host + ":" + std::to_string(svc_.port)},
      {"GRACE_RUN_ID", o_.run_id},
      {"GRACE_TOKEN", token_},
      {"GRACE_INCARNATION", std::to_string(shape_.incarnation)},
      {"GRACE_RESTART_CODE", std::to_string(o_.restart_code)},
      {"GRACE_HOST", ep_.adv.address},
  };
  if (!std::getenv("NCCL_SOCKET_IFNAME") && !ep_.adv.iface.empty()) env["NCCL_SOCKET_IFNAME"] = ep_.adv.iface;
  if (node_.relay) env["GRACE_RELAY"] = "127.0.0.1:" + std::to_string(node_.relay_port);
  if (svc_.elector) {
    env["GRACE_COORDINATOR_FILE"] = svc_.coordinator_file;
    env["GRACE_FAILOVER_WAIT_MS"] = std::to_string(failover_wait().count());
  }
  if (!o_.checkpoint_dir.empty()) env["GRACE_CHECKPOINT_DIR"] = o_.checkpoint_dir;
  if (!o_.checkpoint_key_file.empty()) env["GRACE_CHECKPOINT_KEY_FILE"] = o_.checkpoint_key_file;
  env["GRACE_CHECKPOINT_SIGNING"] = ckpt_key_ ? "job" : "off";  // the key file, if any, wins over "job"
  if (o_.in_place) env["GRACE_RECOVERY"] = "in-place";
  if (o_.node_local_checkpoints) env["GRACE_NODE_LOCAL_CHECKPOINTS"] = "1";
  if (!node_.memory_dir.empty()) env["GRACE_MEMORY_DIR"] = node_.memory_dir;
  if (shape_.plan) {
    std::string nodes;
    for (auto n : shape_.plan->nodes) nodes += (nodes.empty() ? "" : ",") + std::to_string(n);
    env["GRACE_GROUP_NODES"] = nodes;
  }
  env.merge(tls_environment(tls_));
  add_torchrun_environment(env, o_, torchrun_shape(), rank, local_rank, shape_.incarnation, shape_.restarts);
  return env;
}

/// After the last group: the spares, the service, the relay, the election
/// and the memory directory are let go, and the exit reason is recorded.
void launcher::finish(const launcher_decision& d) {
  if (group_.spares) group_.spares->discard();
  if (o_.elastic() && hosts_service() && d.code == exit_code::success) await_stragglers();
  if (hosts_service()) stop_coordinator();
  if (node_.relay) caf::anon_send_exit(node_.relay, caf::exit_reason::user_shutdown);
  if (svc_.elector) {
    svc_.elector->stop(true, d.code == exit_code::success);
    std::error_code ec;
    std::filesystem::remove(svc_.coordinator_file, ec);
  }
  // The mirrors in memory may be the only copy of a lost host's part, for
  // a relaunch after any failure: only a finished job frees the memory.
  if (!node_.memory_dir.empty() && d.code == exit_code::success) {
    std::error_code ec;
    std::filesystem::remove_all(node_.memory_dir, ec);
  }
  auto job = monitor_->finish();
  report_goodput(job);
  say("exit " + std::to_string(d.code) + ": " + d.reason);
  write_reason(o_, d.code, d.reason, shape_.restarts, job);
  if (o_.metrics_linger.count() > 0 && !monitor_->url().empty()) linger_for_scrapes();
  ::close(sfd_);
}

int launcher::run() {
  if (auto st = validate(o_); !st) {
    spdlog::error("grace-launch: {}", st.err().message);
    return exit_code::usage;
  }
  if (auto st = setup_addresses(); !st) {
    spdlog::error("grace-launch: {}", st.err().message);
    return exit_code::usage;
  }
  // Before any thread starts: a thread with SIGCHLD unblocked would take it
  // (ignored) and the loop would see an exit only at its next poll timeout.
  sfd_ = block_launcher_signals();
  if (auto st = start_monitor(); !st) {
    spdlog::error("grace-launch: {}", st.err().message);
    ::close(sfd_);
    return exit_code::usage;
  }
  if (auto st = host_or_join_coordinator(); !st) {
    spdlog::error("grace-launch: {}", st.err().message);
    return exit_code::usage;
  }
  set_event_identity(launcher_rank, shape_.incarnation);
  say("coordination service on " + svc_.host + ":" + std::to_string(svc_.port) + ", run " + o_.run_id + ", " +
      (o_.elastic() ? "elastic: " + std::to_string(o_.min_nodes) + " to " + std::to_string(o_.nnodes) + " nodes of " +
                          std::to_string(o_.nproc) + " workers"
                    : std::to_string(shape_.world) + " workers (" + std::to_string(o_.nproc) + " on this node)") +
      "; this node advertises " +
      ep_.adv.address + (ep_.adv.iface.empty() ? "" : " (" + ep_.adv.iface + ")") + " from " + ep_.adv.source);
  start_checkpoint_server();
  if (o_.standby) group_.spares = std::make_unique<standby_pool>(o_.command, o_.standby_ready_wait);
  rendezvous_streak streak(o_.max_rendezvous_failures);
  group_context ctx;
  ctx.nproc = o_.nproc;
  ctx.max_restarts = o_.max_restarts;
  ctx.restart_code = o_.restart_code;
  ctx.rendezvous_hint = "the workers could not reach the coordination service at " + svc_.host + ":" +
                        std::to_string(svc_.port) + " or each other; this node advertises " + ep_.adv.address + " (" +
                        ep_.adv.source +
                        "): check that every node's address is reachable from the others "
                        "(--host, --iface)";
  launcher_decision d;
  // The failure history (--save-every auto) is node 0's: its chief saves.
  const bool keeps_history = o_.node_rank == 0 && !o_.checkpoint_dir.empty();
  for (;;) {
    if (shape_.previous_group && !hosts_service())
      if (auto gone = await_coordinator()) {
        d = *gone;
        break;
      }
    if (auto stop = enter_incarnation()) {
      d = *stop;
      break;
    }
    if (auto st = start_group(); !st) {
      spdlog::error("grace-launch: {}", st.err().message);
      return exit_code::unhealthy;
    }
    auto started = std::chrono::steady_clock::now();
    if (svc_.elector) svc_.elector->joined_group();
    if (keeps_history) record_incarnation_start(o_.checkpoint_dir, shape_.incarnation);
    auto g = watch_group();
    if (keeps_history)
      record_incarnation_end(o_.checkpoint_dir, shape_.incarnation,
                             std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(),
                             g.crashed || g.fatal);
    ctx.notice_forwarded = group_.notice_forwarded;
    ctx.restarts = shape_.restarts;
    ctx.level_problem = node_.level_problem;
    ctx.membership_change = o_.elastic() && g.restart && !g.fatal && !group_.notice_forwarded && ended_for_growth();
    d = decide_after_group(g, ctx, streak);
    if (!d.restart) break;
    monitor_->restart(g.crashed, g.rendezvous_failed);
    if (d.counted) ++shape_.restarts;
    shape_.previous_group = shape_.incarnation;
    ++shape_.incarnation;
    say((d.counted ? "restart " + std::to_string(shape_.restarts) + "/" + std::to_string(o_.max_restarts)
                   : std::string("regrouping")) +
        " (incarnation " + std::to_string(shape_.incarnation) + "): " + d.reason);
  }
  finish(d);
  return d.code;
}

}  // namespace grace::launch

namespace grace {

int run_launcher(const launch_options& in) { return launch::launcher(in).run(); }

}  // namespace grace
