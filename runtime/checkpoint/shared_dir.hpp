#pragma once
/// Sharded state needs one checkpoint directory that every rank shares: each
/// rank writes its part there and one rank commits them all as a step
/// (runtime/checkpoint/checkpoint.hpp). Node-local directories (a disk per node) hold
/// replicated state only, which one rank saves whole; with sharded state the
/// committer would never see the other nodes' parts and every save would
/// fail. This check, run by every rank when it attaches, turns that into a
/// clear error before the first step instead of a run without checkpoints.
///
/// The probe:
///   1. every rank but 0 writes `.grace-shared-dir-i<incarnation>-r<rank>`
///      (a fresh random nonce) into its checkpoint directory, then publishes
///      the nonce in the rendezvous store under `<prefix>/shared-dir/<rank>`;
///   2. rank 0 waits for every rank's key, reads each rank's file from its
///      own directory and compares the nonce (a directory another node sees
///      through a slow NFS attribute cache gets `settle` to show the file);
///   3. rank 0 removes the probe files (and older incarnations' leftovers)
///      and publishes one verdict, `<prefix>/shared-dir/verdict`: "ok" when
///      every rank's file was there, else the error;
///   4. every rank ends attach with that verdict, so a directory some nodes
///      do not share stops every rank with the same error (exit 2) instead
///      of one node stopping and the others restarting after it.
/// Waits are bounded by `timeout`: a rank that died meanwhile fails the
/// check (errc::disconnected, a failed rendezvous: the group restarts, and
/// the launcher stops after several such groups in a row).

#include "runtime/base/error.hpp"

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace gloo::rendezvous {
class Store;
}

namespace grace {

struct shared_dir_probe {
  std::filesystem::path dir;   ///< this rank's checkpoint directory
  uint32_t rank = 0;
  uint32_t world = 1;
  uint32_t incarnation = 0;
  uint32_t local_world = 0;    ///< workers per node (names nodes in the error); 0: unknown
  std::string prefix;          ///< the rendezvous store's prefix for this incarnation
  std::chrono::milliseconds timeout{30000};
  std::chrono::milliseconds settle{5000};
  /// Node-local directories declared (grace-launch --node-local-checkpoints):
  /// every node's ranks share one directory and no two nodes share one
  /// (each node commits its own parts; see check_node_local_directories).
  bool node_local = false;
};

/// Runs the probe on this rank (all ranks call it). Ok when every rank's
/// checkpoint directory is rank 0's; errc::invalid_input naming the ranks
/// (and nodes) that do not share it, or the ranks that cannot write theirs
/// (and why); errc::disconnected when the store times out or the group
/// breaks.
status check_shared_directory(const shared_dir_probe& p, gloo::rendezvous::Store& kv);

/// Node-local directories (`p.node_local`, `p.local_world` > 0), run by
/// every rank: every rank writes a probe; the first rank of each node
/// checks that its directory holds the probes of its node's ranks and of
/// no other node's, and publishes that node's verdict; rank 0 publishes
/// the first failing node's (or "ok"), and every rank ends with it. Errors
/// as check_shared_directory's: a directory shared across nodes (the
/// per-node commits would collide there) or not shared within a node.
status check_node_local_directories(const shared_dir_probe& p, gloo::rendezvous::Store& kv);

/// What rank 0 found.
struct probe_findings {
  std::vector<uint32_t> missing;                            ///< probes not in rank 0's directory
  std::vector<std::pair<uint32_t, std::string>> unwritable;  ///< ranks that could not write theirs, and why
  std::vector<uint32_t> foreign;                            ///< node-local: other nodes' probes that are there
};

/// The verdict (pure): empty when every probe was found, else the error
/// text naming the ranks (a rank that cannot write its directory first:
/// whether that directory is shared cannot be told).
std::string shared_dir_verdict(const probe_findings& f, uint32_t local_world, const std::filesystem::path& dir0);
/// The same for node `node`'s directory `dir` with node-local directories.
std::string node_local_verdict(const probe_findings& f, uint32_t node, uint32_t local_world,
                               const std::filesystem::path& dir);

}  // namespace grace
