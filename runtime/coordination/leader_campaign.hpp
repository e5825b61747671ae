#pragma once
/// The launcher's side of the optional etcd backend (`grace-launch --etcd`):
/// a thread that campaigns for the job's leader key, renews the lease while
/// it leads, follows the key otherwise, and reports each change as an
/// event. The rules it follows are the pure ones of runtime/coordination/leader_rules.hpp;
/// this class only talks to etcd and keeps time.
///
/// Fencing: when the lease cannot be renewed for half its TTL, the elector
/// calls the `depose` hook on its own thread at once (the launcher closes
/// its coordination service there), before it reports the event; a
/// successor can only be elected after etcd dropped the lease, a full TTL
/// after the last renewal etcd saw.

#include "runtime/net/etcd_client.hpp"
#include "runtime/coordination/leader_rules.hpp"
#include "runtime/base/wake_pipe.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace grace {

struct elector_config {
  std::string endpoints;            ///< etcd, "http://a:p,http://b:p"
  std::string key;                  ///< the job's leader key
  std::string endpoint;             ///< where this launcher would host the service ("address:port")
  uint32_t node = 0;                ///< this launcher's node rank
  int ttl_seconds = 2;              ///< the leader lease
  std::chrono::milliseconds poll{50};  ///< how often a follower reads the key (a GET; on the failover path)
  /// A newcomer's wait before it campaigns (see may_campaign).
  std::chrono::milliseconds newcomer_defer{0};
  /// The job key (runtime/coordination/leader_rules.hpp, job_mark): every leader puts
  /// "running EPOCH" (no lease); the last one replaces it with "finished
  /// EPOCH" under a lease of `finished_ttl_seconds` when the job finished
  /// with success, or removes it when the job failed. A launcher that finds
  /// it running before its first campaign joins a job in progress (a
  /// replacement host started after the leader's lease ran out), so it counts
  /// as a newcomer; one that finds it finished before a later campaign stops
  /// (the job finished while it was away). Read before every campaign.
  /// Empty: none.
  std::string job_key;
  int finished_ttl_seconds = 300;
};

struct leadership_event {
  enum class type : uint8_t {
    elected,    ///< this launcher leads: host the service at `where`
    following,  ///< another launcher leads, at `where` (a newer epoch than the last)
    deposed,    ///< this launcher stopped leading (lease not renewed in time)
    unreachable,  ///< etcd did not answer (`detail`); reported once until it answers again
    finished,   ///< the job finished without this launcher (job_finished_without_us): it stops, exit 0
  };
  type what = type::following;
  coordinator_location where;
  std::string detail;
};
const char* to_string(leadership_event::type t) noexcept;

/// The leader key's value: "address:port node" (the epoch is the key's
/// create revision, known only once it exists).
std::string leader_value(const std::string& endpoint, uint32_t node);
/// The location a leader key describes; nothing if its value is malformed.
std::optional<coordinator_location> location_from(const etcd_value& v);

/// Many fields for a reason: the campaign's thread and the launcher share
/// them under one mutex (the events) or as atomics; split into objects,
/// every transition of the campaign would take several locks.
class leader_campaign {
public:
  /// Checks the endpoints (an error names a malformed one); does not start.
  static result<std::unique_ptr<leader_campaign>> create(elector_config cfg, std::function<void()> depose);
  ~leader_campaign();

  void start();
  /// This launcher started a group: it may campaign at once from now on.
  void joined_group() noexcept { member_ = true; }
  /// Stops the thread; `release`: a leader revokes its lease, so a later
  /// job of the same run id need not wait for it to expire. `finished`: the
  /// job finished with success; a leader marks the job key so before it
  /// releases its key (else it removes its running mark).
  void stop(bool release, bool finished = false);

  /// Whether the service this launcher hosts may decide now: true while the
  /// lease was renewed less than half its TTL ago. Once that lapsed (the
  /// host was frozen, or etcd was out of reach) it waits, at most `limit`,
  /// for this elector's next renewal try: true if etcd renewed the lease,
  /// false if it is lost (the elector deposes the service) or the wait
  /// ran out. Thread-safe; the coordinator calls it before each decision,
  /// so a host thawed after its lease ran out never decides on the stale
  /// lease in the moment before the elector's own thread runs.
  bool lease_holds(std::chrono::milliseconds limit) const;

  /// Readable when events are queued (for a launcher's poll loop).
  int fd() const noexcept { return wake_.fd(); }
  std::vector<leadership_event> take();

private:
  leader_campaign(elector_config cfg, etcd_client client, std::function<void()> depose);
  void loop();
  void lead_once();
  void follow_once();
  void campaign();
  void push(leadership_event e);
  void etcd_failed(const std::string& why);
  void renewed(int64_t t0);
  bool check_job_key();
  void mark_job();
  void mark_finished();

  elector_config cfg_;
  etcd_client client_;
  std::function<void()> depose_;
  leader_lease lease_;
  int64_t lease_id_ = 0;
  bool leading_ = false;
  /// What lease_holds() reads: until when the lease lets the service decide
  /// (steady clock, ns), and a counter bumped at each renewal or deposal.
  std::atomic<int64_t> valid_until_{-1};
  std::atomic<uint64_t> lease_news_{0};
  bool said_unreachable_ = false;
  std::atomic<bool> member_{false};  ///< joined_group
  bool saw_other_ = false;           ///< another launcher led while this one watched (or job_key existed)
  bool job_key_checked_ = false;     ///< the first look at the job key was taken
  bool finished_elsewhere_ = false;  ///< the job finished without this launcher: nothing more to do
  uint64_t earlier_run_ = 0;  ///< a finished mark below this epoch is an earlier run's (seen at the first look)
  bool job_marked_ = false;          ///< job_key created (or found) while leading
  int64_t absent_since_ = 0;         ///< when the key was first seen absent (0: present)
  std::optional<coordinator_location> known_;  ///< the leader last seen (ours while leading)
  std::thread thread_;
  std::mutex m_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::vector<leadership_event> events_;
  wake_pipe wake_;  ///< readable while events wait
};

}  // namespace grace
