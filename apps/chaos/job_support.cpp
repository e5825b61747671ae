#include "apps/chaos/job_support.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <csignal>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <stdexcept>
#include <thread>
#include <unistd.h>

namespace fs = std::filesystem;

namespace grace::chaos {

namespace {
volatile std::sig_atomic_t interrupt_signal = 0;
void on_interrupt(int sig) { interrupt_signal = sig; }
}  // namespace

void install_interrupt_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_interrupt;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
}

bool interrupted() { return interrupt_signal != 0; }

void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

bool alive(pid_t pid) { return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM); }

bool running_process(pid_t pid) {
  if (!alive(pid)) return false;
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(f, line);
  auto close = line.rfind(')');
  return close == std::string::npos || close + 2 >= line.size() || line[close + 2] != 'Z';
}

std::vector<pid_t> children_of(pid_t pid) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (auto it = fs::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec);
       !ec && it != fs::directory_iterator(); it.increment(ec)) {
    std::ifstream f(it->path() / "children");
    long c;
    while (f >> c) out.push_back(static_cast<pid_t>(c));
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

pid_t spawn(const std::vector<std::string>& argv, const fs::path& log, const std::map<std::string, std::string>& env,
            bool own_group) {
  pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid > 0) return pid;
  if (own_group) ::setpgid(0, 0);
  int fd = log.empty() ? ::open("/dev/null", O_WRONLY) : ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd >= 0) {
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::close(fd);
  }
  for (auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
  std::vector<char*> a;
  for (auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
  a.push_back(nullptr);
  ::execvp(a[0], a.data());
  std::fprintf(stderr, "grace-chaos: cannot run %s: %s\n", a[0], std::strerror(errno));
  ::_exit(127);
}

std::vector<std::string> trainer_argv(const run_config& cfg, const fs::path& out_json) {
  std::vector<std::string> a = {cfg.trainer};
  a.insert(a.end(), cfg.trainer_prefix.begin(), cfg.trainer_prefix.end());
  for (auto& s : {std::string("--steps"), std::to_string(cfg.steps), std::string("--output"), out_json.string(),
                  std::string("--save-every"), std::to_string(cfg.save_every), std::string("--step-delay-ms"),
                  std::to_string(cfg.step_delay_ms), std::string("--device"), cfg.device})
    a.push_back(s);
  return a;
}

void append_chaos_event(const fs::path& events, const std::string& what, int64_t incarnation,
                        const nlohmann::json& extra) {
  nlohmann::json j = {
      {"event", "chaos_" + what}, {"t_ns", wall_ns()}, {"pid", ::getpid()}, {"rank", -2}, {"incarnation", incarnation}};
  for (auto& [k, v] : extra.items()) j[k] = v;
  std::ofstream f(events, std::ios::app);
  f << j.dump() << "\n";
}

restore_check verify_restore(const std::string& ckpt_tool, const event& e) {
  restore_check rc;
  rc.path = e.j.value("path", "");
  rc.incarnation = e.incarnation;
  rc.step = e.step();
  rc.t_ns = e.t_ns;
  if (!fs::exists(rc.path)) {
    rc.detail = "gone before it could be verified";
    return rc;
  }
  std::string out;
  int code = run_command({ckpt_tool, "verify", rc.path}, &out);
  rc.checked = true;
  rc.ok = code == 0;
  while (!out.empty() && out.back() == '\n') out.pop_back();
  rc.detail = out;
  return rc;
}

std::optional<int64_t> chained_due(run_result& res, fault_record& r) {
  int64_t ref = res.start_ns;
  if (r.index > 0) {
    auto& prev = res.faults[r.index - 1];
    if (prev.status == "skipped") {
      r.status = "skipped";
      r.detail = "chained to fault " + std::to_string(prev.index) + ", which was skipped";
      return std::nullopt;
    }
    if (prev.status != "injected") return std::nullopt;
    ref = prev.t_ns;
  }
  if (r.f.after_ms) return ref + *r.f.after_ms * 1000000;
  for (auto& e : res.events)
    if (e.name == r.f.on_event && e.t_ns >= ref) return e.t_ns + int64_t(r.f.delay_ms) * 1000000;
  return std::nullopt;
}

void poll_job_events(const fs::path& events, uint64_t& offset, job_view& view, run_result& res,
                     const std::string& ckpt_tool) {
  for (auto& e : read_events(events, offset)) {
    view.apply(e);
    if (e.name == "restored") {
      const std::string path = e.j.value("path", "");
      const bool seen = std::any_of(res.restores.begin(), res.restores.end(), [&](const restore_check& r) {
        return r.path == path && r.incarnation == e.incarnation;
      });
      if (!seen) res.restores.push_back(verify_restore(ckpt_tool, e));
    }
    res.events.push_back(std::move(e));
  }
}

/// The checkpoints and temporaries of one directory into `res`.
static void collect_checkpoints(const fs::path& ckpt, bool full_names, run_result& res);

void collect_outcome(const fs::path& out_json, const std::vector<fs::path>& ckpts, run_result& res) {
  if (std::ifstream f(out_json); f) {
    try {
      f >> res.out;
    } catch (...) {
      res.notes.push_back("out.json is not valid JSON");
    }
  }
  for (auto& ckpt : ckpts) collect_checkpoints(ckpt, ckpts.size() > 1, res);
}

static void collect_checkpoints(const fs::path& ckpt, bool full_names, run_result& res) {
  std::error_code ec;
  for (auto it = fs::directory_iterator(ckpt, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    auto name = it->path().filename().string();
    if (name.rfind(".tmp-", 0) == 0) res.leftover_temporaries.push_back(full_names ? it->path().string() : name);
    if (name.rfind("step-", 0) != 0 || name.find(".corrupt-") != std::string::npos) continue;
    nlohmann::json c = {{"path", it->path().string()}};
    std::ifstream m(it->path() / "grace-manifest.json");
    try {
      nlohmann::json mj;
      m >> mj;
      c["step"] = mj.value("step", 0);
      c["counters"] = mj.value("counters", nlohmann::json::object());
    } catch (...) {
      c["unreadable"] = true;
    }
    res.final_checkpoints.push_back(c);
  }
}

int job_view::group_workers() const {
  auto it = groups.find(incarnation);
  return it == groups.end() ? workers : static_cast<int>(it->second.size()) * per_host;
}

int job_view::host_of(int rank) const {
  if (per_host <= 0 || rank < 0) return -1;
  auto it = groups.find(incarnation);
  if (it == groups.end()) return rank / per_host;
  const auto slot = static_cast<size_t>(rank / per_host);
  return slot < it->second.size() ? it->second[slot] : -1;
}

std::vector<int> job_view::ranks_of(int host) const {
  std::vector<int> out;
  if (per_host <= 0) return out;
  int slot = host;
  if (auto it = groups.find(incarnation); it != groups.end()) {
    auto pos = std::find(it->second.begin(), it->second.end(), host);
    if (pos == it->second.end()) return out;
    slot = static_cast<int>(pos - it->second.begin());
  }
  for (int i = 0; i < per_host; ++i) out.push_back(slot * per_host + i);
  return out;
}

void job_view::apply(const event& e) {
  if (e.name == "group_formed" && e.j.contains("nodes") && e.j["nodes"].is_array()) {
    auto& g = groups[e.incarnation];
    g.clear();
    for (auto& n : e.j["nodes"])
      if (n.is_number_integer()) g.push_back(n.get<int>());
    return;
  }
  if (e.name == "group_started") {
    if (e.incarnation > incarnation) {
      incarnation = e.incarnation;
      incarnation_start_ns = e.t_ns;
      pid_of.clear();
      stepping.clear();
      exited.clear();
      first_step = -1;
    }
    // The launcher names its workers' pids: a fault keyed to the restart
    // can hit a worker before it has said anything.
    if (e.incarnation == incarnation && e.j.contains("pids") && e.j["pids"].is_object())
      for (auto& [rank, pid] : e.j["pids"].items())
        if (pid.is_number_integer()) pid_of[std::stoll(rank)] = pid.get<int64_t>();
    return;
  }
  if (e.rank < 0 || e.incarnation != incarnation) return;
  pid_of[e.rank] = e.pid;
  int64_t s = e.step();
  if (e.name == "first_step") {
    stepping.insert(e.rank);
    if (first_step < 0) {
      first_step = s;
      first_step_ns = e.t_ns;
    }
    anchor(s, e.t_ns);
  } else if (e.name == "committed_local" || e.name == "reached_agreed_step" || e.name == "restored") {
    if (e.name == "committed_local" && first_step >= 0 && s - first_step >= 10 && e.t_ns > first_step_ns)
      step_ns = double(e.t_ns - first_step_ns) / double(s - first_step);
    anchor(s, e.t_ns);
  } else if (e.name == "exit" || e.name == "finished") {
    exited.insert(e.rank);
  }
}

void job_view::anchor(int64_t s, int64_t t) {
  if (s >= anchor_step || t > anchor_ns + 2 * int64_t(step_ns)) {
    anchor_step = s;
    anchor_ns = t;
  }
}

int64_t job_view::estimate(int64_t now) const {
  if (anchor_ns == 0) return 0;
  return anchor_step + static_cast<int64_t>(double(now - anchor_ns) / step_ns);
}

}  // namespace grace::chaos
