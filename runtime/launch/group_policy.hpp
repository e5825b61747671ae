#pragma once
/// The launcher's decisions, pure so they are unit-tested: what one worker's
/// exit means for its group, what the launcher does once a group ended
/// (stop with which code, or restart), when repeated rendezvous failures
/// mean "stop", and which incarnation a launcher that does not host the
/// coordinator starts its group in.

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
/// (a worker refused for that waits for it, actors/session.cpp), so:
/// - `current` when this launcher is behind: it is new (a replacement host)
///   or was cut off while the others restarted: join the group that forms;
/// - `current + 1` once it has been in `current` (a normal restart) or
///   counted past it alone, unable to reach the coordinator.
/// Without an answer it counts on its own.
inline uint32_t next_incarnation(std::optional<uint32_t> previous, uint32_t initial, std::optional<uint32_t> current) {
  if (!current) return previous ? *previous + 1 : initial;
  return (previous && *previous >= *current) ? *current + 1 : *current;
}

/// What one worker's exit means for its group.
enum class exit_effect {
  finished,  ///< exit 0
  restart,   ///< the restart code, a signal, or a failed rendezvous (45)
  fatal,     ///< any other code: a bug or an error reported to everyone
  usage,     ///< exit 2: bad configuration (fatal, and said so)
};
exit_effect classify_exit(int code, int signal, int restart_code);

/// How a group ended, as the launcher collected it from its workers' exits.
struct group_end {
  bool restart = false;            ///< some worker's exit asks for a restart
  bool fatal = false;              ///< some worker failed (no restart)
  bool crashed = false;            ///< some worker died by a signal: a failure, not a notice
  bool usage = false;              ///< ... with a usage error
  bool rendezvous_failed = false;  ///< some worker exited 45
  std::string cause;               ///< the first exit that was not a success, described
  std::string fatal_cause;         ///< the first fatal one (what a fatal end names)
  /// Folds one worker's exit in; `describe` names it for `cause`.
  void add(exit_effect e, bool no_rendezvous, const std::string& describe);
};

/// What the launcher does after a group ended.
struct launcher_decision {
  bool restart = false;  ///< start the next group (then `code` is unused)
  bool counted = true;   ///< ... and it counts toward --max-restarts (a membership change does not)
  int code = 0;          ///< the launcher's exit code otherwise
  std::string reason;    ///< the one line it prints and writes to grace-exit.json
};

struct group_context {
  int nproc = 1;                  ///< workers on this node
  bool notice_forwarded = false;  ///< the launcher got SIGTERM/SIGINT and passed it on
  int restarts = 0;               ///< groups restarted so far
  int max_restarts = 0;
  int restart_code = 42;
  /// Elastic jobs: the group ended to take in a node that waited (a
  /// growth, runtime/coordination/elastic.hpp), not because anything failed.
  bool membership_change = false;
  /// Appended to the "failed its rendezvous" reason: what to check (the
  /// coordinator's address, the one this node advertises).
  std::string rendezvous_hint;
  /// Node-local checkpoints: why this group's leveling failed (empty: it
  /// did not). The ranks then restore different steps and are refused, so
  /// a streak of failed rendezvous names this instead of the addresses.
  std::string level_problem;
};

/// The decision after a group ended. A fatal exit stops (2 or 3); all
/// finished stops with 0; a forwarded notice stops with the restart code
/// (the scheduler restarts the job); `streak` (updated here) stops with 44
/// after too many failed rendezvous in a row, as do exhausted restarts
/// (a membership change is not counted); otherwise restart.
launcher_decision decide_after_group(const group_end& g, const group_context& c, rendezvous_streak& streak);

/// What the launcher knows when one of its workers exited while the group
/// trains (recovery in place, runtime/coordination/agreement.hpp).
struct replace_conditions {
  bool in_place = false;          ///< --recovery in-place
  exit_effect effect = exit_effect::finished;
  int signal = 0;                 ///< the signal that ended the worker (0: it exited)
  bool group_ending = false;      ///< another worker exited for a restart or an error, or a notice came
  int restarts = 0;               ///< restarts and replacements so far
  int max_restarts = 0;
};

/// Whether to start a replacement for that worker at once, in the same
/// incarnation, instead of waiting for the group to end: only for a lost
/// process (killed by a signal, or declared lost and killed), never for a
/// worker that chose its exit (0, the restart code, an error, a usage
/// error) or a group already ending, and only within --max-restarts.
bool replace_in_place(const replace_conditions& c);

/// Why this node's checkpoints cannot be brought level after a leveling
/// (`failed`, with `error`), given what an earlier one found (`before`): a
/// failure names its own reason; one that heard every peer's checkpoint
/// server clears it; one that heard fewer learned nothing and keeps
/// `before` (a node that came back with an empty disk and then finds the
/// node holding the parts gone still cannot resume).
std::string level_problem_after(const std::string& before, bool failed, const std::string& error,
                                bool heard_every_peer);

/// A launcher on node > 0 whose coordination service (in node 0's launcher)
/// stayed unreachable for `waited_ms` after its group ended: nothing can be
/// agreed without it and no other node may take over (that needs an
/// arbiter), so it stops with the restart code (the scheduler restarts the
/// whole job) and names the newest committed checkpoint it will resume
/// from (0: none), or why it cannot (`level_problem`: its node-local
/// checkpoints could not be brought level before its last group).
/// `signal_name` set: a SIGTERM/SIGINT ended the wait.
launcher_decision coordinator_gone(const std::string& where, int64_t waited_ms, uint64_t newest_step,
                                   int restart_code, const std::string& signal_name = "",
                                   const std::string& level_problem = "");

}  // namespace grace
