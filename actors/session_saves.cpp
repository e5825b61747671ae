// The save pipeline: capture, write, commit, periodic saves (session_parts.hpp).
#include "actors/session_parts.hpp"

namespace grace {

void session::impl::start_warmer() {
  saves.warm.thread = std::thread([this] {
    std::unique_lock<std::mutex> lk(saves.warm.m);
    while (!saves.warm.cv.wait_for(lk, std::chrono::seconds(2), [this] { return saves.warm.stop; })) {
      saves.buffers->keep_warm();
      saves.store->keep_io_warm();
    }
  });
}

void session::impl::stop_warmer() {
  {
    std::lock_guard<std::mutex> g(saves.warm.m);
    saves.warm.stop = true;
  }
  saves.warm.cv.notify_all();
  if (saves.warm.thread.joinable()) saves.warm.thread.join();
}

checkpoint_meta session::impl::meta_for(uint64_t step, checkpoint_kind kind) {
  checkpoint_meta m;
  m.step = step;
  m.world_size = static_cast<int>(cluster.world_size);
  m.run_id = cluster.run_id;
  m.incarnation = cluster.incarnation;
  m.kind = kind;
  for (auto& [name, p] : reg.counters) m.counters[name] = *p;
  m.metadata["grace.saved_by_rank"] = std::to_string(cluster.rank);
  if (!cluster.group_nodes.empty()) m.metadata["grace.group_nodes"] = cluster.group_nodes;
  return m;
}

std::string session::impl::part_tag(uint64_t agreement_id) const {
  return "i" + std::to_string(cluster.incarnation) + (agreement_id ? "-a" + std::to_string(agreement_id) : "-p");
}

status session::impl::check_sharding() {
  for (auto& t : reg.tensors) {
    if (auto why = slice_problem(t); !why.empty()) return error{errc::invalid_input, why};
    reg.sharded |= t.sharded();
  }
  if (!reg.sharded) return {};
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

status session::impl::wait_for_commit(uint64_t step) {
  auto until = std::chrono::steady_clock::now() + opts.save_timeout;
  while (saves.store->newest_valid_step() < step) {
    if (auto why = wire.ctl->commit_failure(step)) return error{errc::failed, "the commit failed: " + *why};
    if (wire.ctl->failure_known() || wire.ctl->coordinator_gone())
      return error{errc::failed, "a member or the coordination service was lost before every part of step " +
                                     std::to_string(step) + " was durable"};
    if (std::chrono::steady_clock::now() > until)
      return error{errc::failed, "the parts of step " + std::to_string(step) + " were not committed within " +
                                     std::to_string(opts.save_timeout.count()) + " ms"};
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return {};
}

status session::impl::add_blobs(checkpoint_meta& m) {
  for (auto& [name, h] : reg.blobs) {
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

bool session::impl::reuse_save(uint64_t step, uint64_t id) {
  if (!saves.last_save || saves.last_save->step != step || !saves.last_save->ok) return false;
  log->info("checkpoint step {} is already on disk: reporting it for agreement #{}", step, id);
  if (id == 0) return true;
  auto o = *saves.last_save;
  o.agreement_id = id;
  to_coordinator(saved_report(cluster.rank, o));
  return true;
}

status session::impl::failed_save(uint64_t step, checkpoint_kind kind, uint64_t id, const error& e, int64_t snap_ns) {
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

void session::impl::absorb(const save_outcome& o) {
  saves.last_save = o;
  if (o.ok && member.policy) member.policy->save_time(o.save_ns);
  if (!o.ok && member.policy) member.policy->save_failed(o.step);
  if (o.kind == checkpoint_kind::periodic) periodic_result(o);
}

void session::impl::periodic_result(const save_outcome& o) {
  auto& b = saves.periodic_retry;
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

std::optional<save_outcome> session::impl::take_answers(bool block) {
  std::optional<save_outcome> last;
  bool more = saves.writes_in_flight > 0;
  while (more) {
    auto on_answer = [&](save_outcome& o) {
      --saves.writes_in_flight;
      absorb(o);
      last = std::move(o);
      more = saves.writes_in_flight > 0;
    };
    auto on_down = [&](caf::down_msg& d) {
      log->error("the checkpoint writer is gone ({}): {} write(s) lost", wire.rt->sys().render(d.reason),
                 saves.writes_in_flight);
      saves.writes_in_flight = 0;
      more = false;
    };
    if (block)
      (*wire.self)->receive(on_answer, on_down);
    else
      (*wire.self)->receive(
          on_answer, on_down, caf::after(std::chrono::seconds(0)) >> [&] { more = false; });
  }
  return last;
}

status session::impl::save(uint64_t step, checkpoint_kind kind, uint64_t agreement_id, bool sync, bool make_room) {
  take_answers(true);  // the buffers of the previous write are free again
  if (!reg.sharded && reuse_save(step, agreement_id)) return {};
  auto meta = meta_for(step, kind);
  if (auto b = add_blobs(meta); !b) return failed_save(step, kind, agreement_id, b.err(), 0);
  if (saves.buffers->busy())  // the writer died holding them: its write may still read them
    return failed_save(step, kind, agreement_id, error{errc::overloaded, "the snapshot buffers are still being written"}, 0);
  if (auto st = saves.buffers->check(reg.tensors); !st) return failed_save(step, kind, agreement_id, st.err(), 0);
  // Periodic saves only: a save the trainer waits for (a deadline's) gets
  // the memory bandwidth to itself, and the exit after it no mirror to wait for.
  if (reg.sharded && !sync)
    if (auto keeper = reg.replicas->get()) keeper->mirror(step, meta, part_tag(agreement_id));
  save_request req{saves.buffers, std::move(meta), agreement_id, 0, make_room};
  if (reg.sharded) {
    req.part_tag = part_tag(agreement_id);
    req.with_replicated = cluster.is_chief();
  }
  auto st = sync ? capture_while_written(std::move(req)) : capture_then_write(std::move(req));
  if (!st) return st;
  if (member.policy) member.policy->saved(step);
  if (!sync) return {};
  auto o = take_answers(true);
  if (!o || !o->ok) return error{errc::failed, o ? o->error : "the checkpoint writer is gone"};
  return {};
}

status session::impl::capture_then_write(save_request req) {
  auto step = req.meta.step;
  auto kind = req.meta.kind;
  auto t0 = mono_ns();
  auto st = saves.buffers->capture(reg.tensors);
  req.snap_ns = mono_ns() - t0;
  if (!st) return failed_save(step, kind, req.agreement_id, st.err(), req.snap_ns);
  emit_event("snapshot_done", {{"step", step}, {"kind", to_string(kind)}, {"ns", req.snap_ns}});
  saves.buffers->set_busy(true);
  (*wire.self)->send(saves.writer, save_atom::value, std::move(req));
  ++saves.writes_in_flight;
  return {};
}

status session::impl::capture_while_written(save_request req) {
  auto step = req.meta.step;
  auto kind = req.meta.kind;
  req.overlapped = true;
  req.begin_ns = mono_ns();
  saves.buffers->begin_capture();
  saves.buffers->set_busy(true);
  (*wire.self)->send(saves.writer, save_atom::value, std::move(req));
  ++saves.writes_in_flight;
  auto t0 = mono_ns();
  auto st = saves.buffers->copy_in(reg.tensors);
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

status session::impl::save_kept(const worker_decision& d) {
  auto keeper = reg.replicas->get();
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
  (*wire.self)->send(saves.writer, save_atom::value, std::move(req));
  ++saves.writes_in_flight;
  auto o = take_answers(true);
  if (!o || !o->ok) return error{errc::failed, o ? o->error : "the checkpoint writer is gone"};
  return {};
}

void session::impl::maybe_periodic_save(uint64_t k) {
  if (saves.writes_in_flight) take_answers(false);  // a failed write starts the backoff at once
  if (saves.periodic_retry.pending()) {
    if (!saves.periodic_retry.due(mono_ns())) return;
    saves.last_periodic_ns = mono_ns();
    save(k, checkpoint_kind::periodic, 0, false, opts.prune_on_save_failure);
    return;
  }
  if (saves.auto_interval) return auto_periodic_save(k);
  bool due = opts.save_every_steps && k % opts.save_every_steps == 0;
  if (!due && opts.save_every_seconds > 0 && double(mono_ns() - saves.last_periodic_ns) >= opts.save_every_seconds * 1e9)
    due = true;
  if (!due) return;
  saves.last_periodic_ns = mono_ns();
  save(k, checkpoint_kind::periodic, 0, false);
}

/// --save-every auto: the first save measures the cost (what the trainer
/// waits for: earlier writes still in flight, then the snapshot); after
/// it, the interval is Daly's for that cost and the estimated MTBF.
void session::impl::auto_periodic_save(uint64_t k) {
  auto& ai = *saves.auto_interval;
  auto now = mono_ns();
  ai.set_running(double(now - attached_ns) / 1e9);
  if (ai.measured() && double(now - saves.last_periodic_ns) < ai.seconds() * 1e9) return;
  save(k, checkpoint_kind::periodic, 0, false);
  saves.last_periodic_ns = mono_ns();
  ai.on_save_cost(saves.last_periodic_ns - now);
  double s = ai.seconds();
  if (std::abs(s - saves.announced_interval_s) <= 0.1 * saves.announced_interval_s) return;
  saves.announced_interval_s = s;
  log->info("periodic saves every {:.2f} s (Daly's rule: save cost {:.2f} ms, MTBF estimate {:.0f} s)", s,
            ai.cost_s() * 1e3, ai.mtbf_s());
  emit_event("save_interval", {{"seconds", s}, {"mtbf_s", ai.mtbf_s()}, {"cost_s", ai.cost_s()}, {"step", k}});
}

/// Sharded state: every rank's part of the last step (unless the periodic
/// save of that step already wrote it, or no step ran since the restore of
/// that step's checkpoint), committed by the chief, who alone then removes
/// the backups.
status session::impl::finish_sharded() {
  const bool have = (saves.last_save && saves.last_save->ok && saves.last_save->part && saves.last_save->step == completed) ||
                    (member.restored_any && completed == member.restored_step);
  status s = have ? status{} : save(completed, checkpoint_kind::end, 0, true);
  if (s && dir_keeper()) s = wait_for_commit(completed);
  if (!s) {
    stop(exit_code::fatal,
         "the final checkpoint at step " + std::to_string(completed) + " could not be written: " + s.err().message,
         false);
    return s;
  }
  if (!dir_keeper()) return {};
  saves.store->remove_parts_up_to(completed);
  if (!opts.keep_checkpoints_on_success) remove_backups();
  return {};
}

void session::impl::remove_backups() {
  for (auto& info : saves.store->list()) {
    if (info.temporary || info.set_aside || !info.valid || info.step == completed) continue;
    std::error_code ec;
    std::filesystem::remove_all(info.path, ec);
    if (ec) log->warn("could not delete backup {}: {}", info.path.string(), ec.message());
  }
}

}  // namespace grace
