#pragma once
/// The worker's decisions at a step boundary, as a pure class: inputs are
/// the control block's state (orders, commits, losses, errors, deadline),
/// the completed step, the clocks and what the trainer already did; outputs
/// are decisions (run, acknowledge, reach the agreed step and save, hand a
/// grace-period save off, propose the final save, save alone, wait, stop
/// with a code). No clock, no I/O, no CAF: `session::impl::boundary` carries
/// the decisions out, and tests drive every one of them.
///
/// ## Priorities (first match wins)
/// | state                                         | decision                                     |
/// |-----------------------------------------------|----------------------------------------------|
/// | the step raised an error of its own           | wait for the cluster error, then stop 3      |
/// | a cluster error                               | stop 3, naming its origin                    |
/// | a shutdown order                              | stop with its code                           |
/// | the current order committed, exit after       | stop with the restart code                   |
/// | recovery in place ordered (no newer round)    | recover: take the donor's state if not at    |
/// |                                               | its step, form the collectives again         |
/// | a replacement without its recovery order      | wait for it (the verdict wait)               |
/// | just-in-time round, not agreed                | acknowledge the completed step (once), wait  |
/// | just-in-time round agreed, we save            | save the completed step (sync), wait commit  |
/// | just-in-time round agreed, another saves      | wait for the commit                          |
/// | the coordination service lost                 | chief: save the completed step if newer than |
/// |                                               | what is on disk; then stop (restart code).   |
/// |                                               | With a successor possible (etcd failover)    |
/// |                                               | nobody saves alone: stop (restart code)      |
/// | the coordination service moving (failover)    | wait for the successor's verdict (the        |
/// |                                               | just-in-time round after the rejoin)         |
/// | a peer lost, or a collective failed           | wait for the coordinator's verdict (the      |
/// |                                               | just-in-time round or a commit)              |
/// | proposal, completed >= its lower bound        | wait for the agreed step                     |
/// | proposal, below its lower bound               | run (flag stays up)                          |
/// | agreed, below / past the agreed step          | run (flag up) / stop 3 (protocol violation)  |
/// | agreed step reached                           | reach it (the saver saves), then: exit after |
/// |                                               | -> wait for the commit; else training goes on|
/// | grace-period countdown, margin reached        | chief proposes the final save; run           |
/// | nothing pending                               | lower the flag; run                          |
///
/// ## Waits
/// Every wait ends on a change of the control block or on a deadline derived
/// from configuration, and a deadline that passes is a stop naming the wait:
/// - agreement, verdict, cluster error: `verdict_wait_ns` - the longest the
///   coordination service may take to decide after a failure (dead-after,
///   its heartbeat check, and the connection timeout that reveals its own
///   loss);
/// - commit: `save_wait_ns` - the longest another member's save may take.

#include "runtime/coordination/agreement.hpp"
#include "runtime/worker/control_block.hpp"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace grace {

enum class boundary_mode : uint8_t {
  step_start,         ///< the flag was up before step k started
  collective_failed,  ///< step k failed in a collective or was aborted: it cannot run again
  own_error,          ///< step k raised an error of its own, already reported to the coordinator
};

enum class wait_reason : uint8_t {
  agreement,      ///< the agreed step (or the just-in-time round's outcome)
  commit,         ///< the saver's commit
  verdict,        ///< the coordinator's decision after a loss or a failed collective
  cluster_error,  ///< the broadcast of our own error
};
const char* to_string(wait_reason r) noexcept;

struct worker_decision {
  enum class type : uint8_t {
    run,             ///< run the step; the flag stays up (check again next step)
    run_clear,       ///< run the step; nothing pending: lower the flag
    ack_jit,         ///< acknowledge just-in-time round `id` with completed step `step`
    reach,           ///< agreed step `step` of order `id` reached: `save` it if we are the saver (`sync`)
    continue_grace,  ///< grace period: order `id` is handled, training continues
    propose_final,   ///< grace-period margin reached: propose the final save (`step` about to start)
    save_own,        ///< the coordination service is gone: the chief saves `step` on its own
    recover,         ///< recovery in place `id`: resume after `step` (runtime/coordination/agreement.hpp)
    wait,            ///< wait for a change until `deadline_ns` (monotonic clock)
    stop,            ///< stop with `code`, `message`
  };
  type what = type::run;
  uint64_t id = 0;
  uint64_t step = 0;
  checkpoint_kind kind = checkpoint_kind::initial;
  bool save = false;
  bool sync = false;
  /// reach: write the kept copy of `step` (and the replicas of these
  /// members' parts this worker holds), not the live state.
  bool from_kept = false;
  std::vector<uint32_t> from_replica;
  wait_reason reason = wait_reason::agreement;
  int64_t deadline_ns = 0;
  bool new_wait = false;  ///< the first decision of this wait (log it once)
  int code = 0;
  std::string message;
  int64_t left_ns = 0;    ///< propose_final: time left before the deadline
  int64_t margin_ns = 0;  ///< propose_final: the margin it was compared with
};
const char* to_string(worker_decision::type t) noexcept;

