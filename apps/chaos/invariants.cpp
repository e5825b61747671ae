#include "apps/chaos/invariants.hpp"

#include <climits>
#include <cmath>
#include <algorithm>
#include <map>
#include <set>
#include <csignal>

namespace grace::chaos {

const char* to_string(verdict_status s) noexcept {
  switch (s) {
    case verdict_status::pass: return "PASS";
    case verdict_status::fail: return "FAIL";
    case verdict_status::skip: return "SKIP";
  }
  return "?";
}

bool check_output::passed() const {
  return std::none_of(verdicts.begin(), verdicts.end(), [](auto& v) { return v.status == verdict_status::fail; });
}

namespace {

bool injected(const fault_record& r) { return r.status == "injected"; }

bool step_error_injected(const run_result& res) {
  return std::any_of(res.faults.begin(), res.faults.end(),
                     [](auto& r) { return r.f.kind == fault_kind::step_error && injected(r); });
}

bool step_error_scheduled(const run_config& cfg, const run_result& res) {
  return std::any_of(res.faults.begin(), res.faults.end(), [&](auto& r) {
    return r.f.kind == fault_kind::step_error && r.f.at_step && *r.f.at_step <= cfg.steps;
  });
}

/// Does this fault end its incarnation (workers exit with the restart code)?
bool restarts_group(const fault_record& r) {
  switch (r.f.kind) {
    case fault_kind::fs_full:
    case fault_kind::step_error: return false;
    case fault_kind::sigstop_worker: return r.f.duration_ms == 0;
    default: return true;
  }
}

bool stops_launcher(const fault_record& r) {
  switch (r.f.kind) {
    case fault_kind::sigterm_launcher:
    case fault_kind::flip_byte:
    case fault_kind::truncate_file:
    case fault_kind::delete_file:
    case fault_kind::stale_tmp: return true;
    case fault_kind::sigterm_multi: return r.f.include_launcher;
    default: return false;
  }
}

/// The last launch of each host (one for a single-host run).
std::vector<const launch_record*> last_launches(const run_result& res) {
  std::map<int, const launch_record*> last;
  for (auto& l : res.launches) last[l.host] = &l;
  std::vector<const launch_record*> out;
  for (auto& [h, l] : last) out.push_back(l);
  return out;
}

std::string launch_outcome(const launch_record& l) {
  return l.exit_code >= 0 ? "launcher exit " + std::to_string(l.exit_code)
                          : "launcher killed by signal " + std::to_string(l.signal);
}

/// A host cut off or frozen for at least dead-after: its peers declare it
/// dead and the group restarts without it. Shorter, the group rides it out.
bool declares_dead(const fault_record& f, const run_config& cfg) {
  return (f.f.kind == fault_kind::host_partition || f.f.kind == fault_kind::host_freeze) &&
         f.f.duration_ms >= cfg.dead_after_ms;
}

verdict job_finished(const check_input& in) {
  auto& res = *in.res;
  verdict v{"job_finished", verdict_status::skip, ""};
  if (res.launches.empty()) {
    v.status = verdict_status::fail;
    v.detail = "the launcher never ran";
    return v;
  }
  auto lasts = last_launches(res);
  std::string how;
  bool all_zero = true, all_three = true;
  for (auto* l : lasts) {
    if (lasts.size() > 1) how += (how.empty() ? "" : ", ") + std::string("host ") + std::to_string(l->host) + ": ";
    how += launch_outcome(*l);
    all_zero &= l->exit_code == 0;
    all_three &= l->exit_code == 3;
  }
  how += " after " + std::to_string(res.launches.size()) + " launch(es)";
  if (res.timed_out) how += "; timed out";
  if (step_error_scheduled(*in.cfg, res)) {
    bool ok = all_three && step_error_injected(res);
    v.status = ok ? verdict_status::pass : verdict_status::fail;
    v.detail = how + (ok ? ": stopped with the fatal code for the injected step error"
                         : ": expected exit 3 for the injected step error");
    return v;
  }
  bool ok = all_zero && !res.out.is_null() && !res.timed_out;
  v.status = ok ? verdict_status::pass : verdict_status::fail;
  v.detail = how + (res.out.is_null() ? "; no out.json" : "");
  return v;
}

verdict exactly_once(const check_input& in) {
  auto& res = *in.res;
  verdict v{"exactly_once", verdict_status::skip, ""};
  std::vector<std::string> bad;
  int checked = 0;
  auto expect_sum = [](int64_t n) { return n * (n + 1) / 2; };
  if (!res.out.is_null()) {
    int64_t steps = static_cast<int64_t>(in.cfg->steps);
    int64_t done = res.out.value("steps_done", int64_t(-1)), sum = res.out.value("step_index_sum", int64_t(-1));
    ++checked;
    if (done != steps || sum != expect_sum(steps))
      bad.push_back("out.json: steps_done " + std::to_string(done) + " (want " + std::to_string(steps) +
                    "), step_index_sum " + std::to_string(sum) + " (want " + std::to_string(expect_sum(steps)) + ")");
  }
  for (auto& c : res.final_checkpoints) {
    if (!c.contains("step") || !c.contains("counters")) continue;
    int64_t s = c["step"].get<int64_t>();
    auto& k = c["counters"];
    if (!k.contains("steps_done")) continue;
    ++checked;
    int64_t done = k.value("steps_done", int64_t(-1)), sum = k.value("step_index_sum", int64_t(-1));
    if (done != s || sum != expect_sum(s))
      bad.push_back(c["path"].get<std::string>() + ": steps_done " + std::to_string(done) + ", step_index_sum " +
                    std::to_string(sum) + " at step " + std::to_string(s));
  }
  if (checked == 0) {
    v.detail = "nothing to check (no out.json, no checkpoint with counters)";
    return v;
  }
  v.status = bad.empty() ? verdict_status::pass : verdict_status::fail;
  if (bad.empty()) {
    v.detail = std::to_string(checked) + " accounting(s) exact";
    if (!res.out.is_null())
      v.detail += ": steps_done " + std::to_string(res.out.value("steps_done", 0)) + ", step_index_sum " +
                  std::to_string(res.out.value("step_index_sum", 0));
  } else {
    for (auto& b : bad) v.detail += (v.detail.empty() ? "" : "; ") + b;
  }
  return v;
}

verdict bit_identical(const check_input& in) {
  auto& res = *in.res;
  verdict v{"bit_identical", verdict_status::skip, ""};
  if (step_error_scheduled(*in.cfg, res)) {
    v.detail = "the run stops on the injected step error";
    return v;
  }
  if (res.out.is_null()) {
    v.status = verdict_status::fail;
    v.detail = "no final weights (no out.json)";
    return v;
  }
  if (!in.reference_checksum) {
    if (in.reference_wanted) v.status = verdict_status::fail;
    v.detail = "no reference: " + in.reference_note;
    return v;
  }
  auto got = res.out.value("weights_checksum", std::string("?"));
  v.status = got == *in.reference_checksum ? verdict_status::pass : verdict_status::fail;
  v.detail = "weights checksum " + got + (got == *in.reference_checksum ? " == " : " != ") + "reference " +
             *in.reference_checksum;
  return v;
}

verdict no_corrupt_restore(const check_input& in) {
  auto& res = *in.res;
  verdict v{"no_corrupt_restore", verdict_status::skip, ""};
  std::vector<std::string> bad;
  int verified = 0, unverifiable = 0;
  for (auto& r : res.restores) {
    if (!r.checked) {
      ++unverifiable;
      continue;
    }
    ++verified;
    if (!r.ok)
      bad.push_back("restored " + r.path + " (incarnation " + std::to_string(r.incarnation) +
                    ") does not verify: " + r.detail);
    auto name = std::filesystem::path(r.path).filename().string();
    if (name.rfind("step-", 0) != 0 || name.find(".corrupt-") != std::string::npos)
      bad.push_back("restored a directory that is not a committed checkpoint: " + r.path);
  }
  int damaged = 0;
  for (auto& f : res.faults) {
    if (!injected(f) || f.corrupted_path.empty() || f.f.kind == fault_kind::stale_tmp) continue;
    ++damaged;
    for (auto& e : res.events) {
      if (e.name != "restored" || e.t_ns < f.corrupted_ns) continue;
      if (e.j.value("path", "") != f.corrupted_path) continue;
      // Rewritten (committed again) between the damage and this restore?
      bool rewritten = std::any_of(res.events.begin(), res.events.end(), [&](const event& c) {
        return c.name == "committed_local" && c.t_ns > f.corrupted_ns && c.t_ns < e.t_ns &&
               c.j.value("path", "") == f.corrupted_path;
      });
      if (!rewritten) {
        bad.push_back("rank " + std::to_string(e.rank) + " restored the damaged " + f.corrupted_path + " (" + f.detail +
                      ")");
        break;
      }
    }
  }
  v.status = bad.empty() ? verdict_status::pass : verdict_status::fail;
  if (bad.empty()) {
    v.detail = std::to_string(verified) + " restore(s) verified by grace-ckpt";
    if (unverifiable) v.detail += ", " + std::to_string(unverifiable) + " gone before checking";
    v.detail += "; " + std::to_string(damaged) + " damaged checkpoint(s) never restored";
  } else {
    for (auto& b : bad) v.detail += (v.detail.empty() ? "" : "; ") + b;
  }
  return v;
}

verdict no_temp_left(const check_input& in) {
  verdict v{"no_temp_left", verdict_status::skip, ""};
  auto& t = in.res->leftover_temporaries;
  v.status = t.empty() ? verdict_status::pass : verdict_status::fail;
  if (t.empty()) {
    int planted = 0;
    for (auto& f : in.res->faults) planted += injected(f) && f.f.kind == fault_kind::stale_tmp;
    v.detail = "none left" + (planted ? " (" + std::to_string(planted) + " planted stale one(s) cleaned up)" : "");
  } else {
    for (auto& n : t) v.detail += (v.detail.empty() ? "left: " : ", ") + n;
  }
  return v;
}

/// The faults that can explain what happened in each incarnation: those
/// injected in it, and a host fault still in effect when a later one
/// started (a host cut off, frozen or not yet replaced until its
/// duration, plus dead-after to notice the end, is missing from the
/// groups started meanwhile: their rendezvous fails, its ranks are killed
/// as declared dead).
std::map<int64_t, std::vector<const fault_record*>> faults_by_incarnation(const run_result& res,
                                                                          const run_config& cfg) {
  std::map<int64_t, int64_t> started;  // incarnation -> its first group_started
  for (auto& e : res.events)
    if (e.name == "group_started" && (!started.count(e.incarnation) || e.t_ns < started[e.incarnation]))
      started[e.incarnation] = e.t_ns;
  std::map<int64_t, std::vector<const fault_record*>> out;
  for (auto& f : res.faults) {
    if (!injected(f)) continue;
    out[f.incarnation].push_back(&f);
    if (!is_host_fault(f.f.kind)) continue;
    const int64_t lasts_until = f.t_ns + int64_t(f.f.duration_ms + cfg.dead_after_ms) * 1000000;
    for (auto& [inc, t] : started)
      if (inc > f.incarnation && t < lasts_until) out[inc].push_back(&f);
  }
  return out;
}

verdict exit_codes(const check_input& in) {
  auto& res = *in.res;
  verdict v{"exit_codes", verdict_status::skip, ""};
  std::vector<std::string> bad;
  auto by_inc = faults_by_incarnation(res, *in.cfg);
  // Exit 0 is right only for a worker that finished the job (its
  // `finished` event in that incarnation), never after a save that asked
  // for a restart.
  std::set<std::pair<int64_t, int64_t>> finished;  // (incarnation, rank)
  // Incarnations the service ended itself: to take in a host (an elastic
  // growth), or because a member restored another step than the group
  // (node-local directories that a replacement levelled while a save was
  // still being committed: the group restarts once more, level).
  std::set<int64_t> regrouped;
  for (auto& e : res.events) {
    if (e.name == "finished") finished.insert({e.incarnation, e.rank});
    if (e.name == "grow" || (e.name == "peer_lost" && e.str("why").rfind("not level:", 0) == 0))
      regrouped.insert(e.incarnation);
  }
  int worker_exits = 0;
  for (auto& e : res.events) {
    if (e.name != "worker_exit") continue;
    ++worker_exits;
    int rank = e.j.value("worker_rank", -1), code = e.j.value("code", -1), sig = e.j.value("signal", 0);
    auto& fs = by_inc[e.incarnation];
    auto has = [&](auto pred) { return std::any_of(fs.begin(), fs.end(), [&](auto* f) { return pred(*f); }); };
    bool ok = false;
    if (code == 0)
      ok = finished.count({e.incarnation, rank}) > 0;
    else if (sig == SIGKILL)
      ok = has([&](const fault_record& f) {
        bool targeted = std::find(f.ranks.begin(), f.ranks.end(), rank) != f.ranks.end();
        // A worker declared dead (frozen for good, or its host frozen or
        // cut off past dead-after) is killed by its launcher. A host_lost
        // SIGKILLs the host's workers and launcher one after the other: the
        // launcher may reap a worker (and say so) before its own kill lands.
        return f.deadline_kill ||
               (targeted && (f.f.kind == fault_kind::sigkill_worker || f.f.kind == fault_kind::host_lost ||
                             (f.f.kind == fault_kind::sigstop_worker && f.f.duration_ms == 0) ||
                             declares_dead(f, *in.cfg)));
      });
    // 45: a worker whose rendezvous failed because a fault hit its group
    // while it was connecting: restarted like 42.
    else if (code == 42 || code == 45)
      ok = has([](const fault_record& f) { return restarts_group(f); }) || regrouped.count(e.incarnation) > 0;
    else if (code == 3)
      ok = has([](const fault_record& f) { return f.f.kind == fault_kind::step_error; });
    if (!ok) {
      std::string causes;
      for (auto* f : fs) causes += std::string(causes.empty() ? "" : ",") + to_string(f->f.kind);
      bad.push_back("incarnation " + std::to_string(e.incarnation) + " rank " + std::to_string(rank) + " exited " +
                    (sig ? "by signal " + std::to_string(sig) : "with " + std::to_string(code)) +
                    " (faults in it: " + (causes.empty() ? "none" : causes) + ")");
    }
  }
  const auto lasts = last_launches(res);
  for (auto& l : res.launches) {
    std::vector<const fault_record*> fs;
    for (auto& f : res.faults)
      if (injected(f) && f.launch == l.index) fs.push_back(&f);
    auto has = [&](auto pred) { return std::any_of(fs.begin(), fs.end(), [&](auto* f) { return pred(*f); }); };
    bool ok = false;
    std::string what = l.exit_code >= 0 ? "exit " + std::to_string(l.exit_code) : "signal " + std::to_string(l.signal);
    if (l.exit_code == 0)
      ok = std::any_of(lasts.begin(), lasts.end(), [&](auto* last) { return last == &l; });
    else if (l.exit_code == 42)
      ok = has(stops_launcher);
    else if (l.exit_code == 3)
      ok = has([](const fault_record& f) { return f.f.kind == fault_kind::step_error; });
    else if (l.signal == SIGKILL)
      ok = res.timed_out || has([](const fault_record& f) {
             return f.f.kind == fault_kind::sigkill_launcher || f.f.kind == fault_kind::host_lost ||
                    (f.deadline_kill && stops_launcher(f));
           });
    if (!ok) {
      std::string causes;
      for (auto* f : fs) causes += std::string(causes.empty() ? "" : ",") + to_string(f->f.kind);
      bad.push_back("launch " + std::to_string(l.index) + " ended with " + what +
                    " (faults in it: " + (causes.empty() ? "none" : causes) + ")");
    }
  }
  v.status = bad.empty() ? verdict_status::pass : verdict_status::fail;
  if (bad.empty())
    v.detail = std::to_string(worker_exits) + " worker exits and " + std::to_string(res.launches.size()) +
               " launcher exits, each explained by its cause";
  else
    for (auto& b : bad) v.detail += (v.detail.empty() ? "" : "; ") + b;
  return v;
}

/// Steps a fault may cost on its own (-1: not measured).
int64_t own_bound(const fault_record& f, const run_config& cfg) {
  const int save_every = cfg.save_every;
  auto cls = loss_class_of(f.f.kind);
  if (f.f.kind == fault_kind::sigstop_worker && f.f.duration_ms > 0) cls = loss_class::none;
  if (!declares_dead(f, cfg) && f.f.kind != fault_kind::host_lost && is_host_fault(f.f.kind)) cls = loss_class::none;
  if (!injected(f) || cls == loss_class::terminal || cls == loss_class::none) return -1;
  return cls == loss_class::notice ? 0 : cls == loss_class::hard ? 1 : save_every;
}

/// Overlapping faults (a chain: each chained to the one before) share the
/// bound of their worst member: a notice with a SIGKILL 1 ms later may cost
/// what the SIGKILL alone may.
std::vector<int64_t> group_bounds(const run_result& res, const run_config& cfg) {
  std::vector<int64_t> bound(res.faults.size(), -1);
  size_t start = 0;
  for (size_t i = 0; i <= res.faults.size(); ++i) {
    if (i < res.faults.size() && (i == 0 || res.faults[i].f.chained())) continue;
    int64_t worst = -1;
    for (size_t j = start; j < i; ++j) worst = std::max(worst, own_bound(res.faults[j], cfg));
    for (size_t j = start; j < i; ++j) bound[j] = worst;
    start = i;
  }
  return bound;
}

/// Steps a full disk's window is widened by on either side: the harness's
/// step at the fill is extrapolated from the last event that anchored it,
/// and a periodic save still being written when the disk filled fails too.
constexpr int64_t full_disk_slack_steps = 3;

/// After a periodic save failed, the trainer retries no sooner than this
/// (session's save_backoff: 1 s first), passing over the periodic saves due
/// meanwhile.
constexpr double first_retry_backoff_s = 1.0;

/// The steps the run makes in first_retry_backoff_s, from the median rate
/// between consecutive periodic saves of one incarnation (save_every when
/// the run made fewer than two).
int64_t backoff_steps(const run_result& res, int save_every) {
  std::vector<double> rates;
  std::map<int64_t, std::pair<int64_t, int64_t>> last;  // incarnation -> (step, t_ns) of its last periodic save
  for (auto& e : res.events) {
    if (e.name != "committed_local" || e.rank < 0 || e.str("kind") != "periodic") continue;
    auto it = last.find(e.incarnation);
    if (it != last.end() && e.step() > it->second.first && e.t_ns > it->second.second)
      rates.push_back(double(e.step() - it->second.first) / (double(e.t_ns - it->second.second) / 1e9));
    last[e.incarnation] = {e.step(), e.t_ns};
  }
  if (rates.empty()) return save_every;
  std::sort(rates.begin(), rates.end());
  return static_cast<int64_t>(std::ceil(rates[rates.size() / 2] * first_retry_backoff_s));
}

/// The step of the first save that failed after fault `g` filled the disk
/// (INT64_MAX: none). On a loaded machine the harness's step at the fill can
/// be late by more than the slack; a save that failed after the fill is the
/// full disk's evidence, so the window starts there at the latest.
int64_t first_failed_save_after(const run_result& res, const fault_record& g) {
  int64_t first = INT64_MAX;
  for (auto& e : res.events)
    if (e.name == "save_failed" && e.rank >= 0 && e.t_ns >= g.t_ns && e.incarnation == g.incarnation)
      first = std::min(first, e.step());
  return first;
}

/// A damaged-checkpoint fault after a full disk may fall back further than
/// one save interval: the restore skips the damaged (newest) checkpoint and
/// takes the newest periodic save before it, which the full disk may have
/// swallowed. Bounded by the faults, not by what the run left on disk: an
/// fs_full whose disk was full at step F stays full for save_every + 3 steps
/// (less: the harness frees it at the first failed save), and the retry
/// backoff after that failure passes over the saves due within about a
/// second, so it swallows at most the periodic saves in
/// [F - slack, F + save_every + 3 + slack + backoff_steps]. The
/// bound is `reached` minus the newest multiple of save_every below it that
/// no earlier fs_full can have swallowed (0: start over); -1 when no fs_full
/// came before `f` or `f` is not a damaged-checkpoint fault.
int64_t full_disk_bound(const run_result& res, const fault_record& f, int64_t reached, int save_every) {
  if (loss_class_of(f.f.kind) != loss_class::periodic || save_every <= 0) return -1;
  const int64_t backoff = backoff_steps(res, save_every);
  std::vector<std::pair<int64_t, int64_t>> windows;  // step ranges a full disk may have swallowed saves in
  for (auto& g : res.faults)
    if (injected(g) && g.f.kind == fault_kind::fs_full && g.t_ns < f.t_ns)
      windows.emplace_back(std::min(g.est_step - full_disk_slack_steps, first_failed_save_after(res, g)),
                           g.est_step + save_every + 3 + full_disk_slack_steps + backoff);
  if (windows.empty()) return -1;
  auto swallowed = [&](int64_t step) {
    return std::any_of(windows.begin(), windows.end(), [&](auto& w) { return step >= w.first && step <= w.second; });
  };
  int64_t fallback = (reached - 1) / save_every * save_every;  // the newest periodic save below `reached`
  while (fallback > 0 && swallowed(fallback)) fallback -= save_every;
  return reached - std::max<int64_t>(0, fallback);
}

/// The last step the faulted incarnation completed (from its exits, saves
/// and restores), into l.reached. False when no worker of it said anything
/// (the fault hit the group before any worker restored).
bool reached_step(const run_result& res, const fault_record& f, fault_loss& l) {
  bool worker_spoke = false;
  for (auto& e : res.events) {
    if (e.incarnation != f.incarnation || e.rank < 0) continue;
    worker_spoke = true;
    if (e.t_ns < f.t_ns - 5000000000LL) continue;
    if (e.name == "exit" || e.name == "committed_local" || e.name == "restored")
      l.reached = std::max(l.reached, e.step());
  }
  if (worker_spoke && l.reached < 0) {
    l.reached = f.est_step;
    l.detail += "reached step estimated; ";
  }
  return worker_spoke;
}

/// The step the next incarnation resumed from, into l.restored; that
/// incarnation, or -1 when none followed.
int64_t restored_after(const run_result& res, const fault_record& f, fault_loss& l) {
  int64_t next_inc = -1;
  for (auto& e : res.events)
    if (e.rank >= 0 && e.incarnation > f.incarnation && (next_inc < 0 || e.incarnation < next_inc))
      next_inc = e.incarnation;
  if (next_inc < 0) return next_inc;
  l.restored = 0;
  int64_t first = -1;
  for (auto& e : res.events) {
    if (e.incarnation != next_inc || e.rank < 0) continue;
    if (e.name == "restored") l.restored = std::max(l.restored, e.step());
    if (e.name == "first_step" && (first < 0 || e.step() < first)) first = e.step();
  }
  if (first > 0) l.restored = std::max(l.restored, first - 1);
  return next_inc;
}

/// One fault's lost work against its bound (overlapping groups share the
/// bound of their worst fault).
fault_loss measure_loss(const run_result& res, const fault_record& f, int64_t bound, const run_config& cfg) {
  fault_loss l;
  l.index = f.index;
  if (own_bound(f, cfg) < 0) return l;
  l.applicable = true;
  l.bound = bound;
  if (l.bound != own_bound(f, cfg)) l.detail = "bound of its overlapping group; ";
  if (!reached_step(res, f, l)) {
    l.applicable = false;
    l.detail = "hit its group before any worker restored: nothing to lose";
    return l;
  }
  int64_t next_inc = restored_after(res, f, l);
  if (next_inc < 0) {
    l.applicable = false;
    l.detail += "no restart followed (the job ended first)";
    return l;
  }
  l.lost = std::max<int64_t>(0, l.reached - l.restored);
  const int64_t full_disk = full_disk_bound(res, f, l.reached, cfg.save_every);
  if (full_disk > l.bound) {
    l.bound = full_disk;
    l.detail += "bound widened to step " + std::to_string(l.reached - full_disk) +
                ", the newest periodic save no earlier full disk can have swallowed; ";
  }
  l.ok = l.lost <= l.bound;
  l.detail += "reached " + std::to_string(l.reached) + ", restored " + std::to_string(l.restored) + " in incarnation " +
              std::to_string(next_inc);
  return l;
}

verdict work_lost(const check_input& in, std::vector<fault_loss>& losses) {
  auto& res = *in.res;
  verdict v{"work_lost", verdict_status::skip, ""};
  std::vector<std::string> bad;
  int measured = 0;
  auto bounds = group_bounds(res, *in.cfg);
  for (auto& f : res.faults) {
    auto l = measure_loss(res, f, bounds[f.index], *in.cfg);
    if (l.applicable) ++measured;
    if (l.applicable && !l.ok)
      bad.push_back("fault " + std::to_string(f.index) + " " + to_string(f.f.kind) + ": lost " +
                    std::to_string(l.lost) + " step(s) > bound " + std::to_string(l.bound) + " (" + l.detail + ")");
    losses.push_back(l);
  }
  if (measured == 0) {
    v.detail = "no fault followed by a restart";
    return v;
  }
  v.status = bad.empty() ? verdict_status::pass : verdict_status::fail;
  if (!bad.empty()) {
    for (auto& b : bad) v.detail += (v.detail.empty() ? "" : "; ") + b;
    return v;
  }
  for (auto& l : losses)
    if (l.applicable)
      v.detail += (v.detail.empty() ? "" : ", ") + std::string("f") + std::to_string(l.index) + ": " +
                  std::to_string(l.lost) + "<=" + std::to_string(l.bound);
  return v;
}

/// When the rest of the group declared the ranks `f` cut off dead: the
/// first `peer_lost` (dead) verdict on one of them in f's incarnation.
/// Until then a cut-off host may still lead (its coordinator's lease not
/// yet run out) and save its own ranks just in time; after it, it must not
/// commit. None: nobody declared it dead (it came back in time, e.g. a
/// frozen coordination host thawed within its successor's takeover window
/// and rejoined), so it was never fenced.
std::optional<int64_t> fenced_at(const run_result& res, const fault_record& f) {
  for (auto& e : res.events)
    if (e.name == "peer_lost" && e.incarnation == f.incarnation && e.t_ns >= f.t_ns &&
        e.j.value("verdict", std::string()) == "dead" &&
        std::find(f.ranks.begin(), f.ranks.end(), e.j.value("lost_rank", int64_t(-1))) != f.ranks.end())
      return e.t_ns;
  return std::nullopt;
}

/// Fencing on the test bed: a host cut off or frozen past dead-after never
/// commits a checkpoint in the incarnation it was declared dead in, once
/// it was (fenced_at). A commit is the rename (`committed_ns`).
verdict no_split_brain(const check_input& in) {
  auto& res = *in.res;
  verdict v{"no_split_brain", verdict_status::skip, ""};
  std::vector<std::string> bad;
  std::string undeclared;  // past dead-after, yet nobody declared it dead: named in the detail
  int isolated = 0;
  for (auto& f : res.faults) {
    if (!injected(f) || !declares_dead(f, *in.cfg)) continue;
    const auto fence = fenced_at(res, f);
    if (!fence) {
      undeclared += (undeclared.empty() ? "" : ", ") + std::string("f") + std::to_string(f.index);
      continue;
    }
    ++isolated;
    for (auto& e : res.events) {
      // The rename's own time where the event has it: the save's end (the
      // event) may come long after, when the host froze in its last fsync.
      const int64_t renamed = e.j.value("committed_ns", int64_t(0));
      const int64_t committed = renamed > 0 ? renamed : e.t_ns;
      if (e.name != "committed_local" || e.incarnation != f.incarnation || committed <= *fence) continue;
      if (std::find(f.ranks.begin(), f.ranks.end(), e.rank) == f.ranks.end()) continue;
      bad.push_back("rank " + std::to_string(e.rank) + " on host " + std::to_string(f.f.host) + " committed " +
                    e.j.value("path", std::string("?")) + " in incarnation " + std::to_string(e.incarnation) +
                    " after fault " + std::to_string(f.index) + " (" + to_string(f.f.kind) + ") cut it off and the group declared it dead");
      break;
    }
  }
  const std::string never = undeclared.empty() ? "" : " (" + undeclared + ": back before anyone declared it dead)";
  if (isolated == 0) {
    v.detail = "no host was cut off or frozen past dead-after and declared dead" + never;
    return v;
  }
  v.status = bad.empty() ? verdict_status::pass : verdict_status::fail;
  if (bad.empty())
    v.detail = std::to_string(isolated) + " host(s) cut off or frozen past dead-after and declared dead; none "
               "committed in that incarnation afterwards" + never;
  for (auto& b : bad) v.detail += (v.detail.empty() ? "" : "; ") + b;
  return v;
}

}  // namespace

std::vector<size_phase> size_phases(const std::vector<event>& events, uint64_t steps) {
  std::map<int64_t, int> workers;  // incarnation -> its group's size
  // incarnation -> the step its group resumed from: its first step - 1
  // (not a `restored` event: a straggler refused from the group may have
  // restored a newer step under the same incarnation)
  std::map<int64_t, int64_t> resumed;
  for (auto& e : events) {
    if (e.name == "group_formed") workers[e.incarnation] = e.j.value("world_size", 0);
    const bool worker = e.rank >= 0 && e.rank < (int64_t(1) << 24);  // not a launcher's or the harness's
    if (!worker || e.name != "first_step" || e.step() < 1) continue;
    auto it = resumed.find(e.incarnation);
    if (it == resumed.end() || e.step() - 1 < it->second) resumed[e.incarnation] = e.step() - 1;
  }
  std::vector<size_phase> out;
  for (auto& [inc, from] : resumed) {
    auto w = workers.find(inc);
    if (w == workers.end() || w->second <= 0) continue;
    while (!out.empty() && out.back().from >= from) out.pop_back();  // superseded by this restore
    if (!out.empty()) out.back().to = from;
    if (!out.empty() && out.back().workers == w->second) continue;  // the same size goes on
    out.push_back({w->second, from, 0});
  }
  if (!out.empty()) out.back().to = static_cast<int64_t>(steps);
  return out;
}

namespace {

/// grace-launch --recovery in-place (given with --launcher-arg).
bool recovers_in_place(const run_config& cfg) {
  auto& a = cfg.launcher_args;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] == "--recovery=in-place" || (a[i] == "--recovery" && i + 1 < a.size() && a[i + 1] == "in-place"))
      return true;
  return false;
}

