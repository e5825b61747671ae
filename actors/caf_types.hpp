#pragma once
/// CAF glue for the protocol: inspect() for `msg<S>`, atoms, registration.
/// Included only by actor translation units (CAF headers are heavy).

#include "messages/wire.hpp"

#include <caf/atom.hpp>
#include <caf/meta/type_name.hpp>

namespace grace {

template <class S>
struct wire_name;
#define GRACE_WIRE_NAME(T)                            \
  template <>                                         \
  struct wire_name<proto::T> {                        \
    static constexpr const char* value = "grace." #T; \
  };
GRACE_MESSAGE_TYPES(GRACE_WIRE_NAME)
#undef GRACE_WIRE_NAME

/// Serialized as one byte vector (one memcpy), under a name registered on
/// every node so the message crosses the network.
template <class Inspector, class S>
typename Inspector::result_type inspect(Inspector& f, msg<S>& x) {
  return f(caf::meta::type_name(wire_name<S>::value), x.bytes);
}

// Atoms: at most 10 characters (CAF 0.17).
using join_atom = caf::atom_constant<caf::atom("g_join")>;
using tick_atom = caf::atom_constant<caf::atom("g_tick")>;
using kv_timeout_atom = caf::atom_constant<caf::atom("g_kvto")>;
/// Launcher -> its node relay (same process): the group's incarnation and first rank.
using incarnation_atom = caf::atom_constant<caf::atom("g_incarn")>;
/// Coordinator -> itself: the deadline is near (rescue) / nearer (cutoff),
/// tagged with the arming's generation.
using rescue_atom = caf::atom_constant<caf::atom("g_rescue")>;
using cutoff_atom = caf::atom_constant<caf::atom("g_cutoff")>;
/// Coordinator -> itself: a takeover's window checks, tagged with its generation.
using takeover_atom = caf::atom_constant<caf::atom("g_takeover")>;
/// Peer watcher -> itself: look for a successor service (etcd failover).
using follow_atom = caf::atom_constant<caf::atom("g_follow")>;
/// Connect helper -> peer watcher: the successor's handle (invalid: not
/// reached, with why), its epoch.
using moved_atom = caf::atom_constant<caf::atom("g_moved")>;
/// Node relay (actors/node_relay.hpp): a local worker registers (rank,
/// incarnation). Every message between processes of different hosts is a
/// Cap'n Proto one (messages/grace.capnp); atoms stay within a host.
using relay_atom = caf::atom_constant<caf::atom("g_relay")>;
/// Launcher -> node relay: the coordination service to talk to.
using coord_atom = caf::atom_constant<caf::atom("g_coord")>;
/// Node relay -> itself: send the acknowledgements gathered (generation).
using flush_atom = caf::atom_constant<caf::atom("g_flush")>;

}  // namespace grace

namespace caf {
class actor_system_config;
}

namespace grace {
/// Registers every protocol type with CAF under its wire name.
void register_message_types(caf::actor_system_config& cfg);
}  // namespace grace
