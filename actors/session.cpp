// The embedding API's implementation and the worker's composition root:
// which actor runs where (peer watcher on the scheduler, checkpoint writer
// detached on its own thread, signal watcher on a thread of its own, the
// trainer on the caller's thread).
#include "actors/session.hpp"

#include "actors/checkpoint_writer.hpp"
#include "actors/coordinator_ref.hpp"
#include "runtime/base/guarded.hpp"
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

namespace grace {

namespace {

/// The kept copies and the replica held, frozen for a just-in-time round;
/// nothing without replicas (or before attach() started them).
replica_report freeze_copies(const guarded<std::shared_ptr<replica_keeper>>& replicas) {
  auto keeper = replicas.get();
  return keeper ? keeper->freeze() : replica_report{};
}

/// Workers per node (grace-launch's LOCAL_WORLD_SIZE); 0 when unknown.
uint32_t local_world_size() {
  const char* v = std::getenv("LOCAL_WORLD_SIZE");
  return v ? static_cast<uint32_t>(std::strtoul(v, nullptr, 10)) : 0;
}

}  // namespace

struct session::impl {
  options opts;
  cluster_config cluster;
  std::shared_ptr<spdlog::logger> log;
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

  /// GRACE_TLS_*: certificates for the coordination traffic (runtime/net/tls.hpp).
  tls_files tls;
  std::unique_ptr<actor_runtime> rt;
  /// The coordination service, swapped by the peer watcher if it moves
  /// (etcd failover); read for each message.
  std::shared_ptr<coordinator_ref> coord = std::make_shared<coordinator_ref>();
  bool hosts_coordinator = false;
  peer_watcher_actor watcher;
  std::shared_ptr<control_block> ctl = std::make_shared<control_block>();
  std::unique_ptr<signal_watcher> signals;
  std::unique_ptr<checkpoint_store> store;
  std::unique_ptr<checkpoint_store> fallback_store;  ///< opts.fallback_checkpoint_dir (may be null)
  std::shared_ptr<snapshot_buffers> buffers;
  checkpoint_writer_actor writer;
  /// The trainer thread's mailbox for the writer's answers.
  std::unique_ptr<caf::scoped_actor> self;
  int writes_in_flight = 0;
  /// The newest save as the writer answered it: a later agreement for the
  /// same step (a just-in-time round after a loss during the save) reports
  /// it instead of writing it again. Trainer thread only.
  std::optional<save_outcome> last_save;
  std::shared_ptr<gloo::rendezvous::Store> kv;
  std::string prefix;
  std::unique_ptr<worker_policy> policy;
  std::chrono::milliseconds verdict_wait{10000};
  // Keeps the snapshot buffers resident: idle pages are handed back to the
  // host by the VM, and a snapshot into cold pages runs ~10x slower.
  // Read-only touches, so it may run during a capture or a write.
  std::thread warmer;
  std::mutex warm_m;
  std::condition_variable warm_cv;
  bool warm_stop = false;

  void start_warmer() {
    warmer = std::thread([this] {
      std::unique_lock<std::mutex> lk(warm_m);
      while (!warm_cv.wait_for(lk, std::chrono::seconds(2), [this] { return warm_stop; })) {
        buffers->keep_warm();
        store->keep_io_warm();
      }
    });
  }
  void stop_warmer() {
    {
      std::lock_guard<std::mutex> g(warm_m);
      warm_stop = true;
    }
    warm_cv.notify_all();
    if (warmer.joinable()) warmer.join();
  }

  bool attached = false;
  std::optional<error> standby_error;  ///< a spare's release went wrong: attach() reports it
  bool left = false;  ///< Leave sent (or nobody to tell)
  bool joined = false;  ///< the coordinator knows this worker as a member
  uint64_t completed = 0;
  uint64_t restored_step = 0;
  bool restored_any = false;  ///< attach() restored a checkpoint (at restored_step)
  int code = 0;
  std::string reason;
  int64_t last_periodic_ns = 0;
  int64_t attached_ns = 0;
  std::optional<save_interval> auto_interval;  ///< --save-every auto
  double announced_interval_s = 0;             ///< the interval last logged
  save_backoff periodic_retry;                 ///< failed periodic saves
  bool first_step_logged = false;
  bool in_step = false;  // between begin() and complete() / a failure
  int64_t step_t0 = 0;

  // ---------------------------------------------------------------- helpers

  /// From the trainer thread's actor: the coordinator accepts a member's
  /// messages only from the process that joined as it (an anonymous
  /// message carries no sender to check).
  template <class M>
  void to_coordinator(M m) {
    if (self)
      (*self)->send(coord->get(), std::move(m));
    else
      caf::anon_send(coord->get(), std::move(m));
  }

  checkpoint_meta meta_for(uint64_t step, checkpoint_kind kind) {
    checkpoint_meta m;
    m.step = step;
    m.world_size = static_cast<int>(cluster.world_size);
    m.run_id = cluster.run_id;
    m.incarnation = cluster.incarnation;
    m.kind = kind;
    for (auto& [name, p] : counters) m.counters[name] = *p;
    m.metadata["grace.saved_by_rank"] = std::to_string(cluster.rank);
    if (!cluster.group_nodes.empty()) m.metadata["grace.group_nodes"] = cluster.group_nodes;
    return m;
  }

  static std::string blob_key(const std::string& name) { return "grace.blob." + name; }

  /// The parts directory's name for a sharded save, the same on every rank:
  /// one per agreement (0: periodic and final saves) and incarnation.
  std::string part_tag(uint64_t agreement_id) const {
    return "i" + std::to_string(cluster.incarnation) + (agreement_id ? "-a" + std::to_string(agreement_id) : "-p");
  }

  /// Sharded state: the slices are sound, and periodic saves happen at the
  /// same steps on every rank (each writes its part of the same step).
  status check_sharding() {
    for (auto& t : tensors) {
      if (auto why = slice_problem(t); !why.empty()) return error{errc::invalid_input, why};
      sharded |= t.sharded();
    }
    if (!sharded) return {};
    if (cluster.node_local_checkpoints && cluster.world_size > 1 && local_world_size() == 0)
      return error{errc::invalid_input,
                   "node-local checkpoint directories (GRACE_NODE_LOCAL_CHECKPOINTS=1) need LOCAL_WORLD_SIZE, the "
                   "ranks per node (grace-launch sets both)"};
    if (opts.save_every_auto || opts.save_every_seconds > 0)
      return error{errc::invalid_input,
                   "sharded state: periodic saves must be every N steps (--save-every N), since every rank writes its "
                   "part of the same step; a time-based or automatic interval differs between ranks"};
    if (!opts.fallback_checkpoint_dir.empty())
      log->warn("sharded state: the fallback checkpoint directory is not used (every rank's part goes to {})",
                opts.checkpoint_dir);
    return {};
  }