/// The first event named `name` at or after `t_ns`, if any.
const event* first_after(const run_result& res, const char* name, int64_t t_ns) {
  for (auto& e : res.events)
    if (e.name == name && e.t_ns >= t_ns) return &e;
  return nullptr;
}

/// Recovery in place: every SIGKILL (or freeze for good) of a worker other
/// than the chief with no other fault from 2 s before it until its
/// recovery was recovered without a restart:
/// the launcher replaced that worker, the group resumed, and none of the
/// group's other processes exited in between (their pids are the ones the
/// group started with).
verdict survivors_kept(const check_input& in) {
  auto& res = *in.res;
  verdict v{"survivors_kept", verdict_status::skip, "no lone worker loss to recover in place"};
  std::vector<std::string> bad, good;
  for (auto& f : res.faults) {
    const bool lost = f.f.kind == fault_kind::sigkill_worker ||
                      (f.f.kind == fault_kind::sigstop_worker && f.f.duration_ms == 0);  // killed on the verdict
    if (!injected(f) || !lost) continue;
    if (std::find(f.ranks.begin(), f.ranks.end(), 0) != f.ranks.end()) continue;  // the chief restarts the group
    auto* resumed = first_after(res, "resumed", f.t_ns);
    // Alone: no other fault from 2 s before it until its recovery ended.
    const int64_t until = resumed ? resumed->t_ns : INT64_MAX;
    bool alone = true;
    for (auto& g : res.faults)
      if (&g != &f && injected(g) && g.t_ns >= f.t_ns - 2'000'000'000 && g.t_ns <= until) alone = false;
    if (!alone) continue;
    const std::string name = "f" + std::to_string(f.index);
    auto* replaced = first_after(res, "worker_replaced", f.t_ns);
    auto* regroup = first_after(res, "group_started", f.t_ns);
    if (!replaced || !resumed || (regroup && regroup->t_ns < resumed->t_ns)) {
      bad.push_back(name + ": the group restarted instead of recovering in place");
      continue;
    }
    std::set<int64_t> survivors;
    for (auto& e : res.events)
      if (e.name == "group_started" && e.incarnation == f.incarnation && e.j.contains("pids"))
        for (auto& [rank, pid] : e.j["pids"].items())
          if (std::find(f.ranks.begin(), f.ranks.end(), std::stoi(rank)) == f.ranks.end()) survivors.insert(pid.get<int64_t>());
    for (auto& e : res.events)
      if (e.name == "worker_exit" && e.t_ns >= f.t_ns && e.t_ns <= resumed->t_ns && survivors.count(e.num("pid")))
        bad.push_back(name + ": survivor pid " + std::to_string(e.num("pid")) + " exited during the recovery");
    good.push_back(name + " resumed after " + std::to_string((resumed->t_ns - f.t_ns) / 1000000) + " ms");
  }
  if (bad.empty() && good.empty()) return v;
  v.status = bad.empty() ? verdict_status::pass : verdict_status::fail;
  v.detail.clear();
  for (auto& d : bad.empty() ? good : bad) v.detail += (v.detail.empty() ? "" : "; ") + d;
  return v;
}

}  // namespace

check_output check_invariants(const check_input& in) {
  check_output out;
  out.verdicts.push_back(job_finished(in));
  out.verdicts.push_back(exactly_once(in));
  out.verdicts.push_back(bit_identical(in));
  out.verdicts.push_back(no_corrupt_restore(in));
  out.verdicts.push_back(no_temp_left(in));
  out.verdicts.push_back(exit_codes(in));
  out.verdicts.push_back(work_lost(in, out.losses));
  if (in.cfg->hosts >= 2) out.verdicts.push_back(no_split_brain(in));
  if (recovers_in_place(*in.cfg)) out.verdicts.push_back(survivors_kept(in));
  return out;
}

}  // namespace grace::chaos
