#include "runtime/worker/control_block.hpp"

#include <algorithm>

namespace grace {

namespace {
bool replaced_by(const recover_order& o, uint32_t rank) {
  return std::find(o.replaced.begin(), o.replaced.end(), rank) != o.replaced.end();
}
}  // namespace

const char* to_string(loss_kind k) noexcept {
  switch (k) {
    case loss_kind::peer_dead: return "peer dead";
    case loss_kind::peer_hung: return "peer hung";
    case loss_kind::peer_left: return "peer left";
    case loss_kind::coordinator_lost: return "coordinator lost";
    case loss_kind::coordinator_moving: return "coordinator moving";
  }
  return "?";
}

void control_block::raise_locked() {
  ++state_.version;
  pending.store(true, std::memory_order_seq_cst);
  cv_.notify_all();
}

trainer_progress control_block::post_order(const checkpoint_order& o) {
  std::lock_guard<std::mutex> g(m_);
  state_.order = o;
  if (o.deadline_ns) state_.deadline_ns = o.deadline_ns;
  raise_locked();
  // Dekker: the flag is visible before we read `started`, so the trainer
  // starts no step beyond max(o.step, started).
  trainer_progress p;
  p.started = started.load(std::memory_order_seq_cst);
  p.completed = completed.load(std::memory_order_seq_cst);
  return p;
}

void control_block::post_commit(const commit_info& c) {
  std::lock_guard<std::mutex> g(m_);
  if (!state_.committed || state_.committed->id <= c.id) state_.committed = c;
  raise_locked();
}

void control_block::post_failure(const cluster_failure& f) {
  std::lock_guard<std::mutex> g(m_);
  if (!state_.failure) state_.failure = f;
  raise_locked();
}

void control_block::post_loss(const loss_info& l) {
  std::lock_guard<std::mutex> g(m_);
  if (l.kind == loss_kind::coordinator_lost)
    state_.coordinator_gone = true;
  else if (!state_.lost || (state_.recover && replaced_by(*state_.recover, state_.lost->rank) &&
                            !replaced_by(*state_.recover, l.rank)))
    state_.lost = l;  // a loss the recovery in flight does not cover is kept over one it does
  raise_locked();
}

void control_block::post_recover(const recover_order& o) {
  std::lock_guard<std::mutex> g(m_);
  state_.recover = o;
  raise_locked();
}

void control_block::end_recovery(uint64_t id) {
  std::lock_guard<std::mutex> g(m_);
  if (!state_.recover || state_.recover->id != id) return;
  if (state_.lost && state_.lost->kind != loss_kind::coordinator_moving && replaced_by(*state_.recover, state_.lost->rank))
    state_.lost.reset();
  if (state_.order && state_.order->id <= id) state_.order.reset();
  state_.recover.reset();
  ++state_.version;
}

void control_block::post_deadline(int64_t deadline_ns) {
  std::lock_guard<std::mutex> g(m_);
  state_.deadline_ns = deadline_ns;
  raise_locked();
}

void control_block::post_commit_failure(uint64_t step, std::string why) {
  std::lock_guard<std::mutex> g(m_);
  commit_failure_.emplace(step, std::move(why));
}

std::optional<std::string> control_block::commit_failure(uint64_t step) {
  std::lock_guard<std::mutex> g(m_);
  if (commit_failure_ && commit_failure_->first == step) return commit_failure_->second;
  return std::nullopt;
}

void control_block::post_acked_for_trainer(uint64_t id) {
  std::lock_guard<std::mutex> g(m_);
  state_.acked_for_trainer = std::max(state_.acked_for_trainer, id);
}

control_state control_block::take_snapshot() {
  std::lock_guard<std::mutex> g(m_);
  return state_;
}

bool control_block::wait_for_change(uint64_t seen, std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lk(m_);
  return cv_.wait_until(lk, deadline, [&] { return state_.version != seen; });
}

bool control_block::clear_pending_if_unchanged(uint64_t seen) {
  std::lock_guard<std::mutex> g(m_);
  if (state_.version != seen) return false;
  pending.store(false, std::memory_order_seq_cst);
  return true;
}

void control_block::clear_order(uint64_t id) {
  std::lock_guard<std::mutex> g(m_);
  if (state_.order && state_.order->id == id) state_.order.reset();
  ++state_.version;
}

bool control_block::coordinator_gone() {
  std::lock_guard<std::mutex> g(m_);
  return state_.coordinator_gone;
}

bool control_block::failure_known() {
  std::lock_guard<std::mutex> g(m_);
  return state_.failure || state_.lost || state_.coordinator_gone;
}

void control_block::set_abort_handler(std::function<void()> f) {
  bool due = false;
  {
    std::lock_guard<std::mutex> g(m_);
    abort_collectives_ = std::move(f);
    due = abort_collectives_ && (state_.failure || state_.lost || state_.coordinator_gone);
  }
  // An abort that was due before the handler existed (a peer lost while the
  // trainer was still connecting its collective) is not lost.
  if (due) abort();
}

void control_block::abort() {
  {
    std::function<void()> f;
    {
      std::lock_guard<std::mutex> g(m_);
      if (!abort_collectives_) return;
      f = abort_collectives_;
      ++aborts_running_;
    }
    try {
      f();
    } catch (...) {
      // A handler must not throw; an abort is best effort anyway.
    }
    // `f` (and whatever it captured) is released before the count drops,
    // so after disarm() no abort call holds the communicator.
  }
  {
    std::lock_guard<std::mutex> g(m_);
    --aborts_running_;
  }
  abort_cv_.notify_all();
}

void control_block::disarm() {
  std::unique_lock<std::mutex> lk(m_);
  abort_collectives_ = nullptr;
  ++disarms_waiting_;
  abort_cv_.wait(lk, [this] { return aborts_running_ == 0; });
  --disarms_waiting_;
}

int control_block::disarms_waiting() {
  std::lock_guard<std::mutex> g(m_);
  return disarms_waiting_;
}

bool control_block::armed() {
  std::lock_guard<std::mutex> g(m_);
  return static_cast<bool>(abort_collectives_);
}

}  // namespace grace
