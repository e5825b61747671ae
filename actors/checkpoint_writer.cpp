#include "actors/checkpoint_writer.hpp"

#include "runtime/checkpoint/checkpoint_fetch.hpp"
#include "runtime/worker/control_block.hpp"
#include "runtime/base/events.hpp"

#include <caf/actor_system.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <caf/spawn_options.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>
#include <new>
#include <optional>
#include <thread>

namespace grace {

namespace {

/// A part written and reported, waiting for the service's commit order.
struct written_part {
  checkpoint_meta meta;
  std::string tag;
};

struct writer_state {
  static inline const char* name = "checkpoint_writer";
  checkpoint_writer_config cfg;
  std::map<std::pair<uint64_t, uint64_t>, written_part> parts;  ///< by (agreement id, step); the newest few
};

using writer_ptr = checkpoint_writer_actor::stateful_pointer<writer_state>;

/// Writes one snapshot to one store; never throws (an exception is a
/// failed save).
void write_to(checkpoint_store& store, const save_request& req, save_outcome& o, uint32_t rank,
              const commit_gate& gate) {
  try {
    if (req.make_room) store.keep_only_newest();
    capture_wait wait;
    if (req.overlapped) wait = [b = req.buffers.get()](uint64_t n) { return b->wait_captured(n); };
    // A whole capture ended before the request was sent, and the send (a
    // CAF message) already orders it before these reads. ThreadSanitizer
    // cannot see that hand-off (CAF is not instrumented); the acquire of the
    // capture's last publication here shows it the order. Without it every
    // word of the save is a suppressed race report under ThreadSanitizer,
    // and a 4 MiB save takes minutes.
    else
      req.buffers->wait_capture_end();
    for (auto& p : req.replica_parts) p.bytes->wait_capture_end();
    auto r = req.part_tag.empty() ? store.save(req.buffers->view(), req.meta, wait, gate)
                                  : store.save_part(req.buffers->view(), req.meta, req.part_tag, rank,
                                                    req.with_replicated, wait);
    for (auto& p : req.replica_parts) {
      if (!r) break;
      // The lost rank's own counters and blobs came with its replica.
      auto meta = req.meta;
      if (p.state) meta.counters = p.state->counters, meta.metadata = p.state->metadata;
      auto extra = store.save_part(p.bytes->view(), meta, req.part_tag, p.rank, true, {}, p.state.has_value());
      if (!extra)
        r = error{errc::failed, "rank " + std::to_string(p.rank) + "'s part from its replica: " + extra.err().message};
      else
        r->total_bytes += extra->total_bytes;
    }
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
save_outcome write(checkpoint_store& store, checkpoint_store* fallback, spdlog::logger& log, const save_request& req,
                   uint32_t rank, const commit_gate& gate) {
  save_outcome o;
  o.step = req.meta.step;
  o.kind = req.meta.kind;
  o.agreement_id = req.agreement_id;
  o.snap_ns = req.snap_ns;
  o.part = !req.part_tag.empty();
  const int64_t t0 = mono_ns();
  write_to(store, req, o, rank, gate);
  // A failed capture fails every directory alike: no fallback for it. A
  // part belongs in the directory the other ranks write to: none either.
  if (!o.ok && fallback && !o.part && o.kind != checkpoint_kind::periodic && !req.buffers->capture_failed()) {
    auto primary = o.error;
    log.warn("checkpoint step {} ({}) could not be written to {} ({}): trying the fallback directory {}", o.step,
             to_string(o.kind), store.dir().string(), primary, fallback->dir().string());
    emit_event("save_fallback",
               {{"step", o.step}, {"kind", to_string(o.kind)}, {"error", primary}, {"dir", fallback->dir().string()}});
    o.error.clear();
    write_to(*fallback, req, o, rank, gate);
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
  if (o.part) {
    log.info("checkpoint step {} ({}): this rank's part is durable, {:.1f} MiB in {:.0f} ms; the commit waits for "
             "every rank's",
             o.step, to_string(o.kind), o.stats.total_bytes / 1048576.0, o.write_ns / 1e6);
    emit_event("part_durable", {{"step", o.step}, {"kind", to_string(o.kind)}, {"bytes", o.stats.total_bytes},
                                {"write_ns", o.write_ns}, {"save_ns", o.save_ns}});
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
                                 {"path", o.stats.path.string()},
                                 {"committed_ns", o.stats.committed_wall_ns}});
}

/// Keeps what the commit of a part written now needs (the newest few steps:
/// an older one's commit order can no longer come).
void remember_part(writer_state& st, const save_request& req) {
  st.parts[{req.agreement_id, req.meta.step}] = written_part{req.meta, req.part_tag};
  while (st.parts.size() > 4) {
    auto oldest = std::min_element(st.parts.begin(), st.parts.end(),
                                   [](auto& a, auto& b) { return a.first.second < b.first.second; });
    st.parts.erase(oldest);
  }
}

/// What the commit of one round needs, gathered before the fence is asked:
/// the part this rank wrote and, with node-local directories, every rank's
/// part description with the node holding it.
struct commit_plan {
  written_part part;
  std::vector<std::string> descs;
  std::vector<int32_t> holders;
};

/// Node-local directories: every rank's part description of the round,
/// with the node holding it: this node's from its own parts directory, the
/// others' from their nodes' checkpoint servers.
status gather_node_local(writer_state& st, commit_plan& c, const std::vector<std::string>& servers) {
  const auto world = static_cast<size_t>(c.part.meta.world_size);
  c.descs.assign(world, {});
  c.holders.assign(world, -1);
  auto take = [&](int32_t node, const std::vector<std::string>& texts) {
    for (auto& t : texts) {
      auto j = nlohmann::json::parse(t, nullptr, false);
      auto r = j.is_object() && j.contains("rank") && j["rank"].is_number_unsigned() ? j["rank"].get<uint64_t>() : world;
      if (r < world && c.holders[r] < 0) c.descs[r] = t, c.holders[r] = node;
    }
  };
  auto own = st.cfg.store->part_descriptions(c.part.meta.step, c.part.tag);
  if (!own) return own.err();
  take(st.cfg.node, *own);
  // A node that is gone (its host lost) holds no part of a round that
  // could be agreed without it: its ranks' parts come from replicas, on
  // the nodes that answer. Its silence matters only if a part is missing.
  std::string unreachable;
  for (size_t n = 0; n < servers.size(); ++n) {
    if (static_cast<int32_t>(n) == st.cfg.node || servers[n].empty()) continue;
    auto theirs = list_parts_remote(servers[n], st.cfg.token, c.part.meta.step, c.part.tag, st.cfg.fetch_timeout);
    if (theirs)
      take(static_cast<int32_t>(n), *theirs);
    else
      unreachable += "; node " + std::to_string(n) + ": " + theirs.err().message;
  }
  std::string missing;
  for (size_t r = 0; r < world; ++r)
    if (c.holders[r] < 0) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
  if (!missing.empty())
    return error{errc::failed, "no node holds the part of rank(s) " + missing + " of step " +
                                   std::to_string(c.part.meta.step) + unreachable};
  return {};
}

/// The commit itself: the rename that makes the parts a checkpoint.
result<save_stats> carry_out(writer_state& st, const commit_plan& c) {
  if (st.cfg.node >= 0)
    return st.cfg.store->commit_node_parts(c.part.meta, c.part.tag, c.descs, c.holders, st.cfg.node);
  return st.cfg.store->commit_parts(c.part.meta, c.part.tag);
}

/// Asks the service whether this rank may still commit (proto::CommitCheck):
/// the refusal, or nullopt for yes. No service (a writer on its own): yes.
/// Asked from a scoped actor on this writer's own thread, which it blocks
/// until the answer (the writer takes no other message meanwhile). Not
/// with the writer's own request: CAF 0.17's clock keeps a strong reference
/// to the requester until the timeout's cancellation is processed, and a
/// detached actor still referenced when the system shuts down makes the
/// shutdown wait for it forever (a process that never exits).
/// Asked again every quarter second, of the service this worker talks to
/// then: a service lost meanwhile never answers (a message to a dead
/// remote actor vanishes), and once the peer watcher follows its successor
/// (etcd failover) that one decides. The question is idempotent.
std::optional<std::string> fence(writer_ptr self, uint64_t id, uint64_t step) {
  auto& st = self->state;
  if (!st.cfg.coord || !st.cfg.coord->get()) return std::nullopt;
  auto check = make<proto::CommitCheck>([&](auto b) {
    b.setRank(st.cfg.rank);
    b.setAgreementId(id);
    b.setStep(step);
    b.setIncarnation(st.cfg.incarnation);
  });
  const auto deadline = std::chrono::steady_clock::now() + st.cfg.commit_check_timeout;
  for (;;) {
    if (st.cfg.ctl && st.cfg.ctl->coordinator_gone()) return std::string("the coordination service is gone");
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    std::optional<std::string> refused;
    bool answered = false;
    caf::scoped_actor asker{self->system()};
    asker->request(st.cfg.coord->get(), std::clamp(left, std::chrono::milliseconds(1), std::chrono::milliseconds(250)),
                   check)
        .receive(
            [&](msg<proto::CommitCheckReply>& m) {
              answered = true;
              auto r = decode(m);
              if (!r)
                refused = r.err().message;
              else if (!r->get().getOk())
                refused = str(r->get().getReason());
            },
            [&](caf::error& e) {
              refused = "no answer from the coordination service within " +
                        std::to_string(st.cfg.commit_check_timeout.count()) + " ms (" + self->system().render(e) + ")";
            });
    if (answered || std::chrono::steady_clock::now() >= deadline) return refused;
  }
}

/// The fence of a periodic whole-state save (the chief's): asked once its
/// files are durable, before the rename, so a chief frozen or cut off
/// mid-save and declared dead meanwhile commits nothing after it thaws.
/// With the service known to be gone, no: a periodic save needs none of
/// its own (the chief's save without the service is a just-in-time one).
commit_gate periodic_gate(writer_ptr self, const save_request& req) {
  auto& st = self->state;
  if (!req.part_tag.empty() || req.meta.kind != checkpoint_kind::periodic || !st.cfg.coord) return {};
  return [self, step = req.meta.step]() -> status {
    auto refused = fence(self, 0, step);
    if (!refused) return {};
    emit_event("commit_fenced", {{"step", step}, {"why", *refused}});
    return error{errc::failed, "not committed: the coordination service refused it (" + *refused + ")"};
  };
}

/// Reports a commit's outcome to the service (and a failure to the trainer).
void finish_commit(writer_ptr self, save_outcome& o, int64_t t0) {
  auto& st = self->state;
  o.write_ns = mono_ns() - t0;
  if (st.cfg.coord)
    if (auto c = st.cfg.coord->get()) self->send(c, saved_report(st.cfg.rank, o));
  if (!o.ok && st.cfg.ctl) st.cfg.ctl->post_commit_failure(o.step, o.error);
  record(*st.cfg.log, o);
}

/// Phase 2 of a sharded save, on the rank the service chose: commit every
/// rank's part of `step` (node-local directories: this node's) and report
/// it (part = false). The rename waits for the service's yes, asked once
/// everything else is ready: a committer frozen or cut off while it held
/// the order, and declared dead meanwhile, commits nothing.
void commit_parts(writer_ptr self, uint64_t id, uint64_t step, const std::vector<std::string>& servers) {
  auto& st = self->state;
  save_outcome o;
  o.step = step;
  o.agreement_id = id;
  if (st.cfg.commit_delay.count() > 0 && (!st.cfg.commit_delay_step || st.cfg.commit_delay_step == step))
    std::this_thread::sleep_for(st.cfg.commit_delay);
  const int64_t t0 = mono_ns();
  auto it = st.parts.find({id, step});
  if (it == st.parts.end()) {
    o.error = "no part of step " + std::to_string(step) + (id ? " (agreement #" + std::to_string(id) + ")" : "") +
              " was written by this rank";
    return finish_commit(self, o, t0);
  }
  o.kind = it->second.meta.kind;
  commit_plan plan{it->second, {}, {}};
  if (st.cfg.node >= 0)
    if (auto g = gather_node_local(st, plan, servers); !g) {
      o.error = g.err().message;
      return finish_commit(self, o, t0);
    }
  if (auto refused = fence(self, id, step)) {
    o.error = "not committed: the coordination service refused it (" + *refused + ")";
    emit_event("commit_fenced", {{"step", o.step}, {"why", *refused}});
  } else if (auto r = carry_out(st, plan)) {
    o.ok = true;
    o.stats = std::move(r.value());
  } else {
    o.error = r.err().message;
  }
  finish_commit(self, o, t0);
}

checkpoint_writer_actor::behavior_type writer(writer_ptr self, checkpoint_writer_config cfg) {
  self->state.cfg = std::move(cfg);
  if (!self->state.cfg.log) self->state.cfg.log = spdlog::default_logger();
  return {
      [self](save_atom, const save_request& req) -> save_outcome {
        auto& st = self->state;
        auto o = write(*st.cfg.store, st.cfg.fallback, *st.cfg.log, req, st.cfg.rank, periodic_gate(self, req));
        if (o.part && o.ok) remember_part(st, req);
        // Reported before the trainer hears of it: a commit waits for this.
        if ((o.agreement_id || o.part) && st.cfg.coord)
          if (auto c = st.cfg.coord->get()) self->send(c, saved_report(st.cfg.rank, o));
        if (o.ok && st.cfg.ctl) st.cfg.ctl->last_save_ns.store(o.save_ns, std::memory_order_relaxed);
        record(*st.cfg.log, o);
        return o;
      },
      [self](prepare_atom, uint64_t state_bytes) { self->state.cfg.store->prepare_io(state_bytes); },
      [self](commit_atom, uint64_t id, uint64_t step, const std::vector<std::string>& servers) {
        commit_parts(self, id, step, servers);
      },
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
    b.setPart(o.part);
  });
}

}  // namespace grace
