#pragma once
/// Two small launcher decisions, pure so they are unit-tested:
/// when repeated rendezvous failures mean "stop", and which incarnation a
/// launcher that does not host the coordinator starts its group in.

#include <cstdint>
#include <optional>
#include <string>

namespace grace {

/// Counts groups in a row that failed to rendezvous (a worker exited with
/// exit_code::no_rendezvous: coordination service unreachable, or the
/// collectives' rendezvous failed: typically an address the peers cannot
/// reach). A group that made it past the rendezvous resets the count. At
/// `limit` in a row the launcher stops with exit_code::no_progress instead
/// of restarting forever.
class rendezvous_streak {
public:
  explicit rendezvous_streak(int limit) : limit_(limit) {}
  /// One group ended. Returns true when the launcher should give up.
  bool group_ended(bool rendezvous_failed) {
    count_ = rendezvous_failed ? count_ + 1 : 0;
    return limit_ > 0 && count_ >= limit_;
  }
  int count() const noexcept { return count_; }
  int limit() const noexcept { return limit_; }

private:
  int limit_;
  int count_ = 0;
};

/// The incarnation a launcher on node > 0 starts its next group in.
/// `previous`: the incarnation of its group that just ended (none at its
/// first start, where `initial` is GRACE_INCARNATION or 0); `current`: the
/// coordinator's, if it could be asked. The coordinator accepts a join for
/// its current incarnation, or for current + 1 once the old group is gone
/// (a worker refused for that waits for it, runtime/grace.cpp), so:
/// - `current` when this launcher is behind: it is new (a replacement host)
///   or was cut off while the others restarted: join the group that forms;
/// - `current + 1` once it has been in `current` (a normal restart) or
///   counted past it alone, unable to reach the coordinator.
/// Without an answer it counts on its own.
inline uint32_t next_incarnation(std::optional<uint32_t> previous, uint32_t initial,
                                 std::optional<uint32_t> current) {
  if (!current) return previous ? *previous + 1 : initial;
  return (previous && *previous >= *current) ? *current + 1 : *current;
}

} // namespace grace
