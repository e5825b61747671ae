#pragma once
/// The session's state and the functions its files share. Only
/// actors/session*.cpp include this. `session::impl` is the step boundary;
/// what it owns is grouped by purpose:
///   session_registry   what the trainer registered (tensors, counters, blobs)
///   session_wiring     the worker's actors and their threads
///   session_membership the group as this worker belongs to it
///   session_saves      the save pipeline (store, buffers, writer, intervals)
/// session.cpp holds the public API and the step boundary,
/// session_attach.cpp attach() (restore, actors, join), session_saves.cpp
/// the save pipeline.
#include "actors/session.hpp"

#include "actors/checkpoint_writer.hpp"
#include "actors/coordinator_ref.hpp"
#include "runtime/base/guarded.hpp"
#include "runtime/base/mutants.hpp"
#include "actors/kv_store.hpp"
#include "actors/peer_watcher.hpp"
#include "actors/signal_watcher.hpp"
#include "runtime/base/base64.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/worker/control_block.hpp"
#include "runtime/base/deadline.hpp"
#include "runtime/checkpoint/device_copy.hpp"
#include "runtime/base/events.hpp"
#include "actors/convert.hpp"
#include "runtime/net/net_address.hpp"
#include "runtime/checkpoint/replica.hpp"
#include "runtime/checkpoint/shared_dir.hpp"
#include "runtime/checkpoint/save_interval.hpp"
#include "runtime/checkpoint/snapshot.hpp"
#include "runtime/checkpoint/state_transfer.hpp"
#include "runtime/worker/standby.hpp"
#include "actors/actor_runtime.hpp"
#include "runtime/net/tls.hpp"
#include "runtime/worker/worker_policy.hpp"

#include <caf/actor_system.hpp>
#include <caf/io/middleman.hpp>
#include <caf/after.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/system_messages.hpp>
#include <caf/send.hpp>

#include <nlohmann/json.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>
#include <unistd.h>

#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace grace {


/// The kept copies and the replica held, frozen for a just-in-time round;
/// nothing without replicas (or before attach() started them).
inline replica_report freeze_copies(const guarded<std::shared_ptr<replica_keeper>>& replicas) {
  auto keeper = replicas.get();
  return keeper ? keeper->freeze() : replica_report{};
}

/// Workers per node (grace-launch's LOCAL_WORLD_SIZE); 0 when unknown.
inline uint32_t local_world_size() {
  const char* v = std::getenv("LOCAL_WORLD_SIZE");
  return v ? static_cast<uint32_t>(std::strtoul(v, nullptr, 10)) : 0;
}


/// What the trainer registered: the state a checkpoint holds.
struct session_registry {
  std::vector<tensor_ref> tensors;
  /// Some tensor is a slice of a global one: every rank saves its part of
  /// every checkpoint (two phases, runtime/checkpoint/checkpoint.hpp).
  bool sharded = false;
  /// Sharded state: kept copies of this rank's part (`kept_layout`: its
  /// slices; rank 0's also the replicated tensors) and the replica of
  /// another rank's (runtime/checkpoint/replica.hpp).
  /// The replica keeper, shared with the peer watcher (which acknowledges
  /// a just-in-time round for a trainer outside a step: freeze_copies);
  /// empty until attach() started it, and without replicas.
  std::shared_ptr<guarded<std::shared_ptr<replica_keeper>>> replicas =
      std::make_shared<guarded<std::shared_ptr<replica_keeper>>>();
  std::vector<tensor_ref> kept_layout;
  std::map<std::string, int64_t*> counters;
  struct blob_hooks {
    std::function<std::string()> save;
    std::function<void(const std::string&)> restore;
  };
  std::map<std::string, blob_hooks> blobs;
  /// Recovery in place: forms the trainer's collectives again (session::on_world_change).
  std::function<status()> world_change;
};

/// The worker's actors and the threads that carry them (the file's top
/// comment says which runs where).
struct session_wiring {
  /// GRACE_TLS_*: certificates for the coordination traffic (runtime/net/tls.hpp).
  tls_files tls;
  std::unique_ptr<actor_runtime> rt;
  /// The coordination service, swapped by the peer watcher if it moves
  /// (etcd failover); read for each message.
  std::shared_ptr<coordinator_ref> coord = std::make_shared<coordinator_ref>();
  coordinator_actor hosted;  ///< the service this worker hosts (local mode, or the chief without a launcher)
  peer_watcher_actor watcher;
  std::shared_ptr<control_block> ctl = std::make_shared<control_block>();
  std::unique_ptr<signal_watcher> signals;
  /// The trainer thread's mailbox for the writer's answers.
  std::unique_ptr<caf::scoped_actor> self;
};

