#pragma once
/// The coordination service's host when it may move (the optional etcd
/// backend, `grace-launch --etcd`): the pure rules, unit-tested.
///
/// Every launcher may host the service. The one that creates etcd's leader
/// key (under a lease) hosts it; the key's create revision is the service's
/// epoch (etcd revisions only grow, so a later leader always has a larger
/// one). The others follow the key. When the leader's host is lost, etcd
/// deletes the key once its lease runs out, and a follower takes over with
/// a larger epoch; the workers that survive rejoin the new service, which
/// saves them just in time.
///
/// No split brain: a new leader can only be elected once etcd dropped the
/// old lease, `ttl` after the last renewal etcd saw. A leader that has not
/// renewed for half its TTL stops deciding anything (it closes its
/// coordination service), so its last decision comes at least half a TTL
/// before its successor's first, as long as clock rates differ by less
/// than that margin.

#include "runtime/base/error.hpp"

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>

namespace grace {

/// When a leader may act and when it renews its lease.
class leader_lease {
public:
  explicit leader_lease(int64_t ttl_ns) : ttl_ns_(ttl_ns) {}
  /// etcd granted or renewed the lease at `now_ns`.
  void renewed(int64_t now_ns) noexcept { last_ = now_ns; }
  /// True while the last renewal is less than half the TTL old.
  bool may_lead(int64_t now_ns) const noexcept { return last_ >= 0 && now_ns - last_ < ttl_ns_ / 2; }
  /// When to renew next: a sixth of the TTL after the last renewal, so two
  /// more tries fit before may_lead() turns false.
  int64_t renew_at() const noexcept { return last_ + ttl_ns_ / 6; }
  int64_t ttl_ns() const noexcept { return ttl_ns_; }

private:
  int64_t ttl_ns_;
  int64_t last_ = -1;
};

/// Where the coordination service is: what the leader key holds and what a
/// launcher tells its workers (in the file named by GRACE_COORDINATOR_FILE).
struct coordinator_location {
  std::string endpoint;   ///< "address:port"
  uint64_t epoch = 0;     ///< the leader key's create revision
  uint32_t node = 0;      ///< the node rank of the launcher hosting it
  /// "address:port epoch node", one line.
  std::string to_line() const;
  /// An error names what is malformed.
  static result<coordinator_location> parse(const std::string& line);
};

/// What a follower does with what it last saw of the leader key.
enum class follow_action {
  keep,      ///< the same leader: nothing to do
  moved,     ///< a leader with a larger epoch: reconnect to it
  campaign,  ///< no leader (its lease ran out): try to become one
};
follow_action next_follow_action(const std::optional<coordinator_location>& known,
                                 const std::optional<coordinator_location>& seen);

/// Whether a launcher may campaign now that the leader key is absent. A
/// newcomer (it saw another launcher lead, and has not started a group
/// since: a replacement host joining a job in progress) waits `defer_ns`
/// of absence first, so the survivors of the running group elect one of
/// theirs, which takes the group over; a newcomer elected in its place
/// would host a fresh service that refuses their rejoin (their work since
/// the last checkpoint lost). It still leads when no survivor does.
bool may_campaign(bool member, bool saw_other_leader, int64_t absent_ns, int64_t defer_ns);

/// The job key `/grace/<run-id>/job`: "running EPOCH" while a leader runs
/// the job (every leader puts it once elected), "finished EPOCH" once the
/// last leader saw it finish with success (under a lease of a few minutes,
/// written before that leader releases its key).
struct job_mark {
  enum class state : uint8_t { absent, running, finished };
  state what = state::absent;
  uint64_t epoch = 0;  ///< the leader that wrote it (0: a value without one)
};
/// The job key's value read back; a malformed value reads as running (a job
/// of unknown state: join it as a newcomer, never stop for it).
job_mark read_job_key(const std::optional<std::string>& value);
std::string job_key_value(job_mark::state s, uint64_t epoch);

/// Whether a launcher about to campaign must stop instead: the job it
/// belongs to finished without it (it was away when the group finished and
/// the last leader released its key). Not on the launcher's first look at
/// the key (a requeued run of the same id starts anew), nor for a mark older
/// than the newest leader this launcher saw (an earlier job's mark that the
/// running job's leader had not replaced yet).
bool job_finished_without_us(const job_mark& m, bool first_look, uint64_t newest_leader_epoch);

/// A successor's takeover so far: the running group's survivors rejoin it
/// before one just-in-time round saves them. Rank r runs on node r / nproc.
struct takeover_progress {
  uint32_t world_size = 0;
  uint32_t nproc = 0;                  ///< workers per node
  int32_t own_node = 0;                ///< the node hosting the successor
  int32_t lost_leader = -1;            ///< the node that hosted the service before (its lease ran out); -1 unknown
  std::set<int32_t> registered;        ///< nodes whose launcher registered with the successor
  uint32_t rejoined_count = 0;         ///< ranks back
  int64_t age_ns = 0;                  ///< since the takeover began
  int64_t min_ns = 0;                  ///< before this, only the two rules that need no launcher to register
  int64_t window_ns = 0;               ///< the latest end
};

/// Why a takeover ends now, or `wait`.
enum class takeover_end {
  wait,
  everyone,             ///< every rank rejoined
  all_but_lost_leader,  ///< every rank but the lost leader's node's rejoined: nobody else can come back
  live_nodes,           ///< after min_ns: every rank of this node and of each registered launcher rejoined
  window,               ///< the window closed
};
const char* to_string(takeover_end e) noexcept;

/// The takeover's end rule. The lost leader's node is the one whose lease
/// etcd dropped: its service deposed itself and its workers, if alive, look
/// for a successor they may not reach (a cut). Once every other rank is back
/// there is nobody left worth waiting for; otherwise the successor waits
/// `min_ns` for the other launchers to register (a node also lost never
/// does), then for their ranks, at most `window_ns`. `back(r)`: rank r
/// rejoined.
takeover_end takeover_outcome(const takeover_progress& p, const std::function<bool(uint32_t)>& back);

} // namespace grace
