#pragma once
/// Grace's embedding API: a research trainer wraps its step function.
///
///   grace::session g(opts);
///   g.register_tensor({"w", grace::dtype::f32, {n}, w.data()});
///   auto start = g.attach();                     // join, restore
///   for (uint64_t s = *start + 1; s <= steps; ++s)
///     if (g.run([&](uint64_t step) { train_step(step); }) == grace::step_result::stop)
///       return g.exit_code();                    // 42: restart me
///   g.finish();
///
/// No CAF in this header: the actors live behind the pimpl.

#include "runtime/coordination/cluster_config.hpp"
#include "runtime/base/error.hpp"
#include "runtime/base/exit_codes.hpp"
#include "runtime/base/tensor.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

namespace gloo::rendezvous {
class Store;
}
namespace spdlog {
class logger;
}

namespace grace {

/// Many fields for a reason: a bag of settings without behaviour, one per
/// knob of the embedding API (grace-train maps its flags onto them).
struct options {
  std::string checkpoint_dir = "grace-checkpoints";
  int keep_last = 3;  ///< checkpoints kept (older deleted after a newer commit)
  int restart_exit_code = exit_code::restart;
  uint64_t save_every_steps = 0;  ///< periodic backup (0: off)
  double save_every_seconds = 0;  ///< periodic backup by time (0: off)
  /// Periodic backups at the interval Daly's rule gives for the measured
  /// save cost and the failure history beside the checkpoints
  /// (runtime/checkpoint/save_interval.hpp); the two settings above are then unused.
  bool save_every_auto = false;
  double mtbf_prior_seconds = 6 * 3600.0;  ///< the MTBF assumed until failures are seen
  /// A periodic save that failed is retried after a delay doubling from 1 s
  /// up to this (training goes on meanwhile).
  std::chrono::milliseconds save_retry_max{300000};
  /// Before retrying a failed periodic save, remove every checkpoint but
  /// the newest that verifies (room on a full disk).
  bool prune_on_save_failure = false;
  /// Sharded state: wait this long before committing the parts of a save
  /// (as a slow disk would), so that tests can land a fault inside phase 2
  /// of the commit; only the save of `commit_delay_step` if that is not 0.
  /// 0 in a real job.
  std::chrono::milliseconds commit_delay{0};
  uint64_t commit_delay_step = 0;
  /// Where a save that must not be lost (preemption, grace-period final,
  /// just-in-time, end of training) goes when checkpoint_dir cannot take it
  /// (disk full, I/O error, the directory gone). A restart restores the
  /// newest checkpoint that verifies in either directory. Empty: none.
  std::string fallback_checkpoint_dir;
  /// Sharded state on several ranks: every rank keeps copies of its part of
  /// its last steps and one other rank's (runtime/checkpoint/replica.hpp), so a rank
  /// lost costs at most a step or two instead of the work since the last
  /// checkpoint. Costs a copy of the part per step and memory for about
  /// five parts.
  bool replicas = true;
  bool keep_checkpoints_on_success = false;  ///< finish() keeps backups (else only the final one)
  // notices
  std::string notice_file;                ///< a file whose appearance is a notice
  std::string notice_command;             ///< a command whose exit 0 is a notice
  std::function<bool()> notice_callback;  ///< polled; true is a notice
  /// Told of every notice this process receives itself (source "signal",
  /// "file", "command" or "callback"; detail such as "SIGTERM"), on Grace's
  /// signal thread, before the notice goes to the coordination service.
  /// Must not block: hand it to the trainer thread (the Python module runs
  /// its callbacks at the next step boundary).
  std::function<void(const std::string& source, const std::string& detail)> notice_observer;
  std::chrono::milliseconds poll_interval{1000};
  std::chrono::milliseconds grace_period{0};  ///< time from notice to kill (0: none)
  double margin_factor = 2.0;  ///< final-save margin = factor * (margin_steps * p95 step + p95 save) + 5 ms
  int margin_steps = 2;        ///< steps left to run after the proposal (in flight + agreed)
  // behaviour
  bool throw_on_stop = false;                     ///< run() throws grace::stop_requested instead of returning stop
  std::chrono::milliseconds wait_timeout{60000};  ///< longest wait for a rendezvous key (collectives' setup)
  /// How long attach() keeps trying to reach the coordination service
  /// before it gives up (exit code no_rendezvous, 45).
  std::chrono::milliseconds connect_timeout{30000};
  /// Longest wait for another member's checkpoint to commit (a save of the
  /// whole state by the saver). Waits for the coordinator's decisions are
  /// bounded by what it announces when this worker joins (its dead-after,
  /// heartbeat check and the connection timeout), not by a fixed time.
  std::chrono::milliseconds save_timeout{600000};
  std::chrono::milliseconds heartbeat{200};
  std::chrono::milliseconds dead_after{3000};  ///< coordinator's failure verdict (local/--workers modes)
  std::optional<cluster_config> cluster;       ///< default: from the environment
  /// A --workers/TF_CONFIG member's secret file (else GRACE_TOKEN or
  /// GRACE_TOKEN_FILE), and whether a job across hosts may run without a
  /// secret (else refused; GRACE_INSECURE=1 too): resolve_member_secret.
  std::string token_file;
  bool insecure = false;
  /// Signed checkpoints (runtime/checkpoint/signing.hpp): a long-lived key
  /// file (else GRACE_CHECKPOINT_KEY_FILE) and the mode, "auto", "job" or
  /// "off" (empty: GRACE_CHECKPOINT_SIGNING, else auto).
  std::string checkpoint_key_file;
  std::string checkpoint_signing;
  std::shared_ptr<spdlog::logger> log;
};

enum class step_result { ok, stop };

/// Largest blob (bytes before base64) session::register_blob saves: blobs
/// live in the manifest, which every restore and `grace-ckpt` parses whole.
constexpr size_t max_blob_bytes = size_t(1) << 20;

/// Thrown by run() when options::throw_on_stop is set; exit with code().
class stop_requested : public std::runtime_error {
public:
  stop_requested(int code, const std::string& why) : std::runtime_error(why), code_(code) {}
  int code() const noexcept { return code_; }

private:
  int code_;
};

/// Thrown by a step function when a collective failed (errc::disconnected
/// for a lost peer or an abort): Grace then waits for the coordinator's
/// verdict instead of reporting a bug.
class step_failure : public std::runtime_error {
public:
  explicit step_failure(error e) : std::runtime_error(e.what()), err_(std::move(e)) {}
  const error& err() const noexcept { return err_; }

private:
  error err_;
};

class session {
public:
  /// In a warm spare of `grace-launch --standby` (runtime/worker/standby.hpp),
  /// blocks until the launcher hands it a worker's environment.
  explicit session(options opts = {});
  ~session();
  session(const session&) = delete;
  session& operator=(const session&) = delete;

