#include "apps/chaos/runner.hpp"

#include "apps/chaos/job_support.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <map>
#include <set>
#include <stdexcept>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

namespace fs = std::filesystem;

namespace grace::chaos {

namespace {

/// A pid that belonged to a process that is gone now.
long dead_pid() {
  pid_t p = ::fork();
  if (p == 0) ::_exit(0);
  int st;
  ::waitpid(p, &st, 0);
  return p;
}

/// Newest `step-N` directory that has a manifest.
std::optional<fs::path> newest_checkpoint(const fs::path& dir, uint64_t* step_out = nullptr) {
  std::optional<fs::path> best;
  uint64_t best_step = 0;
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    auto name = it->path().filename().string();
    unsigned long long s;
    char rest;
    if (std::sscanf(name.c_str(), "step-%llu%c", &s, &rest) != 1) continue;
    if (!fs::exists(it->path() / "grace-manifest.json")) continue;
    if (!best || s > best_step) {
      best = it->path();
      best_step = s;
    }
  }
  if (step_out) *step_out = best_step;
  return best;
}

fs::path pick_file(const fs::path& step_dir, const std::string& wanted) {
  if (!wanted.empty()) return step_dir / wanted;
  std::vector<fs::path> shards;
  for (auto& e : fs::directory_iterator(step_dir))
    if (e.path().extension() == ".safetensors") shards.push_back(e.path());
  std::sort(shards.begin(), shards.end());
  if (shards.empty()) return step_dir / "grace-manifest.json";
  return shards.front();
}

/// A fault in progress: what remains to do and when it counts as over.
struct active_fault {
  size_t idx = 0;
  enum class wait_for { restart, launcher_exit, timer } until = wait_for::restart;
  int64_t timer_ns = 0;          ///< timer: when to finish (sigcont, remove filler)
  int64_t deadline_kill_ns = 0;  ///< grace period: platform kill time
  bool gap = false;              ///< checkpoint fault applied once the launcher is down
  std::vector<pid_t> stopped;    ///< SIGSTOPped pids to continue
  fs::path filler;
};

class job {
public:
  job(const run_config& c, const std::vector<fault>& s) : cfg_(c) {
    for (size_t i = 0; i < s.size(); ++i) {
      fault_record r;
      r.f = s[i];
      r.index = i;
      res_.faults.push_back(r);
    }
    view_.workers = c.workers;
    view_.step_ns = c.step_ns_hint;
  }

  run_result run() {
    setup();
    res_.start_ns = wall_ns();
    int64_t next_incarnation = 0;
    for (int launch = 0;; ++launch) {
      if (launch > cfg_.max_relaunches) {
        res_.notes.push_back("gave up after " + std::to_string(cfg_.max_relaunches) + " relaunches");
        break;
      }
      launch_record lr = start_launcher(launch, next_incarnation);
      watch(lr);
      res_.launches.push_back(lr);
      next_incarnation = std::max(next_incarnation, view_.incarnation + 1);
      bool relaunch = (lr.exit_code == 42) || (lr.exit_code < 0);
      for (auto& a : active_)
        if (a.gap) finish_gap_fault(lr, a);
      active_.erase(std::remove_if(active_.begin(), active_.end(),
                                   [](const active_fault& a) {
                                     return a.gap || a.until == active_fault::wait_for::launcher_exit;
                                   }),
                    active_.end());
      if (res_.timed_out || !relaunch) break;
    }
    end_job();
    return std::move(res_);
  }

private:
  void setup() {
    std::error_code ec;
    run_dir_ = cfg_.dir;
    fs::remove_all(run_dir_, ec);
    fs::create_directories(run_dir_, ec);
    if (ec) throw std::runtime_error("cannot create " + run_dir_.string() + ": " + ec.message());
    ckpt_ = run_dir_ / "ckpt";
    fs::create_directories(ckpt_);
    events_path_ = run_dir_ / "events.jsonl";
    std::ofstream(events_path_).flush();
    bool wants_fs =
        std::any_of(res_.faults.begin(), res_.faults.end(), [](auto& r) { return r.f.kind == fault_kind::fs_full; });
    if (wants_fs) {
      auto opts = "size=" + std::to_string(cfg_.fs_size_mb) + "m,mode=0755";
      if (::mount("grace-chaos", ckpt_.c_str(), "tmpfs", 0, opts.c_str()) == 0) {
        res_.fs_mounted = true;
        res_.notes.push_back("checkpoint dir is a " + std::to_string(cfg_.fs_size_mb) + " MiB tmpfs (for fs_full)");
      } else {
        res_.notes.push_back(std::string("fs_full: cannot mount a tmpfs on the checkpoint dir (") +
                             std::strerror(errno) + "): fs_full faults are skipped");
      }
    }
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  }