  /// Sharded state: the chief waits until its writer committed `step` from
  /// every rank's part (the service orders it once all are durable).
  status wait_for_commit(uint64_t step) {
    auto until = std::chrono::steady_clock::now() + opts.save_timeout;
    while (store->newest_valid_step() < step) {
      if (auto why = ctl->commit_failure(step)) return error{errc::failed, "the commit failed: " + *why};
      if (ctl->failure_known() || ctl->coordinator_gone())
        return error{errc::failed, "a member or the coordination service was lost before every part of step " +
                                       std::to_string(step) + " was durable"};
      if (std::chrono::steady_clock::now() > until)
        return error{errc::failed, "the parts of step " + std::to_string(step) + " were not committed within " +
                                       std::to_string(opts.save_timeout.count()) + " ms"};
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return {};
  }

  /// The registered blobs, base64 in the metadata; an error names the blob.
  status add_blobs(checkpoint_meta& m) {
    for (auto& [name, h] : blobs) {
      std::string bytes;
      try {
        bytes = h.save();
      } catch (const std::exception& e) {
        return error{errc::failed, "blob '" + name + "': its save callback raised: " + e.what()};
      }
      if (bytes.size() > max_blob_bytes)
        return error{errc::invalid_input, "blob '" + name + "' is " + std::to_string(bytes.size()) +
                                              " bytes, above the " + std::to_string(max_blob_bytes) +
                                              "-byte limit for manifest blobs: register it as a tensor"};
      m.metadata[blob_key(name)] = base64_encode(bytes);
    }
    return {};
  }

  /// Hands every registered blob its restored bytes (attach, after a
  /// restore): this rank's own, where a sharded checkpoint has them.
  status restore_blobs(const restored_checkpoint& r, const rank_state& own) {
    for (auto& [name, h] : blobs) {
      auto it = own.metadata.find(blob_key(name));
      if (it == own.metadata.end())
        return error{errc::invalid_input, r.path.string() + " has no blob '" + name +
                                              "': it was written by a trainer that did not register it"};
      auto bytes = base64_decode(it->second);
      if (!bytes)
        return error{errc::invalid_input, "blob '" + name + "' in " + r.path.string() + " is not valid base64"};
      try {
        h.restore(*bytes);
      } catch (const std::exception& e) {
        return error{errc::invalid_input,
                     "restoring blob '" + name + "' from " + r.path.string() + " failed: " + e.what()};
      }
    }
    return {};
  }

  /// Reports a save of `step` that is already on disk under agreement `id`.
  bool reuse_save(uint64_t step, uint64_t id) {
    if (!last_save || last_save->step != step || !last_save->ok) return false;
    log->info("checkpoint step {} is already on disk: reporting it for agreement #{}", step, id);
    if (id == 0) return true;
    auto o = *last_save;
    o.agreement_id = id;
    to_coordinator(saved_report(cluster.rank, o));
    return true;
  }

  /// A save that never reached the writer (a blob or the capture failed).
  status failed_save(uint64_t step, checkpoint_kind kind, uint64_t id, const error& e, int64_t snap_ns) {
    log->error("checkpoint step {} not taken: {}", step, e.message);
    emit_event("save_failed", {{"step", step}, {"kind", to_string(kind)}, {"error", e.message}});
    save_outcome o;
    o.step = step;
    o.kind = kind;
    o.agreement_id = id;
    o.error = e.message;
    o.snap_ns = snap_ns;
    if (id) to_coordinator(saved_report(cluster.rank, o));
    absorb(o);
    return e;
  }

  /// What an answer of the writer tells the trainer: the newest save (for
  /// reuse) and, when it succeeded, its duration (grace-period margin).
  void absorb(const save_outcome& o) {
    last_save = o;
    if (o.ok && policy) policy->save_time(o.save_ns);
    if (o.kind == checkpoint_kind::periodic) periodic_result(o);
  }

  /// A periodic save that failed is a warning: training goes on and the
  /// save is tried again after a growing delay (save_backoff).
  void periodic_result(const save_outcome& o) {
    auto& b = periodic_retry;
    if (o.ok) {
      if (b.pending())
        log->info("periodic checkpoints resumed at step {} after {} failed attempt(s)", o.step, b.failures());
      b.succeeded();
      return;
    }
    auto delay = b.failed(mono_ns());
    log->warn("periodic checkpoint of step {} failed ({}); training goes on, next attempt in {:.1f} s{}", o.step,
              o.error, delay / 1e9, opts.prune_on_save_failure ? " (older checkpoints removed first)" : "");
    emit_event("save_retry", {{"step", o.step}, {"error", o.error}, {"in_s", delay / 1e9}, {"failures", b.failures()}});
  }

  /// Takes the writer's answers: all that are due (`block`: waits for the
  /// writes in flight), or only those already in the mailbox. Returns the
  /// last one taken.
  std::optional<save_outcome> take_answers(bool block) {
    std::optional<save_outcome> last;
    bool more = writes_in_flight > 0;
    while (more) {
      auto on_answer = [&](save_outcome& o) {
        --writes_in_flight;
        absorb(o);
        last = std::move(o);
        more = writes_in_flight > 0;
      };
      auto on_down = [&](caf::down_msg& d) {
        log->error("the checkpoint writer is gone ({}): {} write(s) lost", rt->sys().render(d.reason),
                   writes_in_flight);
        writes_in_flight = 0;
        more = false;
      };
      if (block)
        (*self)->receive(on_answer, on_down);
      else
        (*self)->receive(
            on_answer, on_down, caf::after(std::chrono::seconds(0)) >> [&] { more = false; });
    }
    return last;
  }

  /// Snapshot (blocking the trainer only for the copy), then the writer
  /// writes it. `sync`: wait for the commit. The writer reports to the
  /// coordinator when `agreement_id` is set.
  status save(uint64_t step, checkpoint_kind kind, uint64_t agreement_id, bool sync, bool make_room = false) {
    take_answers(true);  // the buffers of the previous write are free again
    if (!sharded && reuse_save(step, agreement_id)) return {};
    auto meta = meta_for(step, kind);
    if (auto b = add_blobs(meta); !b) return failed_save(step, kind, agreement_id, b.err(), 0);
    if (buffers->busy())  // the writer died holding them: its write may still read them
      return failed_save(step, kind, agreement_id, error{errc::overloaded, "the snapshot buffers are still being written"}, 0);
    if (auto st = buffers->check(tensors); !st) return failed_save(step, kind, agreement_id, st.err(), 0);
    // Periodic saves only: a save the trainer waits for (a deadline's) gets
    // the memory bandwidth to itself, and the exit after it no mirror to wait for.
    if (sharded && !sync)
      if (auto keeper = replicas->get()) keeper->mirror(step, meta, part_tag(agreement_id));
    save_request req{buffers, std::move(meta), agreement_id, 0, make_room};
    if (sharded) {
      req.part_tag = part_tag(agreement_id);
      req.with_replicated = cluster.is_chief();
    }
    auto st = sync ? capture_while_written(std::move(req)) : capture_then_write(std::move(req));
    if (!st) return st;
    if (policy) policy->saved(step);
    if (!sync) return {};
    auto o = take_answers(true);
    if (!o || !o->ok) return error{errc::failed, o ? o->error : "the checkpoint writer is gone"};
    return {};
  }

  /// A save the trainer does not wait for: the copy first (the trainer's
  /// stall is the copy alone), then the writer.
  status capture_then_write(save_request req) {
    auto step = req.meta.step;
    auto kind = req.meta.kind;
    auto t0 = mono_ns();
    auto st = buffers->capture(tensors);
    req.snap_ns = mono_ns() - t0;
    if (!st) return failed_save(step, kind, req.agreement_id, st.err(), req.snap_ns);
    emit_event("snapshot_done", {{"step", step}, {"kind", to_string(kind)}, {"ns", req.snap_ns}});
    buffers->set_busy(true);
    (*self)->send(writer, save_atom::value, std::move(req));
    ++writes_in_flight;
    return {};
  }

  /// A save the trainer waits for (preemption, grace period, just in time,
  /// the final one): the writer starts while the copy runs and writes each
  /// piece once it is in, so the save takes the longer of the two instead
  /// of their sum. Not for periodic saves: the writer's copy competes with
  /// the capture for memory bandwidth and lengthens the trainer's stall.
  status capture_while_written(save_request req) {
    auto step = req.meta.step;
    auto kind = req.meta.kind;
    req.overlapped = true;
    req.begin_ns = mono_ns();
    buffers->begin_capture();
    buffers->set_busy(true);
    (*self)->send(writer, save_atom::value, std::move(req));
    ++writes_in_flight;
    auto t0 = mono_ns();
    auto st = buffers->copy_in(tensors);
    if (!st) {
      // The writer gives the save up at once and reports it; its answer is
      // taken before anything else is sent (a Leave must not overtake it).
      log->error("checkpoint step {} not taken: {}", step, st.err().message);
      take_answers(true);
      return st;
    }
    emit_event("snapshot_done", {{"step", step}, {"kind", to_string(kind)}, {"ns", mono_ns() - t0}});
    return {};
  }

  /// No abort may reach the communicator from now on (see
  /// control_block::disarm): the trainer is about to tear it down.
  void disarm_abort() { ctl->disarm(); }

  /// Tells the coordinator this worker leaves on purpose, and waits for its
  /// answer (at most the verdict wait: by then a live service has answered
  /// or its loss is known). Once answered, the coordinator no longer treats
  /// this process's exit as a lost member (no PeerLost, no kill by the
  /// launcher).
  void leave(int c) {
    if (left || !joined || !rt || ctl->coordinator_gone()) return;  // told already, or nobody to tell
    auto m = make<proto::Leave>([&](auto b) {
      b.setRank(cluster.rank);
      b.setExitCode(c);
    });
    left = true;
    caf::scoped_actor self{rt->sys()};
    self->request(coord->get(), verdict_wait, std::move(m))
        .receive([](bool) {},
                 [&](caf::error& e) { log->warn("leave: no answer from the coordinator: {}", rt->sys().render(e)); });
  }

  /// An attach that fails after the join leaves with the exit code the
  /// caller will use (runtime/base/exit_codes.hpp), so the service does not take
  /// the exit for a lost member: a loss restarts every node, a usage error
  /// must stop them.
  error leave_failed_attach(error e) {
    leave(attach_failure_exit(e.code, opts.restart_exit_code));
    return e;
  }

  step_result stop(int c, std::string why, bool may_throw = true) {
    disarm_abort();
    code = c;
    reason = std::move(why);
    log->info("stopping with exit code {}: {}", c, reason);
    emit_event("exit", {{"code", c}, {"reason", reason}, {"step", completed}});
    leave(c);
    if (may_throw && opts.throw_on_stop) throw stop_requested(c, reason);
    return step_result::stop;
  }

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
                                      bool may_throw = true) {
    using ty = worker_decision::type;
    const uint64_t c = k - 1;
    for (;;) {
      take_answers(false);  // saves finished meanwhile: the margin's save times
      auto s = ctl->take_snapshot();
      boundary_input in{c, mode, mono_ns(), wall_ns(), error};
      auto d = policy->next(s, in);
      switch (d.what) {
        case ty::run: return std::nullopt;
        case ty::run_clear:
          if (ctl->clear_pending_if_unchanged(s.version)) return std::nullopt;
          continue;  // something arrived meanwhile: decide again
        case ty::ack_jit: ack_jit(d); continue;
        case ty::reach:
          if (d.save && d.kind == checkpoint_kind::jit && opts.broken.no_just_in_time_save)
            return stop(opts.restart_exit_code, "just-in-time save disabled (broken on purpose)", may_throw);
          if (auto st = reach(d); !st)
            return stop(exit_code::fatal, "checkpoint save failed: " + st.err().message, may_throw);
          continue;
        case ty::continue_grace:
          ctl->clear_order(d.id);
          policy->grace_continues();
          log->info("grace period: training continues after the save at step {}", c);
          continue;
        case ty::propose_final: propose_final(d); return std::nullopt;
        case ty::save_own:
          log->warn("coordination service lost: the chief saves step {} before exiting", d.step);
          if (auto st = save(d.step, checkpoint_kind::jit, 0, true); !st)
            return stop(opts.restart_exit_code,
                        "coordination service lost, and the chief's save of step " + std::to_string(d.step) +
                            " failed: " + st.err().message,
                        may_throw);
          continue;
        case ty::wait:
          if (d.new_wait)
            log->info("step boundary {}: waiting for {} (at most {} ms)", c, to_string(d.reason),
                      (d.deadline_ns - in.mono_ns) / 1000000);
          ctl->wait_for_change(s.version,
                               std::chrono::steady_clock::time_point(std::chrono::nanoseconds(d.deadline_ns)));
          continue;
        case ty::stop: return stop(d.code, d.message, may_throw);
      }
    }
  }

