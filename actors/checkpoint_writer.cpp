#include "actors/checkpoint_writer.hpp"

#include "runtime/control.hpp"
#include "runtime/events.hpp"

#include <caf/actor_system.hpp>
#include <caf/send.hpp>
#include <caf/spawn_options.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <new>

namespace grace {

namespace {

struct writer_state {
  static inline const char* name = "checkpoint_writer";
  checkpoint_writer_config cfg;
};

using self_ptr = checkpoint_writer_actor::stateful_pointer<writer_state>;

/// Writes one snapshot to one store; never throws (an exception is a
/// failed save).
void write_to(checkpoint_store& store, const save_request& req, save_outcome& o) {
  try {
    if (req.make_room) store.keep_only_newest();
    capture_wait wait;
    if (req.overlapped) wait = [b = req.buffers.get()](uint64_t n) { return b->wait_captured(n); };
    auto r = store.save(req.buffers->view(), req.meta, wait);
    o.ok = static_cast<bool>(r);
    if (r)
      o.stats = std::move(r.value());
    else
      o.error = r.err().message;
  } catch (const std::exception& e) {
    o.error = std::string("checkpoint save raised: ") + e.what();
  }
}

/// Writes one snapshot; a save that must not be lost goes to the fallback
/// directory when the primary cannot take it.
save_outcome write(checkpoint_store& store, checkpoint_store* fallback, spdlog::logger& log, const save_request& req) {
  save_outcome o;
  o.step = req.meta.step;
  o.kind = req.meta.kind;
  o.agreement_id = req.agreement_id;
  o.snap_ns = req.snap_ns;
  const int64_t t0 = mono_ns();
  write_to(store, req, o);
  // A failed capture fails every directory alike: no fallback for it.
  if (!o.ok && fallback && o.kind != checkpoint_kind::periodic && !req.buffers->capture_failed()) {
    auto primary = o.error;
    log.warn("checkpoint step {} ({}) could not be written to {} ({}): trying the fallback directory {}", o.step,
             to_string(o.kind), store.dir().string(), primary, fallback->dir().string());
    emit_event("save_fallback",
               {{"step", o.step}, {"kind", to_string(o.kind)}, {"error", primary}, {"dir", fallback->dir().string()}});
    o.error.clear();
    write_to(*fallback, req, o);
    o.error = o.ok ? primary : primary + "; fallback " + fallback->dir().string() + ": " + o.error;
  }
  o.write_ns = mono_ns() - t0;
  if (req.overlapped) {
    req.buffers->wait_capture_end();  // a save that failed early must not free buffers still being filled
    o.snap_ns = req.buffers->capture_failed() ? 0 : req.buffers->capture_ns();
    o.save_ns = mono_ns() - req.begin_ns;
    // What the save took beyond the copy: snap_ns + write_ns is the save's
    // duration, as for a save that captured first (the coordinator's margins).
    o.write_ns = std::max<int64_t>(0, o.save_ns - o.snap_ns);
  } else {
    o.save_ns = o.snap_ns + o.write_ns;
  }
  req.buffers->set_busy(false);
  return o;
}

/// The log line and event of a finished save.
void record(spdlog::logger& log, const save_outcome& o) {
  if (!o.ok) {
    // A periodic save's failure is the session's to retry (a warning there).
    log.log(o.kind == checkpoint_kind::periodic ? spdlog::level::warn : spdlog::level::err,
            "checkpoint step {} ({}) failed: {}", o.step, to_string(o.kind), o.error);
    emit_event("save_failed", {{"step", o.step}, {"kind", to_string(o.kind)}, {"error", o.error}});
    return;
  }
  log.info("checkpoint step {} ({}) committed: {:.1f} MiB in {:.0f} ms (snapshot {:.1f} ms){}", o.step,
           to_string(o.kind), o.stats.total_bytes / 1048576.0, o.write_ns / 1e6, o.snap_ns / 1e6,
           o.stats.already_existed ? " [already on disk]" : "");
  emit_event("committed_local", {{"step", o.step},
                                 {"kind", to_string(o.kind)},
                                 {"bytes", o.stats.total_bytes},
                                 {"write_ns", o.write_ns},
                                 {"save_ns", o.save_ns},
                                 {"path", o.stats.path.string()}});
}

checkpoint_writer_actor::behavior_type writer(self_ptr self, checkpoint_writer_config cfg) {
  self->state.cfg = std::move(cfg);
  if (!self->state.cfg.log) self->state.cfg.log = spdlog::default_logger();
  return {
      [self](save_atom, const save_request& req) -> save_outcome {
        auto& st = self->state;
        auto o = write(*st.cfg.store, st.cfg.fallback, *st.cfg.log, req);
        // Reported before the trainer hears of it: a commit waits for this.
        if (o.agreement_id && st.cfg.coord)
          if (auto c = st.cfg.coord->get()) self->send(c, saved_report(st.cfg.rank, o));
        if (o.ok && st.cfg.ctl) st.cfg.ctl->last_save_ns.store(o.save_ns, std::memory_order_relaxed);
        record(*st.cfg.log, o);
        return o;
      },
      [self](prepare_atom, uint64_t state_bytes) { self->state.cfg.store->prepare_io(state_bytes); },
  };
}

}  // namespace

checkpoint_writer_actor spawn_checkpoint_writer(caf::actor_system& sys, checkpoint_writer_config cfg) {
  return sys.spawn<caf::detached>(writer, std::move(cfg));
}

msg<proto::CheckpointSaved> saved_report(uint32_t rank, const save_outcome& o) {
  return make<proto::CheckpointSaved>([&](auto b) {
    b.setAgreementId(o.agreement_id);
    b.setRank(rank);
    b.setStep(o.step);
    b.setOk(o.ok);
    b.setError(o.error);
    b.setSnapshotNs(o.snap_ns);
    b.setWriteNs(o.write_ns);
    if (o.ok) b.setBytes(o.stats.total_bytes);
  });
}

}  // namespace grace
