#include "runtime/ops/job_monitor.hpp"

#include "runtime/base/atomic_file.hpp"

#include "runtime/base/events.hpp"
#include "runtime/ops/metrics.hpp"

#include <nlohmann/json.hpp>
#include <prometheus/exposer.h>
#include <prometheus/registry.h>
#include <spdlog/spdlog.h>

#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <thread>
#include <unistd.h>

namespace grace {

namespace fs = std::filesystem;

namespace {

constexpr auto poll_every = std::chrono::milliseconds(250);
constexpr int persist_every_polls = 4;  ///< the account on disk lags at most a second

/// The events file all of this launcher's processes append to.
fs::path choose_events_file(const monitor_config& c, bool& temporary) {
  temporary = false;
  if (const char* p = std::getenv("GRACE_EVENTS_FILE"); p && *p) return p;
  fs::path path;
  if (!c.checkpoint_dir.empty()) {
    std::error_code ec;
    fs::create_directories(c.checkpoint_dir, ec);
    path = c.checkpoint_dir / "grace-events.jsonl";
  } else {
    char tmpl[] = "/tmp/grace-events-XXXXXX";
    int fd = ::mkstemp(tmpl);
    if (fd >= 0) ::close(fd);
    path = tmpl;
    temporary = true;
  }
  ::setenv("GRACE_EVENTS_FILE", path.c_str(), 1);
  return path;
}

/// The account of the runs before this one: what a previous launcher
/// persisted (its finished runs plus the run it was in when it stopped),
/// and the newest step it knew of.
goodput_account load_previous(const fs::path& file, uint64_t& high_water) {
  high_water = 0;
  std::ifstream f(file);
  if (!f) return {};
  try {
    auto j = nlohmann::json::parse(f);
    auto a = goodput_account::from_json(j.value("previous", nlohmann::json::object()));
    a += goodput_account::from_json(j.value("current", nlohmann::json::object()));
    if (auto it = j.find("high_water_step"); it != j.end() && it->is_number_unsigned()) high_water = *it;
    return a;
  } catch (const std::exception& e) {
    spdlog::warn("grace-launch: {} is not readable JSON ({}): the goodput account starts again", file.string(),
                 e.what());
    return {};
  }
}

void save_account(const fs::path& file, const goodput_account& previous, const goodput_account& current,
                  uint64_t high_water, const std::string& run_id) {
  auto sum = previous;
  sum += current;
  (void)write_json_atomically(file, {{"run_id", run_id},
                                     {"job", sum.to_json()},
                                     {"previous", previous.to_json()},
                                     {"current", current.to_json()},
                                     {"high_water_step", high_water}});
}

}  // namespace

const char* restart_reason(bool crashed, bool rendezvous_failed, bool member_lost) {
  if (rendezvous_failed) return "rendezvous";
  if (member_lost) return "member_lost";
  if (crashed) return "crash";
  return "preempted";
}

struct job_monitor::impl {
  monitor_config cfg;
  fs::path events;
  bool temporary_events = false;
  uint64_t offset = 0;
  job_metrics metrics;
  std::unique_ptr<prometheus::Exposer> exposer;
  std::string url;
  goodput_account previous;
  std::mutex m;  ///< the tracker: the poller and the coordinator's thread
  goodput_tracker tracker{wall_ns()};
  bool group_lost_member = false;
  std::mutex stop_m;
  std::condition_variable stop_cv;
  bool stopping = false;
  std::thread poller;

  fs::path account_path() const { return cfg.checkpoint_dir / goodput_file; }
  bool persists() const { return cfg.keeps_account && !cfg.checkpoint_dir.empty(); }

  goodput_account poll(bool persist) {
    goodput_account now;
    uint64_t high_water = 0;
    {
      std::lock_guard<std::mutex> g(m);
      for (auto& e : read_events(events, offset)) {
        auto lost = tracker.on_event(e);
        if (e.name == "peer_lost") group_lost_member = true;
        metrics.on_event(e, lost);
      }
      now = tracker.account(wall_ns());
      high_water = tracker.high_water();
    }
    auto job = previous;
    job += now;
    metrics.set_goodput(job);
    if (persist && persists()) save_account(account_path(), previous, now, high_water, cfg.run_id);
    return job;
  }

  void run() {
    for (int n = 1;; ++n) {
      {
        std::unique_lock<std::mutex> l(stop_m);
        if (stop_cv.wait_for(l, poll_every, [&] { return stopping; })) return;
      }
      poll(n % persist_every_polls == 0);
    }
  }
};

result<std::unique_ptr<job_monitor>> job_monitor::start(const monitor_config& c) {
  auto d = std::make_unique<impl>();
  d->cfg = c;
  d->events = choose_events_file(c, d->temporary_events);
  std::error_code ec;
  d->offset = fs::exists(d->events, ec) ? fs::file_size(d->events, ec) : 0;
  if (ec) d->offset = 0;
  if (d->persists()) {
    uint64_t high_water = 0;
    d->previous = load_previous(d->account_path(), high_water);
    d->tracker.resume_from(high_water);
  }
  if (c.metrics_port > 0) {
    auto bind = c.metrics_host + ":" + std::to_string(c.metrics_port);
    try {
      d->exposer = std::make_unique<prometheus::Exposer>(bind, 1);
    } catch (const std::exception& e) {
      return error{errc::invalid_input, "--metrics-port: cannot serve metrics on " + bind + ": " + e.what() +
                                            " (is the port in use?)"};
    }
    d->exposer->RegisterCollectable(d->metrics.registry());
    d->url = "http://" + bind + "/metrics";
  }
  // Counted as a run at once, even if it is killed before its first
  // periodic write.
  d->poll(true);
  std::unique_ptr<job_monitor> m(new job_monitor(std::move(d)));
  m->d_->poller = std::thread([p = m->d_.get()] { p->run(); });
  return m;
}

job_monitor::job_monitor(std::unique_ptr<impl> d) : d_(std::move(d)) {}

job_monitor::~job_monitor() {
  {
    std::lock_guard<std::mutex> g(d_->stop_m);
    d_->stopping = true;
  }
  d_->stop_cv.notify_all();
  if (d_->poller.joinable()) d_->poller.join();
  if (d_->temporary_events) {
    std::error_code ec;
    fs::remove(d_->events, ec);
  }
}

void job_monitor::progress(uint32_t rank, uint64_t completed, int64_t last_step_ns) {
  d_->metrics.on_progress(rank, completed, last_step_ns);
  std::lock_guard<std::mutex> g(d_->m);
  d_->tracker.on_progress(rank, completed, last_step_ns, wall_ns());
}

void job_monitor::restart(bool crashed, bool rendezvous_failed) {
  // The verdict's event may still be unread: read what is there first.
  d_->poll(false);
  bool lost = false;
  {
    std::lock_guard<std::mutex> g(d_->m);
    lost = std::exchange(d_->group_lost_member, false);
    d_->tracker.group_ended();
  }
  d_->metrics.on_restart(restart_reason(crashed, rendezvous_failed, lost));
}

goodput_account job_monitor::finish() {
  {
    std::lock_guard<std::mutex> g(d_->stop_m);
    d_->stopping = true;
  }
  d_->stop_cv.notify_all();
  if (d_->poller.joinable()) d_->poller.join();
  return d_->poll(true);
}

std::string job_monitor::url() const { return d_->url; }

}  // namespace grace
