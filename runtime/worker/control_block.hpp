#pragma once
/// The control block between a worker's actors and its trainer thread.
///
/// The trainer's per-step cost is one seq_cst store (`started`) and one load
/// (`pending`). Everything else happens under the block's own lock, only
/// when `pending` is set, and only through its methods: the peer watcher and
/// the checkpoint writer *post* what they learned, the trainer takes a
/// *snapshot* and waits for a *change*. The store/load pair on each side
/// (trainer: store started, load pending; watcher: store pending, load
/// started) is Dekker's pattern: with seq_cst either the trainer sees the
/// flag before starting step k, or the watcher sees started >= k. So the
/// watcher can promise "this worker stops no later than max(N, started)"
/// without waiting for the trainer.

#include "runtime/coordination/agreement.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace grace {

struct checkpoint_order {
  uint64_t id = 0;
  uint64_t step = 0;
  checkpoint_kind kind = checkpoint_kind::initial;
  bool agreed = false;
  uint32_t saver = 0;
  bool exit_after = false;
  int64_t deadline_ns = 0;
  bool all_save = false;  ///< sharded state: every member writes its part
  bool from_kept = false;  ///< ...from its kept copy of `step` (runtime/checkpoint/replica.hpp)
  std::vector<uint32_t> from_replica{};  ///< ...and the holders write these members' parts
};

struct commit_info {
  uint64_t id = 0;
  uint64_t step = 0;
  bool exit_after = false;
};

struct cluster_failure {
  uint32_t origin = 0;
  uint64_t step = 0;
  std::string message;
};

/// Recovery in place (runtime/coordination/agreement.hpp): resume after
/// `step` with `donor`'s state, collectives re-formed under `prefix`.
struct recover_order {
  uint64_t id = 0;
  uint64_t step = 0;
  uint32_t donor = 0;
  std::string donor_endpoint;
  std::string prefix;
  std::vector<uint32_t> replaced{};
};

/// What this worker lost, as a type (restart policy switches on it).
enum class loss_kind : uint8_t {
  peer_dead,         ///< the coordinator declared a peer dead
  peer_hung,         ///< the coordinator declared a peer hung
  peer_left,         ///< a peer left on purpose while the group trained
  coordinator_lost,  ///< the coordination service is unreachable
  /// The coordination service is gone and a successor is being elected
  /// (etcd failover): wait for its verdict like a peer's loss.
  coordinator_moving,
};
const char* to_string(loss_kind k) noexcept;

struct loss_info {
  loss_kind kind = loss_kind::peer_dead;
  uint32_t rank = 0;       ///< the peer (peer_* kinds)
  uint64_t last_step = 0;  ///< the peer's last completed step, as known
  std::string detail;
};

/// What the trainer sees at a step boundary: a copy taken under the lock.
struct control_state {
  uint64_t version = 0;                    ///< bumps on every post
  std::optional<checkpoint_order> order;   ///< newest checkpoint order
  std::optional<commit_info> committed;    ///< newest committed agreement
  std::optional<cluster_failure> failure;  ///< a cluster error (fatal)
  std::optional<loss_info> lost;           ///< the first peer loss
  bool coordinator_gone = false;
  int64_t deadline_ns = 0;         ///< grace-period deadline (wall clock)
  uint64_t acked_for_trainer = 0;  ///< the peer watcher acknowledged this jit round for us
  std::optional<recover_order> recover;  ///< the newest recovery in place not yet carried out
};

/// The started/completed counters as the peer watcher read them right
/// after raising the flag (Dekker: the trainer starts no step beyond).
struct trainer_progress {
  uint64_t started = 0;
  uint64_t completed = 0;
  /// Not inside a step: at a boundary, before the first step or between
  /// the last step and finish(). Whatever the watcher reports for the
  /// trainer from here is what the trainer itself would report.
  bool idle() const noexcept { return started == completed; }
};

