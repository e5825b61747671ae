#pragma once
/// Failure verdicts from application heartbeats: a pure class (the caller
/// supplies the clock). Heartbeats carry each member's completed step, so
/// "dead" (silent), "hung" (talking but not progressing while it should)
/// and "slow" (progressing, but much slower than its peers) can be told apart.

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace grace {

struct membership_config {
  int64_t dead_after_ns = 5'000'000'000;  ///< silence longer than this: dead
  int64_t hung_after_ns = 0;              ///< no progress longer than this: hung (0: off)
  double slow_factor = 3.0;               ///< step time above factor * median: slow
  /// Two observations further apart than this: the observing process
  /// itself was stalled (frozen, suspended), and the members' heartbeats
  /// could not be read meanwhile; the gap beyond `check_interval_ns` (the
  /// usual distance between checks) is not counted as their silence (0: off).
  int64_t stall_after_ns = 0;
  int64_t check_interval_ns = 0;
};

enum class verdict : uint8_t { healthy, slow, hung, dead };
const char* to_string(verdict v) noexcept;

struct member_verdict {
  uint32_t rank;
  verdict what;
  uint64_t completed;
  std::string detail;
};

class membership {
public:
  explicit membership(membership_config cfg = {}) : cfg_(cfg) {}
  void add(uint32_t rank, int64_t now_ns, uint64_t completed);
  void remove(uint32_t rank);
  void heartbeat(uint32_t rank, int64_t now_ns, uint64_t completed, int64_t last_step_ns, int64_t last_save_ns = 0);
  /// The slowest member's last step and last save (0 when none reported):
  /// what a save before a deadline must leave room for.
  int64_t slowest_step_ns() const;
  int64_t slowest_save_ns() const;
  /// Members not heard from for longer than `threshold_ns` (not yet dead).
  std::set<uint32_t> silent(int64_t now_ns, int64_t threshold_ns) const;
  /// Members that are not healthy now. Each dead/hung member is reported
  /// once (then removed); slow ones are reported each time they turn slow.
  std::vector<member_verdict> check(int64_t now_ns);
  uint64_t completed(uint32_t rank) const;
  bool contains(uint32_t rank) const { return members_.count(rank) != 0; }
  size_t size() const { return members_.size(); }
  /// Suspends hang detection (e.g. while everyone waits at a save).
  void set_paused(bool p) { paused_ = p; }
  /// The stall the last observation discounted (0: none).
  int64_t last_stall_ns() const { return last_stall_ns_; }
  /// Discounts a stall of this process since the last check or observe
  /// (check does it itself); call before `silent`.
  void observe(int64_t now_ns) { discount_stall(now_ns); }

private:
  struct state {
    int64_t last_seen = 0;
    int64_t last_progress = 0;
    uint64_t completed = 0;
    int64_t last_step_ns = 0;
    int64_t last_save_ns = 0;
    bool slow = false;
  };
  membership_config cfg_;
  std::map<uint32_t, state> members_;
  bool paused_ = false;
  int64_t last_check_ns_ = 0;
  int64_t last_stall_ns_ = 0;
  void discount_stall(int64_t now_ns);
};

}  // namespace grace
