// The multi-host runner of grace-chaos (--hosts): one grace-launch per
// network-namespace host, host-level faults, the same records as run_job.
#include "apps/chaos/job_support.hpp"
#include "apps/chaos/runner.hpp"
#include "apps/chaos/testbed.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

namespace fs = std::filesystem;

namespace grace::chaos {

namespace {

constexpr int coordinator_port = 29500;
constexpr int etcd_members = 3;  ///< on hosts 0..2 with --etcd

/// A random hex secret shared by the hosts of one job (grace-launch
/// refuses several nodes without one).
std::string job_token() {
  std::ifstream f("/dev/urandom", std::ios::binary);
  unsigned char b[16] = {};
  f.read(reinterpret_cast<char*>(b), sizeof b);
  std::string hex;
  char two[3];
  for (unsigned char c : b) {
    std::snprintf(two, sizeof two, "%02x", c);
    hex += two;
  }
  return hex;
}

/// One host's launcher as the scheduler sees it.
struct host_slot {
  pid_t pid = -1;         ///< its launcher, -1 when none runs
  int launch = -1;        ///< index of its current (or last) launch in run_result::launches
  bool lost = false;      ///< killed by host_lost: the fault relaunches it
  int64_t relaunch_at = 0;  ///< when to start a new launcher (0: not pending)
  bool done = false;      ///< its last launcher exited for good
};

/// A fault in progress: a timer (thaw, heal, replace), then maybe a restart.
struct host_active {
  size_t idx = 0;
  int64_t timer_ns = 0;    ///< 0: no timer
  bool timer_done = false;
  bool wait_restart = false;
  std::vector<pid_t> stopped;  ///< worker faults: SIGSTOPped pids to continue
};

class host_job {
public:
  host_job(const run_config& c, const std::vector<fault>& s) : cfg_(c), slots_(static_cast<size_t>(c.hosts)) {
    for (size_t i = 0; i < s.size(); ++i) {
      fault_record r;
      r.f = s[i];
      r.index = i;
      res_.faults.push_back(r);
    }
    view_.workers = c.total_workers();
    view_.per_host = c.workers;
    view_.step_ns = c.step_ns_hint;
  }

  run_result run() {
    setup();
    tb_ = std::make_unique<netns_testbed>(cfg_.hosts);
    res_.notes.push_back("test bed: " + std::to_string(cfg_.hosts) + " hosts (network namespaces " + tb_->ns(0) +
                         ".." + tb_->ns(cfg_.hosts - 1) + "), " + std::to_string(cfg_.workers) + " workers each, " +
                         (cfg_.etcd ? "coordination host elected through etcd (members on hosts 0.." +
                                          std::to_string(etcd_members - 1) + ")"
                                    : "coordinator on host 0 (" + tb_->address(0) + ")") +
                         (cfg_.node_local ? ", a checkpoint directory per host" : ", one shared checkpoint directory") +
                         (cfg_.elastic_min > 0 ? ", elastic: groups of " + std::to_string(cfg_.elastic_min) + " to " +
                                                     std::to_string(cfg_.hosts) + " hosts (wait " +
                                                     std::to_string(cfg_.elastic_wait_ms) + " ms)"
                                               : std::string()));
    if (cfg_.etcd) start_etcd_cluster();
    res_.start_ns = wall_ns();
    for (int h = 0; h < cfg_.hosts; ++h) start_launcher(h);
    while (!all_done()) {
      poll_events();
      reap();
      const int64_t now = wall_ns();
      if (!res_.timed_out && (interrupted() || now - res_.start_ns > cfg_.job_timeout_ms * 1000000)) time_out();
      relaunch_due(now);
      progress_active(now);
      maybe_fire(now);
      auto* next = next_fault();
      sleep_ms(next && next->f.chained() ? 2 : 10);
    }
    stop_etcd();
    wait_stragglers();
    poll_events();
    res_.end_ns = wall_ns();
    res_.step_ns = view_.step_ns;
    std::vector<fs::path> dirs;
    for (int h = 0; h < (cfg_.node_local ? cfg_.hosts : 1); ++h) dirs.push_back(ckpt_of(h));
    collect_outcome(run_dir_ / "h0" / "out.json", dirs, res_);
    tb_.reset();
    return std::move(res_);
  }

private:
  void setup() {
    run_dir_ = cfg_.dir;
    std::error_code ec;
    fs::remove_all(run_dir_, ec);
    fs::create_directories(run_dir_, ec);
    if (ec) throw std::runtime_error("cannot create " + run_dir_.string() + ": " + ec.message());
    ckpt_ = run_dir_ / "ckpt";
    fs::create_directories(ckpt_);
    for (int h = 0; h < cfg_.hosts; ++h) {
      fs::create_directories(run_dir_ / ("h" + std::to_string(h)));
      fs::create_directories(ckpt_of(h));
    }
    events_path_ = run_dir_ / "events.jsonl";
    std::ofstream(events_path_).flush();
    token_ = job_token();
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  }

