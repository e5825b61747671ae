#include "runtime/coordination/relay_batches.hpp"

namespace grace {

void relay_batches::set_incarnation(uint32_t incarnation) {
  if (incarnation == incarnation_) return;
  incarnation_ = incarnation;
  members_.clear();
  beats_.clear();
  acks_.clear();
  ack_id_ = 0;
}

bool relay_batches::add_member(uint32_t rank, uint32_t incarnation) {
  if (incarnation != incarnation_) return false;
  members_.insert(rank);
  return true;
}

void relay_batches::remove_member(uint32_t rank) {
  members_.erase(rank);
  beats_.erase(rank);
  acks_.erase(rank);
}

void relay_batches::beat(const relay_beat& b) {
  if (!members_.count(b.rank) || b.incarnation != incarnation_) return;
  beats_[b.rank] = b;
}

std::vector<relay_beat> relay_batches::take_beats() {
  std::vector<relay_beat> out;
  out.reserve(beats_.size());
  for (auto& [rank, b] : beats_) out.push_back(b);
  beats_.clear();
  return out;
}

relay_batches::ack_outcome relay_batches::ack(const relay_ack& a, std::vector<relay_ack>* superseded) {
  if (!members_.count(a.rank)) return ack_outcome::ignored;
  if (!acks_.empty() && a.id != ack_id_) {
    auto old = take_acks();
    if (superseded) *superseded = std::move(old);
  }
  ack_id_ = a.id;
  acks_[a.rank] = a;
  for (auto r : members_)
    if (!acks_.count(r)) return ack_outcome::pending;
  return ack_outcome::complete;
}

std::vector<relay_ack> relay_batches::take_acks() {
  std::vector<relay_ack> out;
  out.reserve(acks_.size());
  for (auto& [rank, a] : acks_) out.push_back(a);
  acks_.clear();
  return out;
}

}  // namespace grace
