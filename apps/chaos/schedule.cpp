#include "apps/chaos/schedule.hpp"

#include <algorithm>
#include <stdexcept>

namespace grace::chaos {

namespace {
struct kind_name {
  fault_kind kind;
  const char* name;
};
const kind_name kind_names[] = {
    {fault_kind::sigterm_worker, "sigterm_worker"}, {fault_kind::sigterm_launcher, "sigterm_launcher"},
    {fault_kind::sigterm_multi, "sigterm_multi"},   {fault_kind::sigkill_worker, "sigkill_worker"},
    {fault_kind::sigstop_worker, "sigstop_worker"}, {fault_kind::sigkill_launcher, "sigkill_launcher"},
    {fault_kind::step_error, "step_error"},         {fault_kind::flip_byte, "flip_byte"},
    {fault_kind::truncate_file, "truncate_file"},   {fault_kind::delete_file, "delete_file"},
    {fault_kind::stale_tmp, "stale_tmp"},           {fault_kind::fs_full, "fs_full"},
    {fault_kind::host_lost, "host_lost"},           {fault_kind::host_partition, "host_partition"},
    {fault_kind::host_freeze, "host_freeze"},
};
}  // namespace

const char* to_string(fault_kind k) noexcept {
  for (auto& kn : kind_names)
    if (kn.kind == k) return kn.name;
  return "?";
}

std::optional<fault_kind> parse_fault_kind(const std::string& s) {
  for (auto& kn : kind_names)
    if (s == kn.name) return kn.kind;
  return std::nullopt;
}

const std::vector<fault_kind>& all_fault_kinds() {
  static const std::vector<fault_kind> all = [] {
    std::vector<fault_kind> v;
    for (auto& kn : kind_names) v.push_back(kn.kind);
    return v;
  }();
  return all;
}

bool is_host_fault(fault_kind k) noexcept {
  return k == fault_kind::host_lost || k == fault_kind::host_partition || k == fault_kind::host_freeze;
}

const std::vector<fault_kind>& single_host_kinds() {
  static const std::vector<fault_kind> kinds = [] {
    std::vector<fault_kind> v;
    for (auto k : all_fault_kinds())
      if (!is_host_fault(k)) v.push_back(k);
    return v;
  }();
  return kinds;
}

const std::vector<fault_kind>& multi_host_kinds() {
  static const std::vector<fault_kind> kinds = {fault_kind::host_lost, fault_kind::host_partition,
                                                fault_kind::host_freeze, fault_kind::sigterm_worker,
                                                fault_kind::sigkill_worker, fault_kind::sigstop_worker};
  return kinds;
}

const std::vector<std::string>& trigger_events() {
  static const std::vector<std::string> names = {
      "proposed",       // the coordinator proposed an agreement
      "agreed",         // the agreed step is out
      "snapshot_done",  // a saver took its snapshot: its write is in flight (for a save the
                        // trainer waits for, the write began with the copy and runs on)
      "committed",      // the coordinator committed an agreement's checkpoint
      "peer_lost",      // the coordinator declared a member lost
      "group_started",  // the launcher started a (re)started group: restores follow
      "restored",       // a worker restored a checkpoint: its rendezvous follows
      "first_step",     // a worker completed its first step after a (re)start
  };
  return names;
}

loss_class loss_class_of(fault_kind k) noexcept {
  switch (k) {
    case fault_kind::sigterm_worker:
    case fault_kind::sigterm_launcher:
    case fault_kind::sigterm_multi:
    case fault_kind::stale_tmp: return loss_class::notice;
    case fault_kind::sigkill_worker:
    case fault_kind::sigstop_worker:
    case fault_kind::sigkill_launcher:
    case fault_kind::host_lost:
    case fault_kind::host_partition:
    case fault_kind::host_freeze: return loss_class::hard;
    case fault_kind::flip_byte:
    case fault_kind::truncate_file:
    case fault_kind::delete_file: return loss_class::periodic;
    case fault_kind::step_error: return loss_class::terminal;
    case fault_kind::fs_full: return loss_class::none;
  }
  return loss_class::none;
}

nlohmann::json to_json(const fault& f) {
  nlohmann::json j;
  j["fault"] = to_string(f.kind);
  if (f.at_step) j["at_step"] = *f.at_step;
  if (f.at_ms) j["at_ms"] = *f.at_ms;
  if (f.after_ms) j["after_ms"] = *f.after_ms;
  if (!f.on_event.empty()) j["on_event"] = f.on_event;
  if (f.delay_ms) j["delay_ms"] = f.delay_ms;
  if (!f.targets.empty()) {
    if (f.targets.size() == 1 && f.kind != fault_kind::sigterm_multi)
      j["target"] = f.targets[0];
    else
      j["targets"] = f.targets;
  }
  if (f.include_launcher) j["include_launcher"] = true;
  if (f.grace_ms) j["grace_ms"] = f.grace_ms;
  if (f.kind == fault_kind::sigstop_worker || is_host_fault(f.kind)) j["duration_ms"] = f.duration_ms;
  if (f.host >= 0) j["host"] = f.host;
  if (f.host == coordinator_host) j["host"] = "coordinator";
  if (!f.file.empty()) j["file"] = f.file;
  return j;
}

fault fault_from_json(const nlohmann::json& j, size_t index) {
  auto bad = [&](const std::string& what) {
    return std::invalid_argument("schedule entry " + std::to_string(index) + ": " + what);
  };
  if (!j.is_object()) throw bad("must be an object like {\"at_step\": 50, \"fault\": \"sigterm_worker\"}");
  static const char* known[] = {"fault",       "at_step", "at_ms",   "after_ms",         "on_event",
                                "delay_ms",    "target",  "targets", "include_launcher", "grace_ms",
                                "duration_ms", "file",    "comment",  "host"};
  for (const auto& item : j.items()) {
    const std::string& key = item.key();
    if (std::find_if(std::begin(known), std::end(known), [&](const char* n) { return key == n; }) == std::end(known))
      throw bad("unknown field '" + key + "'");
  }
  fault f;
  if (!j.contains("fault") || !j["fault"].is_string()) throw bad("missing \"fault\" (a fault kind name)");
  auto k = parse_fault_kind(j["fault"].get<std::string>());
  if (!k) {
    std::string names;
    for (auto kind : all_fault_kinds()) names += std::string(names.empty() ? "" : ", ") + to_string(kind);
    throw bad("unknown fault '" + j["fault"].get<std::string>() + "' (known: " + names + ")");
  }
  f.kind = *k;
  auto uint_field = [&](const char* name) -> std::optional<int64_t> {
    if (!j.contains(name)) return std::nullopt;
    if (!j[name].is_number_integer() || j[name].get<int64_t>() < 0)
      throw bad(std::string(name) + " must be an integer >= 0");
    return j[name].get<int64_t>();
  };
  if (auto v = uint_field("at_step")) f.at_step = static_cast<uint64_t>(*v);
  if (auto v = uint_field("at_ms")) f.at_ms = *v;
  if (auto v = uint_field("after_ms")) f.after_ms = *v;
  if (auto v = uint_field("delay_ms")) f.delay_ms = static_cast<int>(*v);
  if (j.contains("on_event")) {
    if (!j["on_event"].is_string()) throw bad("on_event must be an event name");
    f.on_event = j["on_event"].get<std::string>();
    auto& ev = trigger_events();
    if (std::find(ev.begin(), ev.end(), f.on_event) == ev.end()) {
      std::string names;
      for (auto& n : ev) names += (names.empty() ? "" : ", ") + n;
      throw bad("unknown on_event '" + f.on_event + "' (known: " + names + ")");
    }
  }
  int triggers =
      int(f.at_step.has_value()) + int(f.at_ms.has_value()) + int(f.after_ms.has_value()) + int(!f.on_event.empty());
  if (triggers == 0) throw bad("needs one trigger: \"at_step\", \"at_ms\", \"after_ms\" or \"on_event\"");
  if (triggers > 1) throw bad("has more than one trigger (at_step, at_ms, after_ms, on_event): give one");
  if (f.delay_ms && f.on_event.empty()) throw bad("delay_ms needs on_event");
  if (f.after_ms && index == 0) throw bad("after_ms chains to the previous fault, and this is the first");
  if (auto v = uint_field("target")) f.targets.push_back(static_cast<int>(*v));
  if (j.contains("targets")) {
    if (!j["targets"].is_array()) throw bad("targets must be an array of ranks");
    for (auto& t : j["targets"]) {
      if (!t.is_number_integer() || t.get<int>() < 0) throw bad("targets must be ranks >= 0");
      f.targets.push_back(t.get<int>());
    }
  }
  if (j.contains("include_launcher")) f.include_launcher = j["include_launcher"].get<bool>();
  if (auto v = uint_field("grace_ms")) f.grace_ms = static_cast<int>(*v);
  if (auto v = uint_field("duration_ms")) f.duration_ms = static_cast<int>(*v);
  if (j.contains("host")) {
    auto& h = j["host"];
    if (h == "coordinator")
      f.host = coordinator_host;
    else if (h.is_number_integer() && h.get<int64_t>() >= 0 && h.get<int64_t>() < 4096)
      f.host = h.get<int>();
    else
      throw bad("host must be a node rank >= 0 or \"coordinator\" (the coordination service's host)");
  }
  if (f.host != -1 && !is_host_fault(f.kind)) throw bad("host is for the host_* faults; a worker fault names its rank");
  if (is_host_fault(f.kind) && !f.targets.empty()) throw bad("a host fault names its \"host\", not target ranks");
  if (j.contains("file")) f.file = j["file"].get<std::string>();
  if (f.file.find('/') != std::string::npos) throw bad("file is a name inside the step directory, without '/'");
  return f;
}

std::vector<fault> schedule_from_json(const nlohmann::json& j) {
  if (!j.is_array()) throw std::invalid_argument("a schedule is a JSON array of faults");
  std::vector<fault> out;
  for (size_t i = 0; i < j.size(); ++i) out.push_back(fault_from_json(j[i], i));
  return out;
}

nlohmann::json schedule_to_json(const std::vector<fault>& s) {
  auto j = nlohmann::json::array();
  for (auto& f : s) j.push_back(to_json(f));
  return j;
}

namespace {

/// A host fault's host and duration: host 1..hosts-1 (host 0 runs the
/// coordination service; with `host0`: 0..hosts-1, or whichever host
/// runs the coordination service when the fault fires); lost: a
/// replacement 0-1.5 s later; partition: 3-6 s; freeze: half longer than
/// dead-after (3-4 s), half a pause (0.2-0.8 s) the group rides out.
void host_fault_params(fault& f, int hosts, bool host0, int elastic_wait_ms, splitmix64& rng) {
  const auto last = static_cast<uint64_t>(std::max(1, hosts - 1));
  f.host = static_cast<int>(rng.range(host0 ? 0 : 1, host0 ? last + 1 : last));
  if (f.host == hosts) f.host = coordinator_host;
  const auto wait = static_cast<uint64_t>(std::max(0, elastic_wait_ms));
  switch (f.kind) {
    case fault_kind::host_lost:
      f.duration_ms = static_cast<int>(wait > 0 && rng.range(0, 1) ? rng.range(wait + 3000, wait + 8000)
                                                                  : rng.range(0, 1500));
      break;
    case fault_kind::host_partition: f.duration_ms = static_cast<int>(rng.range(3000, 6000)); break;
    default: f.duration_ms = static_cast<int>(rng.range(0, 1) ? rng.range(3000, 4000) : rng.range(200, 800)); break;
  }
}

}  // namespace

std::vector<fault> generate(const generate_options& o) {
  splitmix64 rng(o.seed * 0x2545f4914f6cdd1dull + 0x9e37);
  const auto& pool = !o.kinds.empty() ? o.kinds : o.hosts >= 2 ? multi_host_kinds() : single_host_kinds();
  std::vector<fault> out;
  const int n = std::max(0, o.faults);
  const uint64_t lo = std::max<uint64_t>(2, o.steps / 10), hi = std::max<uint64_t>(lo + 1, o.steps * 85 / 100);
  const uint64_t slot = std::max<uint64_t>(1, (hi - lo) / std::max(1, n));
  bool terminal = false;
  for (int i = 0; i < n; ++i) {
    fault f;
    for (int tries = 0;; ++tries) {
      f.kind = pool[rng.range(0, pool.size() - 1)];
      // step_error stops the job: only ever the last fault (or the only kind allowed).
      if (f.kind != fault_kind::step_error || i == n - 1 || tries > 50) break;
    }
    if (f.kind == fault_kind::step_error) {
      if (terminal) continue;
      terminal = true;
    }
    uint64_t a = lo + slot * i, b = lo + slot * (i + 1) - 1;
    f.at_step = rng.range(a, std::max(a, b));
    const int w = std::max(1, o.workers);
    switch (f.kind) {
      case fault_kind::sigterm_worker:
      case fault_kind::sigkill_worker:
      case fault_kind::step_error: f.targets = {static_cast<int>(rng.range(0, w - 1))}; break;
      case fault_kind::sigstop_worker:
        f.targets = {static_cast<int>(rng.range(0, w - 1))};
        f.duration_ms = rng.range(0, 1) ? 1000 : 0;
        break;
      case fault_kind::sigterm_multi: {
        int t1 = static_cast<int>(rng.range(0, w - 1));
        int t2 = static_cast<int>((t1 + rng.range(1, std::max(1, w - 1))) % w);
        f.targets = {t1};
        if (t2 != t1) f.targets.push_back(t2);
        f.include_launcher = rng.range(0, 1) == 1;
        break;
      }
      case fault_kind::host_lost:
      case fault_kind::host_partition:
      case fault_kind::host_freeze:
        host_fault_params(f, o.hosts, o.coordinator_host_faults, o.elastic_wait_ms, rng);
        break;
      default: break;
    }
    // Grace periods are given at launch: single-host runs only.
    if (o.hosts < 2 && (f.kind == fault_kind::sigterm_worker || f.kind == fault_kind::sigterm_launcher))
      f.grace_ms = rng.range(0, 1) ? 1500 : 0;
    out.push_back(f);
    if (terminal) break;
    if (o.hosts < 2 && o.overlap > 0 && double(rng.range(0, 999)) < o.overlap * 1000.0)
      for (auto& c : companions(f, w, rng)) out.push_back(c);
  }
  return out;
}

namespace {

fault chained_fault(fault_kind kind, int target, splitmix64& rng, const std::vector<std::string>& events) {
  fault c;
  c.kind = kind;
  c.targets = {target};
  // Half a few milliseconds after the previous fault, half keyed to a phase.
  if (events.empty() || rng.range(0, 1) == 0)
    c.after_ms = static_cast<int64_t>(rng.range(0, 5));
  else {
    c.on_event = events[rng.range(0, events.size() - 1)];
    if (c.on_event == "group_started") c.delay_ms = static_cast<int>(rng.range(0, 30));
  }
  if (kind == fault_kind::sigstop_worker) c.duration_ms = rng.range(0, 1) ? 1000 : 0;
  return c;
}

bool stops_the_launcher(fault_kind k) { return k == fault_kind::sigkill_launcher; }

}  // namespace

std::vector<fault> companions(const fault& primary, int workers, splitmix64& rng) {
  std::vector<fault> out;
  const int w = std::max(1, workers);
  if (w < 3) return out;  // two members: an overlap leaves nobody to save
  std::vector<int> hit(primary.targets.begin(), primary.targets.end());
  bool launcher_killed = stops_the_launcher(primary.kind);
  auto pick = [&](bool allow_chief) -> int {
    for (int tries = 0; tries < 32; ++tries) {
      int r = static_cast<int>(rng.range(0, w - 1));
      if (!allow_chief && r == 0) continue;
      if (std::find(hit.begin(), hit.end(), r) != hit.end()) continue;
      return r;
    }
    return -1;
  };
  const bool notice = primary.kind == fault_kind::sigterm_worker || primary.kind == fault_kind::sigterm_multi ||
                      primary.kind == fault_kind::sigterm_launcher;
  const bool hard = primary.kind == fault_kind::sigkill_worker || primary.kind == fault_kind::sigstop_worker ||
                    primary.kind == fault_kind::sigkill_launcher;
  if (!notice && !hard) return out;
  const int n = static_cast<int>(rng.range(1, 2));
  for (int i = 0; i < n; ++i) {
    // The phases the next fault may be keyed to, after what came before.
    std::vector<std::string> phases = {"group_started", "restored"};
    if (notice) phases.insert(phases.end(), {"proposed", "agreed", "snapshot_done"});
    if (hard && !launcher_killed) phases.push_back("agreed");
    int choice = static_cast<int>(rng.range(0, 3));
    fault c;
    if (choice == 0 && notice && !launcher_killed && primary.kind != fault_kind::sigterm_launcher && i == 0) {
      // The coordination service lost during the agreement.
      c.kind = fault_kind::sigkill_launcher;
      c.on_event = rng.range(0, 1) ? "proposed" : "agreed";
      launcher_killed = true;
    } else if (choice == 1 && !launcher_killed && out.empty()) {
      int t = pick(true);
      if (t < 0) break;
      c = chained_fault(notice ? fault_kind::sigterm_worker : fault_kind::sigkill_worker, t, rng, {});
      if (c.kind == fault_kind::sigterm_worker) c.after_ms = static_cast<int64_t>(rng.range(0, 3));
    } else if (choice == 2) {
      int t = pick(!launcher_killed);
      if (t < 0) break;
      c = chained_fault(fault_kind::sigstop_worker, t, rng, {});
    } else {
      int t = pick(!launcher_killed);
      if (t < 0) break;
      c = chained_fault(fault_kind::sigkill_worker, t, rng, phases);
    }
    for (int t : c.targets) hit.push_back(t);
    out.push_back(c);
  }
  return out;
}

}  // namespace grace::chaos