  /// Host h's checkpoint directory: its own node-local one, or the shared one.
  fs::path ckpt_of(int h) const {
    return cfg_.node_local ? run_dir_ / ("h" + std::to_string(h)) / "ckpt" : ckpt_;
  }

  std::string etcd_url(int h, int port) const { return "http://" + tb_->address(h) + ":" + std::to_string(port); }

  std::string etcd_endpoints() const {
    std::string out;
    for (int h = 0; h < etcd_members; ++h) out += (out.empty() ? "" : ",") + etcd_url(h, 2379);
    return out;
  }

  /// Host h's etcd member (data kept in hN/etcd across a host's loss, as
  /// a replacement machine re-adding the member would have it).
  void start_etcd(int h) {
    std::string cluster;
    for (int i = 0; i < etcd_members; ++i) cluster += (cluster.empty() ? "" : ",") + ("e" + std::to_string(i)) + "=" + etcd_url(i, 2380);
    auto dir = run_dir_ / ("h" + std::to_string(h));
    std::vector<std::string> a = tb_->exec_prefix(h);
    for (auto& s : std::vector<std::string>{
             "etcd", "--name", "e" + std::to_string(h), "--data-dir", (dir / "etcd").string(), "--listen-client-urls",
             etcd_url(h, 2379), "--advertise-client-urls", etcd_url(h, 2379), "--listen-peer-urls", etcd_url(h, 2380),
             "--initial-advertise-peer-urls", etcd_url(h, 2380), "--initial-cluster", cluster,
             "--initial-cluster-state", "new", "--initial-cluster-token", tb_->ns(0), "--heartbeat-interval", "50",
             "--election-timeout", "500", "--pre-vote"})
      a.push_back(s);
    etcd_pid_[h] = spawn(a, dir / "etcd.log", {}, true);
  }

  /// Three members on hosts 0..2, healthy before any launcher starts.
  void start_etcd_cluster() {
    for (int h = 0; h < etcd_members; ++h) start_etcd(h);
    std::vector<std::string> health = tb_->exec_prefix(0);
    for (auto& s : std::vector<std::string>{"etcdctl", "--endpoints", etcd_endpoints(), "--command-timeout=1s",
                                            "endpoint", "health"})
      health.push_back(s);
    const int64_t deadline = wall_ns() + int64_t(30000) * 1000000;
    std::string out;
    while (run_command(health, &out) != 0) {
      if (wall_ns() > deadline)
        throw std::runtime_error("the test bed's etcd did not become healthy within 30 s: " + out + " (logs: " +
                                 (run_dir_ / "h0" / "etcd.log").string() + ")");
      sleep_ms(200);
    }
    res_.notes.push_back("etcd: " + std::to_string(etcd_members) + " members, " + etcd_endpoints());
  }

