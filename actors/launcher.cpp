#include "actors/launcher.hpp"

#include "actors/coordinator.hpp"
#include "actors/node_relay.hpp"
#include "runtime/base/atomic_file.hpp"
#include "runtime/base/wake_pipe.hpp"
#include "actors/signal_watcher.hpp"
#include "runtime/coordination/agreement.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/checkpoint/checkpoint_fetch.hpp"
#include "runtime/checkpoint/node_local_sync.hpp"
#include "runtime/coordination/cluster_config.hpp"
#include "runtime/base/events.hpp"
#include "runtime/base/exit_codes.hpp"
#include "runtime/launch/group_policy.hpp"
#include "runtime/ops/job_monitor.hpp"
#include "runtime/net/job_token.hpp"
#include "runtime/coordination/leader_campaign.hpp"
#include "runtime/checkpoint/save_interval.hpp"
#include "runtime/net/net_address.hpp"
#include "runtime/worker/standby.hpp"
#include "actors/actor_runtime.hpp"

#include <caf/actor_system.hpp>
#include <caf/io/middleman.hpp>
#include <caf/system_messages.hpp>
#include <caf/after.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <fcntl.h>
#include <mutex>
#include <utility>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <netinet/in.h>
#include <poll.h>
#include <random>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <thread>
#include <sys/stat.h>
#include <unistd.h>

namespace grace {

namespace {

struct worker_proc {
  pid_t pid = -1;
  int rank = 0;
  bool exited = false;
  bool killed_lost = false;  ///< killed on a verdict (the service's and the relay's may both come)
  int code = 0;  ///< exit code, or 128 + signal
  int signal = 0;
};

std::string describe(const worker_proc& w) {
  if (w.signal) return "killed by signal " + std::to_string(w.signal) + " (" + strsignal(w.signal) + ")";
  return "exit code " + std::to_string(w.code);
}

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

/// Failure verdicts handed from the coordinator's actor thread to the
/// launcher loop; a pipe wakes the loop's poll at once.
struct verdict_inbox {
  struct entry {
    uint32_t rank;
    uint32_t incarnation;
    std::string why;
  };
  std::mutex m;
  std::vector<entry> entries;
  wake_pipe wake;  ///< readable while entries wait

  void push(uint32_t rank, uint32_t incarnation, const std::string& why) {
    {
      std::lock_guard<std::mutex> g(m);
      entries.push_back({rank, incarnation, why});
    }
    wake.wake();
  }
  std::vector<entry> take() {
    wake.drain();
    std::lock_guard<std::mutex> g(m);
    return std::exchange(entries, {});
  }
};

/// The coordinator's resolved address, where node 0's coordination service
/// listens, and the address this node's workers advertise.
struct endpoints {
  std::string coordinator_ip;
  std::string listen_ip;
  advertise_choice adv;
};

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

/// The coordinator's current incarnation, asked by a launcher on node > 0
/// before it starts a group. Reconnects once if the old connection is gone
/// (a partition, a restart of this host). Nothing if it cannot be reached.
std::optional<uint32_t> current_incarnation(caf::actor_system& sys, coordinator_actor& coord,
                                            const std::function<result<coordinator_actor>()>& reconnect) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    std::optional<uint32_t> out;
    caf::scoped_actor self{sys};
    self->request(coord, std::chrono::seconds(2), current_atom::value)
        .receive([&](uint32_t inc) { out = inc; }, [&](caf::error&) {});
    if (out || attempt == 1) return out;
    auto h = reconnect();
    if (!h) return std::nullopt;
    coord = *h;
  }
  return std::nullopt;
}

/// Registers this node's checkpoint server with the coordinator (empty
/// `endpoint`: only asks) and returns the other nodes' servers.
std::optional<std::vector<std::string>> checkpoint_peers(caf::actor_system& sys, coordinator_actor& coord,
                                                         const launch_options& o, const std::string& endpoint) {
  std::string lines;
  bool answered = false;
  caf::scoped_actor self{sys};
  self->request(coord, std::chrono::seconds(2), ckpt_peer_atom::value, static_cast<int32_t>(o.node_rank), endpoint)
      .receive([&](std::string& r) { lines = std::move(r); answered = true; }, [&](caf::error&) {});
  if (!answered) return std::nullopt;
  std::vector<std::string> out;
  for (size_t start = 0, nl; (nl = lines.find('\n', start)) != std::string::npos; start = nl + 1)
    out.push_back(lines.substr(start, nl - start));
  return out;
}

/// Node-local checkpoint directories: before a group starts, copy the newest
/// committed checkpoint a peer has and this node lacks, so every rank
/// restores the same step (runtime/checkpoint/checkpoint_fetch.hpp). A peer that does not
/// answer is skipped; with a shared directory nothing is ever newer.
/// `own`: this node's server, registered again on the way (a service
/// elected since this node last registered would not know it).
void fetch_newer_checkpoint(caf::actor_system& sys, coordinator_actor& coord, const launch_options& o,
                            const std::string& token, const std::string& own,
                            const std::function<void(const std::string&)>& say) {
  std::vector<peer_checkpoints> peers;
  for (auto& ep : checkpoint_peers(sys, coord, o, own).value_or(std::vector<std::string>{}))
    if (auto steps = list_remote(ep, token, std::chrono::seconds(2))) peers.push_back({ep, *steps});
  const uint64_t local = checkpoint_store(o.checkpoint_dir).newest_valid_step();
  auto plan = plan_fetch(local, peers);
  if (!plan) return;
  auto t0 = mono_ns();
  auto r = fetch_remote(plan->endpoint, token, plan->step, o.checkpoint_dir, std::chrono::seconds(30));
  if (!r) {
    say("could not fetch checkpoint step " + std::to_string(plan->step) + ": " + r.err().message);
    return;
  }
  auto ns = mono_ns() - t0;
  say("fetched checkpoint step " + std::to_string(plan->step) + " from " + plan->endpoint + " (" + std::to_string(*r) +
      " bytes in " + std::to_string(ns / 1000000) + " ms; newest here was " + std::to_string(local) + ")");
  emit_event("fetched", {{"step", plan->step}, {"from", plan->endpoint}, {"bytes", *r}, {"ns", ns}});
}

