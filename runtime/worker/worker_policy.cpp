#include "runtime/worker/worker_policy.hpp"

#include "runtime/base/deadline.hpp"

namespace grace {

const char* to_string(wait_reason r) noexcept {
  switch (r) {
    case wait_reason::agreement: return "the agreed step";
    case wait_reason::commit: return "the commit";
    case wait_reason::verdict: return "the coordinator's verdict";
    case wait_reason::cluster_error: return "the cluster error broadcast";
  }
  return "?";
}

const char* to_string(worker_decision::type t) noexcept {
  using ty = worker_decision::type;
  switch (t) {
    case ty::run: return "run";
    case ty::run_clear: return "run_clear";
    case ty::ack_jit: return "ack_jit";
    case ty::reach: return "reach";
    case ty::continue_grace: return "continue_grace";
    case ty::propose_final: return "propose_final";
    case ty::save_own: return "save_own";
    case ty::recover: return "recover";
    case ty::wait: return "wait";
    case ty::stop: return "stop";
  }
  return "?";
}

using ty = worker_decision::type;

worker_policy::worker_policy(worker_policy_config cfg, uint64_t restored_step)
    : cfg_(cfg), restored_(restored_step), last_saved_(restored_step), prior_saved_(restored_step), replacement_(cfg.replacement) {}

void worker_policy::step_time(int64_t ns) {
  // The first step after a start pays for warm-up (first touches, a fresh
  // rendezvous, cold caches): it stands in only until a real step is measured,
  // so it cannot inflate the margin for the rest of the grace period.
  if (!warmup_seen_) {
    warmup_seen_ = true;
    warmup_ns_ = ns;
    return;
  }
  if (step_ns_.size() < 64)
    step_ns_.push_back(ns);
  else
    step_ns_[step_next_++ % 64] = ns;
}

void worker_policy::save_time(int64_t ns) {
  save_ns_.push_back(ns);
  if (save_ns_.size() > 32) save_ns_.erase(save_ns_.begin());
}

int64_t worker_policy::margin_ns() const {
  if (step_ns_.empty() && warmup_seen_)
    return final_save_margin({warmup_ns_}, save_ns_, cfg_.margin_factor, cfg_.margin_steps);
  return final_save_margin(step_ns_, save_ns_, cfg_.margin_factor, cfg_.margin_steps);
}

worker_decision worker_policy::make(ty t) {
  if (t != ty::wait) waiting_ = false;
  worker_decision d;
  d.what = t;
  return d;
}

worker_decision worker_policy::stop(int code, std::string message) {
  auto d = make(ty::stop);
  d.code = code;
  d.message = std::move(message);
  return d;
}

worker_decision worker_policy::wait(wait_reason r, const boundary_input& in, int code, std::string on_timeout) {
  bool fresh = !waiting_ || wait_reason_ != r;
  if (fresh) {
    waiting_ = true;
    wait_reason_ = r;
    int64_t bound = r == wait_reason::commit ? cfg_.save_wait_ns : cfg_.verdict_wait_ns;
    wait_deadline_ = in.mono_ns + bound;
  }
  if (in.mono_ns >= wait_deadline_) {
    int64_t bound = r == wait_reason::commit ? cfg_.save_wait_ns : cfg_.verdict_wait_ns;
    return stop(code, on_timeout + " (no word within " + std::to_string(bound / 1000000) + " ms waiting for " +
                          to_string(r) + ")");
  }
  worker_decision d;
  d.what = ty::wait;
  d.reason = r;
  d.deadline_ns = wait_deadline_;
  d.new_wait = fresh;
  return d;
}

worker_decision worker_policy::next(const control_state& s, const boundary_input& in) {
  const uint64_t c = in.completed;
  if (in.mode == boundary_mode::own_error) return after_own_error(s, in);
  if (s.failure) return stop(cfg_.fatal_code, "cluster error: " + s.failure->message);
  if (s.order && s.committed && s.committed->id >= s.order->id &&
      (s.order->exit_after || s.committed->exit_after || s.order->kind == checkpoint_kind::jit)) {
    auto step = std::to_string(s.committed->step);
    // A just-in-time round without a lost peer is the coordinator's rescue
    // of a round its grace-period deadline would have cut off.
    const char* why = s.lost ? (s.lost->kind == loss_kind::coordinator_moving ? "coordination service moved" : "peer lost")
                      : s.coordinator_gone ? "coordination service lost"
                                           : "deadline near";
    return stop(cfg_.restart_code, s.order->kind == checkpoint_kind::jit
                                       ? std::string(why) + "; just-in-time checkpoint at step " + step + " committed"
                                       : "preempted: checkpoint at step " + step + " committed, restart to resume");
  }
  if (s.recover && (!s.order || s.order->id <= s.recover->id)) {
    auto d = make(ty::recover);
    d.id = s.recover->id;
    d.step = s.recover->step;
    return d;
  }
  if (s.order && s.order->kind == checkpoint_kind::jit) return follow_jit(s, in);
  if (replacement_ && !s.coordinator_gone)
    return wait(wait_reason::verdict, in, cfg_.restart_code,
                "this replacement for rank " + std::to_string(cfg_.rank) + " got no recovery order");
  if (s.coordinator_gone) return coordinator_lost(in);
  if (s.lost) {
    auto& l = *s.lost;
    return wait(wait_reason::verdict, in, cfg_.restart_code,
                l.kind == loss_kind::coordinator_moving ? l.detail
                                                        : "rank " + std::to_string(l.rank) + " lost: " + l.detail);
  }
  if (in.mode == boundary_mode::collective_failed)
    return wait(wait_reason::verdict, in, cfg_.restart_code,
                "step " + std::to_string(c + 1) +
                    " failed in a collective and the coordination service "
                    "named no cause");
  if (auto d = follow_agreement(s, in)) return *d;
  return countdown(s, in);
}

worker_decision worker_policy::after_own_error(const control_state& s, const boundary_input& in) {
  std::string why =
      "error in step " + std::to_string(in.completed + 1) + " on rank " + std::to_string(cfg_.rank) + ": " + in.error;
  // The broadcast reached us (or cannot come): every member stops with it.
  if (s.failure || s.coordinator_gone) return stop(cfg_.fatal_code, why);
  return wait(wait_reason::cluster_error, in, cfg_.fatal_code, why);
}

worker_decision worker_policy::follow_jit(const control_state& s, const boundary_input& in) {
  auto& o = *s.order;
  if (!o.agreed) {
    if (acked_ != o.id && s.acked_for_trainer != o.id) {
      auto d = make(ty::ack_jit);
      d.id = o.id;
      d.step = in.completed;
      return d;
    }
    if (s.coordinator_gone) return coordinator_lost(in);
    return wait(wait_reason::agreement, in, cfg_.restart_code,
                "just-in-time round #" + std::to_string(o.id) + " did not conclude");
  }
  // From kept copies every member writes its part of the agreed step.
  if ((o.saver == cfg_.rank || o.from_kept) && reached_ != o.id) {
    auto d = make(ty::reach);
    d.id = o.id;
    d.step = o.from_kept ? o.step : in.completed;
    d.kind = checkpoint_kind::jit;
    d.save = true;
    d.sync = true;
    d.from_kept = o.from_kept;
    d.from_replica = o.from_replica;
    return d;
  }
  // Our own save (if we were the saver) is on disk already.
  if (s.coordinator_gone) return coordinator_lost(in);
  return wait(wait_reason::commit, in, cfg_.restart_code,
              "just-in-time checkpoint at step " + std::to_string(o.step) + " by rank " + std::to_string(o.saver) +
                  " was not committed");
}

std::optional<worker_decision> worker_policy::follow_agreement(const control_state& s, const boundary_input& in) {
  if (!s.order) return std::nullopt;
  auto& o = *s.order;
  const uint64_t c = in.completed;
  if (!o.agreed) {
    if (c < o.step) return make(ty::run);
    return wait(
        wait_reason::agreement, in, cfg_.restart_code,
        "agreement #" + std::to_string(o.id) + " (lower bound step " + std::to_string(o.step) + ") did not conclude");
  }
  if (c < o.step) return make(ty::run);
  if (c > o.step)
    return stop(cfg_.fatal_code, "protocol violation: completed step " + std::to_string(c) +
                                     " is past the agreed step " + std::to_string(o.step));
  if (reached_ != o.id) {
    auto d = make(ty::reach);
    d.id = o.id;
    d.step = c;
    d.kind = o.kind;
    d.save = o.saver == cfg_.rank || o.all_save;
    d.sync = o.exit_after;
    return d;
  }
  if (o.exit_after)
    return wait(
        wait_reason::commit, in, cfg_.restart_code,
        "checkpoint at step " + std::to_string(o.step) + " by rank " + std::to_string(o.saver) + " was not committed");
  auto d = make(ty::continue_grace);
  d.id = o.id;
  d.step = c;
  return d;
}

worker_decision worker_policy::coordinator_lost(const boundary_input& in) {
  const uint64_t c = in.completed;
  // Synchronous peers hold the same state at the same step, so the chief's
  // completed step is at most one behind the most advanced survivor.
  if (cfg_.save_alone_without_coordinator && cfg_.is_chief && c > last_saved_) {
    auto d = make(ty::save_own);
    d.step = c;
    d.kind = checkpoint_kind::jit;
    return d;
  }
  return stop(cfg_.restart_code, "coordination service lost");
}

worker_decision worker_policy::countdown(const control_state& s, const boundary_input& in) {
  if (s.deadline_ns && cfg_.is_chief && !final_proposed_ && s.committed) {
    int64_t margin = margin_ns();
    if (final_save_due(s.deadline_ns, in.wall_ns, margin)) {
      auto d = make(ty::propose_final);
      d.step = in.completed + 1;
      d.left_ns = s.deadline_ns - in.wall_ns;
      d.margin_ns = margin;
      return d;
    }
    return make(ty::run);  // keep checking every step
  }
  if (s.deadline_ns && !s.committed) return make(ty::run);
  return make(ty::run_clear);
}

}  // namespace grace