  void note_event(const std::string& what, const nlohmann::json& extra) {
    append_chaos_event(events_path_, what, view_.incarnation, extra);
  }

  /// The next fault not yet handled.
  fault_record* next_fault() {
    for (auto& r : res_.faults)
      if (r.status == "not reached" && r.f.kind != fault_kind::step_error) return &r;
    return nullptr;
  }

  launch_record start_launcher(int index, int64_t incarnation) {
    launch_record lr;
    lr.index = index;
    lr.base_incarnation = incarnation;
    int launcher_grace = 0, worker_grace = 0;
    std::optional<fault> fail;
    for (auto& r : res_.faults) {
      if (r.status != "not reached") continue;
      if (r.f.kind == fault_kind::step_error) {
        fail = r.f;
      }
    }
    if (auto* n = next_fault()) {
      if (n->f.kind == fault_kind::sigterm_launcher ||
          (n->f.kind == fault_kind::sigterm_multi && n->f.include_launcher))
        launcher_grace = n->f.grace_ms;
      if (n->f.kind == fault_kind::sigterm_worker || n->f.kind == fault_kind::sigterm_multi)
        worker_grace = n->f.grace_ms;
    }
    grace_launcher_ = launcher_grace;
    grace_worker_ = worker_grace;
    lr.grace_ms = std::max(launcher_grace, worker_grace);
    std::vector<std::string> a = {cfg_.launcher,
                                  "--nproc",
                                  std::to_string(cfg_.workers),
                                  "--max-restarts",
                                  std::to_string(cfg_.launcher_max_restarts),
                                  "--checkpoint-dir",
                                  ckpt_.string(),
                                  "--exit-timeout-ms",
                                  std::to_string(cfg_.exit_timeout_ms)};
    if (launcher_grace) {
      a.push_back("--grace-period-ms");
      a.push_back(std::to_string(launcher_grace));
    }
    a.insert(a.end(), cfg_.launcher_args.begin(), cfg_.launcher_args.end());
    a.push_back("--");
    for (auto& s : trainer_argv(cfg_, run_dir_ / "out.json")) a.push_back(s);
    if (worker_grace) {
      a.push_back("--grace-period-ms");
      a.push_back(std::to_string(worker_grace));
    }
    if (fail) {
      a.push_back("--fail-at-step");
      a.push_back(std::to_string(fail->at_step.value_or(cfg_.steps / 2)));
      a.push_back("--fail-rank");
      a.push_back(std::to_string(fail->targets.empty() ? 0 : fail->targets[0]));
    }
    for (auto& s : cfg_.trainer_args) a.push_back(s);
    for (auto& s : cfg_.mutant_args) a.push_back(s);
    lr.argv = a;
    std::map<std::string, std::string> env{{"GRACE_EVENTS_FILE", events_path_.string()},
                                           {"GRACE_INCARNATION", std::to_string(incarnation)}};
    lr.start_ns = wall_ns();
    lr.pid = spawn(a, run_dir_ / ("launch-" + std::to_string(index) + ".log"), env, true);
    launcher_ = lr.pid;
    note_event("launch", {{"launch", index}, {"launcher_pid", lr.pid}, {"base_incarnation", incarnation}});
    if (cfg_.verbose) spdlog::info("launch {} (pid {}, incarnation {})", index, lr.pid, incarnation);
    return lr;
  }

  void poll_events() { poll_job_events(events_path_, events_offset_, view_, res_, cfg_.ckpt_tool); }

  /// Reaps whatever exited; returns true when the launcher did.
  bool reap(launch_record& lr) {
    int st = 0;
    pid_t p;
    bool launcher_done = false;
    while ((p = ::waitpid(-1, &st, WNOHANG)) > 0) {
      int code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
      int sig = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
      if (p == lr.pid) {
        lr.exit_code = code;
        lr.signal = sig;
        lr.end_ns = wall_ns();
        launcher_done = true;
      } else {
        lr.notes.push_back("orphaned worker pid " + std::to_string(p) + " reaped by the harness: " +
                           (sig ? "signal " + std::to_string(sig) : "exit " + std::to_string(code)));
      }
    }
    return launcher_done;
  }