/// The group a worker is part of, as torchrun describes it: rank 0's
/// node address (its TCPStore), the world, this node's place and the nodes.
struct torchrun_group {
  std::string master_addr;
  uint32_t world = 1;
  uint32_t group_rank = 0;
  uint32_t group_world = 1;
};

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

/// One grace-launch: the coordination service on node 0 (or the connection
/// to it), the groups it starts one after the other, and the decision after
/// each (group_policy.hpp). Methods run on the caller's thread; only the
/// verdict inbox is touched by the coordinator's actor thread.
class launcher {
public:
  explicit launcher(launch_options o) : o_(std::move(o)) {}
  /// The actor system waits for every actor when it is destroyed: the ones
  /// with timers of their own (relay, service) are stopped on every path.
  ~launcher() {
    if (elector_) elector_->stop(false);
    if (relay_) caf::anon_send_exit(relay_, caf::exit_reason::user_shutdown);
    std::lock_guard<std::mutex> g(hosted_m_);
    if (hosted_) caf::anon_send_exit(hosted_, caf::exit_reason::user_shutdown);
  }
  int run();

private:
  status setup_addresses();
  status start_monitor();
  void report_goodput(const goodput_account& a) const;
  status host_or_join_coordinator();
  coordinator_config service_config(bool takeover, uint64_t epoch);
  std::function<bool()> lease_check() const;
  status host_service(bool takeover, uint64_t epoch);
  bool hosts_service() const { return elector_ ? leading_ : o_.node_rank == 0; }
  status start_election();
  void take_leadership_events();
  launcher_decision finished_elsewhere() const;
  void on_elected(const coordinator_location& where);
  void on_following(const coordinator_location& where);
  void fence_service();
  void set_location(const coordinator_location& where);
  std::chrono::milliseconds failover_wait() const;
  status start_relay();
  void tell_relay_coordinator();
  void tell_relay_incarnation();
  result<coordinator_actor> connect_as_launcher(std::chrono::milliseconds timeout);
  void start_checkpoint_server();
  void setup_memory_dir();
  std::optional<launcher_decision> enter_incarnation();
  std::optional<launcher_decision> await_plan();
  std::optional<launcher_decision> take_plan(const msg<proto::GroupPlan>& m, uint32_t& from, bool& said_excluded);
  std::optional<msg<proto::GroupPlan>> request_plan(uint32_t from);
  void adopt_plan(proto::GroupPlan::Reader p);
  bool ended_for_growth();
  void await_stragglers();
  std::optional<std::string> stop_signal();
  int rank_of(int local_rank) const { return static_cast<int>(slot_) * o_.nproc + local_rank; }
  /// Groups come from the service's plans (runtime/coordination/elastic.hpp): elastic
  /// jobs, and jobs whose service moves (--etcd): there rank 0's host, which
  /// torch.distributed's MASTER_ADDR must name, is known only from the plan.
  bool planned() const { return o_.elastic() || (!o_.etcd.empty() && o_.nnodes > 1); }
  torchrun_group torchrun_shape() const;
  void level_checkpoints();
  void stop_coordinator();
  void linger_for_scrapes();
  std::optional<launcher_decision> await_coordinator();
  status start_group();
  pid_t start_worker(int local_rank, const env_map& env, standby_pool::clock::time_point spares_deadline);
  void start_spares();
  void watch_spares(bool group_intact, std::chrono::steady_clock::time_point started);
  group_end watch_group();
  void kill_declared_dead();
  void read_signals();
  void reap(group_end& g, std::optional<std::chrono::steady_clock::time_point>& kill_at, int& live);
  std::map<std::string, std::string> worker_environment(int rank, int local_rank) const;
  void say(const std::string& line) const;

