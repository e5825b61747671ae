#include "runtime/ops/goodput.hpp"

#include <nlohmann/json.hpp>
#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <fstream>

namespace grace {

namespace {

double s(int64_t ns) { return ns > 0 ? ns / 1e9 : 0.0; }

/// The part of [a, b) inside [lo, hi), in seconds.
double overlap_s(int64_t a, int64_t b, int64_t lo, int64_t hi) { return s(std::min(b, hi) - std::max(a, lo)); }

}  // namespace

const goodput_cause goodput_causes[8] = {
    {"startup", &goodput_account::startup_s},     {"detection", &goodput_account::detection_s},
    {"agreement", &goodput_account::agreement_s}, {"save", &goodput_account::save_s},
    {"restart", &goodput_account::restart_s},     {"restore", &goodput_account::restore_s},
    {"recompute", &goodput_account::recompute_s}, {"other", &goodput_account::other_s},
};

goodput_account& goodput_account::operator+=(const goodput_account& o) {
  wall_s += o.wall_s;
  productive_s += o.productive_s;
  for (auto& c : goodput_causes) this->*c.seconds += o.*c.seconds;
  steps_recomputed += o.steps_recomputed;
  faults += o.faults;
  incarnations += o.incarnations;
  runs += o.runs;
  return *this;
}

nlohmann::json goodput_account::to_json() const {
  nlohmann::json lost = nlohmann::json::object();
  for (auto& c : goodput_causes) lost[c.name] = this->*c.seconds;
  return {{"wall_s", wall_s},
          {"productive_s", productive_s},
          {"goodput", ratio()},
          {"lost_s", lost},
          {"steps_recomputed", steps_recomputed},
          {"faults", faults},
          {"incarnations", incarnations},
          {"runs", runs}};
}

goodput_account goodput_account::from_json(const nlohmann::json& j) {
  goodput_account a;
  if (!j.is_object()) return a;
  auto num = [](const nlohmann::json& o, const char* k) {
    auto it = o.find(k);
    return it != o.end() && it->is_number() ? it->get<double>() : 0.0;
  };
  a.wall_s = num(j, "wall_s");
  a.productive_s = num(j, "productive_s");
  if (auto it = j.find("lost_s"); it != j.end() && it->is_object())
    for (auto& c : goodput_causes) a.*c.seconds = num(*it, c.name);
  a.steps_recomputed = static_cast<uint64_t>(num(j, "steps_recomputed"));
  a.faults = static_cast<uint64_t>(num(j, "faults"));
  a.incarnations = static_cast<uint64_t>(num(j, "incarnations"));
  a.runs = static_cast<uint64_t>(num(j, "runs"));
  return a;
}

std::optional<goodput_account> read_goodput(const std::filesystem::path& checkpoint_dir) {
  std::ifstream f(checkpoint_dir / goodput_file);
  if (!f) return std::nullopt;
  try {
    auto j = nlohmann::json::parse(f);
    if (!j.is_object() || !j.contains("job")) return std::nullopt;
    return goodput_account::from_json(j["job"]);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::string describe(const goodput_account& a) {
  std::string causes;
  for (auto& c : goodput_causes)
    if (a.*c.seconds >= 0.05) causes += fmt::format("{}{} {:.1f} s", causes.empty() ? "" : ", ", c.name, a.*c.seconds);
  return fmt::format("goodput {:.1f}%: {:.1f} s of steps kept in {:.1f} s{}{}{}", 100 * a.ratio(), a.productive_s,
                     a.wall_s, a.runs > 1 ? fmt::format(" over {} runs", a.runs) : "",
                     causes.empty() ? "" : "; lost: " + causes,
                     a.steps_recomputed ? fmt::format(" ({} steps done again)", a.steps_recomputed) : "");
}

void goodput_tracker::on_progress(uint32_t rank, uint64_t completed, int64_t last_step_ns, int64_t t_ns) {
  last_heard_[rank] = t_ns;
  if (completed > high_water_ && last_step_ns > 0) {
    step_ns_sum_ += static_cast<double>(last_step_ns);
    ++step_samples_;
  }
  high_water_ = std::max(high_water_, completed);
}

double goodput_tracker::mean_step_s() const { return step_samples_ ? step_ns_sum_ / step_samples_ / 1e9 : 0.0; }

/// The first verdict of a group: detection runs from the member's exit (as
/// its launcher saw it) or else its last heartbeat, to the verdict.
void goodput_tracker::on_loss(const event& e, group& g) {
  if (g.loss_at) return;  // later losses of the same group overlap the first
  g.loss_at = e.t_ns;
  auto lost = e.num("lost_rank", -1);
  int64_t fault = e.t_ns;
  if (auto it = g.exited.find(lost); it != g.exited.end() && it->second <= e.t_ns)
    fault = it->second;
  else if (auto h = last_heard_.find(static_cast<uint32_t>(lost)); h != last_heard_.end() && h->second <= e.t_ns)
    fault = h->second;
  g.detection_s += s(e.t_ns - fault);
}

std::optional<uint64_t> goodput_tracker::on_event(const event& e) {
  auto& g = at(e.incarnation);
  const bool chief = e.rank == 0;
  if (e.name == "group_started") {
    g.started = e.t_ns;
    last_heard_.clear();
  } else if (e.name == "worker_exit") {
    g.ended = std::max(g.ended, e.t_ns);
    g.exited.emplace(e.num("worker_rank", -1), e.t_ns);
  } else if (e.name == "peer_lost") {
    high_water_ = std::max<uint64_t>(high_water_, std::max<int64_t>(e.step(), 0));
    on_loss(e, g);
  } else if (e.name == "agreed" && g.loss_at && !g.agreement_s) {
    g.agreement_s = s(e.t_ns - g.loss_at);
  } else if (!chief) {
    if ((e.name == "exit" || e.name == "finished") && e.step() > 0)
      high_water_ = std::max<uint64_t>(high_water_, e.step());
  } else if (e.name == "first_step") {
    g.train_start = e.t_ns - e.num("ns");
  } else if (e.name == "snapshot_done") {
    g.snap_s += s(e.num("ns"));
    if (g.reached) g.snap_since_reached += e.num("ns");
  } else if (e.name == "reached_agreed_step") {
    g.reached = e.t_ns;
    g.snap_since_reached = 0;
  } else if (e.name == "exit" || e.name == "finished") {
    if (!g.train_end) g.train_end = e.t_ns;
    if (e.name == "exit" && g.reached) g.wait_s += s(e.t_ns - g.reached - g.snap_since_reached);
    if (e.step() > 0) high_water_ = std::max<uint64_t>(high_water_, e.step());
  } else if (e.name == "restored") {
    g.restore_ns = e.num("ns");
    auto step = static_cast<uint64_t>(std::max<int64_t>(e.step(), 0));
    uint64_t lost = ended_high_water_ > step ? ended_high_water_ - step : 0;
    steps_recomputed_ += lost;
    return lost;
  }
  return std::nullopt;
}

/// The last worker exit of `g` at or before `limit` (0: none).
int64_t goodput_tracker::last_exit_before(const group& g, int64_t limit) {
  int64_t last = 0;
  for (auto& [rank, t] : g.exited)
    if (t <= limit) last = std::max(last, t);
  return last;
}

/// Takes the chief's training interval [train_start, end) of `g` apart into
/// detection, agreement and save (each clipped to the interval, so a late
/// event cannot take more than the interval had) and returns the rest.
double goodput_tracker::split_training(const group& g, int64_t end, goodput_account& a) {
  double training = s(end - g.train_start);
  double in_detection = g.loss_at ? overlap_s(g.loss_at - static_cast<int64_t>(g.detection_s * 1e9), g.loss_at,
                                              g.train_start, end)
                                  : 0.0;
  double in_agreement =
      g.loss_at ? overlap_s(g.loss_at, g.loss_at + static_cast<int64_t>(g.agreement_s * 1e9), g.train_start, end)
                : 0.0;
  double wait = std::max(0.0, g.wait_s);
  if (g.reached) wait = std::min(wait, s(end - g.reached));  // a commit wait ends with the interval too
  double saves = std::min(g.snap_s + wait, std::max(0.0, training - in_detection - in_agreement));
  a.detection_s += in_detection;
  a.agreement_s += in_agreement;
  a.save_s += saves;
  return training - in_detection - in_agreement - saves;
}

goodput_account goodput_tracker::account(int64_t now_ns) const {
  goodput_account a;
  a.runs = 1;
  a.wall_s = s(now_ns - run_start_ns_);
  double training = 0;
  int64_t previous_end = 0;
  bool first = true;
  for (auto it = groups_.begin(); it != groups_.end(); ++it) {
    auto& g = it->second;
    if (!g.started) continue;
    auto next = std::find_if(std::next(it), groups_.end(), [](auto& kv) { return kv.second.started != 0; });
    // A group never outlasts the next one's start: a chief cut off from the
    // job (fenced, its host partitioned) may run on into the next group.
    const int64_t limit = next != groups_.end() ? next->second.started : now_ns;
    const int64_t end = std::min(g.train_end ? g.train_end : g.ended ? g.ended : now_ns, limit);
    const int64_t ready = std::min(g.train_start ? g.train_start : end, end) - g.restore_ns;
    ++a.incarnations;
    if (first)
      a.startup_s += s(ready - run_start_ns_);
    else
      a.restart_s += s(g.started - previous_end) + s(ready - g.started);
    a.restore_s += s(g.restore_ns);
    if (g.train_start && g.train_start < end) training += split_training(g, end, a);
    if (g.loss_at) ++a.faults;
    // The gap to the next group runs from the last exit before its start.
    previous_end = std::max(end, last_exit_before(g, limit));
    first = false;
  }
  a.steps_recomputed = steps_recomputed_;
  // Priced at the run's mean step time (a restore precedes its run's first
  // heartbeats, so the price is taken when the account is).
  a.recompute_s = std::min(steps_recomputed_ * mean_step_s(), std::max(0.0, training));
  a.productive_s = std::max(0.0, training - a.recompute_s);
  double lost = 0;
  for (auto& c : goodput_causes)
    if (c.seconds != &goodput_account::other_s) lost += a.*c.seconds;
  a.other_s = std::max(0.0, a.wall_s - a.productive_s - lost);
  return a;
}

}  // namespace grace
