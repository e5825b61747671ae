#pragma once
/// Conversions between the protocol's enums (generated, camelCase) and
/// Grace's own: the only place they meet.

#include "messages/grace.capnp.h"
#include "runtime/coordination/agreement.hpp"
#include "runtime/checkpoint/checkpoint_kind.hpp"
#include "runtime/worker/control_block.hpp"

namespace grace {

/// Only agreement kinds travel (initial, final, jit, periodic).
proto::CheckpointKind to_wire(checkpoint_kind k) noexcept;
checkpoint_kind from_wire(proto::CheckpointKind k) noexcept;
proto::LossReason to_wire(loss_reason r) noexcept;
/// A lost peer as the worker's control block records it.
loss_kind from_wire(proto::LossReason r) noexcept;
/// A just-in-time acknowledgement's kept copies and replica (sharded state).
void set_copies(proto::Ack::Builder b, const replica_report& r);
replica_report copies_of(proto::Ack::Reader a);

}  // namespace grace
