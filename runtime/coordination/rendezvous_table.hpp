#pragma once
/// The coordination service's key-value store and barriers (the Gloo
/// rendezvous, the NCCL id exchange, the finish barrier) as a pure class:
/// requests in, replies out, no clock, no CAF. The coordinator actor keeps
/// one response promise per waiter id and delivers what this class returns.
///
/// Rules:
/// - keys are set once (a second set of a key is refused) and never deleted
///   within an incarnation; a get of a missing key waits (if the caller
///   allows it) until the key is set or the caller's timeout expires;
/// - a barrier completes when `count` distinct ranks arrived; every
///   arrival must name the same count;
/// - once the group is broken (a member lost or gone) every pending wait
///   fails at once, and later waits that cannot be answered fail at once:
///   the keys and barriers of a broken group will never complete;
/// - a new incarnation starts empty (its keys use a fresh prefix anyway);
/// - everything a member can make the table hold is bounded (`limits`): a
///   request past a bound fails with an error naming it, and the table's
///   state is unchanged.

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace grace {

class rendezvous_table {
public:
  /// Bounds on what members can make the table hold. The defaults leave
  /// room for a 4096-member job's Gloo and NCCL rendezvous many times over.
  struct limits {
    size_t key_bytes = 4096;                     ///< a key or a barrier name
    size_t value_bytes = 1u << 20;               ///< one value
    size_t keys = 1u << 16;                      ///< keys stored
    size_t total_bytes = size_t(256) << 20;      ///< keys and values stored
    size_t pending_gets = 1u << 16;              ///< gets waiting for a key
    size_t barriers = 4096;                      ///< barriers not yet complete
    uint32_t barrier_count = 1u << 20;           ///< the most members a barrier may wait for
  };
  rendezvous_table() = default;
  explicit rendezvous_table(limits l) : limits_(l) {}

  /// An answer to a waiter registered earlier (by its id).
  struct reply {
    uint64_t waiter = 0;
    bool ok = false;
    std::vector<uint8_t> value;
    std::string error;
  };

  struct set_result {
    bool ok = false;
    std::string error;
    std::vector<reply> woken;  ///< gets of this key that were waiting
  };
  set_result set(const std::string& key, std::vector<uint8_t> value);

  struct get_result {
    enum class type { found, failed, pending } what = type::failed;
    std::vector<uint8_t> value;
    std::string error;
  };
  /// `waiter`: the id to answer later when the key is missing and
  /// `may_wait` (then the result is pending until set() or expire()).
  get_result get(const std::string& key, uint64_t waiter, bool may_wait);
  /// The waiter's timeout expired: its failure reply, if it still waits.
  std::optional<reply> expire(uint64_t waiter);

  struct barrier_result {
    bool pending = false;  ///< this arrival waits (its waiter id is kept)
    bool ok = false;       ///< when not pending: the arrival's own answer
    std::string error;
    std::vector<reply> released;  ///< waiters released by this arrival (complete)
  };
  barrier_result arrive(const std::string& name, uint32_t rank, uint32_t count, uint64_t waiter);

  /// The group is broken: every pending get and barrier fails with `why`,
  /// and later waits that cannot be answered at once fail too.
  std::vector<reply> break_group(const std::string& why);
  /// The group was mended in place (a lost member replaced): waits may be
  /// answered again. The keys stay; the re-formed group uses new ones.
  void mend() noexcept { broken_.reset(); }
  /// A new incarnation: empty, not broken; pending waiters fail with `why`.
  std::vector<reply> reset(const std::string& why);

  bool broken() const noexcept { return broken_.has_value(); }
  size_t keys() const noexcept { return kv_.size(); }
  size_t pending_gets() const noexcept { return gets_.size(); }
  size_t pending_barriers() const noexcept { return barriers_.size(); }

private:
  struct barrier {
    uint32_t count = 0;
    std::set<uint32_t> arrived;
    std::vector<uint64_t> waiters;
  };
  std::vector<reply> fail_waiters(const std::string& why);

  std::map<std::string, std::vector<uint8_t>> kv_;
  std::map<uint64_t, std::string> gets_;  ///< waiter -> key
  std::map<std::string, barrier> barriers_;
  std::optional<std::string> broken_;
  limits limits_;
  size_t bytes_ = 0;  ///< keys and values stored
};

}  // namespace grace