  void ack_jit(const worker_decision& d) {
    log->warn("peer lost: stopped at step {}, reporting it for a just-in-time save", d.step);
    auto copies = freeze_copies(*replicas);
    to_coordinator(make<proto::Ack>([&](auto b) {
      b.setAgreementId(d.id);
      b.setRank(cluster.rank);
      b.setEarliestStep(d.step);
      set_copies(b, copies);
    }));
    policy->acked(d.id);
  }

  status reach(const worker_decision& d) {
    emit_event("reached_agreed_step", {{"step", d.step}, {"id", d.id}});
    policy->reached(d.id);
    if (!d.save) return {};
    if (d.from_kept) return save_kept(d);
    if (d.kind == checkpoint_kind::jit)
      log->warn("saving a just-in-time checkpoint at step {} (the most advanced survivor)", d.step);
    return save(d.step, d.kind, d.id, d.sync);
  }

  void propose_final(const worker_decision& d) {
    log->info("grace period: {} ms left, margin {} ms: proposing the final save", d.left_ns / 1000000,
              d.margin_ns / 1000000);
    emit_event("propose_final", {{"left_ns", d.left_ns}, {"margin_ns", d.margin_ns}, {"step", d.step}});
    to_coordinator(make<proto::ProposeFinal>([&](auto b) {
      b.setRank(cluster.rank);
      b.setStartedStep(d.step);
    }));
    policy->proposed_final();
  }

