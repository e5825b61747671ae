#pragma once
/// Node-local sharded checkpoints (grace-launch --node-local-checkpoints):
/// before a group starts, every launcher brings its node's directory level
/// with its peers', so that every rank restores the same step and finds
/// the parts it reads on its own disk.
///
/// A node-local step is committed on every node (checkpoint_store::
/// commit_node_parts): each node's `step-<N>` holds the same manifest and
/// index and the parts that node holds. What can go wrong between nodes:
///   - a node was killed after the parts were durable but before its own
///     commit: its parts are in `.parts-step-<N>-<tag>`, another node has
///     `step-<N>`. It rolls forward: the peer's manifest and index, then
///     its own parts adopted against the manifest's checksums;
///   - a node is new (a replacement) or lost its disk: it takes the
///     manifest and index from a peer and fetches the parts its ranks read;
///   - a step some part of which exists nowhere any more (its only holder
///     lost its disk): it is set aside on every node, and the newest step
///     whose every part exists is restored instead.
/// A part is available when some node holds it in a committed step or
/// durable in a parts directory (that node rolls it forward itself, in
/// parallel: a fetch from it is retried until it has), or mirrored in a
/// node's memory directory by the replica holder (runtime/checkpoint/replica.hpp):
/// the last resort, adopted (copied to disk, checked against the manifest)
/// by that node only when no disk holds the part, e.g. a host lost with
/// its disk when the holder's workers died too and no just-in-time save
/// could write the part from their replicas.
///
/// Every launcher decides from what all nodes report, so they agree; a
/// node whose peers' reports changed meanwhile may decide differently, and
/// the service then refuses the mismatched restore (agreement::
/// join_refusal) and the group restarts once more, level by then.

#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/base/error.hpp"

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace grace {

/// The newest step in `needed` (its parts, from its manifest) whose every
/// part is in `available` (held somewhere, committed or durable).
std::optional<uint64_t> newest_restorable(const std::map<uint64_t, std::set<std::string>>& needed,
                                          const std::map<uint64_t, std::set<std::string>>& available);

/// The parts this node's `ranks` read from a node-local step of `m` in a
/// group of `world`: on the world size it was saved with, their own parts
/// and every part holding a replicated tensor (the index's `weight_map`);
/// on another (resharded at load), every part.
std::set<std::string> parts_needed_here(const checkpoint_manifest& m, const nlohmann::json& index,
                                        const std::vector<uint32_t>& ranks, uint32_t world);

struct level_config {
  std::filesystem::path dir;         ///< this node's checkpoint directory
  std::string token;                 ///< the job's secret (the peers' checkpoint servers)
  std::vector<std::string> peers;    ///< the other nodes' checkpoint servers
  std::vector<uint32_t> ranks;       ///< this node's ranks in the coming group
  uint32_t world = 0;                ///< the coming group's world size
  std::chrono::milliseconds io_timeout{10000};
  /// How long a part only durable on a peer may take to appear there
  /// (that peer rolls it forward in parallel).
  std::chrono::milliseconds roll_forward_wait{20000};
  /// This node's memory directory, where replica holders mirror their
  /// sources' parts (empty: none).
  std::filesystem::path memory_dir;
  /// The job's checkpoint key: steps (ours and the peers') must be signed
  /// with it, and what leveling commits is (none: unsigned checkpoints).
  std::optional<checkpoint_key> key;
};

/// What a leveling found.
struct leveled {
  uint64_t step = 0;              ///< the step the group will restore (0: none)
  bool heard_every_peer = true;   ///< false: some peers' checkpoint servers did not answer
};

/// Brings `c.dir` level (see above). Returns the step the group will
/// restore, and says what it did through `say`. An error names what could
/// not be done, among others that checkpoints exist but none has every part
/// on some node; the directory is then as consistent as before.
result<leveled> level_node_local(const level_config& c, const std::function<void(const std::string&)>& say);

}  // namespace grace
