// The embedding API's implementation and the worker's composition root:
// which actor runs where (peer watcher on the scheduler, signal watcher and
// checkpoint writer on their own threads, the trainer on the caller's thread).
#include "runtime/grace.hpp"

#include "actors/coordinator.hpp"
#include "actors/kv_store.hpp"
#include "actors/peer_watcher.hpp"
#include "actors/signal_watcher.hpp"
#include "runtime/base64.hpp"
#include "runtime/checkpoint.hpp"
#include "runtime/control.hpp"
#include "runtime/deadline.hpp"
#include "runtime/device_copy.hpp"
#include "runtime/events.hpp"
#include "runtime/snapshot.hpp"
#include "runtime/system.hpp"

#include <caf/actor_system.hpp>
#include <caf/io/middleman.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include <nlohmann/json.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <thread>
#include <unistd.h>

namespace grace {

namespace {

checkpoint_kind to_checkpoint_kind(ckpt_kind k) {
  switch (k) {
    case ckpt_kind::initial: return checkpoint_kind::preempt;
    case ckpt_kind::final: return checkpoint_kind::preempt;
    case ckpt_kind::jit: return checkpoint_kind::jit;
    case ckpt_kind::periodic: return checkpoint_kind::periodic;
  }
  return checkpoint_kind::manual;
}


} // namespace

struct session::impl {
  options opts;
  cluster_config cluster;
  std::shared_ptr<spdlog::logger> log;
  std::vector<tensor_ref> tensors;
  std::map<std::string, int64_t*> counters;
  struct blob_hooks {
    std::function<std::string()> save;
    std::function<void(const std::string&)> restore;
  };
  std::map<std::string, blob_hooks> blobs;

  std::unique_ptr<actor_runtime> rt;
  coordinator_actor coord;
  bool hosts_coordinator = false;
  peer_watcher_actor watcher;
  std::shared_ptr<control_block> ctl = std::make_shared<control_block>();
  std::unique_ptr<signal_watcher> signals;
  std::unique_ptr<checkpoint_store> store;
  std::shared_ptr<snapshot_buffers> buffers;
  std::unique_ptr<checkpoint_writer> writer;
  std::shared_ptr<gloo::rendezvous::Store> kv;
  std::string prefix;
  // Keeps the snapshot buffers resident: this VM hands idle pages back to
  // the host, and a snapshot into cold pages runs ~10x slower. Read-only
  // touches, so it may run during a capture or a write.
  std::thread warmer;
  std::mutex warm_m;
  std::condition_variable warm_cv;
  bool warm_stop = false;