  launch_options o_;
  std::string host_ = "127.0.0.1";  ///< the coordinator's address
  uint16_t port_ = 0;
  endpoints ep_;
  uint32_t world_ = 0;  ///< the current group's workers (an elastic job's plan)
  /// This node's place in the current group: its node rank, or in an
  /// elastic job its slot in the incarnation's plan (runtime/coordination/elastic.hpp).
  uint32_t slot_ = 0;
  std::optional<group_plan> plan_;  ///< elastic: the current incarnation's group
  std::string token_;
  tls_files tls_;
  int sfd_ = -1;
  std::unique_ptr<actor_runtime> rt_;
  coordinator_actor coord_;
  /// Shared with the coordinator's hook, so it stays valid on the actor
  /// thread for as long as the coordinator may call it.
  std::shared_ptr<verdict_inbox> verdicts_ = std::make_shared<verdict_inbox>();
  uint32_t incarnation_ = 0;
  uint32_t initial_incarnation_ = 0;
  std::optional<uint32_t> previous_group_;
  std::unique_ptr<checkpoint_server> ckpt_server_;
  bool node_local_sync_ = false;
  std::string level_problem_;  ///< why this node's checkpoints cannot be brought level (level_problem_after)
  std::string memory_dir_;  ///< replicas mirrored in memory (setup_memory_dir); empty: none
  std::vector<worker_proc> workers_;
  int restarts_ = 0;
  bool notice_forwarded_ = false;
  std::shared_ptr<job_monitor> monitor_;  ///< shared with the coordinator's progress hook
  std::unique_ptr<standby_pool> spares_;  ///< --standby: the next incarnation's processes
  bool spares_said_ready_ = false;
  std::optional<uint32_t> spares_group_;  ///< the incarnation during which spares were last started
  // --etcd: the election of the launcher hosting the service
  std::shared_ptr<leader_campaign> elector_;  ///< shared with the hosted service's lease check
  bool leading_ = false;
  std::optional<std::string> finished_elsewhere_;  ///< the elector found the job finished without this node
  int32_t leader_node_ = -1;  ///< the node hosting the service, as last elected or followed; -1 none yet
  bool group_running_ = false;
  bool warned_plaintext_ = false;
  std::string coordinator_file_;  ///< the service's location for this node's workers (GRACE_COORDINATOR_FILE)
  /// The service this launcher hosts, and its port: guarded, since the
  /// elector's depose hook closes it from the elector's thread.
  std::mutex hosted_m_;
  coordinator_actor hosted_;
  uint16_t hosted_port_ = 0;
  /// Multi-node jobs: this node's relay (actors/node_relay.hpp), published
  /// on loopback for the node's workers.
  node_relay_actor relay_;
  uint16_t relay_port_ = 0;
};

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
    host_ = hp->first;
    port_ = hp->second;
  }
  if (!o_.etcd.empty()) {
    // The address advertised is the one that routes to etcd (any launcher
    // may be elected: its peers reach it where they reach etcd).
    auto first = o_.etcd.substr(0, o_.etcd.find(','));
    if (first.rfind("http://", 0) == 0) first = first.substr(7);
    auto hp = parse_host_port(first);
    if (!hp) return error{errc::invalid_input, "--etcd: " + hp.err().message};
    host_ = hp->first;
  }
  auto ep = resolve_endpoints(o_, host_);
  if (!ep) return ep.err();
  ep_ = *ep;
  host_ = ep_.coordinator_ip;
  world_ = o_.elastic() ? 0 : static_cast<uint32_t>(o_.nproc * o_.nnodes);  // elastic: each plan's
  slot_ = static_cast<uint32_t>(o_.node_rank);
  auto token = launcher_token(o_.token_file, std::getenv("GRACE_TOKEN"), o_.nnodes);
  if (!token) return token.err();
  token_ = *token;
  tls_ = tls_files_from(o_.tls, [](const char* v) { return std::getenv(v); });
  if (auto st = check_tls_files(tls_); !st) return st.err();
  if (const char* inc = std::getenv("GRACE_INCARNATION")) incarnation_ = static_cast<uint32_t>(std::atoi(inc));
  initial_incarnation_ = incarnation_;
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

/// Node > 0: connects to the coordination service and registers this
/// process as the node's launcher (coordinator.hpp, register_launcher).
result<coordinator_actor> launcher::connect_as_launcher(std::chrono::milliseconds timeout) {
  auto& sys = rt_->sys();
  auto h = connect_coordinator(sys, host_, port_, timeout);
  if (!h) return h.err();
  if (auto st = register_launcher(sys, *h, o_.node_rank, o_.nproc, token_, o_.elastic() ? o_.min_nodes : o_.nnodes,
                                  o_.nnodes);
      !st)
    return st.err();
  coord_ = *h;
  tell_relay_coordinator();
  // Whichever service this is (a successor elected since), it learns where
  // this node's checkpoints are served.
  if (ckpt_server_) checkpoint_peers(sys, coord_, o_, ckpt_server_->endpoint());
  return *h;
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
    coord_ = *h;
    return {};
  }
  if (auto st = host_service(false, 0); !st) return st;
  if (auto w = plaintext_warning(ep_.listen_ip, tls_.any())) say(*w);
  return {};
}

coordinator_config launcher::service_config(bool takeover, uint64_t epoch) {
  coordinator_config cc;
  cc.world_size = world_;
  cc.run_id = o_.run_id;
  cc.token = token_;
  cc.incarnation = incarnation_;
  cc.dead_after = o_.dead_after;
  cc.hung_after = o_.hang_after;
  cc.connection_timeout = system_options{}.connection_timeout;
  // Member-lost verdicts come back here, so a worker the coordinator has
  // declared dead (frozen, hung) is killed at once instead of holding the
  // restart until --exit-timeout-ms.
  cc.on_member_lost = [v = verdicts_](uint32_t rank, uint32_t inc, const std::string& why) { v->push(rank, inc, why); };
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
  if (takeover && leader_node_ != o_.node_rank) cc.lost_leader_node = leader_node_;
  cc.own_node = o_.node_rank;
  cc.nproc = o_.nproc;
  if (elector_) cc.lease_holds = lease_check();
  if (planned()) {
    cc.min_nodes = static_cast<uint32_t>(o_.elastic() ? o_.min_nodes : o_.nnodes);
    cc.max_nodes = static_cast<uint32_t>(o_.nnodes);
    cc.elastic_wait = o_.elastic_wait;
    if (takeover) cc.plan = plan_;  // the group it takes over
  }
  return cc;
}

/// The hosted service's fence (coordinator_config::lease_holds). Its wait
/// covers the elector's renewal try at its slowest (each etcd endpoint
/// timing out on connect and on read), so the check reports the outcome
/// and never gives up while the elector still leads.
std::function<bool()> launcher::lease_check() const {
  const auto limit = std::chrono::milliseconds(2000 * (1 + std::count(o_.etcd.begin(), o_.etcd.end(), ',')) + 1000);
  return [w = std::weak_ptr<leader_campaign>(elector_), limit] {
    auto e = w.lock();
    return e && e->lease_holds(limit);
  };
}

/// Spawns and publishes the coordination service on this node.
status launcher::host_service(bool takeover, uint64_t epoch) {
  auto& sys = rt_->sys();
  auto coord = spawn_coordinator(sys, service_config(takeover, epoch));
  auto p = publish_coordinator(sys, coord, elector_ ? o_.coordinator_port : port_, ep_.listen_ip);
  if (!p) {
    caf::anon_send_exit(coord, caf::exit_reason::user_shutdown);
    return p.err();
  }
  {
    std::lock_guard<std::mutex> g(hosted_m_);
    hosted_ = coord;
    hosted_port_ = *p;
  }
  coord_ = coord;
  port_ = *p;
  tell_relay_coordinator();
  return {};
}