  /// Step k raised: a collective that failed (or any error while a failure
  /// is already known) waits for the cluster's verdict; an error of the
  /// step's own is reported to everyone first.
  step_result after_step_error(uint64_t k, bool collective, const std::string& what) {
    in_step = false;
    // An error while a failure is known is its consequence (an aborted
    // collective surfacing as some other exception).
    if (!collective) collective = ctl->failure_known();
    if (collective) {
      log->warn("step {} failed in a collective: {}", k, what);
      if (auto s = boundary(k, boundary_mode::collective_failed)) return *s;
      return stop(opts.restart_exit_code, "collective failed: " + what);
    }
    log->error("step {} raised: {}", k, what);
    emit_event("step_error", {{"step", k}, {"message", what}});
    to_coordinator(make<proto::ErrorReport>([&](auto b) {
      b.setRank(cluster.rank);
      b.setStep(k);
      b.setMessage(what);
    }));
    if (auto s = boundary(k, boundary_mode::own_error, what)) return *s;
    return stop(exit_code::fatal, "error in step " + std::to_string(k) + ": " + what);
  }

  /// Before step k = completed + 1: nullopt to run it, or a stop.
  std::optional<step_result> begin() {
    if (!attached) return stop(exit_code::usage, "a step before attach()");
    const uint64_t k = completed + 1;
    ctl->started.store(k, std::memory_order_seq_cst);
    if (ctl->pending.load(std::memory_order_seq_cst)) {
      if (auto s = boundary(k, boundary_mode::step_start)) return s;
    }
    in_step = true;
    step_t0 = mono_ns();
    return std::nullopt;
  }

  /// Step k finished: count it; the chief takes a periodic save when due.
  void complete(uint64_t k) {
    in_step = false;
    auto dt = mono_ns() - step_t0;
    completed = k;
    ctl->completed.store(k, std::memory_order_seq_cst);
    ctl->last_step_ns.store(dt, std::memory_order_relaxed);
    policy->step_time(dt);
    if (!first_step_logged) {
      first_step_logged = true;
      emit_event("first_step", {{"step", k}, {"ns", dt}});
    }
    keep_copy(k);
    if (cluster.is_chief() || sharded) maybe_periodic_save(k);
  }

  /// Sharded state with replicas: this rank's part of step k, with the
  /// counters and blobs of step k, into a kept copy (shipped to its holder).
  void keep_copy(uint64_t k) {
    auto keeper = replicas->get();
    if (!keeper) return;
    auto meta = meta_for(k, checkpoint_kind::jit);
    auto st = add_blobs(meta);
    if (st) st = keeper->keep(k, kept_layout, std::move(meta));
    if (!st) log->warn("replicas: step {} not kept: {}", k, st.err().message);
  }

  /// Sharded state in node-local directories (declared by the launcher):
  /// the ranks per node, else 0.
  uint32_t node_local_world() const {
    return sharded && cluster.node_local_checkpoints && cluster.world_size > 1 ? local_world_size() : 0;
  }
  /// Who commits this node's parts and keeps its directory tidy: the
  /// node's first rank (node-local), else the chief.
  bool dir_keeper() const {
    const auto lw = node_local_world();
    return lw ? cluster.rank % lw == 0 : cluster.is_chief();
  }

  /// Sharded state on several ranks: every rank's checkpoint directory is
  /// rank 0's (runtime/checkpoint/shared_dir.hpp), or with node-local directories
  /// declared every node's ranks share one and no two nodes do; else every
  /// rank stops with the same clear error before its first step.
  status check_shared_dir() {
    if (!sharded || cluster.world_size < 2 || !kv || opts.checkpoint_dir.empty()) return {};
    shared_dir_probe p;
    p.dir = opts.checkpoint_dir;
    p.rank = cluster.rank;
    p.world = cluster.world_size;
    p.incarnation = cluster.incarnation;
    p.local_world = local_world_size();
    p.prefix = prefix;
    p.timeout = opts.wait_timeout;
    p.node_local = node_local_world() > 0;
    auto st = p.node_local ? check_node_local_directories(p, *kv) : check_shared_directory(p, *kv);
    if (!st) log->error("{}", st.err().message);
    return st;
  }

  /// Starts the replicas (sharded state on several ranks, unless turned off).
  status start_replicas() {
    if (!sharded || !opts.replicas || cluster.world_size < 2 || !kv) return {};
    for (auto& t : tensors)
      if (t.sharded() || cluster.is_chief()) kept_layout.push_back(t);
    replica_keeper::config rc;
    rc.rank = cluster.rank;
    rc.world = cluster.world_size;
    rc.local_world = local_world_size();
    rc.host = cluster.host;
    rc.token = cluster.token;
    rc.kv = kv;
    rc.prefix = prefix;
    rc.log = log;
    rc.mirror = mirror_store();
    auto k = replica_keeper::start(rc, kept_layout);
    if (!k) return k.err();
    std::shared_ptr<replica_keeper> keeper = std::move(*k);
    size_t bytes = 0;
    for (auto& t : kept_layout) bytes += t.bytes();
    log->info("replicas: this rank keeps copies of its part ({:.2f} MiB) and of rank {}'s; rank {} keeps a copy of "
              "this rank's",
              bytes / 1048576.0, keeper->source(), keeper->holder());
    replicas->set(std::move(keeper));
    return {};
  }