  void start_warmer() {
    warmer = std::thread([this] {
      std::unique_lock<std::mutex> lk(warm_m);
      while (!warm_cv.wait_for(lk, std::chrono::seconds(2), [this] { return warm_stop; })) {
        buffers->keep_warm();
        checkpoint_store::keep_io_buffers_warm();
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
  uint64_t completed = 0;
  uint64_t restored_step = 0;
  uint64_t last_saved_step = 0;
  int code = 0;
  std::string reason;
  uint64_t acked_jit_id = 0;
  uint64_t handled_order_id = 0;
  bool final_proposed = false;
  int64_t last_periodic_ns = 0;
  std::vector<int64_t> step_ns;   // recent step durations (ring)
  std::vector<int64_t> save_ns;   // recent snapshot+write durations
  bool first_step_logged = false;
  bool in_step = false;     // between begin() and complete() / fail()
  int64_t step_t0 = 0;

  // ---------------------------------------------------------------- helpers

  template <class M>
  void to_coordinator(M m) {
    caf::anon_send(coord, std::move(m));
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
    return m;
  }

  static std::string blob_key(const std::string& name) { return "grace.blob." + name; }

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

  /// Hands every registered blob its restored bytes (attach, after a restore).
  status restore_blobs(const restored_checkpoint& r) {
    for (auto& [name, h] : blobs) {
      auto it = r.manifest.metadata.find(blob_key(name));
      if (it == r.manifest.metadata.end())
        return error{errc::invalid_input, r.path.string() + " has no blob '" + name +
                                              "': it was written by a trainer that did not register it"};
      auto bytes = base64_decode(it->second);
      if (!bytes)
        return error{errc::invalid_input, "blob '" + name + "' in " + r.path.string() + " is not valid base64"};
      try {
        h.restore(*bytes);
      } catch (const std::exception& e) {
        return error{errc::invalid_input, "restoring blob '" + name + "' from " + r.path.string() +
                                              " failed: " + e.what()};
      }
    }
    return {};
  }

  /// Snapshot (blocking the trainer only for the copy), then write on the
  /// writer thread. `sync`: wait for the commit. Reports to the coordinator
  /// when `agreement_id` is set.
  status save(uint64_t step, checkpoint_kind kind, uint64_t agreement_id, bool sync) {
    auto meta = meta_for(step, kind);
    if (auto b = add_blobs(meta); !b) {
      log->error("checkpoint step {} not taken: {}", step, b.err().message);
      report_saved(agreement_id, step, false, b.err().message, nullptr, 0, 0);
      return b;
    }
    writer->wait_idle(); // the buffers of the previous write are free again
    auto t0 = mono_ns();
    auto st = buffers->capture(tensors);
    auto snap_ns = mono_ns() - t0;
    if (!st) {
      report_saved(agreement_id, step, false, st.err().message, {}, snap_ns, 0);
      return st;
    }
    emit_event("snapshot_done", {{"step", step}, {"kind", to_string(kind)}, {"ns", snap_ns}});
    auto done = std::make_shared<std::promise<status>>();
    auto fut = done->get_future();
    auto t1 = mono_ns();
    writer->submit(buffers, std::move(meta), [this, agreement_id, step, snap_ns, t1, done,
                                                   kind](result<save_stats> r) {
      auto write_ns = mono_ns() - t1;
      if (r) {
        save_ns.push_back(snap_ns + write_ns);
        if (save_ns.size() > 32) save_ns.erase(save_ns.begin());
        log->info("checkpoint step {} ({}) committed: {:.1f} MiB in {:.0f} ms (snapshot {:.1f} ms){}",
                  step, to_string(kind), r->total_bytes / 1048576.0, write_ns / 1e6, snap_ns / 1e6,
                  r->already_existed ? " [already on disk]" : "");
        emit_event("committed_local", {{"step", step}, {"bytes", r->total_bytes}, {"write_ns", write_ns},
                                       {"path", r->path.string()}});
        report_saved(agreement_id, step, true, "", &r.value(), snap_ns, write_ns);
        done->set_value(status{});
      } else {
        log->error("checkpoint step {} failed: {}", step, r.err().message);
        report_saved(agreement_id, step, false, r.err().message, nullptr, snap_ns, write_ns);
        done->set_value(status{r.err()});
      }
    });
    last_saved_step = std::max(last_saved_step, step);
    if (!sync) return {};
    return fut.get();
  }

  void report_saved(uint64_t id, uint64_t step, bool ok, const std::string& err, const save_stats* s,
                    int64_t snap_ns, int64_t write_ns) {
    if (id == 0) return;
    to_coordinator(make<proto::CheckpointSaved>([&](auto b) {
      b.setAgreementId(id); b.setRank(cluster.rank); b.setStep(step); b.setOk(ok); b.setError(err);
      b.setSnapshotNs(snap_ns); b.setWriteNs(write_ns);
      if (s) {
        b.setBytes(s->total_bytes);
        b.setPath(s->path.string());
        auto files = b.initFiles(static_cast<unsigned>(s->files.size()));
        for (size_t i = 0; i < s->files.size(); ++i) {
          files[i].setName(s->files[i].name);
          files[i].setSize(s->files[i].size);
          files[i].setChecksum(s->files[i].xxh3);
        }
      }
    }));
  }

  /// No abort may reach the communicator from now on (see
  /// control_block::disarm): the trainer is about to tear it down.
  void disarm_abort() { ctl->disarm(); }

  /// Tells the coordinator this worker leaves on purpose, and waits for its
  /// answer (bounded): once answered, the coordinator no longer treats this
  /// process's exit as a lost member (no PeerLost, no kill by the launcher).
  void leave(int c) {
    if (!attached || !rt) return;
    {
      std::lock_guard<std::mutex> g(ctl->m);
      if (ctl->coordinator_gone) return;  // nobody to tell; don't wait for a timeout
    }
    auto m = make<proto::Leave>([&](auto b) {
      b.setRank(cluster.rank); b.setExitCode(c); b.setCompletedStep(completed);
    });
    caf::scoped_actor self{rt->sys()};
    self->request(coord, std::chrono::seconds(2), std::move(m))
      .receive([](bool) {},
               [&](caf::error& e) { log->warn("leave: no answer from the coordinator: {}", rt->sys().render(e)); });
  }

  step_result stop(int c, std::string why) {
    disarm_abort();
    code = c;
    reason = std::move(why);
    log->info("stopping with exit code {}: {}", c, reason);
    emit_event("exit", {{"code", c}, {"reason", reason}, {"step", completed}});
    leave(c);
    if (opts.throw_on_stop) throw stop_requested(c, reason);
    return step_result::stop;
  }

  /// Waits (at a step boundary) until the control block changes or the
  /// timeout passes. `lk` holds ctl->m.
  bool wait_for_change(std::unique_lock<std::mutex>& lk, const std::function<bool()>& done) {
    return ctl->cv.wait_for(lk, opts.wait_timeout, done);
  }

  /// The rare path, entered at the start of step k (k - 1 completed) when
  /// the flag is set. Returns nullopt to run step k, or a stop.
  std::optional<step_result> boundary(uint64_t k) {
    const uint64_t c = k - 1;
    std::unique_lock<std::mutex> lk(ctl->m);
    for (;;) {
      if (ctl->failure) {
        auto f = *ctl->failure;
        lk.unlock();
        log->error("cluster error from rank {} at step {}: {}", f.origin, f.step, f.message);
        return stop(exit_code::fatal, "cluster error: " + f.message);
      }
      if (ctl->shutdown_code) {
        int sc = *ctl->shutdown_code;
        lk.unlock();
        return stop(sc, "shutdown requested by the coordinator");
      }
      auto order = ctl->order;
      if (order && order->kind == ckpt_kind::jit) {
        if (!order->agreed) {
          if (acked_jit_id != order->id) {
            acked_jit_id = order->id;
            log->warn("peer lost: stopped at step {}, reporting it for a just-in-time save", c);
            to_coordinator(make<proto::Ack>([&](auto b) {
              b.setAgreementId(order->id); b.setRank(cluster.rank); b.setEarliestStep(c);
            }));
          }
          if (!wait_for_change(lk, [&] { return ctl->failure || (ctl->order && ctl->order->agreed); }))
            break;
          continue;
        }
        if (handled_order_id != order->id) {
          handled_order_id = order->id;
          if (order->saver == cluster.rank) {
            lk.unlock();
            log->warn("saving a just-in-time checkpoint at step {} (the most advanced survivor)", c);
            if (order->step != c)
              log->warn("just-in-time step {} differs from completed {}: saving completed", order->step, c);
            auto s = save(c, checkpoint_kind::jit, order->id, true);
            lk.lock();
            if (!s) { lk.unlock(); return stop(exit_code::fatal, "just-in-time save failed: " + s.err().message); }
          }
        }
        wait_for_change(lk, [&] { return ctl->committed_id && *ctl->committed_id >= order->id; });
        lk.unlock();
        return stop(opts.restart_exit_code, "peer lost; just-in-time checkpoint at step " +
                                                std::to_string(order->step) + " committed");
      }
      if (ctl->lost && (!order || order->kind != ckpt_kind::jit)) {
        // Wait briefly for the coordinator's just-in-time proposal, which
        // follows the peer-lost notice in the same dispatch.
        auto lost = *ctl->lost;
        bool coordinator_gone = lost.find("coordination service") != std::string::npos;
        if (!coordinator_gone &&
            ctl->cv.wait_for(lk, std::chrono::seconds(5), [&] {
              return ctl->failure || (ctl->order && ctl->order->kind == ckpt_kind::jit);
            }))
          continue;
        lk.unlock();
        if (coordinator_gone && cluster.is_chief() && c > last_saved_step && c > restored_step) {
          log->warn("coordination service lost: the chief saves step {} before exiting", c);
          save(c, checkpoint_kind::jit, 0, true);
        }
        return stop(opts.restart_exit_code, lost);
      }
      if (order && order->kind != ckpt_kind::jit) {
        if (!order->agreed) {
          if (c >= order->step) {
            // We reached the lower bound: wait here (a step boundary, never
            // inside a step) for the agreed step.
            if (!wait_for_change(lk, [&] {
                  return ctl->failure || ctl->lost || (ctl->order && ctl->order->agreed) ||
                         (ctl->order && ctl->order->id != order->id);
                }))
              break;
            continue;
          }
          return std::nullopt;  // keep the flag: check again next step
        }
        if (c < order->step) return std::nullopt;
        if (c > order->step) {
          lk.unlock();
          return stop(exit_code::fatal, "protocol violation: completed step " + std::to_string(c) +
                                            " is past the agreed step " + std::to_string(order->step));
        }
        if (handled_order_id != order->id) {
          handled_order_id = order->id;
          emit_event("reached_agreed_step", {{"step", c}, {"id", order->id}});
          if (order->saver == cluster.rank) {
            lk.unlock();
            auto s = save(c, to_checkpoint_kind(order->kind), order->id, order->exit_after);
            lk.lock();
            if (!s) { lk.unlock(); return stop(exit_code::fatal, "checkpoint save failed: " + s.err().message); }
          }
        }
        if (order->exit_after) {
          if (!wait_for_change(lk, [&] {
                return ctl->failure || ctl->lost ||
                       (ctl->committed_id && *ctl->committed_id >= order->id);
              }))
            break;
          if (ctl->committed_id && *ctl->committed_id >= order->id) {
            lk.unlock();
            return stop(opts.restart_exit_code, "preempted: checkpoint at step " + std::to_string(c) +
                                                    " committed, restart to resume");
          }
          continue;
        }
        // Grace period: training continues while the writer persists.
        ctl->order.reset();
        final_proposed = false;
        log->info("grace period: training continues after the save at step {}", c);
      }
      // Countdown: the chief keeps time for the final save.
      if (ctl->deadline_ns && cluster.is_chief() && !final_proposed && ctl->committed_id) {
        int64_t margin = final_save_margin(step_ns, save_ns, opts.margin_factor, opts.margin_steps);
        int64_t now = wall_ns();
        int64_t left = ctl->deadline_ns - now;
        if (final_save_due(ctl->deadline_ns, now, margin)) {
          final_proposed = true;
          log->info("grace period: {} ms left, margin {} ms: proposing the final save", left / 1000000,
                    margin / 1000000);
          emit_event("propose_final", {{"left_ns", left}, {"margin_ns", margin}, {"step", k}});
          to_coordinator(make<proto::ProposeFinal>([&](auto b) {
            b.setRank(cluster.rank); b.setStartedStep(k);
          }));
        }
        return std::nullopt;  // keep checking every step
      }
      if (ctl->deadline_ns && !ctl->committed_id) return std::nullopt;
      ctl->pending.store(false, std::memory_order_seq_cst);
      return std::nullopt;
    }
    lk.unlock();
    return stop(opts.restart_exit_code, "timed out waiting for the coordination service at step " +
                                            std::to_string(c));
  }

  // --------------------------------------------- one step: run() or split

  /// Before step k = completed + 1: nullopt to run it, or a stop.
  std::optional<step_result> begin() {
    if (!attached) return stop(exit_code::usage, "a step before attach()");
    const uint64_t k = completed + 1;
    ctl->started.store(k, std::memory_order_seq_cst);
    if (ctl->pending.load(std::memory_order_seq_cst)) {
      if (auto s = boundary(k)) return s;
    }
    in_step = true;
    step_t0 = mono_ns();
    return std::nullopt;
  }

  /// Step k raised. `collective`: a collective failed (step_failure); wait
  /// for the coordinator's verdict. Otherwise report the error to everyone,
  /// unless it is the consequence of a failure already known.
  step_result fail(uint64_t k, const std::string& what, bool collective) {
    in_step = false;
    if (collective) {
      log->warn("step {} failed in a collective: {}", k, what);
      // Wait for the coordinator's verdict (peer lost -> just-in-time save).
      {
        std::unique_lock<std::mutex> lk(ctl->m);
        ctl->cv.wait_for(lk, opts.wait_timeout, [&] { return ctl->pending.load(); });
      }
      if (ctl->pending.load())
        if (auto s = boundary(k)) return *s;
      return stop(opts.restart_exit_code, "collective failed: " + what);
    }
    bool consequence = false;
    {
      std::lock_guard<std::mutex> g(ctl->m);
      consequence = ctl->failure || ctl->lost;
    }
    if (!consequence) {
      log->error("step {} raised: {}", k, what);
      emit_event("step_error", {{"step", k}, {"message", what}});
      to_coordinator(make<proto::ErrorReport>([&](auto b) {
        b.setRank(cluster.rank); b.setStep(k); b.setKind(proto::ErrorKind::FAILED); b.setMessage(what);
      }));
      std::unique_lock<std::mutex> lk(ctl->m);
      ctl->cv.wait_for(lk, std::chrono::seconds(5), [&] { return ctl->failure.has_value(); });
      lk.unlock();
      return stop(exit_code::fatal, "error in step " + std::to_string(k) + " on rank " +
                                        std::to_string(cluster.rank) + ": " + what);
    }
    if (auto s = boundary(k)) return *s;
    return stop(opts.restart_exit_code, "step aborted: " + what);
  }

  /// Step k finished: count it; the chief takes a periodic save when due.
  void complete(uint64_t k) {
    in_step = false;
    auto dt = mono_ns() - step_t0;
    completed = k;
    ctl->completed.store(k, std::memory_order_release);
    ctl->last_step_ns.store(dt, std::memory_order_relaxed);
    if (step_ns.size() < 64) step_ns.push_back(dt); else step_ns[k % 64] = dt;
    if (!first_step_logged) {
      first_step_logged = true;
      emit_event("first_step", {{"step", k}, {"ns", dt}});
    }
    if (cluster.is_chief()) {
      bool due = opts.save_every_steps && k % opts.save_every_steps == 0;
      if (!due && opts.save_every_seconds > 0 &&
          double(mono_ns() - last_periodic_ns) >= opts.save_every_seconds * 1e9)
        due = true;
      if (due) {
        last_periodic_ns = mono_ns();
        save(k, checkpoint_kind::periodic, 0, false);
      }
    }
  }
};

session::session(options opts) : impl_(std::make_unique<impl>()) {
  block_termination_signals();
  impl_->opts = std::move(opts);
  impl_->log = impl_->opts.log ? impl_->opts.log : spdlog::default_logger();
}

session::~session() {
  if (!impl_) return;
  impl_->disarm_abort();
  if (impl_->signals) impl_->signals->stop();
  impl_->stop_warmer();
  if (impl_->writer) impl_->writer->wait_idle();
  impl_->writer.reset();
  if (impl_->rt) {
    caf::anon_send_exit(impl_->watcher, caf::exit_reason::user_shutdown);
    if (impl_->hosts_coordinator) caf::anon_send_exit(impl_->coord, caf::exit_reason::user_shutdown);
  }
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
  if (d.opts.cluster) {
    d.cluster = *d.opts.cluster;
  } else {
    auto c = cluster_from_environment();
    if (!c) return c.err();
    d.cluster = *c;
  }
  set_event_identity(d.cluster.rank, d.cluster.incarnation);
  d.log->info("grace: rank {}/{} (cluster from {}), incarnation {}, checkpoints in {}", d.cluster.rank,
              d.cluster.world_size, d.cluster.source, d.cluster.incarnation, d.opts.checkpoint_dir);

  for (auto& t : d.tensors)
    if (t.memory == memory_kind::device && !device_copy_available())
      return error{errc::invalid_input, "tensor '" + t.name + "' is in device memory but no CUDA device-copy "
                                        "hook is registered (a CUDA build calls register_cuda_device_copy())"};
  // Restore first, so the join carries the restored step.
  d.store = std::make_unique<checkpoint_store>(d.opts.checkpoint_dir, d.opts.keep_last);
  if (d.cluster.is_chief()) d.store->remove_stale_temporaries();
  // The snapshot buffers first: the restore reads into them (warm pages,
  // and a checkpoint that fails verification never touches the tensors).
  d.buffers = std::make_shared<snapshot_buffers>(d.tensors);
  auto t0 = mono_ns();
  auto restored = d.store->restore_latest(d.tensors, d.buffers->regions());
  if (!restored) return restored.err();
  for (auto& s : restored->skipped)
    d.log->warn("skipped checkpoint {}: {}", s.path.string(), s.reason);
  if (restored->found) {
    d.completed = restored->manifest.step;
    for (auto& [name, p] : d.counters) {
      auto it = restored->manifest.counters.find(name);
      if (it != restored->manifest.counters.end()) *p = it->second;
    }
    if (auto b = d.restore_blobs(*restored); !b) return b.err();
    d.log->info("restored step {} from {} ({} tensors, {:.1f} ms)", d.completed, restored->path.string(),
                restored->loaded.size(), (mono_ns() - t0) / 1e6);
    emit_event("restored", {{"step", d.completed}, {"path", restored->path.string()},
                            {"ns", mono_ns() - t0}});
  }
  d.restored_step = d.last_saved_step = d.completed;
  d.ctl->started = d.completed;
  d.ctl->completed = d.completed;
  d.writer = std::make_unique<checkpoint_writer>(*d.store);
  // The first save must not fault in the write staging on its critical
  // path (after a restore the pages are resident already; this then only
  // rewrites them, in the writer thread).
  d.writer->prepare_io(d.buffers->total_bytes());
  d.start_warmer();

  // The actor system, and the coordinator: in-process for one worker or
  // for rank 0 of a --workers/TF_CONFIG cluster; remote under grace-launch.
  d.rt = std::make_unique<actor_runtime>();
  auto& sys = d.rt->sys();
  bool launched = d.cluster.source == "GRACE_*";
  if (d.cluster.local_mode() || (!launched && d.cluster.is_chief())) {
    coordinator_config cc;
    cc.world_size = d.cluster.world_size;
    cc.run_id = d.cluster.run_id;
    cc.token = d.cluster.token;
    cc.incarnation = d.cluster.incarnation;
    cc.dead_after = d.opts.dead_after;
    cc.log = d.log;
    d.coord = spawn_coordinator(sys, cc);
    d.hosts_coordinator = true;
    if (!d.cluster.local_mode()) {
      auto port = sys.middleman().publish(d.coord, d.cluster.coordinator_port,
                                          d.cluster.coordinator_host.c_str(), true);
      if (!port)
        return error{errc::invalid_input, "cannot host the coordination service on " +
                                              d.cluster.coordinator_host + ":" +
                                              std::to_string(d.cluster.coordinator_port) + ": " +
                                              sys.render(port.error())};
    }
  } else {
    auto h = connect_coordinator(sys, d.cluster.coordinator_host, d.cluster.coordinator_port,
                                 std::chrono::seconds(30));
    if (!h) return h.err();
    d.coord = *h;
  }
  peer_watcher_config pc;
  pc.rank = d.cluster.rank;
  pc.incarnation = d.cluster.incarnation;
  pc.heartbeat = d.opts.heartbeat;
  pc.log = d.log;
  d.watcher = spawn_peer_watcher(sys, d.coord, d.ctl, pc);

  char host[256] = "?";
  ::gethostname(host, sizeof(host) - 1);
  auto join = make<proto::Join>([&](auto b) {
    b.setRank(d.cluster.rank); b.setWorldSize(d.cluster.world_size); b.setRunId(d.cluster.run_id);
    b.setIncarnation(d.cluster.incarnation); b.setToken(d.cluster.token);
    b.setProtocolVersion(proto::PROTOCOL_VERSION); b.setHost(host);
    b.setPid(static_cast<uint32_t>(::getpid())); b.setCompletedStep(d.completed);
  });
  std::optional<error> failure;
  {
    caf::scoped_actor self{sys};
    self->request(d.watcher, std::chrono::seconds(30), join_atom::value, std::move(join))
      .receive(
        [&](msg<proto::Welcome>& w) {
          auto r = decode(w);
          if (!r) { failure = r.err(); return; }
          if (!r->get().getAccepted()) {
            failure = error{errc::invalid_input, "the coordination service refused rank " +
                                                     std::to_string(d.cluster.rank) + ": " +
                                                     str(r->get().getReason())};
            return;
          }
          d.prefix = str(r->get().getRendezvousPrefix());
        },
        [&](caf::error& e) { failure = error{errc::disconnected, "join: " + sys.render(e)}; });
  }
  if (failure) return *failure;
  if (!d.cluster.local_mode())
    d.kv = std::make_shared<coordinator_store>(sys, d.coord, d.opts.wait_timeout);

  signal_watcher_config sc;
  sc.notice_file = d.opts.notice_file;
  sc.notice_command = d.opts.notice_command;
  sc.callback = d.opts.notice_callback;
  sc.poll_interval = d.opts.poll_interval;
  sc.grace_period = d.opts.grace_period;
  auto watcher = d.watcher;
  auto rank = d.cluster.rank;
  d.signals = std::make_unique<signal_watcher>(sc, [watcher, rank](const notice_info& n) {
    caf::anon_send(watcher, make<proto::Notice>([&](auto b) {
      b.setRank(rank); b.setSource(static_cast<proto::NoticeSource>(n.source)); b.setDetail(n.detail);
      b.setReceivedNs(n.received_ns); b.setDeadlineNs(n.deadline_ns);
    }));
  });
  d.last_periodic_ns = mono_ns();
  d.attached = true;
  return d.completed;
}

step_result session::run(const std::function<void(uint64_t)>& fn) {
  auto& d = *impl_;
  if (auto s = d.begin()) return *s;
  const uint64_t k = d.completed + 1;
  try {
    fn(k);
  } catch (const step_failure& e) {
    return d.fail(k, e.what(), true);
  } catch (const std::exception& e) {
    return d.fail(k, e.what(), false);
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
  return impl_->fail(impl_->completed + 1, what, collective);
}

status session::finish() {
  auto& d = *impl_;
  if (!d.attached) return error{errc::invalid_input, "finish() before attach()"};
  d.disarm_abort();  // no collective runs after the last step
  if (d.signals) d.signals->stop();
  d.writer->wait_idle();
  if (d.cluster.is_chief()) {
    auto s = d.save(d.completed, checkpoint_kind::final, 0, true);
    if (!s) return s;
    if (!d.opts.keep_checkpoints_on_success) {
      for (auto& info : d.store->list()) {
        if (info.temporary || info.set_aside || !info.valid || info.step == d.completed) continue;
        std::error_code ec;
        std::filesystem::remove_all(info.path, ec);
        if (ec) d.log->warn("could not delete backup {}: {}", info.path.string(), ec.message());
      }
    }
  }
  // Nobody leaves before the chief's final checkpoint is on disk.
  if (d.kv) {
    caf::scoped_actor self{d.rt->sys()};
    std::string err;
    self->request(d.coord, d.opts.wait_timeout + std::chrono::seconds(1),
                  make<proto::Barrier>([&](auto b) {
                    b.setName(d.prefix + "finish"); b.setRank(d.cluster.rank);
                    b.setCount(d.cluster.world_size);
                  }))
      .receive([&](msg<proto::BarrierReply>& r) {
                 auto rr = decode(r);
                 if (!rr || !rr->get().getOk()) err = rr ? str(rr->get().getError()) : rr.err().message;
               },
               [&](caf::error& e) { err = d.rt->sys().render(e); });
    if (!err.empty()) d.log->warn("finish barrier: {}", err);
  }
  d.leave(0);
  d.code = exit_code::success;
  d.reason = "finished";
  emit_event("finished", {{"step", d.completed}});
  return {};
}

void session::quick_exit(int code) {
  impl_->disarm_abort();
  if (impl_->writer) impl_->writer->wait_idle();
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

void session::set_abort_handler(std::function<void()> f) {
  impl_->ctl->set_abort_handler(std::move(f));
}

void session::notify(const std::string& detail) {
  auto& d = *impl_;
  if (!d.attached) return;
  caf::anon_send(d.watcher, make<proto::Notice>([&](auto b) {
    b.setRank(d.cluster.rank); b.setSource(proto::NoticeSource::TEST); b.setDetail(detail);
    b.setReceivedNs(wall_ns());
    if (d.opts.grace_period.count() > 0)
      b.setDeadlineNs(wall_ns() + std::chrono::duration_cast<std::chrono::nanoseconds>(d.opts.grace_period).count());
  }));
}

} // namespace grace