  void stop_etcd() {
    for (auto& [h, pid] : etcd_pid_)
      if (pid > 0) ::kill(pid, SIGTERM);
    const int64_t deadline = wall_ns() + int64_t(5000) * 1000000;
    while (std::any_of(etcd_pid_.begin(), etcd_pid_.end(), [](auto& e) { return e.second > 0; }) && wall_ns() < deadline) {
      reap();
      sleep_ms(20);
    }
  }

  /// Reaped `p` as an etcd member: true (a fault or stop_etcd killed it).
  bool etcd_exited(pid_t p) {
    for (auto& [h, pid] : etcd_pid_)
      if (pid == p) {
        pid = -1;
        return true;
      }
    return false;
  }

  bool all_done() const {
    return std::all_of(slots_.begin(), slots_.end(), [](const host_slot& s) { return s.done; });
  }

  void start_launcher(int h) {
    auto& slot = slots_[static_cast<size_t>(h)];
    launch_record lr;
    lr.index = static_cast<int>(res_.launches.size());
    lr.host = h;
    std::vector<std::string> a = tb_->exec_prefix(h);
    const std::string nnodes =
        (cfg_.elastic_min > 0 ? std::to_string(cfg_.elastic_min) + ":" : std::string()) + std::to_string(cfg_.hosts);
    for (auto& s : std::vector<std::string>{cfg_.launcher, "--nproc", std::to_string(cfg_.workers), "--nnodes", nnodes,
                                            "--node-rank", std::to_string(h)})
      a.push_back(s);
    if (cfg_.elastic_min > 0)
      for (auto& s : std::vector<std::string>{"--elastic-wait-ms", std::to_string(cfg_.elastic_wait_ms)})
        a.push_back(s);
    for (auto& s : coordination_args()) a.push_back(s);
    for (auto& s : std::vector<std::string>{"--run-id", "chaos", "--checkpoint-dir", ckpt_of(h).string(),
                                            "--dead-after-ms", std::to_string(cfg_.dead_after_ms), "--exit-timeout-ms",
                                            std::to_string(cfg_.exit_timeout_ms), "--max-restarts",
                                            std::to_string(cfg_.launcher_max_restarts)})
      a.push_back(s);
    a.insert(a.end(), cfg_.launcher_args.begin(), cfg_.launcher_args.end());
    a.push_back("--");
    auto host_dir = run_dir_ / ("h" + std::to_string(h));
    for (auto& s : trainer_argv(cfg_, host_dir / "out.json")) a.push_back(s);
    a.insert(a.end(), cfg_.trainer_args.begin(), cfg_.trainer_args.end());
    a.insert(a.end(), cfg_.mutant_args.begin(), cfg_.mutant_args.end());
    lr.argv = a;
    lr.start_ns = wall_ns();
    lr.pid = spawn(a, host_dir / ("launch-" + std::to_string(lr.index) + ".log"),
                   {{"GRACE_EVENTS_FILE", events_path_.string()}, {"GRACE_TOKEN", token_}}, true);
    slot.pid = lr.pid;
    slot.launch = lr.index;
    slot.lost = false;
    slot.relaunch_at = 0;
    res_.launches.push_back(lr);
    append_chaos_event(events_path_, "launch", view_.incarnation,
                       {{"launch", lr.index}, {"launcher_pid", lr.pid}, {"host", h}});
    if (cfg_.verbose) spdlog::info("launch {} on host {} (pid {})", lr.index, h, lr.pid);
  }

  /// Where the launchers find the coordination service: host 0, or the
  /// launcher etcd elects.
  std::vector<std::string> coordination_args() const {
    if (!cfg_.etcd) return {"--coordinator", tb_->address(0) + ":" + std::to_string(coordinator_port)};
    return {"--etcd", etcd_endpoints(), "--etcd-ttl", std::to_string(cfg_.etcd_ttl_s), "--coordinator-port",
            std::to_string(coordinator_port)};
  }

  void poll_events() { poll_job_events(events_path_, events_offset_, view_, res_, cfg_.ckpt_tool); }