  /// Node-local sharded checkpoints with a memory directory from the
  /// launcher: the store on it that this rank mirrors its source's parts
  /// into (runtime/checkpoint/replica.hpp); else null.
  std::shared_ptr<checkpoint_store> mirror_store() const {
    if (!node_local_world() || cluster.memory_dir.empty()) return nullptr;
    std::error_code ec;
    std::filesystem::create_directories(cluster.memory_dir, ec);
    if (ec) {
      log->warn("replicas: cannot use the memory directory {} ({}): parts are not mirrored there", cluster.memory_dir,
                ec.message());
      return nullptr;
    }
    auto store = std::make_shared<checkpoint_store>(cluster.memory_dir, 0);
    store->set_direct_io(false);  // tmpfs has no O_DIRECT, and needs none
    return store;
  }

  /// Just in time from copies: this rank's kept copy of the agreed step,
  /// and the part of each lost rank whose replica it holds.
  status save_kept(const worker_decision& d) {
    auto keeper = replicas->get();
    auto own = keeper ? keeper->kept(d.step) : std::nullopt;
    if (!own)
      return failed_save(d.step, checkpoint_kind::jit, d.id,
                         error{errc::failed, "no kept copy of step " + std::to_string(d.step)}, 0);
    take_answers(true);
    save_request req{own->buffers, own->meta, d.id, 0, false};
    req.meta.kind = checkpoint_kind::jit;
    req.part_tag = part_tag(d.id);
    req.with_replicated = true;  // the kept copy holds exactly this rank's part
    for (auto q : d.from_replica) {
      if (q != keeper->source()) continue;
      auto bytes = keeper->replica(d.step);
      if (!bytes)
        return failed_save(d.step, checkpoint_kind::jit, d.id,
                           error{errc::failed, "no whole replica of rank " + std::to_string(q) + "'s part at step " +
                                                   std::to_string(d.step)},
                           0);
      log->warn("writing rank {}'s part of step {} from the replica this rank keeps", q, d.step);
      req.replica_parts.push_back({q, std::move(bytes), keeper->replica_state(d.step)});
    }
    log->warn("saving a just-in-time checkpoint at step {} from this rank's kept copy", d.step);
    own->buffers->set_busy(true);
    (*self)->send(writer, save_atom::value, std::move(req));
    ++writes_in_flight;
    auto o = take_answers(true);
    if (!o || !o->ok) return error{errc::failed, o ? o->error : "the checkpoint writer is gone"};
    return {};
  }
};

session::session(options opts) : impl_(std::make_unique<impl>()) {
  if (auto released = await_standby_release(); !released) impl_->standby_error = released.err();
  block_termination_signals();
  impl_->opts = std::move(opts);
  impl_->log = impl_->opts.log ? impl_->opts.log : spdlog::default_logger();
}

session::~session() {
  if (!impl_) return;
  impl_->disarm_abort();
  if (impl_->signals) impl_->signals->stop();
  impl_->stop_warmer();
  if (impl_->self) impl_->take_answers(true);
  impl_->self.reset();
  if (impl_->rt) {
    caf::anon_send_exit(impl_->writer, caf::exit_reason::user_shutdown);
    // A detached actor's thread ends only once its last handle is gone, and
    // the actor system's destructor waits for that thread.
    impl_->writer = nullptr;
    caf::anon_send_exit(impl_->watcher, caf::exit_reason::user_shutdown);
    if (impl_->hosts_coordinator) caf::anon_send_exit(impl_->coord->get(), caf::exit_reason::user_shutdown);
  }
  impl_->replicas->set(nullptr);  // its threads use the store and the actor system
  impl_->kv.reset();
  impl_->rt.reset();
}

void session::register_tensor(tensor_ref t) { impl_->tensors.push_back(std::move(t)); }
void session::register_counter(const std::string& name, int64_t* value) { impl_->counters[name] = value; }
void session::register_blob(const std::string& name, std::function<std::string()> save,
                            std::function<void(const std::string&)> restore) {
  impl_->blobs[name] = impl::blob_hooks{std::move(save), std::move(restore)};
}

result<uint64_t> session::attach() {
  auto& d = *impl_;
  if (d.attached) return error{errc::invalid_input, "attach() called twice"};
  if (d.standby_error) return *d.standby_error;
  if (d.opts.cluster) {
    d.cluster = *d.opts.cluster;
  } else {
    auto c = cluster_from_environment();
    if (!c) return c.err();
    d.cluster = *c;
  }
  set_event_identity(d.cluster.rank, d.cluster.incarnation);
  d.tls = tls_files_from({}, [](const char* v) { return std::getenv(v); });
  if (auto st = check_tls_files(d.tls, "GRACE_TLS_"); !st) return st.err();
  if (d.cluster.host.empty()) {
    auto adv = advertised_address_from_environment(d.cluster.coordinator_host);
    if (!adv) return adv.err();
    d.cluster.host = adv->address;
    d.cluster.iface = adv->iface;
    d.cluster.host_source = adv->source;
  }
  d.log->info("grace: rank {}/{} (cluster from {}), incarnation {}, address {} ({}), checkpoints in {}", d.cluster.rank,
              d.cluster.world_size, d.cluster.source, d.cluster.incarnation, d.cluster.host, d.cluster.host_source,
              d.opts.checkpoint_dir);

  for (auto& t : d.tensors)
    if (t.memory == memory_kind::device && !device_copy_available())
      return error{errc::invalid_input, "tensor '" + t.name +
                                            "' is in device memory but no CUDA device-copy "
                                            "hook is registered (a CUDA build calls register_cuda_device_copy())"};
  if (auto st = d.check_sharding(); !st) return st.err();
  // Restore first, so the join carries the restored step.
  if (auto st = d.restore(); !st) return st.err();
  if (auto st = d.start_actors(); !st) return st.err();
  if (auto st = d.join(); !st) return st.err();
  d.joined = true;
  if (auto st = d.check_shared_dir(); !st) return d.leave_failed_attach(st.err());
  if (auto st = d.start_replicas(); !st) return st.err();
  d.start_signal_watcher();
  d.last_periodic_ns = d.attached_ns = mono_ns();
  d.periodic_retry =
      save_backoff(1'000'000'000, std::max<int64_t>(1'000'000'000, d.opts.save_retry_max.count() * 1'000'000));
  if (d.opts.save_every_auto)
    d.auto_interval.emplace(
        d.opts.mtbf_prior_seconds,
        read_failure_history((std::filesystem::path(d.opts.checkpoint_dir) / failure_history_file).string()));
  d.attached = true;
  return d.completed;
}

