#pragma once
/// What the single-host and multi-host runners share: processes, the job's
/// view through its events, chained-fault timing, and the outcome on disk.

#include "apps/chaos/runner.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <sys/types.h>
#include <vector>

#include "runtime/base/events.hpp"

namespace grace::chaos {

/// SIGINT and SIGTERM to grace-chaos stop the job in progress (killed as on
/// a timeout) and then the harness, which removes what it made (test bed,
/// tmpfs) on the way out; `interrupted` says whether one came.
void install_interrupt_handlers();
bool interrupted();
void sleep_ms(int ms);
bool alive(pid_t pid);
/// Alive and not a zombie waiting to be reaped.
bool running_process(pid_t pid);
/// Children of `pid`, from /proc/<pid>/task/*/children.
std::vector<pid_t> children_of(pid_t pid);
/// Forks and execs `argv` with stdout+stderr appended to `log` (or
/// /dev/null) and `env` added; `own_group`: in a process group of its own.
pid_t spawn(const std::vector<std::string>& argv, const std::filesystem::path& log,
            const std::map<std::string, std::string>& env, bool own_group);

/// The trainer's part of a launch: the program, its prefix and the flags
/// every run gets (steps, output, save interval, delay, device); the
/// caller appends its own and the extras.
std::vector<std::string> trainer_argv(const run_config& cfg, const std::filesystem::path& out_json);

/// Appends a `chaos_<what>` event (rank -2) to the job's events file.
void append_chaos_event(const std::filesystem::path& events, const std::string& what, int64_t incarnation,
                        const nlohmann::json& extra);

/// Runs `grace-ckpt verify` on a `restored` event's directory.
restore_check verify_restore(const std::string& ckpt_tool, const event& e);

struct job_view;
/// Reads the events appended since `offset` into `res.events`, applying
/// each to `view` and verifying every new `restored` directory once
/// (verify_restore, while the checkpoint still exists).
void poll_job_events(const std::filesystem::path& events, uint64_t& offset, job_view& view, run_result& res,
                     const std::string& ckpt_tool);

/// When the chained fault `r` is due: its predecessor's injection time
/// plus after_ms, or its on_event's first occurrence since then plus
/// delay_ms; nullopt while unknown. A predecessor that was skipped skips it.
std::optional<int64_t> chained_due(run_result& res, fault_record& r);

/// Fills res.out from `out_json`, and res.final_checkpoints and
/// res.leftover_temporaries from the checkpoint directories (one, or one
/// per host: then temporaries are named by their path).
void collect_outcome(const std::filesystem::path& out_json, const std::vector<std::filesystem::path>& ckpts,
                     run_result& res);

/// The job's state as seen through the events file.
struct job_view {
  int workers = 0;
  int64_t incarnation = -1;  ///< newest group_started
  int64_t incarnation_start_ns = 0;
  std::map<int64_t, int64_t> pid_of;  ///< rank -> pid (current incarnation)
  std::set<int64_t> stepping;         ///< ranks with first_step in the current incarnation
  std::set<int64_t> exited;           ///< ranks with an exit/finished event in the current incarnation
  int64_t anchor_step = 0, anchor_ns = 0;
  int64_t first_step = -1, first_step_ns = 0;
  double step_ns = 25e6;

  void apply(const event& e);
  /// Elastic jobs: each incarnation's group (the service's group_formed:
  /// node ranks in slot order); its workers are their number x per_host.
  std::map<int64_t, std::vector<int>> groups;
  int per_host = 0;

  void anchor(int64_t s, int64_t t);
  /// Workers of the current group (every host's in a fixed-size job).
  int group_workers() const;
  /// The host a rank of the current group runs on, or -1.
  int host_of(int rank) const;
  /// The ranks of a host in the current group (none: not in it).
  std::vector<int> ranks_of(int host) const;
  bool running() const { return static_cast<int>(stepping.size()) == group_workers() && exited.empty(); }
  int64_t estimate(int64_t now) const;
};

}  // namespace grace::chaos
