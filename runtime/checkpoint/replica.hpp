#pragma once
/// In-memory replicas of sharded state: just-in-time recovery when a rank
/// that holds bytes nobody else has is lost.
///
/// After every completed step each rank copies its part (its slices; rank 0
/// also the replicated tensors, which it alone writes) into the oldest of a
/// few kept copies, and a background thread ships the copy over TCP to the
/// rank that holds its replica (`replica_holder`). A rank therefore keeps
/// its own part of its last `kept_slots` steps and the newest whole copies
/// of one other rank's part. In a just-in-time round (runtime/coordination/agreement.hpp,
/// "Replicas") it reports both and freezes them; the agreement picks a step
/// every part exists for, each survivor writes its kept copy and the holder
/// writes the lost rank's part from its replica.
///
/// The copy is on the training thread (a memcpy of the part at the step
/// boundary); the transfer overlaps the next step. Before copying step k
/// the keeper waits for the transfer of the previous copy, so a rank that
/// started step k + 1 has its step k - 1 replicated: at most two steps
/// behind the most advanced survivor, one when a transfer takes less than a
/// step (measured: docs/BENCHMARKS.md, row 7s).
///
/// A transfer also carries the counters and blobs of the copy's step, so a
/// part written from a replica restores the lost rank's own (runtime/
/// checkpoint.hpp, rank_state).
///
/// Transfers carry the job token (runtime/net/job_token.hpp); the holder drops
/// a connection with a wrong one, from a rank other than its source, or
/// with a layout that does not add up.
///
/// Mirrors in the node's memory (node-local checkpoints, `config::mirror`):
/// a replica lives in the worker and is gone when it exits. So at each
/// sharded save the holder also writes the source's part of that step, once
/// its replica is whole, into a store on the node's memory file system
/// (grace-launch --memory-dir, tmpfs) as a prepared part: the same file the
/// source wrote, which outlives the worker. When the source's disk is lost
/// and no just-in-time save could be made (the holder's workers died too),
/// the launcher adopts it into the committed step before the next group
/// (runtime/checkpoint/node_local_sync.hpp), checked against the manifest's checksum.
/// The mirror is written by a thread of its own from a pinned replica slot
/// (a third slot keeps the newest replica receivable meanwhile), for
/// periodic saves (a save the trainer waits for keeps the memory bandwidth);
/// each source's newest two mirrored rounds are kept.

#include "runtime/checkpoint/replica_report.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/base/error.hpp"
#include "runtime/base/posix_file.hpp"
#include "runtime/net/bulk_channel.hpp"
#include "runtime/checkpoint/snapshot.hpp"
#include "runtime/base/tensor.hpp"

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace gloo::rendezvous {
class Store;
}
namespace spdlog {
class logger;
}

namespace grace {

/// The rank that keeps `rank`'s replica: the previous rank on one node;
/// with several nodes of `local_world` ranks each, the same local rank on
/// the previous node, so a host lost never takes a part and its replica.
uint32_t replica_holder(uint32_t rank, uint32_t world, uint32_t local_world) noexcept;
/// The rank whose replica `rank` keeps (the inverse of replica_holder).
uint32_t replica_source(uint32_t rank, uint32_t world, uint32_t local_world) noexcept;

/// A kept copy of this rank's own part at `step`, with the counters and
/// blobs of that step (the manifest of a checkpoint written from it).
struct kept_copy {
  uint64_t step = 0;
  std::shared_ptr<snapshot_buffers> buffers;
  checkpoint_meta meta;
};

/// Many fields for a reason: the kept copies, the replica slots and the
/// sender's and mirrorer's hand-offs are one state under one mutex (m_);
/// the threads and the bulk channel are listed last so they stop first.
class replica_keeper {
public:
  static constexpr size_t kept_slots = 3;
  static constexpr size_t replica_slots = 2;

  struct config {
    uint32_t rank = 0;
    uint32_t world = 1;
    uint32_t local_world = 1;
    std::string host;   ///< the address this rank listens on (its advertised one)
    std::string token;  ///< the job's secret
    std::shared_ptr<gloo::rendezvous::Store> kv;  ///< where listen addresses are published
    std::string prefix;                           ///< this incarnation's key prefix
    std::chrono::milliseconds io_timeout{5000};   ///< each read/write, and the wait for a transfer
    std::shared_ptr<spdlog::logger> log;
    /// Where the source's parts are mirrored (a store on tmpfs); null: not mirrored.
    std::shared_ptr<checkpoint_store> mirror;
  };

