#pragma once
/// The harness's scheduler role: runs grace-launch + the trainer under a
/// fault schedule, injects each fault when its trigger is reached, and
/// relaunches the job when the launcher exits with the restart code (or
/// was killed), as a cluster scheduler would. It records everything the
/// invariant checks need; it judges nothing itself.

#include "apps/chaos/schedule.hpp"
#include "runtime/base/event_reader.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <sys/types.h>
#include <vector>

namespace grace::chaos {

/// Many fields for a reason: a bag of settings without behaviour, one per
/// grace-chaos flag that reaches the runner.
struct run_config {
  std::string launcher;  ///< grace-launch
  std::string trainer;   ///< grace-train (or any program embedding Grace that takes the same flags)
  /// Arguments between the trainer program and the harness's flags: an
  /// interpreter's script (`grace-chaos ... -- /usr/bin/python3 train.py`).
  std::vector<std::string> trainer_prefix;
  std::string ckpt_tool;  ///< grace-ckpt
  int workers = 4;
  uint64_t steps = 200;
  int save_every = 20;
  int step_delay_ms = 20;
  std::string device = "cpu";             ///< trainer --device (the harness measures CPU runs by default)
  std::vector<std::string> trainer_args;  ///< extra, appended verbatim
  /// Appended after trainer_args, but not given to the reference run: a
  /// broken-on-purpose flag whose job is to make an invariant fail.
  std::vector<std::string> mutant_args;
  /// Extra grace-launch flags for every launch, reference included (e.g.
  /// --standby: restarts onto warm spares under the same faults).
  std::vector<std::string> launcher_args;
  int launcher_max_restarts = 20;   ///< in-launcher group restarts
  int max_relaunches = 20;          ///< scheduler relaunches of grace-launch
  int exit_timeout_ms = 8000;       ///< grace-launch --exit-timeout-ms
  int64_t job_timeout_ms = 240000;  ///< give up on the whole job after this
  int grace_kill_slack_ms = 500;    ///< the "platform" kills this long after a grace period ends
  double step_ns_hint = 25e6;       ///< step time, for "at step X" triggers
  /// Size of the tmpfs mounted on the checkpoint directory when a schedule
  /// has fs_full: room for the kept checkpoints of the trainer's model (the
  /// fault itself fills whatever is left).
  int fs_size_mb = 256;
  std::filesystem::path dir;  ///< the run's directory (created, emptied)
  bool verbose = false;
  /// >= 2: the job runs on the multi-host test bed (every host a network
  /// namespace, one grace-launch per host, `workers` per host, checkpoints
  /// in one directory shared by all); see run_host_job.
  int hosts = 0;
  int dead_after_ms = 1500;  ///< grace-launch --dead-after-ms on the test bed
  /// Test bed: a three-member etcd on hosts 0..2 elects the coordination
  /// host (grace-launch --etcd) instead of pinning it to host 0, so host
  /// faults may hit host 0 (needs hosts >= 3 and Debian etcd-server).
  bool etcd = false;
  int etcd_ttl_s = 2;  ///< grace-launch --etcd-ttl
  /// Test bed: every host has its own checkpoint directory (a node-local
  /// disk) instead of one shared by all; host_lost's replacement starts
  /// with an empty one, as a new machine would.
  bool node_local = false;
  /// Test bed: an elastic job (grace-launch --nnodes MIN:hosts): each group
  /// has elastic_min to `hosts` hosts; a host lost for longer than
  /// elastic_wait_ms is left out until its replacement comes, and the
  /// reference run changes size at the same steps (0: not elastic).
  int elastic_min = 0;
  int elastic_wait_ms = 2000;
  /// Workers of the whole job.
  int total_workers() const noexcept { return hosts >= 2 ? hosts * workers : workers; }
};

using grace::event;

/// What happened to one scheduled fault.
struct fault_record {
  fault f;
  size_t index = 0;
  std::string status = "not reached";  ///< injected, skipped, not reached
  std::string detail;
  int64_t t_ns = 0;          ///< injection time (wall)
  int64_t est_step = -1;     ///< the harness's estimate of the step in flight at injection
  int launch = -1;           ///< which launcher run it hit
  int64_t incarnation = -1;  ///< group incarnation it hit
  std::vector<int> ranks;    ///< workers signalled
  int effective_grace_ms = 0;
  bool deadline_kill = false;  ///< the platform's kill at the end of a grace period was needed
  std::string corrupted_path;  ///< checkpoint faults: step dir (or tmp dir) touched
  int64_t corrupted_ns = 0;
};

struct launch_record {
  int index = 0;
  int host = 0;  ///< the host (node rank) it ran on; 0 for a single-host run
  pid_t pid = -1;
  int64_t start_ns = 0, end_ns = 0;
  int exit_code = -1;  ///< -1: killed by `signal`
  int signal = 0;
  int grace_ms = 0;
  int64_t base_incarnation = 0;
  std::vector<std::string> argv;
  std::vector<std::string> notes;  ///< stragglers killed, orphans reaped with their codes
};

/// A `restored` event checked while the job ran (the directory may be
/// pruned later).
struct restore_check {
  std::string path;
  int64_t incarnation = 0;
  int64_t step = 0;
  int64_t t_ns = 0;
  bool checked = false;  ///< false: gone before we could look
  bool ok = false;
  std::string detail;
};

struct run_result {
  std::vector<event> events;
  std::vector<fault_record> faults;
  std::vector<launch_record> launches;
  std::vector<restore_check> restores;
  nlohmann::json out;                             ///< the trainer's out.json (null if missing)
  std::vector<std::string> leftover_temporaries;  ///< `.tmp-*` in the checkpoint dir at the end
  std::vector<nlohmann::json> final_checkpoints;  ///< {path, step, counters} of what is left
  std::vector<std::string> notes;
  bool timed_out = false;
  bool fs_mounted = false;
  int64_t start_ns = 0, end_ns = 0;
  double step_ns = 0;  ///< measured
};

/// Runs the job under `schedule`; throws std::runtime_error only for
/// harness problems (cannot create the directory, cannot start a process,
/// no network namespaces for a multi-host run).
run_result run_job(const run_config& cfg, const std::vector<fault>& schedule);

/// run_job on the multi-host test bed (cfg.hosts >= 2): a network
/// namespace per host joined by a bridge, one grace-launch per host
/// (node rank = host), host 0 running the coordination service (with
/// cfg.etcd: whichever launcher etcd elects, and its successor). Host
/// faults kill a host (its launcher is relaunched after the fault's
/// duration, as a replacement machine would be), cut its link or freeze
/// it; worker faults hit ranks as on one host. A launcher that exits with
/// the restart code or was killed is relaunched on its host.
run_result run_host_job(const run_config& cfg, const std::vector<fault>& schedule);

/// Runs `argv` to completion; stdout+stderr into `output`. Returns the exit
/// code (128 + signal if killed).
int run_command(const std::vector<std::string>& argv, std::string* output = nullptr);

using grace::read_events;

}  // namespace grace::chaos