/// This worker as a member of the group: its rendezvous, its verdicts, and
/// where it stands (joined, left, restored).
struct session_membership {
  std::shared_ptr<gloo::rendezvous::Store> kv;
  std::string prefix;
  std::unique_ptr<worker_policy> policy;
  std::chrono::milliseconds verdict_wait{10000};
  bool attached = false;
  std::optional<error> standby_error;  ///< a spare's release went wrong: attach() reports it
  bool left = false;  ///< Leave sent (or nobody to tell)
  bool joined = false;  ///< the coordinator knows this worker as a member
  uint64_t restored_step = 0;
  bool restored_any = false;  ///< attach() restored a checkpoint (at restored_step)
  /// Recovery in place (runtime/coordination/agreement.hpp): this process
  /// replaces a lost rank (GRACE_REPLACEMENT), serves its state to peers
  /// from `donor` (started at attach when it can recover in place), and
  /// has recovered this many times.
  bool replacement = false;
  std::unique_ptr<state_server> donor;
  uint64_t recoveries = 0;
};

/// The save pipeline: where checkpoints go, the snapshot buffers, the
/// writer and its answers, and when the next periodic save is due.
struct session_saves {
  std::unique_ptr<checkpoint_store> store;
  std::unique_ptr<checkpoint_store> fallback_store;  ///< opts.fallback_checkpoint_dir (may be null)
  std::shared_ptr<snapshot_buffers> buffers;
  checkpoint_writer_actor writer;
  int writes_in_flight = 0;
  /// The newest save as the writer answered it: a later agreement for the
  /// same step (a just-in-time round after a loss during the save) reports
  /// it instead of writing it again. Trainer thread only.
  std::optional<save_outcome> last_save;
  int64_t last_periodic_ns = 0;
  std::optional<save_interval> auto_interval;  ///< --save-every auto
  double announced_interval_s = 0;             ///< the interval last logged
  save_backoff periodic_retry;                 ///< failed periodic saves
  /// Keeps the snapshot buffers resident: idle pages are handed back to the
  /// host by the VM, and a snapshot into cold pages runs ~10x slower.
  /// Read-only touches, so it may run during a capture or a write.
  struct {
    std::thread thread;
    std::mutex m;
    std::condition_variable cv;
    bool stop = false;
  } warm;
};

/// The session's state: what it owns is grouped above; what is left here
/// is the step boundary (which step, in a step or not, how it ended).
struct session::impl {
  options opts;
  cluster_config cluster;
  /// What this job's checkpoints are signed with (none: unsigned), every
  /// store of the session reads and writes with it (choose_key).
  std::optional<checkpoint_key> ckpt_key;
  std::shared_ptr<spdlog::logger> log;
  session_registry reg;
  session_wiring wire;
  session_membership member;
  session_saves saves;
  uint64_t completed = 0;
  int code = 0;
  std::string reason;
  int64_t attached_ns = 0;
  bool first_step_logged = false;
  bool in_step = false;  // between begin() and complete() / a failure
  int64_t step_t0 = 0;

  void start_warmer();
  void stop_warmer();

  // ---------------------------------------------------------------- helpers

  /// From the trainer thread's actor: the coordinator accepts a member's
  /// messages only from the process that joined as it (an anonymous
  /// message carries no sender to check).
  template <class M>
  void to_coordinator(M m) {
    if (wire.self)
      (*wire.self)->send(wire.coord->get(), std::move(m));
    else
      caf::anon_send(wire.coord->get(), std::move(m));
  }

  checkpoint_meta meta_for(uint64_t step, checkpoint_kind kind);

  static std::string blob_key(const std::string& name) { return "grace.blob." + name; }

  /// The parts directory's name for a sharded save, the same on every rank:
  /// one per agreement (0: periodic and final saves) and incarnation.
  std::string part_tag(uint64_t agreement_id) const;

  /// Sharded state: the slices are sound, and periodic saves happen at the
  /// same steps on every rank (each writes its part of the same step).
  status check_sharding();

  /// Sharded state: the chief waits until its writer committed `step` from
  /// every rank's part (the service orders it once all are durable).
  status wait_for_commit(uint64_t step);

  /// The registered blobs, base64 in the metadata; an error names the blob.
  status add_blobs(checkpoint_meta& m);

  /// Hands every registered blob its restored bytes (attach, after a
  /// restore): this rank's own, where a sharded checkpoint has them.
  status restore_blobs(const restored_checkpoint& r, const rank_state& own);

  /// Reports a save of `step` that is already on disk under agreement `id`.
  bool reuse_save(uint64_t step, uint64_t id);

  /// A save that never reached the writer (a blob or the capture failed).
  status failed_save(uint64_t step, checkpoint_kind kind, uint64_t id, const error& e, int64_t snap_ns);

  /// What an answer of the writer tells the trainer: the newest save (for
  /// reuse) and, when it succeeded, its duration (grace-period margin).
  void absorb(const save_outcome& o);

  /// A periodic save that failed is a warning: training goes on and the
  /// save is tried again after a growing delay (save_backoff).
  void periodic_result(const save_outcome& o);

  /// Takes the writer's answers: all that are due (`block`: waits for the
  /// writes in flight), or only those already in the mailbox. Returns the
  /// last one taken.
  std::optional<save_outcome> take_answers(bool block);

