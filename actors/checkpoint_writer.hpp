#pragma once
/// The checkpoint writer: a detached actor (its own thread, since one save
/// blocks on disk I/O for up to seconds) that takes a save request and
/// answers with the outcome as a message. The trainer hands it a snapshot
/// it captured into host buffers and goes on training; everything the
/// trainer learns about a save (success, durations for the grace-period
/// margin) it reads from that answer, so no state is shared between the two
/// threads.
///
/// The writer itself reports a save taken under an agreement to the
/// coordination service (the commit must not wait for the trainer's next
/// step boundary), and writes each save's log line and event.
///
/// In-process only: its messages are C++ structs (a snapshot is host
/// memory); the protocol between processes is Cap'n Proto (messages/).

#include "actors/coordinator_ref.hpp"
#include "runtime/checkpoint/checkpoint.hpp"

#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/atom.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace grace {

class control_block;

/// One save: a snapshot already captured into `buffers`, which the writer
/// owns (busy) until it answered.
struct save_request {
  std::shared_ptr<snapshot_buffers> buffers;
  checkpoint_meta meta;
  uint64_t agreement_id = 0;  ///< 0: not under an agreement (nothing reported)
  int64_t snap_ns = 0;        ///< the capture's duration (reported with the write's)
  /// Before writing, remove every committed checkpoint but the newest (a
  /// retry after a failed save, when the trainer allows it: make room).
  bool make_room = false;
  /// The capture still runs while the writer starts: it writes each piece
  /// once `buffers` says it is in (snapshot_buffers::wait_captured), and
  /// takes the capture's duration from the buffers instead of `snap_ns`.
  bool overlapped = false;
  int64_t begin_ns = 0;  ///< when overlapped: mono_ns() at the capture's start
  /// Sharded state: phase 1 only, this rank's part into the parts directory
  /// of (step, part_tag), reported to the service even without an
  /// agreement; the commit waits for commit_atom. Empty: a whole save.
  std::string part_tag{};
  bool with_replicated = false;  ///< the part includes the replicated tensors
  /// Sharded state, just in time from copies: the parts of lost ranks this
  /// rank holds replicas of (rank, its part's bytes), written beside its
  /// own and reported with it.
  struct replica_part {
    uint32_t rank = 0;
    std::shared_ptr<snapshot_buffers> bytes;
    std::optional<rank_state> state;  ///< its counters and blobs, when the replica brought them
  };
  std::vector<replica_part> replica_parts{};
};

/// The answer to a save_request.
struct save_outcome {
  uint64_t step = 0;
  checkpoint_kind kind = checkpoint_kind::periodic;
  uint64_t agreement_id = 0;
  bool ok = false;
  std::string error;  ///< when !ok; when ok, the primary directory's failure if the fallback took the save
  save_stats stats;   ///< when ok
  int64_t snap_ns = 0;
  int64_t write_ns = 0;  ///< the write's time; when overlapped, what the save took beyond the copy
  int64_t save_ns = 0;   ///< from the capture's start to the answer
  bool part = false;     ///< a sharded save's part: durable, not committed
};

/// Atoms: at most 10 characters (CAF 0.17).
using save_atom = caf::atom_constant<caf::atom("g_save")>;
using prepare_atom = caf::atom_constant<caf::atom("g_prepare")>;
/// Sharded state, phase 2: commit the parts of (agreement id, step).
using commit_atom = caf::atom_constant<caf::atom("g_commit")>;

using checkpoint_writer_actor =
    caf::typed_actor<caf::replies_to<save_atom, save_request>::with<save_outcome>,
                     /// Fault in the direct-I/O staging for a state of this many bytes before
                     /// the first save (off the training thread; see checkpoint_store).
                     caf::reacts_to<prepare_atom, uint64_t>,
                     /// Every part of (agreement id, step) is durable: commit them (the
                     /// service chose this rank), and report it.
                     /// With node-local directories the last argument names every node's
                     /// checkpoint server, where the other nodes' part descriptions are read.
                     caf::reacts_to<commit_atom, uint64_t, uint64_t, std::vector<std::string>>>;

struct checkpoint_writer_config {
  checkpoint_store* store = nullptr;  ///< outlives the actor
  /// Takes a save other than a periodic one that `store` failed (may be
  /// null; outlives the actor).
  checkpoint_store* fallback = nullptr;
  std::shared_ptr<coordinator_ref> coord;  ///< where agreement saves are reported (none: not reported)
  uint32_t rank = 0;
  /// Where the last successful save's duration is published for the peer
  /// watcher's heartbeats (may be null).
  std::shared_ptr<control_block> ctl;
  std::shared_ptr<spdlog::logger> log;
  /// Sharded state in node-local directories: this rank's node (every
  /// node's committer commits that node's parts, checkpoint_store::
  /// commit_node_parts); -1: one directory shared by every rank.
  int32_t node = -1;
  std::string token;  ///< the job's secret, for the other nodes' checkpoint servers
  std::chrono::milliseconds fetch_timeout{10000};
  /// The incarnation this rank joined, and how long a commit waits for the
  /// service's yes (proto::CommitCheck) before it gives up uncommitted.
  uint32_t incarnation = 0;
  std::chrono::milliseconds commit_check_timeout{5000};
  std::chrono::milliseconds commit_delay{0};  ///< options::commit_delay (tests)
  uint64_t commit_delay_step = 0;             ///< options::commit_delay_step
};

/// Spawned detached: the one thread that writes this process's checkpoints.
checkpoint_writer_actor spawn_checkpoint_writer(caf::actor_system& sys, checkpoint_writer_config cfg);

/// The coordination service's report of a save (the writer's, or the
/// trainer's when an agreement names a step already on disk).
msg<proto::CheckpointSaved> saved_report(uint32_t rank, const save_outcome& o);

}  // namespace grace

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(grace::save_request)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(grace::save_outcome)