  /// Registers state to checkpoint (before attach()): host memory, or device
  /// memory when the CUDA backend is built in (copied through pinned buffers).
  void register_tensor(tensor_ref t);
  /// Registers a counter saved in the manifest (epoch, samples seen...).
  void register_counter(const std::string& name, int64_t* value);
  /// Registers a small byte string saved with every checkpoint (before
  /// attach()): RNG states, a data sampler's position. `save` is called on
  /// the trainer thread at each checkpoint, at the same step boundary as the
  /// snapshot; `restore` in attach() with the restored checkpoint's bytes
  /// (a restored checkpoint without the blob is an error, as for tensors).
  /// Kept base64 in the manifest's metadata ("grace.blob.<name>"); a blob
  /// over max_blob_bytes, or a `save` that throws, fails that save.
  void register_blob(const std::string& name, std::function<std::string()> save,
                     std::function<void(const std::string&)> restore);

  /// Joins the cluster, restores the newest valid checkpoint (if any) and
  /// returns the number of completed steps: resume at the next one.
  result<uint64_t> attach();

  /// Runs step `completed_steps() + 1` with preemption handling.
  step_result run(const std::function<void(uint64_t step)>& fn);

  /// run() in three calls, for a caller that cannot hand Grace its step as
  /// a function (a Python `for step in g.steps(n)` loop). begin_step():
  /// ok to run step completed_steps() + 1 now, or stop, as run() decides
  /// before calling its function. After the step's work, end_step() counts
  /// it (and takes a periodic checkpoint when one is due); when the work
  /// failed, fail_step() instead, which returns stop: `collective` for a
  /// failed collective (as grace::step_failure: wait for the coordinator's
  /// verdict), otherwise an error in the step (reported to every worker).
  /// run(fn) is exactly begin_step(); fn(k); end_step() / fail_step().
  step_result begin_step();
  void end_step();
  step_result fail_step(const std::string& what, bool collective);

