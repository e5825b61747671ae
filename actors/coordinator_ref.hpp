#pragma once
/// The coordination service a worker talks to, shared by its actors (peer
/// watcher, checkpoint writer) and its trainer thread. Swapped by the peer
/// watcher when the service moves (etcd failover: a successor was elected
/// after the host of the old one was lost); everyone else reads it for each
/// message, so nothing keeps talking to the old one.

#include "actors/coordinator.hpp"
#include "runtime/base/guarded.hpp"

namespace grace {

using coordinator_ref = guarded<coordinator_member>;

}  // namespace grace