  /// Reaps whatever exited: a host's launcher (relaunched on the restart
  /// code or a kill, as a scheduler would), or an orphaned worker.
  void reap() {
    int st = 0;
    pid_t p;
    while ((p = ::waitpid(-1, &st, WNOHANG)) > 0) {
      const int code = WIFEXITED(st) ? WEXITSTATUS(st) : -1, sig = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
      if (etcd_exited(p)) continue;
      auto it = std::find_if(slots_.begin(), slots_.end(), [&](const host_slot& s) { return s.pid == p; });
      if (it == slots_.end()) {
        if (!res_.launches.empty())
          res_.launches.back().notes.push_back("orphaned worker pid " + std::to_string(p) + " reaped: " +
                                               (sig ? "signal " + std::to_string(sig) : "exit " + std::to_string(code)));
        continue;
      }
      auto& lr = res_.launches[static_cast<size_t>(it->launch)];
      lr.exit_code = code;
      lr.signal = sig;
      lr.end_ns = wall_ns();
      it->pid = -1;
      launcher_exited(*it, lr);
    }
  }

  void launcher_exited(host_slot& slot, const launch_record& lr) {
    if (slot.lost) return;  // the host_lost fault brings a replacement
    const bool again = (lr.exit_code == 42 || lr.exit_code < 0) && !res_.timed_out;
    if (!again) {
      slot.done = true;
      return;
    }
    if (res_.launches.size() >= static_cast<size_t>(cfg_.hosts + cfg_.max_relaunches)) {
      res_.notes.push_back("gave up after " + std::to_string(cfg_.max_relaunches) + " relaunches");
      slot.done = true;
      return;
    }
    slot.relaunch_at = wall_ns();
  }

  void relaunch_due(int64_t now) {
    for (int h = 0; h < cfg_.hosts; ++h) {
      auto& s = slots_[static_cast<size_t>(h)];
      if (s.relaunch_at && now >= s.relaunch_at && s.pid < 0 && !s.done) start_launcher(h);
    }
  }

  void time_out() {
    res_.timed_out = true;
    res_.notes.push_back(interrupted() ? std::string("interrupted (SIGINT/SIGTERM): killing the job")
                                       : "job timed out after " + std::to_string(cfg_.job_timeout_ms) +
                                             " ms: killing it");
    for (int h = 0; h < cfg_.hosts; ++h) {
      tb_->kill_host(h);
      auto& s = slots_[static_cast<size_t>(h)];
      s.lost = false;
      s.relaunch_at = 0;
      if (s.pid < 0) s.done = true;
    }
  }

  /// Workers left behind by a killed launcher: time to notice, then SIGKILL.
  void wait_stragglers() {
    const int64_t deadline = wall_ns() + int64_t(15000) * 1000000;
    for (;;) {
      reap();
      bool any = false;
      for (int h = 0; h < cfg_.hosts; ++h) any |= !tb_->pids(h).empty();
      if (!any) return;
      if (wall_ns() > deadline) {
        for (int h = 0; h < cfg_.hosts; ++h)
          if (!tb_->pids(h).empty()) {
            tb_->kill_host(h);
            res_.notes.push_back("stragglers on host " + std::to_string(h) + " killed by the harness");
          }
        sleep_ms(100);
        reap();
        return;
      }
      sleep_ms(20);
    }
  }

  fault_record* next_fault() {
    for (auto& r : res_.faults)
      if (r.status == "not reached") return &r;
    return nullptr;
  }

  void maybe_fire(int64_t now) {
    auto* r = next_fault();
    if (!r) return;
    if (r->f.chained()) {
      auto due = chained_due(res_, *r);
      if (due && now >= *due) fire(*r, now);
      return;
    }
    if (!active_.empty() || !view_.running()) return;
    const int64_t est = view_.estimate(now);
    if (est < view_.first_step + 2) return;  // let a restarted group settle
    const bool due = (r->f.at_step && est >= static_cast<int64_t>(*r->f.at_step)) ||
                     (r->f.at_ms && now - res_.start_ns >= *r->f.at_ms * 1000000);
    if (due) fire(*r, now);
  }

