#pragma once
/// The checkpoint interval that tunes itself (`--save-every auto`): Daly's
/// rule for the optimum time between saves, with the save's cost measured
/// by the job and the mean time between failures estimated from the job's
/// failure history (a configured prior until failures are observed). Pure:
/// the session feeds it measurements and asks for the interval.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace grace {

/// Run time between the job's failures, across incarnations.
struct failure_history {
  std::vector<double> gaps_s;  ///< run time between consecutive failures, oldest first
  double open_s = 0;           ///< run time since the last failure (or the job's start)
};

/// Mean time between failures for exponential lifetimes: the maximum-
/// likelihood estimate over the last `window` gaps, the open gap counted as
/// a censored observation (it only adds run time). Before any failure the
/// prior counts as one observed failure gap, so the estimate starts at the
/// prior and grows as the job runs without failing.
double estimate_mtbf(const failure_history& h, double prior_s, std::size_t window = 8);

/// Daly's higher-order optimum of the work between saves, in seconds, for a
/// save costing `save_cost_s` of training time and failures every `mtbf_s`
/// on average: sqrt(2CM)(1 + sqrt(C/2M)/3 + C/18M) - C when C < 2M (Young's
/// sqrt(2CM) is its first term), M otherwise.
double daly_interval(double save_cost_s, double mtbf_s);

/// Expected wall time to finish `work_s` of training with a save every
/// `interval_s` of work, each costing `save_cost_s`, a restart costing
/// `restart_s` and exponential failures of mean `mtbf_s` (Daly 2006, the
/// exact expression). The tests' brute force minimises it.
double expected_wall_time(double work_s, double interval_s, double save_cost_s, double restart_s, double mtbf_s);

/// Reads the failure history the launcher keeps beside the checkpoints
/// (`grace-failures.jsonl`: one {"run_s", "failure"} line per incarnation
/// that ended, and {"start": true} for one that began); an incarnation that
/// began and never ended (its launcher was killed) counts as a failure of
/// unknown run time (0). A missing file is an empty history; a damaged line
/// is skipped.
failure_history read_failure_history(const std::string& path);

/// The history's file name in a checkpoint directory.
inline constexpr const char* failure_history_file = "grace-failures.jsonl";

/// Appends one line to `dir`/grace-failures.jsonl (O_APPEND, one write):
/// an incarnation began, or it ended after `run_s` seconds, in a failure
/// (a worker killed or crashed) or not (finished, preempted, stopped).
/// Errors are returned, not thrown: the history is advisory.
bool record_incarnation_start(const std::string& dir, uint32_t incarnation);
bool record_incarnation_end(const std::string& dir, uint32_t incarnation, double run_s, bool failure);

/// The running choice: measured save costs and the history in, seconds
/// between saves out.
class save_interval {
public:
  save_interval(double prior_mtbf_s, failure_history h) : prior_s_(prior_mtbf_s), history_(std::move(h)) {}

  /// A periodic save's cost on the training thread (what the trainer waited
  /// for: the snapshot, not the background write).
  void on_save_cost(int64_t ns);
  /// Run time of this incarnation so far, added to the open gap.
  void set_running(double seconds) { running_s_ = seconds; }

  bool measured() const { return !costs_.empty(); }
  double mtbf_s() const;
  /// The save cost the interval uses: the median of the last eight.
  double cost_s() const;
  /// Seconds of training between saves; 0 until a save was measured (the
  /// caller saves once early to measure it).
  double seconds() const;

private:
  double prior_s_;
  failure_history history_;
  double running_s_ = 0;
  std::vector<int64_t> costs_;  ///< the last few save costs (their median is used)
};

/// After a periodic save failed (a full disk, an I/O error, a directory
/// that vanished): training goes on, and the save is tried again after a
/// delay that doubles from `first_ns` up to `longest_ns`; a success resets
/// it. While a retry is pending it replaces the regular schedule (a disk
/// that just filled up is not tried again every few steps).
class save_backoff {
public:
  explicit save_backoff(int64_t first_ns = 1'000'000'000, int64_t longest_ns = 300'000'000'000)
      : first_ns_(first_ns), longest_ns_(longest_ns), delay_ns_(first_ns) {}
  /// A periodic save failed at `now_ns`; returns the delay until the retry.
  int64_t failed(int64_t now_ns);
  void succeeded();
  bool pending() const { return failures_ > 0; }
  bool due(int64_t now_ns) const { return pending() && now_ns >= next_ns_; }
  int failures() const { return failures_; }

private:
  int64_t first_ns_, longest_ns_, delay_ns_;
  int64_t next_ns_ = 0;
  int failures_ = 0;
};

}  // namespace grace