/// Restores from the fallback directory when it holds a newer checkpoint
/// (a preemption save the primary could not take), else from the primary.
result<restored_checkpoint> session::impl::restore_newest() {
  if (fallback_store) {
    const uint64_t primary = store->newest_valid_step();
    if (fallback_store->newest_valid_step() > primary) {
      auto r = fallback_store->restore_latest(tensors, buffers->regions());
      if (r && r->found && r->manifest.step > primary) {
        log->warn("restoring step {} from the fallback directory {}: the newest checkpoint in {} is step {}",
                  r->manifest.step, fallback_store->dir().string(), store->dir().string(), primary);
        return r;
      }
    }
  }
  return store->restore_latest(tensors, buffers->regions());
}

status session::impl::restore() {
  store = std::make_unique<checkpoint_store>(opts.checkpoint_dir, opts.keep_last);
  if (!opts.fallback_checkpoint_dir.empty()) {
    fallback_store = std::make_unique<checkpoint_store>(opts.fallback_checkpoint_dir, opts.keep_last);
    fallback_store->set_restoring_rank(cluster.rank, static_cast<int>(cluster.world_size));
  }
  if (opts.broken.restore_without_checksums) store->break_restore_checksums_on_purpose();
  if (opts.broken.keep_stale_temporaries) store->break_temporary_cleanup_on_purpose();
  store->set_aside_damaged_on_restore(true);
  store->set_restoring_rank(cluster.rank, static_cast<int>(cluster.world_size));
  if (cluster.is_chief()) store->remove_stale_temporaries();
  // The snapshot buffers first: the restore reads into them (warm pages,
  // and a checkpoint that fails verification never touches the tensors).
  buffers = std::make_shared<snapshot_buffers>(tensors);
  auto t0 = mono_ns();
  auto restored = restore_newest();
  if (!restored) return restored.err();
  for (auto& s : restored->skipped) log->warn("skipped checkpoint {}: {}", s.path.string(), s.reason);
  if (restored->found) {
    restored_any = true;
    completed = restored->manifest.step;
    const auto& own = restored->own;
    for (auto& [name, p] : counters) {
      auto it = own.counters.find(name);
      if (it != own.counters.end()) *p = it->second;
    }
    if (auto b = restore_blobs(*restored, own); !b) return b;
    log->info("restored step {} from {} ({} tensors, {:.1f} ms)", completed, restored->path.string(),
              restored->loaded.size(), (mono_ns() - t0) / 1e6);
    emit_event("restored", {{"step", completed}, {"path", restored->path.string()}, {"ns", mono_ns() - t0}});
  }
  restored_step = completed;
  ctl->started = completed;
  ctl->completed = completed;
  start_warmer();
  return {};
}

/// The actor system, and the coordinator: in-process for one worker or for
/// rank 0 of a --workers/TF_CONFIG cluster; remote under grace-launch.
status session::impl::start_actors() {
  system_options so;
  so.tls = tls;
  rt = std::make_unique<actor_runtime>(so);
  auto& sys = rt->sys();
  bool launched = cluster.source == "GRACE_*";
  if (cluster.local_mode() || (!launched && cluster.is_chief())) {
    coordinator_config cc;
    cc.world_size = cluster.world_size;
    cc.run_id = cluster.run_id;
    cc.token = cluster.token;
    cc.incarnation = cluster.incarnation;
    cc.dead_after = opts.dead_after;
    cc.connection_timeout = system_options{}.connection_timeout;
    cc.log = log;
    coord->set(spawn_coordinator(sys, cc));
    hosts_coordinator = true;
    if (!cluster.local_mode()) {
      auto port = publish_coordinator(sys, coord->get(), cluster.coordinator_port, cluster.coordinator_host);
      if (!port) return port.err();
      if (auto w = plaintext_warning(cluster.coordinator_host, tls.any())) log->warn("{}", *w);
    }
  } else {
    auto h = connect_coordinator(sys, cluster.coordinator_host, cluster.coordinator_port, opts.connect_timeout);
    if (!h) return h.err();
    coord->set(*h);
  }
  peer_watcher_config pc;
  pc.rank = cluster.rank;
  pc.incarnation = cluster.incarnation;
  pc.heartbeat = opts.heartbeat;
  pc.log = log;
  pc.coordinator_file = cluster.coordinator_file;
  pc.epoch = cluster.coordinator_epoch;
  pc.failover_wait = std::chrono::milliseconds(cluster.failover_wait_ms);
  if (!cluster.relay.empty()) {
    if (auto r = connect_node_relay(sys, cluster.relay, std::chrono::seconds(10)))
      pc.relay = *r;
    else
      log->warn("{}: heartbeats and acknowledgements go to the service directly", r.err().message);
  }
  checkpoint_writer_config wc;
  wc.store = store.get();
  wc.fallback = fallback_store.get();
  wc.coord = coord;
  wc.rank = cluster.rank;
  wc.incarnation = cluster.incarnation;
  wc.ctl = ctl;
  wc.log = log;
  wc.commit_delay = opts.commit_delay;
  wc.commit_delay_step = opts.commit_delay_step;
  if (auto lw = node_local_world()) {
    wc.node = static_cast<int32_t>(cluster.rank / lw);
    wc.token = cluster.token;
  }
  writer = spawn_checkpoint_writer(sys, wc);
  pc.on_commit_parts = [w = writer](uint64_t id, uint64_t step, std::vector<std::string> servers) {
    caf::anon_send(w, commit_atom::value, id, step, std::move(servers));
  };
  pc.freeze_copies = [r = replicas] { return freeze_copies(*r); };
  watcher = spawn_peer_watcher(sys, coord, ctl, pc);
  self = std::make_unique<caf::scoped_actor>(sys);
  (*self)->monitor(writer);
  // The first save must not fault in the write staging on its critical
  // path (after a restore the pages are resident already; this then only
  // rewrites them, on the writer's thread).
  caf::anon_send(writer, prepare_atom::value, static_cast<uint64_t>(buffers->total_bytes()));
  return {};
}