  /// The current worker of `rank`, or -1.
  pid_t pid_of_rank(int rank) const {
    auto it = view_.pid_of.find(rank);
    if (it == view_.pid_of.end()) return -1;
    auto pid = static_cast<pid_t>(it->second);
    return running_process(pid) ? pid : -1;
  }

  void fire(fault_record& r, int64_t now) {
    r.t_ns = now;
    r.est_step = view_.estimate(now);
    r.incarnation = view_.incarnation;
    host_active a;
    a.idx = r.index;
    const bool ok = is_host_fault(r.f.kind) ? fire_host(r, a, now) : fire_worker(r, a, now);
    if (!ok) {
      r.status = "skipped";
      return;
    }
    r.status = "injected";
    append_chaos_event(events_path_, "fault",
                       view_.incarnation,
                       {{"fault", to_string(r.f.kind)}, {"index", r.index}, {"est_step", r.est_step},
                        {"ranks", r.ranks}, {"host", r.f.host}});
    if (cfg_.verbose)
      spdlog::info("fault {} {} at ~step {} (incarnation {})", r.index, to_string(r.f.kind), r.est_step,
                   view_.incarnation);
    active_.push_back(a);
  }

  /// The host whose launcher runs the coordination service now: the
  /// endpoint of the newest coordinator_elected event (host 0 without etcd).
  int coordinator_host_now() const {
    if (!cfg_.etcd) return 0;
    for (auto it = res_.events.rbegin(); it != res_.events.rend(); ++it) {
      if (it->name != "coordinator_elected") continue;
      auto endpoint = it->j.value("endpoint", std::string());
      for (int h = 0; h < cfg_.hosts; ++h)
        if (endpoint.rfind(tb_->address(h) + ":", 0) == 0) return h;
    }
    return -1;
  }

  /// host_lost / host_partition / host_freeze on host f.host (default 1;
  /// "coordinator": resolved here, and recorded, to the host it is now).
  bool fire_host(fault_record& r, host_active& a, int64_t now) {
    if (r.f.host == coordinator_host) {
      const int now_host = coordinator_host_now();
      if (now_host < 0) {
        r.detail = "no coordinator_elected event yet: the coordination host is unknown";
        return false;
      }
      r.f.host = now_host;
    }
    const int h = r.f.host >= 0 ? r.f.host : 1;
    if (h >= cfg_.hosts || (h == 0 && !cfg_.etcd)) {
      r.detail = "host " + std::to_string(h) + " cannot be hit (hosts " + (cfg_.etcd ? "0.." : "1..") +
                 std::to_string(cfg_.hosts - 1) + ")";
      return false;
    }
    auto& slot = slots_[static_cast<size_t>(h)];
    r.launch = slot.launch;
    r.ranks = view_.ranks_of(h);  // none: an elastic group that runs without it
    a.timer_ns = now + int64_t(r.f.duration_ms) * 1000000;
    switch (r.f.kind) {
      case fault_kind::host_lost:
        slot.lost = true;
        tb_->kill_host(h);
        r.detail = "host " + std::to_string(h) + " lost (launcher and workers SIGKILLed, link down); replaced after " +
                   std::to_string(r.f.duration_ms) + " ms";
        a.wait_restart = true;
        break;
      case fault_kind::host_partition:
        tb_->set_link(h, false);
        r.detail = "host " + std::to_string(h) + " cut off for " + std::to_string(r.f.duration_ms) + " ms";
        a.wait_restart = r.f.duration_ms >= cfg_.dead_after_ms;
        break;
      default:
        tb_->signal_host(h, SIGSTOP);
        r.detail = "host " + std::to_string(h) + " frozen for " + std::to_string(r.f.duration_ms) + " ms";
        a.wait_restart = r.f.duration_ms >= cfg_.dead_after_ms;
        break;
    }
    return true;
  }