  void watch(launch_record& lr) {
    std::vector<pid_t> last_children;
    for (;;) {
      poll_events();
      auto kids = children_of(lr.pid);
      if (!kids.empty()) last_children = kids;
      if (reap(lr)) break;
      int64_t now = wall_ns();
      if (interrupted() || now - res_.start_ns > cfg_.job_timeout_ms * 1000000) {
        if (!res_.timed_out)
          res_.notes.push_back(interrupted() ? std::string("interrupted (SIGINT/SIGTERM): killing the job")
                                             : "job timed out after " + std::to_string(cfg_.job_timeout_ms) +
                                                   " ms: killing it");
        res_.timed_out = true;
        kill_job(lr.pid, last_children);
      }
      progress_active(lr, last_children, now);
      maybe_fire(lr, last_children, now);
      // A chained fault keyed to a phase must land inside it: look often.
      auto* next = next_fault();
      sleep_ms(next && next->f.chained() ? 2 : 10);
    }
    poll_events();
    // Workers left behind (the launcher was killed): give them time to
    // notice the lost coordinator and exit, then kill their groups.
    auto deadline = wall_ns() + int64_t(15000) * 1000000;
    for (;;) {
      reap(lr);
      bool any = false;
      for (pid_t k : last_children) any |= (::kill(-k, 0) == 0);
      if (!any) break;
      if (wall_ns() > deadline) {
        for (pid_t k : last_children)
          if (::kill(-k, 0) == 0) {
            ::kill(-k, SIGKILL);
            lr.notes.push_back("straggler process group " + std::to_string(k) + " killed by the harness");
          }
        sleep_ms(100);
        reap(lr);
        break;
      }
      sleep_ms(20);
    }
    poll_events();
  }

  void kill_job(pid_t launcher, const std::vector<pid_t>& kids) {
    ::kill(launcher, SIGKILL);
    for (pid_t k : kids) ::kill(-k, SIGKILL);
  }

  /// The current incarnation's worker of `rank`: a child of the launcher,
  /// or, once the launcher is gone (its workers are orphans the harness
  /// reaps as subreaper), any live process the launcher named for it.
  pid_t pid_of_rank(int rank, const std::vector<pid_t>& kids) {
    auto it = view_.pid_of.find(rank);
    if (it == view_.pid_of.end()) return -1;
    auto pid = static_cast<pid_t>(it->second);
    if (std::find(kids.begin(), kids.end(), pid) != kids.end()) return pid;
    if (!running_process(launcher_) && running_process(pid)) return pid;
    return -1;
  }

  void maybe_fire(launch_record& lr, const std::vector<pid_t>& kids, int64_t now) {
    auto* r = next_fault();
    if (!r) return;
    if (r->f.chained()) {
      // Overlapping: fires while earlier faults are still in progress.
      auto due = chained_due(res_, *r);
      if (due && now >= *due) fire(*r, lr, kids, now);
      return;
    }
    if (!active_.empty() || !view_.running()) return;
    int64_t est = view_.estimate(now);
    // Let a restarted group settle for two steps before the next fault.
    if (est < view_.first_step + 2) return;
    bool due = (r->f.at_step && est >= static_cast<int64_t>(*r->f.at_step)) ||
               (r->f.at_ms && now - res_.start_ns >= *r->f.at_ms * 1000000);
    if (due) fire(*r, lr, kids, now);
  }

  int target_of(const fault& f, size_t i) const {
    return f.targets.size() > i ? f.targets[i] : (cfg_.workers > 1 ? 1 : 0);
  }

  /// Signals one worker; its pid, or -1 (noted) when it is not there.
  pid_t signal_rank(fault_record& r, int rank, int sig, const std::vector<pid_t>& kids) {
    pid_t p = pid_of_rank(rank, kids);
    if (p > 0 && ::kill(p, sig) == 0) {
      r.ranks.push_back(rank);
      return p;
    }
    r.detail += "rank " + std::to_string(rank) + " not found; ";
    return -1;
  }

