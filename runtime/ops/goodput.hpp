#pragma once
/// The goodput account: where a job's wall time went. Productive step time
/// against the time lost by cause, rebuilt from the events the job already
/// writes (runtime/base/events.hpp) and the members' heartbeats, with no cost on
/// the trainer's thread. grace-launch keeps one per run, adds it to the
/// account persisted beside the checkpoints (grace-goodput.json), and puts
/// both in grace-exit.json and its metrics.
///
/// What each cause measures (the chief's view, rank 0; README "Metrics and goodput"):
///   startup     first group of a run: from the launcher's start to its first step
///   detection   a member's failure (its exit, else its last heartbeat) to the verdict
///   agreement   the verdict to the agreed just-in-time step (nobody trains)
///   save        snapshots (the trainer is paused) and the wait for an exiting save's commit
///   restart     a group's end to the next group's first step, its restore excepted
///   restore     reading the checkpoint back
///   recompute   steps done again because they were lost (count x mean step time)
///   other       the rest of the wall time (e.g. a launcher's own decisions)

#include "runtime/base/event_reader.hpp"

#include <nlohmann/json_fwd.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>

namespace grace {

struct goodput_account {
  double wall_s = 0;
  double productive_s = 0;
  double startup_s = 0;
  double detection_s = 0;
  double agreement_s = 0;
  double save_s = 0;
  double restart_s = 0;
  double restore_s = 0;
  double recompute_s = 0;
  double other_s = 0;
  uint64_t steps_recomputed = 0;
  uint64_t faults = 0;        ///< groups that lost a member
  uint64_t incarnations = 0;  ///< groups started
  uint64_t runs = 0;          ///< launcher runs summed in

  double ratio() const { return wall_s > 0 ? productive_s / wall_s : 0; }
  goodput_account& operator+=(const goodput_account& o);
  nlohmann::json to_json() const;
  /// Fields absent or not numbers read as 0.
  static goodput_account from_json(const nlohmann::json& j);
};

/// The account file grace-launch keeps beside the checkpoints.
inline constexpr const char* goodput_file = "grace-goodput.json";

/// The job's account as grace-launch last persisted it in `checkpoint_dir`
/// (every run, the current one to within a second); nothing when the file
/// is missing or unreadable.
std::optional<goodput_account> read_goodput(const std::filesystem::path& checkpoint_dir);

/// One line: "goodput 93.1%: 41.0 s of steps kept in 44.0 s; lost: ...".
std::string describe(const goodput_account& a);

/// The cause names and values in a fixed order (metrics labels, tables).
struct goodput_cause {
  const char* name;
  double goodput_account::*seconds;
};
extern const goodput_cause goodput_causes[8];

/// Folds one launcher run's events and heartbeats into an account.
class goodput_tracker {
public:
  explicit goodput_tracker(int64_t run_start_ns) : run_start_ns_(run_start_ns) {}

  /// One event of the run. Returns the steps lost when it is the chief's
  /// restore (the newest completed step known when the previous group
  /// ended, minus the restored step), nothing otherwise.
  std::optional<uint64_t> on_event(const event& e);
  /// A heartbeat: `rank` had completed `completed` steps at `t_ns`, the
  /// last of which took `last_step_ns`.
  void on_progress(uint32_t rank, uint64_t completed, int64_t last_step_ns, int64_t t_ns);
  /// The group ended (all its events read): the steps its restart loses
  /// are counted from the newest step known now, not from the heartbeats
  /// of the next group, which may arrive before its restore is read.
  void group_ended() { ended_high_water_ = high_water_; }
  /// The newest step a previous run of the job knew of (its persisted
  /// account): a restore at the start of this run is measured against it.
  void resume_from(uint64_t high_water) {
    high_water_ = std::max(high_water_, high_water);
    ended_high_water_ = high_water_;
  }
  /// The account as of `now_ns`.
  goodput_account account(int64_t now_ns) const;
  /// The newest completed step heard of (heartbeats and events).
  uint64_t high_water() const { return high_water_; }

private:
  struct group {
    int64_t started = 0, ended = 0;         ///< the launcher's group_started, last worker_exit
    int64_t train_start = 0, train_end = 0; ///< the chief's first step began, its exit or finish
    int64_t restore_ns = 0;
    int64_t reached = 0;  ///< the chief reached an agreed step (0: not waiting)
    int64_t snap_since_reached = 0;
    int64_t loss_at = 0;  ///< the first verdict in this group (0: none)
    double detection_s = 0, agreement_s = 0, wait_s = 0, snap_s = 0;
    std::map<int64_t, int64_t> exited;  ///< worker rank -> exit time
  };
  group& at(int64_t incarnation) { return groups_[incarnation]; }
  void on_loss(const event& e, group& g);
  static int64_t last_exit_before(const group& g, int64_t limit);
  static double split_training(const group& g, int64_t end, goodput_account& a);
  double mean_step_s() const;

  int64_t run_start_ns_;
  std::map<int64_t, group> groups_;
  std::map<uint32_t, int64_t> last_heard_;  ///< rank -> newest heartbeat time
  uint64_t high_water_ = 0;
  uint64_t ended_high_water_ = 0;  ///< high_water_ when the last group ended
  double step_ns_sum_ = 0;
  uint64_t step_samples_ = 0;
  uint64_t steps_recomputed_ = 0;
};

}  // namespace grace