/// Several nodes: the node relay, before any worker starts.
status launcher::start_relay() {
  if (o_.nnodes <= 1) return {};
  node_relay_config rc;
  rc.node = o_.node_rank;
  rc.nproc = o_.nproc;
  rc.on_own_rank_lost = [v = verdicts_](uint32_t rank, uint32_t inc, const std::string& why) { v->push(rank, inc, why); };
  relay_ = spawn_node_relay(rt_->sys(), rc);
  auto p = publish_node_relay(rt_->sys(), relay_);
  if (!p) return p.err();
  relay_port_ = *p;
  return {};
}

/// The relay's messages to the service come from this process: the
/// service accepts them once this launcher registered (or hosts it).
void launcher::tell_relay_coordinator() {
  if (!relay_) return;
  caf::scoped_actor self{rt_->sys()};
  self->send(relay_, coord_atom::value, caf::actor_cast<caf::actor>(coord_));
}

void launcher::tell_relay_incarnation() {
  if (!relay_) return;
  caf::scoped_actor self{rt_->sys()};
  self->send(relay_, incarnation_atom::value, incarnation_, static_cast<uint32_t>(rank_of(0)));
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
  memory_dir_ = dir;
}

void launcher::start_checkpoint_server() {
  node_local_sync_ = o_.nnodes > 1 && !o_.checkpoint_dir.empty();
  if (!node_local_sync_) return;
  setup_memory_dir();
  auto s = checkpoint_server::start(o_.checkpoint_dir, ep_.adv.address, token_, std::chrono::seconds(10), memory_dir_);
  if (!s) {
    say("not serving this node's checkpoints to peers: " + s.err().message);
    return;
  }
  ckpt_server_ = std::move(s.value());
  checkpoint_peers(rt_->sys(), coord_, o_, ckpt_server_->endpoint());
}