struct worker_policy_config {
  uint32_t rank = 0;
  bool is_chief = false;
  int restart_code = 42;
  int fatal_code = 3;
  int64_t verdict_wait_ns = 10'000'000'000;
  int64_t save_wait_ns = 600'000'000'000;
  double margin_factor = 2.0;
  int margin_steps = 2;
  /// The chief saves on its own when the coordination service is lost.
  /// Off when a successor service may exist (etcd failover): a worker cut
  /// off from it must not write while the others save under the successor.
  bool save_alone_without_coordinator = true;
  /// A replacement process (recovery in place): it holds no state until
  /// its recovery order comes, and waits for it.
  bool replacement = false;
};

struct boundary_input {
  uint64_t completed = 0;  ///< steps completed; the boundary is before completed + 1
  boundary_mode mode = boundary_mode::step_start;
  int64_t mono_ns = 0;  ///< monotonic clock (waits)
  int64_t wall_ns = 0;  ///< wall clock (the grace-period deadline is a wall time)
  std::string error;    ///< own_error: what the step raised
};

class worker_policy {
public:
  worker_policy(worker_policy_config cfg, uint64_t restored_step);

  /// The next thing to do at this boundary.
  worker_decision next(const control_state& s, const boundary_input& in);

  // What the trainer did, after carrying a decision out.
  void acked(uint64_t id) { acked_ = id; }
  void reached(uint64_t id) { reached_ = id; }
  /// A save of `step` was written or handed to the writer.
  void saved(uint64_t step) {
    if (step > last_saved_) prior_saved_ = std::exchange(last_saved_, step);
  }
  /// That save failed (its commit fenced, the disk full): its step is not
  /// saved after all, so a chief that then loses the coordination service
  /// saves it on its own.
  void save_failed(uint64_t step) {
    if (step == last_saved_) last_saved_ = prior_saved_;
  }
  void proposed_final() { final_proposed_ = true; }
  void grace_continues() { final_proposed_ = false; }
  /// Recovery in place `id` carried out: this worker holds the group's state.
  void recovered() { replacement_ = false; }
  /// A step's duration. The first one after a start (warm-up) counts only
  /// until a second is measured.
  void step_time(int64_t ns);
  void save_time(int64_t ns);

  /// The grace-period margin from the measured step and save times.
  int64_t margin_ns() const;
  uint64_t last_saved() const noexcept { return last_saved_; }
  const worker_policy_config& config() const noexcept { return cfg_; }
  /// Calls `put(v)` for every field of the policy's memory (without
  /// timings): the protocol model's de-duplication key.
  template <class Put>
  void visit_state(Put&& put) const {
    put(last_saved_), put(prior_saved_), put(acked_), put(reached_), put(final_proposed_), put(waiting_), put(wait_reason_), put(replacement_);
  }

private:
  worker_decision after_own_error(const control_state& s, const boundary_input& in);
  worker_decision follow_jit(const control_state& s, const boundary_input& in);
  std::optional<worker_decision> follow_agreement(const control_state& s, const boundary_input& in);
  worker_decision coordinator_lost(const boundary_input& in);
  worker_decision countdown(const control_state& s, const boundary_input& in);
  worker_decision wait(wait_reason r, const boundary_input& in, int code, std::string on_timeout);
  worker_decision stop(int code, std::string message);
  worker_decision make(worker_decision::type t);

  worker_policy_config cfg_;
  uint64_t restored_;
  uint64_t last_saved_;
  uint64_t prior_saved_;  ///< last_saved_ before the newest save (save_failed)
  uint64_t acked_ = 0;
  uint64_t reached_ = 0;
  bool final_proposed_ = false;
  bool replacement_ = false;  ///< no state yet: a replacement before its recovery
  bool waiting_ = false;
  wait_reason wait_reason_ = wait_reason::agreement;
  int64_t wait_deadline_ = 0;
  bool warmup_seen_ = false;       ///< the first step after a start was measured
  int64_t warmup_ns_ = 0;          ///< its duration: the step time only until a second step is measured
  std::vector<int64_t> step_ns_;  ///< recent step durations after the first (ring of 64)
  size_t step_next_ = 0;
  std::vector<int64_t> save_ns_;  ///< recent snapshot+write durations (last 32)
};

}  // namespace grace