  /// Snapshot (blocking the trainer only for the copy), then the writer
  /// writes it. `sync`: wait for the commit. The writer reports to the
  /// coordinator when `agreement_id` is set.
  status save(uint64_t step, checkpoint_kind kind, uint64_t agreement_id, bool sync, bool make_room = false);

  /// A save the trainer does not wait for: the copy first (the trainer's
  /// stall is the copy alone), then the writer.
  status capture_then_write(save_request req);

  /// A save the trainer waits for (preemption, grace period, just in time,
  /// the final one): the writer starts while the copy runs and writes each
  /// piece once it is in, so the save takes the longer of the two instead
  /// of their sum. Not for periodic saves: the writer's copy competes with
  /// the capture for memory bandwidth and lengthens the trainer's stall.
  status capture_while_written(save_request req);

  /// No abort may reach the communicator from now on (see
  /// control_block::disarm): the trainer is about to tear it down.
  void disarm_abort() { wire.ctl->disarm(); }

  /// Tells the coordinator this worker leaves on purpose, and waits for its
  /// answer (at most the verdict wait: by then a live service has answered
  /// or its loss is known). Once answered, the coordinator no longer treats
  /// this process's exit as a lost member (no PeerLost, no kill by the
  /// launcher).
  void leave(int c);

  /// An attach that fails after the join leaves with the exit code the
  /// caller will use (runtime/base/exit_codes.hpp), so the service does not take
  /// the exit for a lost member: a loss restarts every node, a usage error
  /// must stop them.
  error leave_failed_attach(error e);

  step_result stop(int c, std::string why, bool may_throw = true);
  status choose_key(secret_mode secret);

  status restore();
  result<restored_checkpoint> restore_newest();
  status start_actors();
  status join();
  void start_signal_watcher();
  void maybe_periodic_save(uint64_t k);
  void auto_periodic_save(uint64_t k);
  void remove_backups();
  status finish_sharded();
  void finish_barrier();

  /// The rare path, entered before step k (k - 1 completed) when the flag
  /// is set, or after step k failed (`mode`). Carries out the policy's
  /// decisions until one says run (nullopt) or stop.
  std::optional<step_result> boundary(uint64_t k, boundary_mode mode, const std::string& error = {},
                                      bool may_throw = true);

  void ack_jit(const worker_decision& d);

  /// Recovery in place: whether this worker can take part (the launcher
  /// replaces lost workers, the trainer re-forms its collectives, the state
  /// is replicated and in host memory), and its state server if so.
  bool can_recover_in_place() const;
  void start_state_server();
  /// Carries out recovery order `d` (session_recover.cpp): takes the
  /// donor's state when not at its step, or serves it as the donor; then
  /// the collectives are formed again under the order's prefix and the
  /// service hears this worker recovered. An error of the transfer leaves
  /// the state torn (errc::failed / disconnected / invalid_input from
  /// fetch_state, `torn` set): the caller stops; an error of the re-form
  /// waits for the verdict like a failed collective.
  status recover_in_place(const worker_decision& d, bool& torn);
  /// A replacement's attach: waits for its recovery order and carries it out.
  status await_recovery();

  status reach(const worker_decision& d);

  void propose_final(const worker_decision& d);

  /// Step k raised: a collective that failed (or any error while a failure
  /// is already known) waits for the cluster's verdict; an error of the
  /// step's own is reported to everyone first.
  step_result after_step_error(uint64_t k, bool collective, const std::string& what);

  /// Before step k = completed + 1: nullopt to run it, or a stop.
  std::optional<step_result> begin();

  /// Step k finished: count it; the chief takes a periodic save when due.
  void complete(uint64_t k);

  /// Sharded state with replicas: this rank's part of step k, with the
  /// counters and blobs of step k, into a kept copy (shipped to its holder).
  void keep_copy(uint64_t k);

  /// Sharded state in node-local directories (declared by the launcher):
  /// the ranks per node, else 0.
  uint32_t node_local_world() const;
  /// Who commits this node's parts and keeps its directory tidy: the
  /// node's first rank (node-local), else the chief.
  bool dir_keeper() const;

  /// Sharded state on several ranks: every rank's checkpoint directory is
  /// rank 0's (runtime/checkpoint/shared_dir.hpp), or with node-local directories
  /// declared every node's ranks share one and no two nodes do; else every
  /// rank stops with the same clear error before its first step.
  status check_shared_dir();

  /// Starts the replicas (sharded state on several ranks, unless turned off).
  status start_replicas();

  /// Node-local sharded checkpoints with a memory directory from the
  /// launcher: the store on it that this rank mirrors its source's parts
  /// into (runtime/checkpoint/replica.hpp); else null.
  std::shared_ptr<checkpoint_store> mirror_store() const;

  /// Just in time from copies: this rank's kept copy of the agreed step,
  /// and the part of each lost rank whose replica it holds.
  status save_kept(const worker_decision& d);
};

}  // namespace grace
