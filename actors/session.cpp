// The embedding API's implementation and the worker's composition root:
// which actor runs where (peer watcher on the scheduler, checkpoint writer
// detached on its own thread, signal watcher on a thread of its own, the
// trainer on the caller's thread).
#include "actors/session_parts.hpp"

namespace grace {

void session::impl::leave(int c) {
  if (member.left || !member.joined || !wire.rt || wire.ctl->coordinator_gone()) return;  // told already, or nobody to tell
  auto m = make<proto::Leave>([&](auto b) {
    b.setRank(cluster.rank);
    b.setExitCode(c);
  });
  member.left = true;
  caf::scoped_actor self{wire.rt->sys()};
  self->request(wire.coord->get(), member.verdict_wait, std::move(m))
      .receive([](bool) {},
               [&](caf::error& e) { log->warn("leave: no answer from the coordinator: {}", wire.rt->sys().render(e)); });
}

error session::impl::leave_failed_attach(error e) {
  leave(attach_failure_exit(e.code, opts.restart_exit_code));
  return e;
}

step_result session::impl::stop(int c, std::string why, bool may_throw) {
  disarm_abort();
  code = c;
  reason = std::move(why);
  log->info("stopping with exit code {}: {}", c, reason);
  emit_event("exit", {{"code", c}, {"reason", reason}, {"step", completed}});
  leave(c);
  if (may_throw && opts.throw_on_stop) throw stop_requested(c, reason);
  return step_result::stop;
}

std::optional<step_result> session::impl::boundary(uint64_t k, boundary_mode mode, const std::string& error,
                                                  bool may_throw) {
  using ty = worker_decision::type;
  for (;;) {
    const uint64_t c = k - 1;
    take_answers(false);  // saves finished meanwhile: the margin's save times
    auto s = wire.ctl->take_snapshot();
    // Without the service a save in flight may yet fail (its commit is
    // fenced): a chief that may save alone learns its outcome first. Only
    // it: a sharded part's commit waits on the service, and no one else
    // acts on the outcome.
    if (s.coordinator_gone && saves.writes_in_flight > 0 && member.policy &&
        member.policy->config().save_alone_without_coordinator && cluster.is_chief())
      take_answers(true);
    boundary_input in{c, mode, mono_ns(), wall_ns(), error};
    auto d = member.policy->next(s, in);
    switch (d.what) {
      case ty::run: return std::nullopt;
      case ty::run_clear:
        if (wire.ctl->clear_pending_if_unchanged(s.version)) return std::nullopt;
        continue;  // something arrived meanwhile: decide again
      case ty::ack_jit: ack_jit(d); continue;
      case ty::reach:
        if (d.save && d.kind == checkpoint_kind::jit && mutants::active().no_just_in_time_save)
          return stop(opts.restart_exit_code, "just-in-time save disabled (broken on purpose)", may_throw);
        if (auto st = reach(d); !st)
          return stop(exit_code::fatal, "checkpoint save failed: " + st.err().message, may_throw);
        continue;
      case ty::continue_grace:
        wire.ctl->clear_order(d.id);
        member.policy->grace_continues();
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
        wire.ctl->wait_for_change(s.version,
                             std::chrono::steady_clock::time_point(std::chrono::nanoseconds(d.deadline_ns)));
        continue;
      case ty::recover: {
        bool torn = false;
        auto st = recover_in_place(d, torn);
        if (!st && torn)
          return stop(opts.restart_exit_code, "recovery in place: " + st.err().message, may_throw);
        // Recovered: the next step is the one after the donor's. A re-form
        // that failed waits for the verdict like a failed collective.
        k = completed + 1;
        mode = st ? boundary_mode::step_start : boundary_mode::collective_failed;
        continue;
      }
      case ty::stop: return stop(d.code, d.message, may_throw);
    }
  }
}

void session::impl::ack_jit(const worker_decision& d) {
  log->warn("peer lost: stopped at step {}, reporting it for a just-in-time save", d.step);
  auto copies = freeze_copies(*reg.replicas);
  to_coordinator(make<proto::Ack>([&](auto b) {
    b.setAgreementId(d.id);
    b.setRank(cluster.rank);
    b.setEarliestStep(d.step);
    set_copies(b, copies);
  }));
  member.policy->acked(d.id);
}

status session::impl::reach(const worker_decision& d) {
  emit_event("reached_agreed_step", {{"step", d.step}, {"id", d.id}});
  member.policy->reached(d.id);
  if (!d.save) return {};
  if (d.from_kept) return save_kept(d);
  if (d.kind == checkpoint_kind::jit)
    log->warn("saving a just-in-time checkpoint at step {} (the most advanced survivor)", d.step);
  return save(d.step, d.kind, d.id, d.sync);
}

void session::impl::propose_final(const worker_decision& d) {
  log->info("grace period: {} ms left, margin {} ms: proposing the final save", d.left_ns / 1000000,
            d.margin_ns / 1000000);
  emit_event("propose_final", {{"left_ns", d.left_ns}, {"margin_ns", d.margin_ns}, {"step", d.step}});
  to_coordinator(make<proto::ProposeFinal>([&](auto b) {
    b.setRank(cluster.rank);
    b.setStartedStep(d.step);
  }));
  member.policy->proposed_final();
}

step_result session::impl::after_step_error(uint64_t k, bool collective, const std::string& what) {
  in_step = false;
  // An error while a failure is known is its consequence (an aborted
  // collective surfacing as some other exception).
  if (!collective) collective = wire.ctl->failure_known();
  if (collective) {
    log->warn("step {} failed in a collective: {}", k, what);
    const auto recoveries = member.recoveries;
    if (auto s = boundary(k, boundary_mode::collective_failed)) return *s;
    // Recovered in place: step k is abandoned, the trainer goes on with
    // completed_steps() + 1.
    if (member.recoveries != recoveries) return step_result::ok;
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

std::optional<step_result> session::impl::begin() {
  if (!member.attached) return stop(exit_code::usage, "a step before attach()");
  const uint64_t k = completed + 1;
  wire.ctl->started.store(k, std::memory_order_seq_cst);
  if (wire.ctl->pending.load(std::memory_order_seq_cst)) {
    if (auto s = boundary(k, boundary_mode::step_start)) return s;
  }
  in_step = true;
  step_t0 = mono_ns();
  return std::nullopt;
}

void session::impl::complete(uint64_t k) {
  in_step = false;
  auto dt = mono_ns() - step_t0;
  completed = k;
  wire.ctl->completed.store(k, std::memory_order_seq_cst);
  wire.ctl->last_step_ns.store(dt, std::memory_order_relaxed);
  member.policy->step_time(dt);
  if (!first_step_logged) {
    first_step_logged = true;
    emit_event("first_step", {{"step", k}, {"ns", dt}});
  }
  keep_copy(k);
  if (cluster.is_chief() || reg.sharded) maybe_periodic_save(k);
}

void session::impl::keep_copy(uint64_t k) {
  auto keeper = reg.replicas->get();
  if (!keeper) return;
  auto meta = meta_for(k, checkpoint_kind::jit);
  auto st = add_blobs(meta);
  if (st) st = keeper->keep(k, reg.kept_layout, std::move(meta));
  if (!st) log->warn("replicas: step {} not kept: {}", k, st.err().message);
}

session::session(options opts) : impl_(std::make_unique<impl>()) {
  if (auto released = await_standby_release(); !released) impl_->member.standby_error = released.err();
  block_termination_signals();
  impl_->opts = std::move(opts);
  impl_->log = impl_->opts.log ? impl_->opts.log : spdlog::default_logger();
}

session::~session() {
  if (!impl_) return;
  impl_->disarm_abort();
  if (impl_->wire.signals) impl_->wire.signals->stop();
  impl_->stop_warmer();
  if (impl_->wire.self) impl_->take_answers(true);
  impl_->wire.self.reset();
  if (impl_->wire.rt) {
    caf::anon_send_exit(impl_->saves.writer, caf::exit_reason::user_shutdown);
    // A detached actor's thread ends only once its last handle is gone, and
    // the actor system's destructor waits for that thread.
    impl_->saves.writer = nullptr;
    caf::anon_send_exit(impl_->wire.watcher, caf::exit_reason::user_shutdown);
    if (impl_->wire.hosted) caf::anon_send_exit(impl_->wire.hosted, caf::exit_reason::user_shutdown);
  }
  impl_->reg.replicas->set(nullptr);  // its threads use the store and the actor system
  impl_->member.kv.reset();
  impl_->wire.rt.reset();
}

void session::register_tensor(tensor_ref t) { impl_->reg.tensors.push_back(std::move(t)); }
void session::register_counter(const std::string& name, int64_t* value) { impl_->reg.counters[name] = value; }
void session::register_blob(const std::string& name, std::function<std::string()> save,
                            std::function<void(const std::string&)> restore) {
  impl_->reg.blobs[name] = session_registry::blob_hooks{std::move(save), std::move(restore)};
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
  if (!impl_->member.attached) return impl_->stop(exit_code::usage, "fail_step() before attach()");
  return impl_->after_step_error(impl_->completed + 1, collective, what);
}



int session::stop_after_failure(const error& e, int no_verdict_code) {
  auto& d = *impl_;
  if (!d.member.attached) return exit_code::usage;
  d.log->warn("outside a step: {}", e.message);
  const auto recoveries = d.member.recoveries;
  if (!d.boundary(d.completed + 1, boundary_mode::collective_failed, {}, false)) {
    if (d.member.recoveries != recoveries) return exit_code::success;  // recovered in place: carry on
    d.stop(no_verdict_code >= 0 ? no_verdict_code : d.opts.restart_exit_code, e.message, false);
  }
  return d.code;
}

status session::finish() {
  auto& d = *impl_;
  if (!d.member.attached) return error{errc::invalid_input, "finish() before attach()"};
  d.disarm_abort();  // no collective runs after the last step
  if (d.wire.signals) d.wire.signals->stop();
  d.take_answers(true);
  if (d.reg.sharded) {
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



/// Nobody leaves before the chief's final checkpoint is on disk (the chief
/// arrives once it is). The service fails the barrier at once when a member
/// is lost; otherwise it may take as long as the chief's save.
void session::impl::finish_barrier() {
  if (!member.kv) return;
  caf::scoped_actor self{wire.rt->sys()};
  std::string err;
  self->request(wire.coord->get(), opts.save_timeout + member.verdict_wait, make<proto::Barrier>([&](auto b) {
                  b.setName(member.prefix + "finish");
                  b.setRank(cluster.rank);
                  b.setCount(cluster.world_size);
                }))
      .receive(
          [&](msg<proto::BarrierReply>& r) {
            auto rr = decode(r);
            if (!rr || !rr->get().getOk()) err = rr ? str(rr->get().getError()) : rr.err().message;
          },
          [&](caf::error& e) { err = wire.rt->sys().render(e); });
  if (!err.empty()) log->warn("finish barrier: {}", err);
}

void session::quick_exit(int code) {
  impl_->disarm_abort();
  // Not after stop() or finish() (they left already): an exit the
  // coordinator must not take for a lost member (e.g. a failed rendezvous).
  if (!impl_->member.left) impl_->leave(code);
  if (impl_->wire.self) impl_->take_answers(true);
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
std::shared_ptr<gloo::rendezvous::Store> session::rendezvous_store() { return impl_->member.kv; }
std::string session::rendezvous_prefix() const { return impl_->member.prefix; }

void session::set_abort_handler(std::function<void()> f) { impl_->wire.ctl->set_abort_handler(std::move(f)); }

void session::on_world_change(std::function<status()> reconnect) { impl_->reg.world_change = std::move(reconnect); }
uint64_t session::recoveries() const { return impl_->member.recoveries; }

void session::notify(const std::string& detail) {
  auto& d = *impl_;
  if (!d.member.attached) return;
  caf::anon_send(d.wire.watcher, make<proto::Notice>([&](auto b) {
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