  /// sigterm_worker / sigkill_worker / sigstop_worker on a rank of any host.
  bool fire_worker(fault_record& r, host_active& a, int64_t now) {
    const int rank = r.f.targets.empty() ? 1 : r.f.targets[0];
    int sig = SIGTERM;
    if (r.f.kind == fault_kind::sigkill_worker) sig = SIGKILL;
    if (r.f.kind == fault_kind::sigstop_worker) sig = SIGSTOP;
    if (r.f.kind != fault_kind::sigterm_worker && sig == SIGTERM) {
      r.detail = std::string(to_string(r.f.kind)) + " is a single-host fault (not on the multi-host test bed)";
      return false;
    }
    const pid_t p = pid_of_rank(rank);
    if (p <= 0 || ::kill(p, sig) != 0) {
      r.detail = "rank " + std::to_string(rank) + " not found";
      return false;
    }
    r.ranks.push_back(rank);
    if (auto h = view_.host_of(rank); h >= 0 && h < cfg_.hosts) r.launch = slots_[static_cast<size_t>(h)].launch;
    if (sig == SIGSTOP && r.f.duration_ms > 0) {
      a.stopped.push_back(p);
      a.timer_ns = now + int64_t(r.f.duration_ms) * 1000000;
      a.wait_restart = false;
    } else {
      a.wait_restart = true;
    }
    return true;
  }

  void progress_active(int64_t now) {
    for (size_t i = 0; i < active_.size();) {
      if (progress_one(active_[i], now))
        active_.erase(active_.begin() + static_cast<long>(i));
      else
        ++i;
    }
  }

  /// Advances one fault in progress; true once it is over.
  bool progress_one(host_active& a, int64_t now) {
    auto& r = res_.faults[a.idx];
    if (a.timer_ns && !a.timer_done) {
      if (now < a.timer_ns || !end_timer(r, a)) return false;
      a.timer_done = true;
      append_chaos_event(events_path_, "fault_end", view_.incarnation, {{"index", r.index}});
    }
    if (!a.wait_restart) return true;
    return view_.incarnation > r.incarnation && view_.running();
  }

  /// The end of a fault's duration: link up, thaw, or the replacement
  /// host (once the lost launcher is reaped); false to try again later.
  bool end_timer(fault_record& r, host_active& a) {
    for (pid_t p : a.stopped) ::kill(p, SIGCONT);
    if (!is_host_fault(r.f.kind)) return true;
    const int h = r.f.host >= 0 ? r.f.host : 1;
    auto& slot = slots_[static_cast<size_t>(h)];
    switch (r.f.kind) {
      case fault_kind::host_lost:
        if (slot.pid > 0) return false;
        tb_->set_link(h, true);
        if (res_.timed_out) break;
        if (cfg_.node_local) replace_disk(h);
        if (cfg_.etcd && h < etcd_members) start_etcd(h);
        start_launcher(h);
        break;
      case fault_kind::host_partition: tb_->set_link(h, true); break;
      default: tb_->signal_host(h, SIGCONT); break;
    }
    return true;
  }

  /// A replacement machine's empty node-local checkpoint directory.
  void replace_disk(int h) {
    std::error_code ec;
    fs::remove_all(ckpt_of(h), ec);
    fs::create_directories(ckpt_of(h), ec);
  }

  run_config cfg_;
  run_result res_;
  job_view view_;
  std::vector<host_slot> slots_;
  std::unique_ptr<netns_testbed> tb_;
  fs::path run_dir_, ckpt_, events_path_;
  uint64_t events_offset_ = 0;
  std::string token_;
  std::vector<host_active> active_;
  std::map<int, pid_t> etcd_pid_;  ///< host -> its etcd member (-1: not running)
};

}  // namespace

run_result run_host_job(const run_config& cfg, const std::vector<fault>& schedule) {
  host_job j(cfg, schedule);
  return j.run();
}

}  // namespace grace::chaos