  /// The notices: SIGTERM to workers and/or the launcher, each with the
  /// grace period it runs with, and the platform's kill after it.
  void inject_notice(fault_record& r, active_fault& a, launch_record& lr, const std::vector<pid_t>& kids, int64_t now) {
    auto& f = r.f;
    bool launcher =
        f.kind == fault_kind::sigterm_launcher || (f.kind == fault_kind::sigterm_multi && f.include_launcher);
    bool workers = f.kind != fault_kind::sigterm_launcher;
    std::vector<pid_t> ps;  // every pid first: the signals land within microseconds of each other
    size_t n = !workers ? 0 : f.kind == fault_kind::sigterm_multi ? std::max<size_t>(1, f.targets.size()) : 1;
    for (size_t i = 0; i < n; ++i) ps.push_back(pid_of_rank(target_of(f, i), kids));
    if (launcher) ::kill(lr.pid, SIGTERM);
    for (size_t i = 0; i < ps.size(); ++i)
      if (ps[i] > 0 && ::kill(ps[i], SIGTERM) == 0) r.ranks.push_back(target_of(f, i));
    r.effective_grace_ms =
        launcher ? (workers ? std::max(grace_launcher_, grace_worker_) : grace_launcher_) : grace_worker_;
    a.until = launcher ? active_fault::wait_for::launcher_exit : active_fault::wait_for::restart;
    if (r.effective_grace_ms)
      a.deadline_kill_ns = now + int64_t(r.effective_grace_ms + cfg_.grace_kill_slack_ms) * 1000000;
  }

