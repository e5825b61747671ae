#pragma once
/// The launcher's state and the functions its files share. Only
/// actors/launcher*.cpp include this. The state is grouped by what owns it:
///   service_host  where the coordination service is, the one this node
///                 hosts, and the --etcd election (launcher_service.cpp)
///   node_services the node's checkpoint server, relay, memory directory and
///                 leveling (launcher_node.cpp)
///   group_shape   this node's place in the current group: world, slot,
///                 elastic plan, incarnation, restarts (launcher_plan.cpp)
///   supervised    the worker processes: fork, reap, signals, verdicts,
///                 spares (launcher_group.cpp)
/// launcher.cpp holds the incarnation loop (`launcher::run`) and the
/// workers' environment.

#include "actors/coordinator.hpp"
#include "actors/launcher.hpp"
#include "actors/node_relay.hpp"
#include "actors/actor_runtime.hpp"
#include "runtime/base/wake_pipe.hpp"
#include "runtime/checkpoint/checkpoint_fetch.hpp"
#include "runtime/coordination/elastic.hpp"
#include "runtime/coordination/leader_campaign.hpp"
#include "runtime/launch/group_policy.hpp"
#include "runtime/net/net_address.hpp"
#include "runtime/ops/job_monitor.hpp"
#include "runtime/worker/standby.hpp"

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace grace::launch {

struct worker_proc {
  pid_t pid = -1;
  int rank = 0;
  bool exited = false;
  bool killed_lost = false;  ///< killed on a verdict (the service's and the relay's may both come)
  bool replacement = false;  ///< started in place of a lost worker (recovery in place)
  int code = 0;  ///< exit code, or 128 + signal
  int signal = 0;
};

std::string describe(const worker_proc& w);

/// Failure verdicts handed from the coordinator's actor thread to the
/// launcher loop; a pipe wakes the loop's poll at once.
struct verdict_inbox {
  struct entry {
    uint32_t rank;
    uint32_t incarnation;
    std::string why;
    uint32_t pid = 0;  ///< the process declared lost (0: any process of the rank)
  };
  std::mutex m;
  std::vector<entry> entries;
  wake_pipe wake;  ///< readable while entries wait

  void push(uint32_t rank, uint32_t incarnation, const std::string& why, uint32_t pid = 0) {
    {
      std::lock_guard<std::mutex> g(m);
      entries.push_back({rank, incarnation, why, pid});
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

/// The group a worker is part of, as torchrun describes it: rank 0's
/// node address (its TCPStore), the world, this node's place and the nodes.
struct torchrun_group {
  std::string master_addr;
  uint32_t world = 1;
  uint32_t group_rank = 0;
  uint32_t group_world = 1;
};

/// The coordinator's current incarnation, asked by a launcher on node > 0
/// before it starts a group (launcher_service.cpp).
std::optional<uint32_t> current_incarnation(caf::actor_system& sys, coordinator_launcher& coord,
                                            const std::function<result<coordinator_launcher>()>& reconnect);

/// Registers this node's checkpoint server with the coordinator (empty
/// `endpoint`: only asks) and returns the other nodes' servers; nothing when
/// the service did not answer (launcher_node.cpp).
std::optional<std::vector<std::string>> checkpoint_peers(caf::actor_system& sys, coordinator_launcher& coord,
                                                         const launch_options& o, const std::string& endpoint);

/// Where the coordination service is, the one this launcher hosts, and
/// --etcd's election of the launcher hosting it.
struct service_host {
  std::string host = "127.0.0.1";  ///< the coordinator's address
  uint16_t port = 0;
  coordinator_launcher coord;
  std::shared_ptr<leader_campaign> elector;  ///< shared with the hosted service's lease check
  bool leading = false;
  std::optional<std::string> finished_elsewhere;  ///< the elector found the job finished without this node
  int32_t leader_node = -1;  ///< the node hosting the service, as last elected or followed; -1 none yet
  bool warned_plaintext = false;
  std::string coordinator_file;  ///< the service's location for this node's workers (GRACE_COORDINATOR_FILE)
  /// The service this launcher hosts, and its port: guarded, since the
  /// elector's depose hook closes it from the elector's thread.
  std::mutex hosted_m;
  coordinator_actor hosted;
  uint16_t hosted_port = 0;
};

/// What this node serves its peers and workers besides the workers
/// themselves.
struct node_services {
  std::unique_ptr<checkpoint_server> ckpt_server;
  bool sync = false;          ///< several nodes share checkpoints through the servers
  std::string level_problem;  ///< why this node's checkpoints cannot be brought level (level_problem_after)
  std::string memory_dir;     ///< replicas mirrored in memory (setup_memory_dir); empty: none
  /// Multi-node jobs: this node's relay (actors/node_relay.hpp), published
  /// on loopback for the node's workers.
  node_relay_actor relay;
  uint16_t relay_port = 0;
};

/// This node's place in the current group.
struct group_shape {
  uint32_t world = 0;  ///< the current group's workers (an elastic job's plan)
  /// Its node rank, or in an elastic job its slot in the incarnation's plan
  /// (runtime/coordination/elastic.hpp).
  uint32_t slot = 0;
  std::optional<group_plan> plan;  ///< elastic: the current incarnation's group
  uint32_t incarnation = 0;
  uint32_t initial_incarnation = 0;
  std::optional<uint32_t> previous_group;
  int restarts = 0;
};

/// The worker processes of the current group and the next one's spares.
struct supervised {
  std::vector<worker_proc> workers;
  bool running = false;
  bool notice_forwarded = false;
  /// Shared with the coordinator's hook, so it stays valid on the actor
  /// thread for as long as the coordinator may call it.
  std::shared_ptr<verdict_inbox> verdicts = std::make_shared<verdict_inbox>();
  std::unique_ptr<standby_pool> spares;  ///< --standby: the next incarnation's processes
  bool spares_said_ready = false;
  std::optional<uint32_t> spares_for;  ///< the incarnation during which spares were last started
};

/// One grace-launch: the coordination service on node 0 (or the connection
/// to it), the groups it starts one after the other, and the decision after
/// each (group_policy.hpp). Methods run on the caller's thread; only the
/// verdict inbox is touched by the coordinator's actor thread.
class launcher {
public:
  explicit launcher(launch_options o) : o_(std::move(o)) {}
  /// The actor system waits for every actor when it is destroyed: the ones
  /// with timers of their own (relay, service) are stopped on every path.
  ~launcher();
  int run();

private:
  // launcher.cpp: the incarnation loop
  status setup_addresses();
  status choose_signing();
  status start_monitor();
  void report_goodput(const goodput_account& a) const;
  std::optional<launcher_decision> enter_incarnation();
  std::optional<launcher_decision> await_coordinator();
  std::optional<std::string> stop_signal();
  void linger_for_scrapes();
  void finish(const launcher_decision& d);
  std::map<std::string, std::string> worker_environment(int rank, int local_rank) const;
  int rank_of(int local_rank) const { return static_cast<int>(shape_.slot) * o_.nproc + local_rank; }
  void say(const std::string& line) const;

  // launcher_service.cpp: hosting, joining, electing the service
  status host_or_join_coordinator();
  coordinator_config service_config(bool takeover, uint64_t epoch);
  std::function<bool()> lease_check() const;
  status host_service(bool takeover, uint64_t epoch);
  bool hosts_service() const { return svc_.elector ? svc_.leading : o_.node_rank == 0; }
  result<coordinator_launcher> connect_as_launcher(std::chrono::milliseconds timeout);
  void stop_coordinator();
  status start_election();
  void take_leadership_events();
  launcher_decision finished_elsewhere() const;
  void on_elected(const coordinator_location& where);
  void on_following(const coordinator_location& where);
  void fence_service();
  void set_location(const coordinator_location& where);
  std::chrono::milliseconds failover_wait() const;

  // launcher_node.cpp: relay, checkpoint server, memory directory, leveling
  status start_relay();
  void tell_relay_coordinator();
  void tell_relay_incarnation();
  void start_checkpoint_server();
  void setup_memory_dir();
  void level_checkpoints();
  void fetch_newer_checkpoint();
  std::string own_checkpoint_endpoint() const;

  // launcher_plan.cpp: the group's shape (elastic plans, torchrun's view)
  /// Groups come from the service's plans (runtime/coordination/elastic.hpp): elastic
  /// jobs, and jobs whose service moves (--etcd): there rank 0's host, which
  /// torch.distributed's MASTER_ADDR must name, is known only from the plan.
  bool planned() const { return o_.elastic() || (!o_.etcd.empty() && o_.nnodes > 1); }
  std::optional<launcher_decision> await_plan();
  std::optional<launcher_decision> take_plan(const msg<proto::GroupPlan>& m, uint32_t& from, bool& said_excluded);
  std::optional<msg<proto::GroupPlan>> request_plan(uint32_t from);
  void adopt_plan(proto::GroupPlan::Reader p);
  bool ended_for_growth();
  void await_stragglers();
  torchrun_group torchrun_shape() const;

  // launcher_group.cpp: the worker processes
  status start_group();
  pid_t start_worker(int local_rank, const env_map& env, standby_pool::clock::time_point spares_deadline);
  void start_spares();
  void watch_spares(bool group_intact, std::chrono::steady_clock::time_point started);
  group_end watch_group();
  void kill_declared_dead();
  void read_signals();
  void reap(group_end& g, std::optional<std::chrono::steady_clock::time_point>& kill_at, int& live);
  /// Recovery in place: starts a replacement for lost worker `w` (its spare
  /// if one is ready) in the same incarnation; false when the policy says
  /// the group restarts instead (runtime/launch/group_policy.hpp).
  bool replace_lost(worker_proc& w, exit_effect effect, bool group_ending);

  launch_options o_;
  endpoints ep_;
  std::string token_;
  std::optional<checkpoint_key> ckpt_key_;  ///< what this job's checkpoints are signed with (none: unsigned)
  /// The checkpoint directory, reading with the job's key.
  checkpoint_store local_store() const {
    checkpoint_store s(o_.checkpoint_dir);
    s.set_signing_key(ckpt_key_);
    return s;
  }
  tls_files tls_;
  int sfd_ = -1;  ///< SIGTERM, SIGINT, SIGCHLD (block_launcher_signals)
  std::unique_ptr<actor_runtime> rt_;
  std::shared_ptr<job_monitor> monitor_;  ///< shared with the coordinator's progress hook
  service_host svc_;
  node_services node_;
  group_shape shape_;
  supervised group_;
};

}  // namespace grace::launch