  /// Listens for the source's transfers, publishes the address, and
  /// allocates the kept copies for `layout` (the tensors this rank writes).
  static result<std::unique_ptr<replica_keeper>> start(config cfg, const std::vector<tensor_ref>& layout);
  ~replica_keeper();
  replica_keeper(const replica_keeper&) = delete;
  replica_keeper& operator=(const replica_keeper&) = delete;

  /// Training thread, after `step` completed: copies `tensors` (matching
  /// the layout) and `meta` into the oldest kept copy and hands it to the
  /// sender. A no-op once frozen; a transfer still running after the I/O
  /// timeout skips this step's copy (the replica is stale, not wrong).
  status keep(uint64_t step, const std::vector<tensor_ref>& tensors, checkpoint_meta meta);
  /// What this rank can write in a just-in-time round; from now on
  /// neither the kept copies nor the replica change.
  replica_report freeze();
  /// The kept copy of `step`, if any.
  std::optional<kept_copy> kept(uint64_t step) const;
  /// The replica of `source()`'s part at `step`, if whole.
  std::shared_ptr<snapshot_buffers> replica(uint64_t step) const;
  /// The counters and blobs that came with that replica.
  std::optional<rank_state> replica_state(uint64_t step) const;
  uint32_t source() const noexcept { return replica_source(cfg_.rank, cfg_.world, cfg_.local_world); }
  uint32_t holder() const noexcept { return replica_holder(cfg_.rank, cfg_.world, cfg_.local_world); }
  /// Transfers the holder acknowledged, and the newest step among them.
  uint64_t pushed() const;
  uint64_t pushed_step() const;
  /// This rank saves its part of `step` in round `tag` (meta: its own save's):
  /// mirror the source's part of that step once its replica is whole. A
  /// newer request replaces one not yet carried out. No-op without a mirror.
  void mirror(uint64_t step, checkpoint_meta meta, std::string tag);
  /// The newest step mirrored (0: none).
  uint64_t mirrored_step() const;

private:
  struct kept_slot {
    kept_copy copy;
    bool valid = false;
  };
  struct replica_slot {
    std::shared_ptr<snapshot_buffers> buffers;
    std::string layout;  ///< the layout text the buffers were made for
    rank_state state;    ///< the source's counters and blobs at `step`
    uint64_t step = 0;
    bool whole = false;
    bool pinned = false;  ///< being mirrored: never received into
  };
  struct mirror_request {
    uint64_t step = 0;
    checkpoint_meta meta;
    std::string tag;
  };
  explicit replica_keeper(config cfg);
  void send_loop();
  bool push(const kept_slot& s);
  bool connect_holder();
  void receive_from(int fd, int stop_fd);
  bool receive_one(int fd);
  std::optional<size_t> begin_receive();
  void mirror_loop();
  std::optional<size_t> mirror_slot(const mirror_request& r) const;
  void write_mirror(const mirror_request& r, const replica_slot& slot);

  config cfg_;
  std::string layout_text_;  ///< this rank's layout, as sent with every transfer
  mutable std::mutex m_;
  std::condition_variable cv_;
  std::vector<kept_slot> kept_;
  std::vector<replica_slot> replicas_;
  bool frozen_ = false;
  bool stop_ = false;
  std::optional<size_t> to_push_;  ///< the kept slot the sender ships next
  bool in_flight_ = false;
  uint64_t pushed_ = 0;
  uint64_t pushed_step_ = 0;
  bool warned_slow_ = false;
  fd_guard holder_;  ///< the bulk channel to the holder of this rank's replica; sender thread only
  std::optional<mirror_request> mirror_req_;
  uint64_t mirrored_ = 0;       ///< the newest step mirrored
  uint64_t mirrored_prev_ = 0;  ///< the one before (kept too)
  std::thread sender_;
  std::thread mirrorer_;
  /// The bulk channel (runtime/net/bulk_channel.hpp) whose thread receives
  /// the replica this rank keeps.
  std::unique_ptr<bulk_server> server_;
};

}  // namespace grace