/// Joins through the peer watcher; the welcome carries the rendezvous
/// prefix and how long the service may take to decide after a failure,
/// which bounds this worker's waits.
status session::impl::join() {
  auto& sys = rt->sys();
  char host[256] = "?";
  ::gethostname(host, sizeof(host) - 1);
  auto m = make<proto::Join>([&](auto b) {
    b.setRank(cluster.rank);
    b.setWorldSize(cluster.world_size);
    b.setRunId(cluster.run_id);
    b.setIncarnation(cluster.incarnation);
    b.setToken(cluster.token);
    b.setProtocolVersion(proto::PROTOCOL_VERSION);
    b.setHost(host);
    b.setPid(static_cast<uint32_t>(::getpid()));
    b.setCompletedStep(completed);
    b.setSharded(sharded);
    b.setNodeLocal(node_local_world());
  });
  // A join for the next incarnation is refused (restartable, naming the
  // current one) while the old group still has live members: asked again
  // until they are gone, within the join timeout.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (;;) {
    std::optional<error> failure;
    bool wait_for_old_group = false;
    {
      caf::scoped_actor self{sys};
      self->request(watcher, std::chrono::seconds(30), join_atom::value, m)
          .receive(
              [&](msg<proto::Welcome>& w) {
                auto r = decode(w);
                if (!r) {
                  failure = r.err();
                  return;
                }
                auto wr = r->get();
                if (!wr.getAccepted()) {
                  wait_for_old_group = wr.getRestartable() && wr.getIncarnation() + 1 == cluster.incarnation;
                  failure = error{wr.getRestartable() ? errc::preempted : errc::invalid_input,
                                  "the coordination service refused rank " + std::to_string(cluster.rank) + ": " +
                                      str(wr.getReason())};
                  return;
                }
                if (wr.getRank() != cluster.rank || wr.getWorldSize() != cluster.world_size ||
                    str(wr.getRunId()) != cluster.run_id || wr.getIncarnation() != cluster.incarnation) {
                  failure = error{errc::invalid_input,
                                  "the coordination service welcomed rank " + std::to_string(wr.getRank()) + " of " +
                                      std::to_string(wr.getWorldSize()) + " in run '" + str(wr.getRunId()) +
                                      "' incarnation " + std::to_string(wr.getIncarnation()) + " (protocol error)"};
                  return;
                }
                prefix = str(wr.getRendezvousPrefix());
                if (wr.getVerdictWaitMs()) verdict_wait = std::chrono::milliseconds(wr.getVerdictWaitMs());
              },
              [&](caf::error& e) {
                failure = error{errc::disconnected, "join: " + sys.render(e)};
              });
    }
    if (!failure) break;
    if (!wait_for_old_group || std::chrono::steady_clock::now() > deadline) return *failure;
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  worker_policy_config pc;
  pc.rank = cluster.rank;
  pc.is_chief = cluster.is_chief();
  pc.restart_code = opts.restart_exit_code;
  pc.fatal_code = exit_code::fatal;
  pc.verdict_wait_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(verdict_wait).count();
  pc.save_wait_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(opts.save_timeout).count();
  pc.margin_factor = opts.margin_factor;
  pc.margin_steps = opts.margin_steps;
  if (!cluster.coordinator_file.empty()) {
    // A successor service may take the group over: the verdict may come
    // from it, after the failover, and nobody saves without it.
    pc.verdict_wait_ns += static_cast<int64_t>(cluster.failover_wait_ms) * 1'000'000;
    pc.save_alone_without_coordinator = false;
  }
  // The chief holds only its own part of sharded state.
  if (sharded) pc.save_alone_without_coordinator = false;
  policy = std::make_unique<worker_policy>(pc, completed);
  if (!cluster.local_mode()) kv = std::make_shared<coordinator_store>(sys, coord->get(), opts.wait_timeout);
  return {};
}

void session::impl::start_signal_watcher() {
  signal_watcher_config sc;
  sc.notice_file = opts.notice_file;
  sc.notice_command = opts.notice_command;
  sc.callback = opts.notice_callback;
  sc.poll_interval = opts.poll_interval;
  sc.grace_period = opts.grace_period;
  auto w = watcher;
  auto r = cluster.rank;
  signals = std::make_unique<signal_watcher>(sc, [w, r](const notice_info& n) {
    caf::anon_send(w, make<proto::Notice>([&](auto b) {
                     b.setRank(r);
                     b.setSource(static_cast<proto::NoticeSource>(n.source));
                     b.setDetail(n.detail);
                     b.setReceivedNs(n.received_ns);
                     b.setDeadlineNs(n.deadline_ns);
                   }));
  });
}

step_result session::run(const std::function<void(uint64_t)>& fn) {
  auto& d = *impl_;
  if (auto s = d.begin()) return *s;
  const uint64_t k = d.completed + 1;
  try {
    fn(k);
  } catch (const step_failure& e) {
    return d.after_step_error(k, true, e.what());
  } catch (const std::exception& e) {
    return d.after_step_error(k, false, e.what());
  }
  d.complete(k);
  return step_result::ok;
}

step_result session::begin_step() {
  if (impl_->in_step) throw std::logic_error("begin_step() twice without end_step() or fail_step()");
  if (auto s = impl_->begin()) return *s;
  return step_result::ok;
}

void session::end_step() {
  if (!impl_->in_step) throw std::logic_error("end_step() without begin_step()");
  impl_->complete(impl_->completed + 1);
}

step_result session::fail_step(const std::string& what, bool collective) {
  if (!impl_->attached) return impl_->stop(exit_code::usage, "fail_step() before attach()");
  return impl_->after_step_error(impl_->completed + 1, collective, what);
}

void session::impl::maybe_periodic_save(uint64_t k) {
  if (writes_in_flight) take_answers(false);  // a failed write starts the backoff at once
  if (periodic_retry.pending()) {
    if (!periodic_retry.due(mono_ns())) return;
    last_periodic_ns = mono_ns();
    save(k, checkpoint_kind::periodic, 0, false, opts.prune_on_save_failure);
    return;
  }
  if (auto_interval) return auto_periodic_save(k);
  bool due = opts.save_every_steps && k % opts.save_every_steps == 0;
  if (!due && opts.save_every_seconds > 0 && double(mono_ns() - last_periodic_ns) >= opts.save_every_seconds * 1e9)
    due = true;
  if (!due) return;
  last_periodic_ns = mono_ns();
  save(k, checkpoint_kind::periodic, 0, false);
}

