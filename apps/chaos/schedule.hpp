#pragma once
/// Fault schedules for grace-chaos: what to do, to whom, and when.
///
/// A schedule is a JSON array, scripted by hand or generated from a seed:
///   [{"at_step": 50, "fault": "sigterm_worker", "target": 1},
///    {"after_ms": 1, "fault": "sigkill_worker", "target": 2},
///    {"at_ms": 3000, "fault": "sigstop_worker", "target": 2, "duration_ms": 1000},
///    {"on_event": "snapshot_done", "fault": "sigkill_worker", "target": 0}]
/// A fault with `after_ms` or `on_event` is *chained* to the one before it:
/// it fires that many ms after the previous fault was injected, or at the
/// first `on_event` event (a phase: "proposed", "agreed", "snapshot_done",
/// "group_started", "restored", ...) after it, plus `delay_ms` - without
/// waiting for the previous fault's effects to settle. Chained faults make
/// overlapping faults: a notice and a kill 1 ms apart, a kill of the saver
/// while its save is in flight, a kill during the restart that follows.
/// The same seed always gives the same schedule: generation uses its own
/// generator (splitmix64) rather than std::uniform_*_distribution, whose
/// output differs between standard libraries.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace grace::chaos {

/// Every fault the harness can inject. See docs/RELIABILITY.md for the
/// invariant each one exercises.
enum class fault_kind {
  sigterm_worker,    ///< notice to one worker (optionally with a grace period)
  sigterm_launcher,  ///< notice to the launcher (optionally with a grace period)
  sigterm_multi,     ///< notices to several workers (and maybe the launcher) at once
  sigkill_worker,    ///< hard failure of one worker
  sigstop_worker,    ///< freeze a worker for duration_ms (0: for good), then SIGCONT
  sigkill_launcher,  ///< the coordination service dies with the launcher
  step_error,        ///< an exception inside a step (trainer --fail-at-step)
  flip_byte,         ///< preempt, then flip a byte in the newest checkpoint while the job is down
  truncate_file,     ///< preempt, then truncate a file of the newest checkpoint
  delete_file,       ///< preempt, then delete a file of the newest checkpoint
  stale_tmp,         ///< preempt, then leave a `.tmp-step-N-<deadpid>-x` directory
  fs_full,           ///< fill the checkpoint file system across a periodic save
  // Host-level faults: only with --hosts (every host a network namespace).
  host_lost,       ///< a host's launcher and workers SIGKILLed, its link down; a replacement after duration_ms
  host_partition,  ///< a host's link down for duration_ms, then up
  host_freeze,     ///< every process of a host SIGSTOPped for duration_ms, then SIGCONT
};

const char* to_string(fault_kind k) noexcept;
std::optional<fault_kind> parse_fault_kind(const std::string& s);
/// All kinds, in declaration order.
const std::vector<fault_kind>& all_fault_kinds();
/// The faults of one machine (everything but the host_* kinds): the
/// default pool of a single-host run.
const std::vector<fault_kind>& single_host_kinds();
/// What a run on the multi-host test bed draws from by default: the host
/// faults and the worker faults that make sense across hosts.
const std::vector<fault_kind>& multi_host_kinds();
bool is_host_fault(fault_kind k) noexcept;

/// How much work a fault may cost, in steps re-run after the restart.
enum class loss_class { none, notice, hard, periodic, terminal };
loss_class loss_class_of(fault_kind k) noexcept;

/// Events a chained fault can be keyed to (the phase it hits).
const std::vector<std::string>& trigger_events();

constexpr int coordinator_host = -2;

struct fault {
  fault_kind kind = fault_kind::sigterm_worker;
  std::optional<uint64_t> at_step;  ///< fire when the job reaches this step
  std::optional<int64_t> at_ms;     ///< or this long after the job started
  std::optional<int64_t> after_ms;  ///< chained: this long after the previous fault fired
  std::string on_event;             ///< chained: at this event after the previous fault fired
  int delay_ms = 0;                 ///< chained on_event: this long after the event
  bool chained() const noexcept { return after_ms.has_value() || !on_event.empty(); }
  std::vector<int> targets;       ///< worker ranks; empty = chosen at run time (rank 1 or 0)
  bool include_launcher = false;  ///< sigterm_multi: the launcher gets one too
  int grace_ms = 0;               ///< sigterm_*: grace period given to the job
  int duration_ms = 0;            ///< sigstop_worker: 0 = frozen for good; host_*: how long (see fault_kind)
  /// host_*: the host (node rank); -1 = chosen at run time (host 1);
  /// coordinator_host ("coordinator" in JSON): the host whose launcher
  /// runs the coordination service when the fault fires (test bed with etcd).
  int host = -1;
  std::string file;               ///< checkpoint faults: file name inside the step dir (default: a shard)
};

nlohmann::json to_json(const fault& f);
/// Throws std::invalid_argument naming the entry and field that is wrong.
fault fault_from_json(const nlohmann::json& j, size_t index);
std::vector<fault> schedule_from_json(const nlohmann::json& j);
nlohmann::json schedule_to_json(const std::vector<fault>& s);

/// Knobs for random schedules.
struct generate_options {
  uint64_t seed = 1;
  int faults = 3;
  int workers = 4;  ///< all workers of the job (hosts x per host with hosts)
  uint64_t steps = 200;
  /// >= 2: the multi-host test bed; host faults hit hosts 1..hosts-1
  /// (host 0 runs the coordination service) ...
  int hosts = 0;
  /// ... or 0..hosts-1 when an elected coordinator survives its host (etcd).
  bool coordinator_host_faults = false;
  /// Restrict to these kinds (empty: all). Used by the CI soak to pin coverage.
  std::vector<fault_kind> kinds;
  /// Chance (0..1) that a fault brings one or two overlapping companions
  /// (chained faults a few ms later or keyed to a phase of the agreement,
  /// the save or the restart that follows). Single-host runs only: on the
  /// test bed, overlaps are scripted (a host fault chained with after_ms).
  double overlap = 0;
  /// An elastic job's wait for a missing host (0: not elastic): half of the
  /// host losses then last past it, so the group shrinks before the
  /// replacement comes and grows again when it does.
  int elastic_wait_ms = 0;
};

/// A random schedule: faults spread over 10%..85% of the steps, at least a
/// few steps apart, step_error (terminal) only ever last; with `overlap`,
/// some faults bring chained companions (see `companions`).
std::vector<fault> generate(const generate_options& o);

struct splitmix64;
/// One or two chained faults to overlap `primary` with: a second notice, a
/// SIGKILL or SIGSTOP a few ms later or keyed to the agreement's proposal,
/// the save's snapshot or the next group's start; the launcher's SIGKILL
/// during the agreement. Never kills the chief together with the launcher
/// (that takes the coordinator's whole host: a multi-host matter).
std::vector<fault> companions(const fault& primary, int workers, splitmix64& rng);

/// splitmix64: small, portable, good enough to pick faults.
struct splitmix64 {
  uint64_t s;
  explicit splitmix64(uint64_t seed) : s(seed) {}
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  /// Uniform in [lo, hi] (hi - lo small, bias negligible).
  uint64_t range(uint64_t lo, uint64_t hi) { return lo + next() % (hi - lo + 1); }
};

}  // namespace grace::chaos
