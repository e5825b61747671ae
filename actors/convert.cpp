#include "actors/convert.hpp"

namespace grace {

proto::CheckpointKind to_wire(checkpoint_kind k) noexcept {
  switch (k) {
    case checkpoint_kind::final: return proto::CheckpointKind::FINAL;
    case checkpoint_kind::jit: return proto::CheckpointKind::JIT;
    case checkpoint_kind::periodic: return proto::CheckpointKind::PERIODIC;
    default: return proto::CheckpointKind::INITIAL;
  }
}

checkpoint_kind from_wire(proto::CheckpointKind k) noexcept {
  switch (k) {
    case proto::CheckpointKind::INITIAL: return checkpoint_kind::initial;
    case proto::CheckpointKind::FINAL: return checkpoint_kind::final;
    case proto::CheckpointKind::JIT: return checkpoint_kind::jit;
    case proto::CheckpointKind::PERIODIC: return checkpoint_kind::periodic;
  }
  return checkpoint_kind::initial;
}

proto::LossReason to_wire(loss_reason r) noexcept {
  switch (r) {
    case loss_reason::dead: return proto::LossReason::DEAD;
    case loss_reason::hung: return proto::LossReason::HUNG;
    case loss_reason::left: return proto::LossReason::LEFT;
  }
  return proto::LossReason::DEAD;
}

loss_kind from_wire(proto::LossReason r) noexcept {
  switch (r) {
    case proto::LossReason::DEAD: return loss_kind::peer_dead;
    case proto::LossReason::HUNG: return loss_kind::peer_hung;
    case proto::LossReason::LEFT: return loss_kind::peer_left;
  }
  return loss_kind::peer_dead;
}

void set_copies(proto::Ack::Builder b, const replica_report& r) {
  auto kept = b.initKeptSteps(static_cast<unsigned>(r.kept.size()));
  for (unsigned i = 0; i < r.kept.size(); ++i) kept.set(i, r.kept[i]);
  b.setHoldsReplica(r.of.has_value());
  b.setReplicaOf(r.of.value_or(0));
  auto rep = b.initReplicaSteps(static_cast<unsigned>(r.replica.size()));
  for (unsigned i = 0; i < r.replica.size(); ++i) rep.set(i, r.replica[i]);
}

replica_report copies_of(proto::Ack::Reader a) {
  replica_report r;
  for (auto s : a.getKeptSteps()) r.kept.push_back(s);
  if (a.getHoldsReplica()) r.of = a.getReplicaOf();
  for (auto s : a.getReplicaSteps()) r.replica.push_back(s);
  return r;
}

}  // namespace grace
