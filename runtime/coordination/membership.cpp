#include "runtime/coordination/membership.hpp"

#include <algorithm>

namespace grace {

const char* to_string(verdict v) noexcept {
  switch (v) {
    case verdict::healthy: return "healthy";
    case verdict::slow: return "slow";
    case verdict::hung: return "hung";
    case verdict::dead: return "dead";
  }
  return "?";
}

void membership::add(uint32_t rank, int64_t now_ns, uint64_t completed) {
  members_[rank] = state{now_ns, now_ns, completed, 0, false};
}

void membership::remove(uint32_t rank) { members_.erase(rank); }

void membership::heartbeat(uint32_t rank, int64_t now_ns, uint64_t completed, int64_t last_step_ns,
                           int64_t last_save_ns) {
  auto it = members_.find(rank);
  if (it == members_.end()) return;
  auto& s = it->second;
  s.last_seen = now_ns;
  if (completed != s.completed) s.last_progress = now_ns;
  s.completed = completed;
  s.last_step_ns = last_step_ns;
  if (last_save_ns > 0) s.last_save_ns = last_save_ns;
}

int64_t membership::slowest_step_ns() const {
  int64_t m = 0;
  for (auto& [r, s] : members_) m = std::max(m, s.last_step_ns);
  return m;
}

std::set<uint32_t> membership::silent(int64_t now_ns, int64_t threshold_ns) const {
  std::set<uint32_t> out;
  for (auto& [r, s] : members_)
    if (now_ns - s.last_seen > threshold_ns) out.insert(r);
  return out;
}

int64_t membership::slowest_save_ns() const {
  int64_t m = 0;
  for (auto& [r, s] : members_) m = std::max(m, s.last_save_ns);
  return m;
}

uint64_t membership::completed(uint32_t rank) const {
  auto it = members_.find(rank);
  return it == members_.end() ? 0 : it->second.completed;
}

/// A gap since the previous observation beyond stall_after: this process
/// did not run, so nobody's heartbeats were read; every member's clocks move
/// on by the gap less one check interval (never past now), and only silence
/// outside the stall counts.
void membership::discount_stall(int64_t now_ns) {
  last_stall_ns_ = 0;
  const int64_t gap = last_check_ns_ > 0 ? now_ns - last_check_ns_ : 0;
  last_check_ns_ = now_ns;
  if (cfg_.stall_after_ns <= 0 || gap <= cfg_.stall_after_ns) return;
  const int64_t stall = gap - cfg_.check_interval_ns;
  if (stall <= 0) return;
  last_stall_ns_ = stall;
  for (auto& [r, s] : members_) {
    s.last_seen = std::min(now_ns, s.last_seen + stall);
    s.last_progress = std::min(now_ns, s.last_progress + stall);
  }
}

std::vector<member_verdict> membership::check(int64_t now_ns) {
  discount_stall(now_ns);
  std::vector<member_verdict> out;
  std::vector<int64_t> step_times;
  for (auto& [r, s] : members_) {
    if (s.last_step_ns > 0) step_times.push_back(s.last_step_ns);
  }
  int64_t median = 0;
  if (!step_times.empty()) {
    std::nth_element(step_times.begin(), step_times.begin() + step_times.size() / 2, step_times.end());
    median = step_times[step_times.size() / 2];
  }
  for (auto it = members_.begin(); it != members_.end();) {
    auto r = it->first;
    auto& s = it->second;
    if (now_ns - s.last_seen > cfg_.dead_after_ns) {
      out.push_back({r, verdict::dead, s.completed,
                     "no heartbeat for " + std::to_string((now_ns - s.last_seen) / 1'000'000) + " ms"});
      it = members_.erase(it);
      continue;
    }
    // Hung: heartbeats arrive (the process lives) but the completed step
    // has not moved for longer than the timeout.
    if (!paused_ && cfg_.hung_after_ns > 0 && now_ns - s.last_progress > cfg_.hung_after_ns) {
      out.push_back({r, verdict::hung, s.completed,
                     "no progress for " + std::to_string((now_ns - s.last_progress) / 1'000'000) + " ms at step " +
                         std::to_string(s.completed)});
      it = members_.erase(it);
      continue;
    }
    bool slow = median > 0 && s.last_step_ns > cfg_.slow_factor * double(median);
    if (slow && !s.slow)
      out.push_back({r, verdict::slow, s.completed,
                     "step time " + std::to_string(s.last_step_ns / 1000) + " us vs median " +
                         std::to_string(median / 1000) + " us"});
    s.slow = slow;
    ++it;
  }
  return out;
}

}  // namespace grace