  /// After the last step: final checkpoint, backup cleanup, leave.
  status finish();

  /// Something outside run() that needs every peer failed (typically the
  /// collective's rendezvous after attach()): waits, as after a failed step,
  /// for the cluster's verdict (a lost peer's just-in-time save, a cluster
  /// error, or the coordinator's loss), leaves, and returns the exit code
  /// for main. Never throws stop_requested. `no_verdict_code`: the exit
  /// code when no verdict comes (no peer was lost); default the restart code.
  /// 0 when the group recovered in place meanwhile: the collectives were
  /// formed again (on_world_change) and training goes on.
  int stop_after_failure(const error& why, int no_verdict_code = -1);

  /// Ends the process with `code` at once: waits for a checkpoint write in
  /// flight, flushes the logs and the event file, then skips destructors
  /// (joining helper threads and finalizing CUDA libraries costs 35-150 ms per
  /// process, which a restart pays on its critical path). For a trainer with
  /// nothing left to do after run() returned stop or after finish().
  [[noreturn]] void quick_exit(int code);

  /// Exit code for main when run() returned stop (or 0 after finish()).
  int exit_code() const;
  std::string stop_reason() const;

  uint32_t rank() const;
  uint32_t world_size() const;
  bool is_chief() const;
  uint64_t completed_steps() const;
  const cluster_config& cluster() const;

  /// Rendezvous for the trainer's collectives (Gloo store; NCCL id exchange);
  /// its keys are under rendezvous_prefix(), fresh for each incarnation.
  std::shared_ptr<gloo::rendezvous::Store> rendezvous_store();
  std::string rendezvous_prefix() const;
  /// Called from outside the trainer thread to abort a collective stuck on a
  /// lost peer (close the Gloo context, ncclCommAbort). Disarmed before run()
  /// returns stop, and in finish(), quick_exit() and ~session: disarming
  /// waits for an abort already running, and afterwards the handler is never
  /// called, so the communicator may be destroyed once run() returned stop.
  void set_abort_handler(std::function<void()> f);
  /// Recovery in place (`grace-launch --recovery in-place`, docs/ARCHITECTURE.md):
  /// when a peer is lost the survivors keep their processes, a replacement
  /// takes the lost rank, and every member that is not at the most advanced
  /// survivor's step takes that survivor's registered state (tensors,
  /// counters, blobs) from its memory. Then `reconnect` is called on the
  /// trainer thread to form the collectives again from rendezvous_store()
  /// and rendezvous_prefix() (fresh for the new group): the old
  /// communicator was aborted and is not used again. In a replacement,
  /// attach() calls it before it returns. Set before attach(); without it
  /// (or with sharded or device state) a loss restarts the group. After a
  /// recovery, run() returns ok for the abandoned step and the trainer
  /// continues with completed_steps() + 1: loop on completed_steps(), not
  /// on a counter of its own. A step must not change registered state
  /// before its last collective can fail (the usual order: gradients,
  /// all-reduce, then the update).
  void on_world_change(std::function<status()> reconnect);
  /// Recoveries in place this process took part in.
  uint64_t recoveries() const;
  /// A notice from code (tests, or a trainer's own watcher).
  void notify(const std::string& detail);

private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace grace
