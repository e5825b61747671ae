#pragma once
/// What a node relay (actors/node_relay.hpp) holds between two messages to
/// the coordination service, as a pure class: the node's workers of the
/// current incarnation, the newest heartbeat of each since the last batch,
/// and the acknowledgements of the current proposal. No clock, no CAF; the
/// relay asks it what to send and when.
///
/// Heartbeats: one batch per heartbeat interval, the newest beat of each
/// worker heard since the previous batch (a worker that said nothing is not
/// in it: its silence is what the service's failure detector must see).
/// Acknowledgements: one batch per proposal, sent once every local worker
/// of the incarnation acknowledged it (the usual case: the peer watchers
/// acknowledge at once), or when the relay's short flush timer fires
/// (just-in-time rounds: a trainer inside a step acknowledges later, and
/// directly). A proposal with a new id flushes what the old one gathered.

#include "runtime/coordination/agreement.hpp"

#include <cstdint>
#include <map>
#include <set>
#include <vector>

namespace grace {

struct relay_beat {
  uint32_t rank = 0;
  uint32_t incarnation = 0;
  uint64_t completed = 0;
  int64_t last_step_ns = 0;
  int64_t last_save_ns = 0;
};

struct relay_ack {
  uint64_t id = 0;
  uint32_t rank = 0;
  uint64_t earliest = 0;
  replica_report copies{};  ///< sharded state's kept copies and replica (just in time)
};

class relay_batches {
public:
  /// The group's incarnation (the launcher's, at each group start):
  /// workers of an older one no longer count.
  void set_incarnation(uint32_t incarnation);
  uint32_t incarnation() const noexcept { return incarnation_; }
  /// A local worker of `incarnation` registered (false: an older one, refused).
  bool add_member(uint32_t rank, uint32_t incarnation);
  void remove_member(uint32_t rank);
  const std::set<uint32_t>& members() const noexcept { return members_; }

  /// A heartbeat of a local worker (kept only if it is a member).
  void beat(const relay_beat& b);
  /// The beats to send now (empty: nothing heard), cleared.
  std::vector<relay_beat> take_beats();

  enum class ack_outcome : uint8_t {
    ignored,   ///< not a member
    pending,   ///< wait for the others (arm the flush timer if it is the first)
    complete,  ///< every member acknowledged: send the batch now
  };
  /// An acknowledgement of a local worker. If it is of another proposal
  /// than the one gathered so far, `superseded` receives those acks (send
  /// them first).
  ack_outcome ack(const relay_ack& a, std::vector<relay_ack>* superseded = nullptr);
  /// The acks gathered so far, cleared.
  std::vector<relay_ack> take_acks();
  bool acks_pending() const noexcept { return !acks_.empty(); }

private:
  uint32_t incarnation_ = 0;
  std::set<uint32_t> members_;
  std::map<uint32_t, relay_beat> beats_;
  uint64_t ack_id_ = 0;
  std::map<uint32_t, relay_ack> acks_;
};

}  // namespace grace