/// Node 0 moves the coordinator to the group's incarnation; other nodes
/// start theirs in the coordinator's current one (group_policy.hpp). An
/// elastic job's launcher then waits for the plan of a group that has its
/// node; the decision to stop if none comes.
std::optional<launcher_decision> launcher::enter_incarnation() {
  auto& sys = rt_->sys();
  if (elector_) take_leadership_events();
  if (hosts_service()) {
    caf::scoped_actor self{sys};
    self->request(coord_, std::chrono::seconds(10), incarnation_atom::value, incarnation_)
        .receive([](uint32_t) {}, [&](caf::error& e) { spdlog::warn("incarnation: {}", sys.render(e)); });
  } else {
    const uint32_t counted = incarnation_;
    incarnation_ =
        next_incarnation(previous_group_, initial_incarnation_, current_incarnation(sys, coord_, [this] { return connect_as_launcher(std::chrono::seconds(2)); }));
    if (incarnation_ != counted)
      say("starting the group in incarnation " + std::to_string(incarnation_) +
          ", the coordination service's current one");
  }
  if (planned())
    if (auto stop = await_plan()) return stop;
  if (node_local_sync_ && o_.node_local_checkpoints)
    level_checkpoints();
  else if (node_local_sync_)
    fetch_newer_checkpoint(sys, coord_, o_, token_, ckpt_server_ ? ckpt_server_->endpoint() : std::string(),
                           [this](const std::string& l) { say(l); });
  tell_relay_incarnation();
  set_event_identity(launcher_rank, incarnation_);
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

/// One ask for the plan of the first group this node may join from
/// incarnation `from` on. The service holds the request until that plan is
/// decided; nothing when no answer came within a second (asked again).
std::optional<msg<proto::GroupPlan>> launcher::request_plan(uint32_t from) {
  std::optional<msg<proto::GroupPlan>> out;
  caf::scoped_actor self{rt_->sys()};
  self->request(coord_, std::chrono::seconds(1), make<proto::GroupPlanRequest>([&](auto b) {
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
  slot_ = g.slot_of(o_.node_rank).value_or(0);
  world_ = g.world_size();
  incarnation_ = g.incarnation;
  say("the group of incarnation " + std::to_string(incarnation_) + ": " + g.describe() + "; this node is slot " +
      std::to_string(slot_) + " (ranks " + std::to_string(rank_of(0)) + "-" + std::to_string(rank_of(o_.nproc - 1)) +
      ")");
  plan_ = std::move(g);
  emit_event("group_plan", {{"incarnation", incarnation_}, {"slot", slot_}, {"world_size", world_},
                            {"nodes", nlohmann::json(plan_->nodes)}, {"master_addr", torchrun_shape().master_addr}});
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
  uint32_t from = incarnation_;
  bool said_wait = false, said_excluded = false;
  plan_.reset();
  while (!plan_) {
    if (elector_) take_leadership_events();
    if (finished_elsewhere_) return finished_elsewhere();
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
      if (current_incarnation(rt_->sys(), coord_, [this] { return connect_as_launcher(std::chrono::seconds(2)); }))
        heard = clock::now();
    }
    if (!hosts_service() && now - heard > o_.coordinator_wait)
      return coordinator_gone(host_ + ":" + std::to_string(port_),
                              std::chrono::duration_cast<std::chrono::milliseconds>(now - heard).count(),
                              o_.checkpoint_dir.empty() ? 0 : checkpoint_store(o_.checkpoint_dir).newest_valid_step(),
                              o_.restart_code, "", level_problem_);
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
  bool grew = false;
  caf::scoped_actor self{rt_->sys()};
  self->request(coord_, std::chrono::seconds(2), resize_atom::value, incarnation_)
      .receive([&](bool g) { grew = g; }, [](caf::error&) {});
  return grew;
}

/// Elastic jobs that finished while a node of theirs was away (cut off,
/// frozen, or restarting): the service stays up until each such node has
/// asked for its next group and heard that the job finished (it then
/// exits 0 instead of waiting for a service that is gone), at most
/// --coordinator-wait-ms (the time such a node itself waits for the
/// service). A node lost for good costs the job's end that wait.
void launcher::await_stragglers() {
  auto owed = [this] {
    std::string nodes;
    caf::scoped_actor self{rt_->sys()};
    self->request(coord_, std::chrono::seconds(2), owed_atom::value)
        .receive([&](std::string& n) { nodes = std::move(n); }, [](caf::error&) {});
    return nodes;
  };
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
  if (plan_) return {plan_->hosts.empty() ? host_ : plan_->hosts.front(), world_, slot_,
                     static_cast<uint32_t>(plan_->nodes.size())};
  return {host_, world_, static_cast<uint32_t>(o_.node_rank), static_cast<uint32_t>(o_.nnodes)};
}

/// --node-local-checkpoints: this node's directory brought level with its
/// peers' before the group starts (runtime/checkpoint/node_local_sync.hpp).
void launcher::level_checkpoints() {
  level_config c;
  c.dir = o_.checkpoint_dir;
  c.token = token_;
  // Without the service's answer the peers are unknown: nothing heard from
  // them clears a problem found earlier (an empty list would, vacuously).
  auto peers = checkpoint_peers(rt_->sys(), coord_, o_, ckpt_server_ ? ckpt_server_->endpoint() : std::string());
  c.peers = peers.value_or(std::vector<std::string>{});
  for (int i = 0; i < o_.nproc; ++i) c.ranks.push_back(static_cast<uint32_t>(rank_of(i)));
  c.world = world_;
  c.memory_dir = memory_dir_;
  auto t0 = mono_ns();
  auto r = level_node_local(c, [this](const std::string& l) { say(l); });
  level_problem_ = level_problem_after(level_problem_, !r, r ? std::string() : r.err().message,
                                       r && r->heard_every_peer && peers);
  if (!r) {
    say("node-local checkpoints not brought level: " + r.err().message);
    return;
  }
  if (r->step)
    emit_event("leveled",
               {{"step", r->step}, {"ns", mono_ns() - t0}, {"peers", static_cast<int64_t>(c.peers.size())}});
}

std::map<std::string, std::string> launcher::worker_environment(int rank, int local_rank) const {
  std::map<std::string, std::string> env{
      {"GRACE_RANK", std::to_string(rank)},
      {"GRACE_LOCAL_RANK", std::to_string(local_rank)},
      {"GRACE_WORLD_SIZE", std::to_string(world_)},
      {"GRACE_COORDINATOR", host_ + ":" + std::to_string(port_)},
      {"GRACE_RUN_ID", o_.run_id},
      {"GRACE_TOKEN", token_},
      {"GRACE_INCARNATION", std::to_string(incarnation_)},
      {"GRACE_RESTART_CODE", std::to_string(o_.restart_code)},
      {"GRACE_HOST", ep_.adv.address},
  };
  if (!std::getenv("NCCL_SOCKET_IFNAME") && !ep_.adv.iface.empty()) env["NCCL_SOCKET_IFNAME"] = ep_.adv.iface;
  if (relay_) env["GRACE_RELAY"] = "127.0.0.1:" + std::to_string(relay_port_);
  if (elector_) {
    env["GRACE_COORDINATOR_FILE"] = coordinator_file_;
    env["GRACE_FAILOVER_WAIT_MS"] = std::to_string(failover_wait().count());
  }
  if (!o_.checkpoint_dir.empty()) env["GRACE_CHECKPOINT_DIR"] = o_.checkpoint_dir;
  if (o_.node_local_checkpoints) env["GRACE_NODE_LOCAL_CHECKPOINTS"] = "1";
  if (!memory_dir_.empty()) env["GRACE_MEMORY_DIR"] = memory_dir_;
  if (plan_) {
    std::string nodes;
    for (auto n : plan_->nodes) nodes += (nodes.empty() ? "" : ",") + std::to_string(n);
    env["GRACE_GROUP_NODES"] = nodes;
  }
  env.merge(tls_environment(tls_));
  add_torchrun_environment(env, o_, torchrun_shape(), rank, local_rank, incarnation_, restarts_);
  return env;
}

status launcher::start_group() {
  workers_.assign(o_.nproc, worker_proc{});
  const auto spares_deadline = spares_ ? spares_->ready_deadline() : standby_pool::clock::now();
  for (int i = 0; i < o_.nproc; ++i) {
    int rank = rank_of(i);
    workers_[i].rank = rank;
    workers_[i].pid = start_worker(i, worker_environment(rank, i), spares_deadline);
    if (workers_[i].pid < 0) return error{errc::failed, std::string("fork failed: ") + std::strerror(errno)};
  }
  nlohmann::json pids = nlohmann::json::object();
  for (auto& w : workers_) pids[std::to_string(w.rank)] = w.pid;
  emit_event("group_started", {{"incarnation", incarnation_}, {"workers", o_.nproc}, {"pids", pids}});
  return {};
}

/// A worker of the group: its spare if one is usable (--standby), else a
/// new process.
pid_t launcher::start_worker(int local_rank, const env_map& env, standby_pool::clock::time_point spares_deadline) {
  if (spares_ && spares_->count() > 0) {
    auto pid = spares_->release(local_rank, env, spares_deadline);
    if (pid) {
      emit_event("standby_released", {{"worker_rank", rank_of(local_rank)}, {"pid", *pid}});
      return *pid;
    }
    say("local rank " + std::to_string(local_rank) + ": spare not used (" + pid.err().message +
        "): starting the worker from scratch");
  }
  return spawn_process(o_.command, env);
}

/// Starts one spare per local rank for the next incarnation. Their
/// environment is this incarnation's; the release replaces it.
void launcher::start_spares() {
  nlohmann::json pids = nlohmann::json::object();
  for (int i = 0; i < o_.nproc; ++i) {
    const int rank = rank_of(i);
    auto pid = spares_->start(i, spare_environment(worker_environment(rank, i)));
    if (!pid) {
      say("spares not started: " + pid.err().message);
      spares_->discard();
      return;
    }
    pids[std::to_string(rank)] = *pid;
  }
  spares_said_ready_ = false;
  emit_event("standby_started", {{"for_incarnation", incarnation_ + 1}, {"pids", pids}});
}

/// --standby, while the group runs: starts the spares --standby-delay-ms
/// after the group started (while it is intact and a restart may still
/// come), and notes when they are all ready.
void launcher::watch_spares(bool group_intact, std::chrono::steady_clock::time_point started) {
  if (!spares_) return;
  spare_conditions c;
  c.spares = spares_->count();
  c.started_for_this_group = spares_group_ == incarnation_;
  c.group_intact = group_intact;
  c.stopping = notice_forwarded_;
  c.restarts_left = o_.max_restarts - restarts_;
  c.group_age = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started);
  c.delay = o_.standby_delay;
  if (should_start_spares(c)) {
    spares_group_ = incarnation_;
    start_spares();
  }
  for (auto& [rank, fd] : spares_->waiting_fds()) spares_->check_ready(rank);
  if (!spares_said_ready_ && spares_->count() == o_.nproc && spares_->ready_count() == o_.nproc) {
    spares_said_ready_ = true;
    emit_event("standby_ready", {{"for_incarnation", incarnation_ + 1}, {"spares", o_.nproc}});
    say(std::to_string(o_.nproc) + " spare(s) ready for a restart");
  }
}

/// Declared dead by the coordinator: kill our own worker now (never a
/// worker another launcher started, never one of an older group).
void launcher::kill_declared_dead() {
  for (auto& v : verdicts_->take()) {
    if (v.incarnation != incarnation_) continue;
    for (auto& w : workers_) {
      if (w.rank != static_cast<int>(v.rank) || w.exited || w.killed_lost) continue;
      w.killed_lost = true;
      say("rank " + std::to_string(w.rank) + " declared lost by the coordinator (" + v.why + "): killing it");
      emit_event("kill_lost", {{"worker_rank", w.rank}, {"why", v.why}});
      ::kill(w.pid, SIGKILL);
    }
  }
}

/// SIGTERM/SIGINT: the first is forwarded as one notice (a claim carrying
/// the grace period's deadline); a second kills the workers.
void launcher::read_signals() {
  signalfd_siginfo si;
  while (::read(sfd_, &si, sizeof(si)) == sizeof(si)) {
    if (si.ssi_signo == SIGCHLD) continue;
    if (notice_forwarded_) {
      say(std::string(strsignal(si.ssi_signo)) + " again: stopping workers now");
      for (auto& w : workers_)
        if (!w.exited) ::kill(w.pid, SIGKILL);
      continue;
    }
    notice_forwarded_ = true;
    int64_t deadline = o_.grace_period.count() > 0
                           ? wall_ns() + std::chrono::duration_cast<std::chrono::nanoseconds>(o_.grace_period).count()
                           : 0;
    say(std::string("received ") + strsignal(si.ssi_signo) + ": forwarding a notice to the workers" +
        (deadline ? " (grace period " + std::to_string(o_.grace_period.count()) + " ms)" : ""));
    caf::scoped_actor self{rt_->sys()};  // a sender: the service accepts a launcher's notice from launchers only
    self->send(coord_, make<proto::Claim>([&](auto b) {
                     auto n = b.initNotice();
                     n.setRank(launcher_rank);
                     n.setSource(proto::NoticeSource::LAUNCHER);
                     n.setDetail(std::string("launcher received ") + strsignal(si.ssi_signo));
                     n.setReceivedNs(wall_ns());
                     n.setDeadlineNs(deadline);
                     b.setStartedStep(0);
                   }));
  }
}

/// Collects exited workers. A process exit is a verdict for the
/// coordinator: it may not have seen this worker at all yet (it died
/// restoring or joining), and a member that left on purpose first is
/// ignored there. The first exit that is not a success starts the exit
/// timeout for the rest.
void launcher::reap(group_end& g, std::optional<std::chrono::steady_clock::time_point>& kill_at, int& live) {
  int status = 0;
  pid_t pid;
  while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
    if (spares_ && spares_->reaped(pid)) {
      worker_proc spare;
      spare.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      spare.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
      say("a spare exited before it was needed (" + describe(spare) + "); its worker will start from scratch");
      continue;
    }
    for (auto& w : workers_) {
      if (w.pid != pid || w.exited) continue;
      w.exited = true;
      --live;
      if (WIFEXITED(status))
        w.code = WEXITSTATUS(status);
      else if (WIFSIGNALED(status)) {
        w.signal = WTERMSIG(status);
        w.code = 128 + w.signal;
      }
      emit_event("worker_exit", {{"worker_rank", w.rank}, {"code", w.code}, {"signal", w.signal}});
      g.crashed |= w.signal != 0;
      auto effect = classify_exit(w.code, w.signal, o_.restart_code);
      if (effect == exit_effect::finished) break;
      caf::scoped_actor self{rt_->sys()};  // a sender: exits are accepted from this node's launcher only
      self->send(coord_, exited_atom::value, static_cast<uint32_t>(w.rank), incarnation_, static_cast<int32_t>(w.code));
      g.add(effect, w.code == exit_code::no_rendezvous, "rank " + std::to_string(w.rank) + " " + describe(w));
      if (!kill_at) kill_at = std::chrono::steady_clock::now() + o_.exit_timeout;
    }
  }
}

/// Waits for the whole group; a worker still running --exit-timeout-ms
/// after the first exit that was not a success is killed.
group_end launcher::watch_group() {
  group_end g;
  std::optional<std::chrono::steady_clock::time_point> kill_at;
  int live = o_.nproc;
  const auto started = std::chrono::steady_clock::now();
  group_running_ = true;
  while (live > 0) {
    pollfd pfds[3] = {{sfd_, POLLIN, 0}, {verdicts_->wake.fd(), POLLIN, 0}, {elector_ ? elector_->fd() : -1, POLLIN, 0}};
    int pr = ::poll(pfds, 3, 200);
    if (elector_) take_leadership_events();
    kill_declared_dead();
    if (pr > 0 && (pfds[0].revents & POLLIN)) read_signals();
    reap(g, kill_at, live);
    watch_spares(live == o_.nproc && !kill_at, started);
    if (kill_at && std::chrono::steady_clock::now() > *kill_at) {
      for (auto& w : workers_)
        if (!w.exited) {
          say("rank " + std::to_string(w.rank) + " did not exit in time: killing it");
          // An event, not only a line: tests order it against the restart
          // (a kill on the verdict must come first, never this one).
          emit_event("exit_timeout", {{"worker_rank", w.rank}});
          ::kill(w.pid, SIGKILL);
        }
      kill_at = std::chrono::steady_clock::now() + std::chrono::hours(1);
    }
  }
  group_running_ = false;
  return g;
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
  set_event_identity(launcher_rank, incarnation_);
  say("coordination service on " + host_ + ":" + std::to_string(port_) + ", run " + o_.run_id + ", " +
      (o_.elastic() ? "elastic: " + std::to_string(o_.min_nodes) + " to " + std::to_string(o_.nnodes) + " nodes of " +
                          std::to_string(o_.nproc) + " workers"
                    : std::to_string(world_) + " workers (" + std::to_string(o_.nproc) + " on this node)") +
      "; this node advertises " +
      ep_.adv.address + (ep_.adv.iface.empty() ? "" : " (" + ep_.adv.iface + ")") + " from " + ep_.adv.source);
  start_checkpoint_server();
  if (o_.standby) spares_ = std::make_unique<standby_pool>(o_.command, o_.standby_ready_wait);
  rendezvous_streak streak(o_.max_rendezvous_failures);
  group_context ctx;
  ctx.nproc = o_.nproc;
  ctx.max_restarts = o_.max_restarts;
  ctx.restart_code = o_.restart_code;
  ctx.rendezvous_hint = "the workers could not reach the coordination service at " + host_ + ":" +
                        std::to_string(port_) + " or each other; this node advertises " + ep_.adv.address + " (" +
                        ep_.adv.source +
                        "): check that every node's address is reachable from the others "
                        "(--host, --iface)";
  launcher_decision d;
  // The failure history (--save-every auto) is node 0's: its chief saves.
  const bool keeps_history = o_.node_rank == 0 && !o_.checkpoint_dir.empty();
  for (;;) {
    if (previous_group_ && !hosts_service())
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
    if (elector_) elector_->joined_group();
    if (keeps_history) record_incarnation_start(o_.checkpoint_dir, incarnation_);
    auto g = watch_group();
    if (keeps_history)
      record_incarnation_end(o_.checkpoint_dir, incarnation_,
                             std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(),
                             g.crashed || g.fatal);
    ctx.notice_forwarded = notice_forwarded_;
    ctx.restarts = restarts_;
    ctx.level_problem = level_problem_;
    ctx.membership_change = o_.elastic() && g.restart && !g.fatal && !notice_forwarded_ && ended_for_growth();
    d = decide_after_group(g, ctx, streak);
    if (!d.restart) break;
    monitor_->restart(g.crashed, g.rendezvous_failed);
    if (d.counted) ++restarts_;
    previous_group_ = incarnation_;
    ++incarnation_;
    say((d.counted ? "restart " + std::to_string(restarts_) + "/" + std::to_string(o_.max_restarts)
                   : std::string("regrouping")) +
        " (incarnation " + std::to_string(incarnation_) + "): " + d.reason);
  }
  if (spares_) spares_->discard();
  if (o_.elastic() && hosts_service() && d.code == exit_code::success) await_stragglers();
  if (hosts_service()) stop_coordinator();
  if (relay_) caf::anon_send_exit(relay_, caf::exit_reason::user_shutdown);
  if (elector_) {
    elector_->stop(true, d.code == exit_code::success);
    std::error_code ec;
    std::filesystem::remove(coordinator_file_, ec);
  }
  // The mirrors in memory may be the only copy of a lost host's part, for
  // a relaunch after any failure: only a finished job frees the memory.
  if (!memory_dir_.empty() && d.code == exit_code::success) {
    std::error_code ec;
    std::filesystem::remove_all(memory_dir_, ec);
  }
  auto job = monitor_->finish();
  report_goodput(job);
  say("exit " + std::to_string(d.code) + ": " + d.reason);
  write_reason(o_, d.code, d.reason, restarts_, job);
  if (o_.metrics_linger.count() > 0 && !monitor_->url().empty()) linger_for_scrapes();
  ::close(sfd_);
  return d.code;
}

/// Node > 0, between groups: waits (--coordinator-wait-ms) until the
/// coordination service answers. Nothing if it does; otherwise the decision
/// to stop (it is gone, or a SIGTERM/SIGINT came while waiting).
std::optional<launcher_decision> launcher::await_coordinator() {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  auto where = [this] {
    return host_ + ":" + std::to_string(port_) +
           (elector_ ? " (the last one elected through etcd)" : std::string(" (node 0)"));
  };
  auto newest = [&] { return o_.checkpoint_dir.empty() ? 0 : checkpoint_store(o_.checkpoint_dir).newest_valid_step(); };
  bool said = false;
  for (;;) {
    if (elector_) take_leadership_events();
    if (finished_elsewhere_) return finished_elsewhere();
    if (hosts_service()) return std::nullopt;
    if (current_incarnation(rt_->sys(), coord_, [this] { return connect_as_launcher(std::chrono::seconds(2)); })) return std::nullopt;
    auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(clock::now() - t0);
    if (waited >= o_.coordinator_wait)
      return coordinator_gone(where(), waited.count(), newest(), o_.restart_code, "", level_problem_);
    if (!std::exchange(said, true))
      say("the coordination service at " + where() + " does not answer: waiting up to " +
          std::to_string(o_.coordinator_wait.count() / 1000) + " s for it");
    pollfd p[2] = {{sfd_, POLLIN, 0}, {elector_ ? elector_->fd() : -1, POLLIN, 0}};
    if (::poll(p, 2, 500) <= 0 || !(p[0].revents & POLLIN)) continue;
    signalfd_siginfo si;
    while (::read(sfd_, &si, sizeof(si)) == sizeof(si))
      if (si.ssi_signo != SIGCHLD)
        return coordinator_gone(where(), waited.count(), newest(), o_.restart_code,
                                si.ssi_signo == SIGTERM ? "SIGTERM" : "SIGINT", level_problem_);
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

/// Closes the coordination service's port and stops it, waiting (at most
/// 2 s) until it is down: its state holds the workers' remote handles, and
/// an actor system destroyed while it still ran could leave it and CAF's
/// connection broker referring to each other, never freed.
void launcher::stop_coordinator() {
  auto& sys = rt_->sys();
  coordinator_actor hosted;
  uint16_t port;
  {
    std::lock_guard<std::mutex> g(hosted_m_);
    hosted = std::exchange(hosted_, coordinator_actor{});
    port = hosted_port_;
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

// ------------------------------------------------------------ --etcd failover

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
  coordinator_file_ = (std::filesystem::temp_directory_path() /
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
  elector_ = std::move(*e);
  elector_->start();
  const auto deadline = std::chrono::steady_clock::now() + o_.coordinator_wait;
  while (!leading_ && !coord_) {
    if (std::chrono::steady_clock::now() > deadline)
      return error{errc::disconnected, "no coordination service was elected through etcd (" + o_.etcd + ") within " +
                                           std::to_string(o_.coordinator_wait.count()) + " ms"};
    pollfd p{elector_->fd(), POLLIN, 0};
    ::poll(&p, 1, 200);
    take_leadership_events();
  }
  return {};
}

void launcher::set_location(const coordinator_location& where) {
  auto hp = parse_host_port(where.endpoint);
  if (hp) {
    host_ = hp->first;
    port_ = hp->second;
  }
  // For this node's workers: those running rejoin the successor, new ones
  // start with it. Written whole, then renamed: a reader sees one line.
  auto st = write_file_atomically(coordinator_file_, where.to_line() + "\n");
  if (!st) say(st.err().message);
}

/// The elector found the job finished while this node was away (its last
/// leader marked it so and released its key): nothing is left to join.
launcher_decision launcher::finished_elsewhere() const {
  return launcher_decision{false, true, exit_code::success, "nothing to join: " + *finished_elsewhere_};
}

void launcher::take_leadership_events() {
  for (auto& e : elector_->take()) {
    using ty = leadership_event::type;
    switch (e.what) {
      case ty::elected: on_elected(e.where); break;
      case ty::following: on_following(e.where); break;
      case ty::deposed:
        leading_ = false;
        say("no longer hosting the coordination service: " + e.detail + " (closed at once, so a successor cannot "
            "overlap with it)");
        emit_event("coordinator_deposed", {{"epoch", e.where.epoch}});
        break;
      case ty::unreachable: say("etcd does not answer: " + e.detail); break;
      case ty::finished:
        finished_elsewhere_ = e.detail;
        emit_event("job_finished_elsewhere", {{"epoch", e.where.epoch}});
        break;
    }
  }
}

/// This launcher leads: it hosts the service, taking the running group
/// over when it has one (its predecessor was lost).
void launcher::on_elected(const coordinator_location& where) {
  leading_ = true;
  const bool takeover = group_running_;
  say("elected through etcd to host the coordination service on " + where.endpoint + " (epoch " +
      std::to_string(where.epoch) + ")" +
      (takeover ? ", taking over incarnation " + std::to_string(incarnation_) : std::string()));
  emit_event("coordinator_elected", {{"epoch", where.epoch}, {"takeover", takeover}, {"endpoint", where.endpoint}});
  auto hosted = host_service(takeover, where.epoch);
  leader_node_ = static_cast<int32_t>(where.node);
  if (!hosted) {
    say("cannot host the coordination service: " + hosted.err().message);
    return;
  }
  if (auto w = plaintext_warning(ep_.listen_ip, tls_.any()); w && !warned_plaintext_) {
    warned_plaintext_ = true;
    say(*w);
  }
  set_location(where);
  if (ckpt_server_) checkpoint_peers(rt_->sys(), coord_, o_, ckpt_server_->endpoint());
}

/// Another launcher leads (a newer epoch than the last seen): the workers
/// are told first (they rejoin on their own), then this launcher registers.
void launcher::on_following(const coordinator_location& where) {
  leading_ = false;
  say("following the coordination service on " + where.endpoint + " (epoch " + std::to_string(where.epoch) +
      ", node " + std::to_string(where.node) + ")");
  emit_event("coordinator_following", {{"epoch", where.epoch}, {"endpoint", where.endpoint}, {"node", where.node}});
  leader_node_ = static_cast<int32_t>(where.node);
  set_location(where);
  auto h = connect_as_launcher(std::chrono::seconds(3));
  if (!h) {
    say("cannot register with it yet: " + h.err().message);
    return;
  }
  coord_ = *h;
}

/// The elector's depose hook (its own thread): the service stops deciding
/// now, before etcd may elect a successor.
void launcher::fence_service() {
  std::lock_guard<std::mutex> g(hosted_m_);
  if (!hosted_) return;
  unpublish_coordinator(rt_->sys(), hosted_, hosted_port_);
  caf::anon_send_exit(hosted_, caf::exit_reason::kill);
  hosted_ = coordinator_actor{};
}

}  // namespace

int run_launcher(const launch_options& in) { return launcher(in).run(); }

}  // namespace grace