class control_block {
public:
  // --- fast path (trainer thread) ---
  std::atomic<bool> pending{false};
  std::atomic<uint64_t> started{0};
  std::atomic<uint64_t> completed{0};
  std::atomic<int64_t> last_step_ns{0};
  /// Snapshot + write of the last successful save: stored by the checkpoint
  /// writer, read by the peer watcher (heartbeats carry it).
  std::atomic<int64_t> last_save_ns{0};

  // --- posted by the peer watcher (any thread) ---
  /// A new checkpoint order; returns the trainer's progress read after the
  /// flag was raised.
  trainer_progress post_order(const checkpoint_order& o);
  void post_commit(const commit_info& c);
  void post_failure(const cluster_failure& f);
  /// Keeps the first peer loss; a coordinator loss is recorded on its own.
  void post_loss(const loss_info& l);
  void post_deadline(int64_t deadline_ns);
  /// Recovery in place: the group resumes without a restart.
  void post_recover(const recover_order& o);
  /// The trainer carried out recovery `id`: the loss, its round and the
  /// order are forgotten (the group is whole again), and the flag comes
  /// down unless something newer is pending.
  void end_recovery(uint64_t id);
  /// The peer watcher acknowledged jit round `id` for an idle trainer.
  void post_acked_for_trainer(uint64_t id);
  /// The checkpoint writer: this rank's commit of a sharded save's parts at
  /// `step` failed (the trainer waiting for that commit stops waiting).
  void post_commit_failure(uint64_t step, std::string why);

  // --- read by the trainer ---
  /// A copy of the state.
  control_state take_snapshot();
  /// Waits until the version moves past `seen` or `deadline` passes.
  /// Returns false on the deadline.
  bool wait_for_change(uint64_t seen, std::chrono::steady_clock::time_point deadline);
  /// Lowers the flag, unless something was posted after version `seen`.
  bool clear_pending_if_unchanged(uint64_t seen);
  /// Forgets order `id` (a grace-period save handed to the writer).
  void clear_order(uint64_t id);
  /// Why this rank's commit of `step` failed, if it did.
  std::optional<std::string> commit_failure(uint64_t step);
  /// True once the coordination service is known to be gone.
  bool coordinator_gone();
  /// True once a cluster error, a lost peer or the coordinator's loss is known.
  bool failure_known();

  /// Installs (or, with an empty function, clears) the handler that unblocks
  /// a collective stuck on a dead peer (closes the Gloo context /
  /// ncclCommAbort). Set by the trainer; called from actor threads. When a
  /// loss, a cluster error or the coordinator's loss is already known, the
  /// new handler is called at once (the abort it would have had).
  void set_abort_handler(std::function<void()> f);
  /// Aborts collectives, if a handler is armed. Runs the handler outside the
  /// lock (it may block briefly) but counted, so disarm() can wait for it.
  void abort();
  /// Clears the handler and waits until an abort already running has
  /// returned. Afterwards the handler is never called again, so what it
  /// points at (the communicator) may be destroyed. Why this is needed: the
  /// peer watcher calls abort() on a ClusterError / PeerLost from an actor
  /// thread, which races with the trainer thread tearing the communicator
  /// down once run() returned stop. Never call from inside the handler.
  void disarm();
  /// True while a handler is installed (tests, diagnostics).
  bool armed();
  /// Threads inside disarm() waiting for a running abort to return (read
  /// under the block's lock, which that wait releases): lets a test see
  /// disarm() blocked instead of sleeping and guessing it is.
  int disarms_waiting();

private:
  /// Bumps the version, raises the flag and wakes the trainer. `m_` held.
  void raise_locked();

  std::mutex m_;
  std::condition_variable cv_;
  control_state state_;                      ///< guarded by m_
  std::function<void()> abort_collectives_;  ///< guarded by m_
  int aborts_running_ = 0;                   ///< guarded by m_
  int disarms_waiting_ = 0;                  ///< guarded by m_
  std::optional<std::pair<uint64_t, std::string>> commit_failure_;  ///< the newest failed commit; guarded by m_
  std::condition_variable abort_cv_;
};

}  // namespace grace