  /// fs_full: fills the checkpoint file system for save_every + 3 steps.
  bool fill_disk(fault_record& r, active_fault& a) {
    if (!res_.fs_mounted) {
      r.status = "skipped";
      r.detail = "no small file system could be mounted (needs root and mount(2))";
      return false;
    }
    a.filler = ckpt_ / ".chaos-filler";
    int fd = ::open(a.filler.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    std::vector<char> buf(16384, 0x5a);
    uint64_t n = 0;
    while (fd >= 0) {
      ssize_t w = ::write(fd, buf.data(), buf.size());
      if (w <= 0) break;
      n += static_cast<uint64_t>(w);
    }
    if (fd >= 0) ::close(fd);
    // Filling takes a while (a quarter of a second for 256 MiB, several
    // steps of a fast job): the disk is full from here, so its step (what
    // work_lost bounds the fault by) and its window start here, not at
    // `now`.
    const int64_t full_ns = wall_ns();
    r.est_step = view_.estimate(full_ns);
    r.detail = "filled with " + std::to_string(n) + " bytes, full at ~step " + std::to_string(r.est_step);
    a.until = active_fault::wait_for::timer;
    a.timer_ns = full_ns + static_cast<int64_t>(double(cfg_.save_every + 3) * view_.step_ns);
    return true;
  }

  /// Carries out one fault of the schedule; what to wait for before the
  /// next one goes into `active_`.
  void fire(fault_record& r, launch_record& lr, const std::vector<pid_t>& kids, int64_t now) {
    int64_t est = view_.estimate(now);
    r.t_ns = now;
    r.est_step = est;
    r.launch = lr.index;
    r.incarnation = view_.incarnation;
    r.status = "injected";
    active_fault a;
    a.idx = r.index;
    auto& f = r.f;
    switch (f.kind) {
      case fault_kind::sigterm_worker:
      case fault_kind::sigterm_multi:
      case fault_kind::sigterm_launcher: inject_notice(r, a, lr, kids, now); break;
      case fault_kind::sigkill_worker:
        signal_rank(r, target_of(f, 0), SIGKILL, kids);
        a.until = active_fault::wait_for::restart;
        break;
      case fault_kind::sigstop_worker:
        if (pid_t p = signal_rank(r, target_of(f, 0), SIGSTOP, kids); p > 0) a.stopped.push_back(p);
        // Short: SIGCONT at the timer. For good: the launcher's kill ends it.
        a.until = f.duration_ms > 0 ? active_fault::wait_for::timer : active_fault::wait_for::restart;
        a.timer_ns = now + int64_t(f.duration_ms) * 1000000;
        break;
      case fault_kind::sigkill_launcher:
        ::kill(lr.pid, SIGKILL);
        a.until = active_fault::wait_for::launcher_exit;
        break;
      case fault_kind::step_error: break;  // armed at launch (--fail-at-step): never fired from here
      case fault_kind::flip_byte:
      case fault_kind::truncate_file:
      case fault_kind::delete_file:
      case fault_kind::stale_tmp:
        // Take the job down with a notice, damage the directory while it
        // is down, let the scheduler start it again.
        ::kill(lr.pid, SIGTERM);
        a.until = active_fault::wait_for::launcher_exit;
        a.gap = true;
        break;
      case fault_kind::fs_full:
        if (!fill_disk(r, a)) return;
        break;
      case fault_kind::host_lost:
      case fault_kind::host_partition:
      case fault_kind::host_freeze:
        r.status = "skipped";
        r.detail = "a host fault needs the multi-host test bed (--hosts)";
        return;
    }
    bool worker_fault = f.kind == fault_kind::sigterm_worker || f.kind == fault_kind::sigkill_worker ||
                        f.kind == fault_kind::sigstop_worker ||
                        (f.kind == fault_kind::sigterm_multi && !f.include_launcher);
    if (worker_fault && r.ranks.empty()) {
      // Nothing was signalled: not covered, never counted as injected.
      r.status = "skipped";
      r.detail += "no target process to signal";
      return;
    }
    note_event("fault", {{"fault", to_string(f.kind)}, {"index", r.index}, {"est_step", est}, {"ranks", r.ranks}});
    if (cfg_.verbose)
      spdlog::info("fault {} {} at ~step {} (incarnation {})", r.index, to_string(f.kind), est, view_.incarnation);
    active_.push_back(a);
  }

  void progress_active(launch_record& lr, const std::vector<pid_t>& kids, int64_t now) {
    for (size_t i = 0; i < active_.size();) {
      if (progress_one(active_[i], lr, kids, now))
        active_.erase(active_.begin() + static_cast<long>(i));
      else
        ++i;
    }
  }

  /// A full disk has done its work once a save failed on it: free it then,
  /// not on a step estimate that may outrun the job's last save.
  bool save_failed_since(int64_t t_ns) const {
    return std::any_of(res_.events.begin(), res_.events.end(),
                       [&](const event& e) { return e.name == "save_failed" && e.t_ns >= t_ns; });
  }

  /// The group recovered in place (grace-launch --recovery in-place) after
  /// `t_ns`: the fault is over without a new incarnation.
  bool resumed_since(int64_t t_ns) const {
    return std::any_of(res_.events.begin(), res_.events.end(),
                       [&](const event& e) { return e.name == "resumed" && e.t_ns >= t_ns; });
  }

  /// Advances one fault in progress; true once it is over.
  bool progress_one(active_fault& a, launch_record& lr, const std::vector<pid_t>& kids, int64_t now) {
    auto& r = res_.faults[a.idx];
    if (a.deadline_kill_ns && now >= a.deadline_kill_ns) {
      a.deadline_kill_ns = 0;
      bool killed = false;
      if (r.f.kind == fault_kind::sigterm_launcher || r.f.include_launcher) {
        if (alive(lr.pid)) {
          kill_job(lr.pid, kids);
          killed = true;
        }
      } else if (view_.incarnation == r.incarnation) {
        for (int rank : r.ranks) {
          pid_t p = pid_of_rank(rank, kids);
          if (p > 0) {
            ::kill(-p, SIGKILL);
            killed = true;
          }
        }
      }
      if (killed) {
        r.deadline_kill = true;
        r.detail += "grace period over: the platform killed what was still running; ";
        note_event("deadline_kill", {{"index", r.index}});
      }
    }
    switch (a.until) {
      case active_fault::wait_for::restart:
        return (view_.incarnation > r.incarnation || resumed_since(r.t_ns)) && view_.running();
      case active_fault::wait_for::launcher_exit: return false;  // handled after the launcher exits
      case active_fault::wait_for::timer:
        if (now < a.timer_ns && !(r.f.kind == fault_kind::fs_full && save_failed_since(r.t_ns))) return false;
        for (pid_t p : a.stopped) ::kill(p, SIGCONT);
        if (!a.filler.empty()) {
          std::error_code ec;
          fs::remove(a.filler, ec);
        }
        note_event("fault_end", {{"index", r.index}});
        return true;
    }
    return false;
  }

  void finish_gap_fault(const launch_record& lr, const active_fault& a) {
    auto& r = res_.faults[a.idx];
    if (lr.exit_code != 42) {
      r.status = "skipped";
      r.detail = "the job did not stop for the preemption (launcher exit " + std::to_string(lr.exit_code) +
                 "): nothing damaged";
      return;
    }
    uint64_t step = 0;
    auto newest = newest_checkpoint(ckpt_, &step);
    r.corrupted_ns = wall_ns();
    try {
      if (r.f.kind == fault_kind::stale_tmp) {
        auto tmp = ckpt_ / (".tmp-step-" + std::to_string(step + 1) + "-" + std::to_string(dead_pid()) + "-x");
        fs::create_directories(tmp);
        std::ofstream(tmp / "model-00001-of-00001.safetensors") << std::string(1000, '\x01');
        r.corrupted_path = tmp.string();
        r.detail += "left " + tmp.filename().string();
      } else if (!newest) {
        r.status = "skipped";
        r.detail = "no checkpoint to damage";
      } else {
        auto file = pick_file(*newest, r.f.file);
        r.corrupted_path = newest->string();
        auto size = fs::file_size(file);
        if (r.f.kind == fault_kind::flip_byte) {
          std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
          uint64_t off = size / 2;
          f.seekg(off);
          char c = 0;
          f.get(c);
          f.seekp(off);
          f.put(static_cast<char>(c ^ 0x10));
          r.detail += "flipped a bit at offset " + std::to_string(off) + " of " + file.filename().string();
        } else if (r.f.kind == fault_kind::truncate_file) {
          fs::resize_file(file, size / 2);
          r.detail += "truncated " + file.filename().string() + " to " + std::to_string(size / 2) + " bytes";
        } else {
          fs::remove(file);
          r.detail += "deleted " + file.filename().string();
        }
        r.detail += " in " + newest->filename().string();
      }
    } catch (const std::exception& e) {
      r.status = "skipped";
      r.detail += std::string("could not damage the checkpoint: ") + e.what();
    }
    note_event("damage", {{"index", r.index}, {"path", r.corrupted_path}, {"detail", r.detail}});
  }

  void end_job() {
    res_.end_ns = wall_ns();
    // step_error is armed at launch and fires inside the trainer: its
    // injection time is the step_error event.
    for (auto& r : res_.faults) {
      if (r.f.kind != fault_kind::step_error) continue;
      for (auto& e : res_.events)
        if (e.name == "step_error") {
          r.status = "injected";
          r.t_ns = e.t_ns;
          r.est_step = e.step();
          r.incarnation = e.incarnation;
          r.ranks = {static_cast<int>(e.rank)};
          r.detail =
              "--fail-at-step " + std::to_string(r.f.at_step.value_or(0)) + " raised on rank " + std::to_string(e.rank);
          for (auto& l : res_.launches)
            if (e.t_ns >= l.start_ns && (l.end_ns == 0 || e.t_ns <= l.end_ns)) r.launch = l.index;
          break;
        }
    }
    res_.step_ns = view_.step_ns;
    collect_outcome(run_dir_ / "out.json", {ckpt_}, res_);
    std::error_code ec;
    fs::remove(ckpt_ / ".chaos-filler", ec);
    if (res_.fs_mounted) {
      // Keep the final checkpoints for the user: copy them out first.
      auto keep = run_dir_ / "ckpt-final";
      fs::copy(ckpt_, keep, fs::copy_options::recursive, ec);
      if (::umount2(ckpt_.c_str(), MNT_DETACH) != 0)
        res_.notes.push_back(std::string("umount failed: ") + std::strerror(errno));
    }
  }

  run_config cfg_;
  run_result res_;
  job_view view_;
  fs::path run_dir_, ckpt_, events_path_;
  uint64_t events_offset_ = 0;
  pid_t launcher_ = -1;
  int grace_launcher_ = 0, grace_worker_ = 0;
  std::vector<active_fault> active_;  ///< faults whose effects are still in progress
};

}  // namespace

int run_command(const std::vector<std::string>& argv, std::string* output) {
  char tmpl[] = "/tmp/grace-chaos-cmd-XXXXXX";
  int fd = ::mkstemp(tmpl);
  if (fd >= 0) ::close(fd);
  pid_t p = spawn(argv, tmpl, {}, false);
  int st = 0;
  while (::waitpid(p, &st, 0) < 0 && errno == EINTR) {}
  if (output) {
    std::ifstream f(tmpl);
    output->assign(std::istreambuf_iterator<char>(f), {});
  }
  ::unlink(tmpl);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

run_result run_job(const run_config& cfg, const std::vector<fault>& schedule) {
  if (cfg.hosts >= 2) return run_host_job(cfg, schedule);
  job j(cfg, schedule);
  return j.run();
}

}  // namespace grace::chaos
