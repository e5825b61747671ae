#pragma once
/// Sharded state with in-memory replicas (runtime/checkpoint/replica.hpp): what a
/// member can write in a just-in-time round besides its live state. The
/// agreement (runtime/coordination/agreement.hpp, "Replicas") picks a step
/// from these reports.

#include <cstdint>
#include <optional>
#include <vector>

namespace grace {

struct replica_report {
  std::vector<uint64_t> kept;     ///< steps of which it keeps a copy of its own part
  std::optional<uint32_t> of;     ///< the member whose part it holds a replica of
  std::vector<uint64_t> replica;  ///< steps of that replica that arrived whole
  bool operator==(const replica_report& o) const { return kept == o.kept && of == o.of && replica == o.replica; }
};

}  // namespace grace