/// --save-every auto: the first save measures the cost (what the trainer
/// waits for: earlier writes still in flight, then the snapshot); after
/// it, the interval is Daly's for that cost and the estimated MTBF.
void session::impl::auto_periodic_save(uint64_t k) {
  auto& ai = *auto_interval;
  auto now = mono_ns();
  ai.set_running(double(now - attached_ns) / 1e9);
  if (ai.measured() && double(now - last_periodic_ns) < ai.seconds() * 1e9) return;
  save(k, checkpoint_kind::periodic, 0, false);
  last_periodic_ns = mono_ns();
  ai.on_save_cost(last_periodic_ns - now);
  double s = ai.seconds();
  if (std::abs(s - announced_interval_s) <= 0.1 * announced_interval_s) return;
  announced_interval_s = s;
  log->info("periodic saves every {:.2f} s (Daly's rule: save cost {:.2f} ms, MTBF estimate {:.0f} s)", s,
            ai.cost_s() * 1e3, ai.mtbf_s());
  emit_event("save_interval", {{"seconds", s}, {"mtbf_s", ai.mtbf_s()}, {"cost_s", ai.cost_s()}, {"step", k}});
}

int session::stop_after_failure(const error& e, int no_verdict_code) {
  auto& d = *impl_;
  if (!d.attached) return exit_code::usage;
  d.log->warn("outside a step: {}", e.message);
  if (!d.boundary(d.completed + 1, boundary_mode::collective_failed, {}, false))
    d.stop(no_verdict_code >= 0 ? no_verdict_code : d.opts.restart_exit_code, e.message, false);
  return d.code;
}

status session::finish() {
  auto& d = *impl_;
  if (!d.attached) return error{errc::invalid_input, "finish() before attach()"};
  d.disarm_abort();  // no collective runs after the last step
  if (d.signals) d.signals->stop();
  d.take_answers(true);
  if (d.sharded) {
    auto s = d.finish_sharded();
    if (!s) return s;
  } else if (d.cluster.is_chief()) {
    auto s = d.save(d.completed, checkpoint_kind::end, 0, true);
    if (!s) {
      // An error (issue: nothing durable holds the last steps), said to the
      // group on the way out so this exit is not taken for a lost member.
      d.stop(
          exit_code::fatal,
          "the final checkpoint at step " + std::to_string(d.completed) + " could not be written: " + s.err().message,
          false);
      return s;
    }
    if (!d.opts.keep_checkpoints_on_success) d.remove_backups();
  }
  d.finish_barrier();
  d.leave(0);
  d.code = exit_code::success;
  d.reason = "finished";
  emit_event("finished", {{"step", d.completed}});
  return {};
}

/// Sharded state: every rank's part of the last step (unless the periodic
/// save of that step already wrote it, or no step ran since the restore of
/// that step's checkpoint), committed by the chief, who alone then removes
/// the backups.
status session::impl::finish_sharded() {
  const bool have = (last_save && last_save->ok && last_save->part && last_save->step == completed) ||
                    (restored_any && completed == restored_step);
  status s = have ? status{} : save(completed, checkpoint_kind::end, 0, true);
  if (s && dir_keeper()) s = wait_for_commit(completed);
  if (!s) {
    stop(exit_code::fatal,
         "the final checkpoint at step " + std::to_string(completed) + " could not be written: " + s.err().message,
         false);
    return s;
  }
  if (!dir_keeper()) return {};
  store->remove_parts_up_to(completed);
  if (!opts.keep_checkpoints_on_success) remove_backups();
  return {};
}

void session::impl::remove_backups() {
  for (auto& info : store->list()) {
    if (info.temporary || info.set_aside || !info.valid || info.step == completed) continue;
    std::error_code ec;
    std::filesystem::remove_all(info.path, ec);
    if (ec) log->warn("could not delete backup {}: {}", info.path.string(), ec.message());
  }
}

/// Nobody leaves before the chief's final checkpoint is on disk (the chief
/// arrives once it is). The service fails the barrier at once when a member
/// is lost; otherwise it may take as long as the chief's save.
void session::impl::finish_barrier() {
  if (!kv) return;
  caf::scoped_actor self{rt->sys()};
  std::string err;
  self->request(coord->get(), opts.save_timeout + verdict_wait, make<proto::Barrier>([&](auto b) {
                  b.setName(prefix + "finish");
                  b.setRank(cluster.rank);
                  b.setCount(cluster.world_size);
                }))
      .receive(
          [&](msg<proto::BarrierReply>& r) {
            auto rr = decode(r);
            if (!rr || !rr->get().getOk()) err = rr ? str(rr->get().getError()) : rr.err().message;
          },
          [&](caf::error& e) { err = rt->sys().render(e); });
  if (!err.empty()) log->warn("finish barrier: {}", err);
}

void session::quick_exit(int code) {
  impl_->disarm_abort();
  // Not after stop() or finish() (they left already): an exit the
  // coordinator must not take for a lost member (e.g. a failed rendezvous).
  if (!impl_->left) impl_->leave(code);
  if (impl_->self) impl_->take_answers(true);
  // Flush, never spdlog::shutdown(): shutdown drops the default logger, and
  // an actor thread still logging through spdlog's free functions (events,
  // checkpoint messages) would dereference it while we exit.
  if (impl_->log) impl_->log->flush();
  spdlog::apply_all([](const std::shared_ptr<spdlog::logger>& l) { l->flush(); });
  std::fflush(nullptr);
  std::_Exit(code);
}

int session::exit_code() const { return impl_->code; }
std::string session::stop_reason() const { return impl_->reason; }
uint32_t session::rank() const { return impl_->cluster.rank; }
uint32_t session::world_size() const { return impl_->cluster.world_size; }
bool session::is_chief() const { return impl_->cluster.is_chief(); }
uint64_t session::completed_steps() const { return impl_->completed; }
const cluster_config& session::cluster() const { return impl_->cluster; }
std::shared_ptr<gloo::rendezvous::Store> session::rendezvous_store() { return impl_->kv; }
std::string session::rendezvous_prefix() const { return impl_->prefix; }

void session::set_abort_handler(std::function<void()> f) { impl_->ctl->set_abort_handler(std::move(f)); }

void session::notify(const std::string& detail) {
  auto& d = *impl_;
  if (!d.attached) return;
  caf::anon_send(d.watcher, make<proto::Notice>([&](auto b) {
                   b.setRank(d.cluster.rank);
                   b.setSource(proto::NoticeSource::TEST);
                   b.setDetail(detail);
                   b.setReceivedNs(wall_ns());
                   if (d.opts.grace_period.count() > 0)
                     b.setDeadlineNs(wall_ns() +
                                     std::chrono::duration_cast<std::chrono::nanoseconds>(d.opts.grace_period).count());
                 }));
}

}  // namespace grace
