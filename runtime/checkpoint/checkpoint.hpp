#pragma once
/// The checkpoint directory format and store.
///
/// Layout of one checkpoint (`<dir>/step-0000000120/`):
///   model-00001-of-0000K.safetensors   shards, whole tensors, <= shard_bytes each
///   model.safetensors.index.json       Hugging Face sharded index
///   grace-manifest.json                written last: step, kind, counters,
///                                      metadata, and size + xxh3-64 of every file
///
/// A checkpoint is committed atomically: everything is written and fsynced in
/// `<dir>/.tmp-step-<N>-<pid>-<rand>/`, which is renamed to `step-<N>` and the
/// parent fsynced. A reader therefore sees either nothing or a complete
/// directory; what can still go wrong (bit rot, a truncating copy, a manual
/// edit) is caught by the manifest checksums, and restore falls back to the
/// previous checkpoint. Nothing on disk is ever deleted because it looks
/// corrupt: corrupt checkpoints are skipped, reported and left (or renamed
/// aside when a new one takes their name).

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/checkpoint/checkpoint_kind.hpp"
#include "runtime/base/error.hpp"
#include "runtime/checkpoint/snapshot.hpp"
#include "runtime/checkpoint/signing.hpp"
#include "runtime/base/tensor.hpp"

namespace grace {

class io_staging;
namespace ckpt_io {
struct step_contents;
}

/// Why a checkpoint was taken (restart policy and tooling read this).

/// One rank's own counters and metadata (blobs) in a sharded checkpoint:
/// the entries where they differ from the manifest's (the committer's).
struct rank_state {
  std::map<std::string, int64_t> counters;
  std::map<std::string, std::string> metadata;
  bool empty() const noexcept { return counters.empty() && metadata.empty(); }
};

/// What the caller knows about a checkpoint besides the tensors.
struct checkpoint_meta {
  uint64_t step = 0;
  int world_size = 1;
  std::string run_id;
  uint64_t incarnation = 0;
  checkpoint_kind kind = checkpoint_kind::periodic;
  std::map<std::string, int64_t> counters;      ///< e.g. samples seen, rng offset
  std::map<std::string, std::string> metadata;  ///< free-form user metadata
  /// Filled in by a sharded commit (commit_parts), ignored on input: the
  /// file holding each rank's own counters and metadata, for the ranks
  /// whose differ from the committer's.
  std::map<uint32_t, std::string> rank_files;
};

/// One file of a checkpoint as recorded in the manifest.
struct checkpoint_file {
  std::string name;
  uint64_t size = 0;
  std::string xxh3;  ///< xxh3-64 of the full contents, 16 lowercase hex digits
  /// Node-local sharded checkpoints: the node whose directory holds this
  /// part (another node's directory may lack it; a copy fetched there
  /// must match the checksum). -1: every directory of the step holds it.
  int32_t node = -1;
};

/// The contents of `grace-manifest.json`.
struct checkpoint_manifest {
  /// 2: some `ranks` entries name a file (`rank_files`); written only then,
  /// so readers that know 1 alone refuse such a manifest instead of
  /// restoring the committer's state for every rank.
  /// 3: some files name the node holding them (node-local sharded
  /// checkpoints), so a directory may lack them; older readers would call
  /// such a step corrupt and must refuse it instead.
  static constexpr int current_format_version = 3;
  int format_version = 1;
  uint64_t step = 0;
  int world_size = 1;
  std::string run_id;
  uint64_t incarnation = 0;
  checkpoint_kind kind = checkpoint_kind::periodic;
  double wall_time = 0;  ///< seconds since the Unix epoch at commit
  std::map<std::string, int64_t> counters;
  std::map<std::string, std::string> metadata;
  /// Sharded checkpoints: each rank's counters and metadata that differ
  /// from the ones above, in a file of its own (`ranks` entries
  /// `{"file": name}`, the file listed in `files`), so the manifest every
  /// rank reads does not grow with every rank's blobs ...
  std::map<uint32_t, std::string> rank_files;
  /// ... or inline (`ranks` entries with counters and metadata), as
  /// checkpoints written before per-rank files have them.
  std::map<uint32_t, rank_state> ranks;
  std::vector<checkpoint_file> files;
  /// The counters and metadata a rank restores when the checkpoint was
  /// written by `world` ranks: the committer's overlaid with `own` (the
  /// rank's differing entries: its `ranks` entry or file,
  /// checkpoint_store::read_rank_state); on another world size the
  /// committer's alone.
  rank_state state_for(int world, const rank_state& own) const;
  /// Whether parts of this checkpoint live on several nodes' directories.
  bool node_local() const noexcept {
    for (auto& f : files)
      if (f.node >= 0) return true;
    return false;
  }
  uint64_t total_bytes() const noexcept {
    uint64_t n = 0;
    for (auto& f : files) n += f.size;
    return n;
  }
};

/// What a save did, for logs and metrics.
struct save_stats {
  uint64_t step = 0;
  std::filesystem::path path;
  std::vector<checkpoint_file> files;  ///< with checksums
  uint64_t total_bytes = 0;
  double write_seconds = 0;      ///< writing and checksumming
  double fsync_seconds = 0;      ///< fsync of files and directories
  bool already_existed = false;  ///< a valid step-N was there; ours was discarded
  /// Wall-clock time of the rename that committed it (0: not renamed by
  /// this save): a commit's moment, where the save's end may come later.
  int64_t committed_wall_ns = 0;
};

/// Asked once every file of a save is durable, right before the rename
/// that commits it: an error leaves the step uncommitted (the fence).
using commit_gate = std::function<status()>;

/// One entry of `checkpoint_store::list`.
struct checkpoint_info {
  uint64_t step = 0;
  std::filesystem::path path;
  std::string kind;  ///< from the manifest; empty when unreadable
  uint64_t total_bytes = 0;
  bool valid = false;      ///< quick check: manifest parses, files present with right sizes
  std::string reason;      ///< why not valid
  bool temporary = false;  ///< a leftover `.tmp-*` directory
  bool set_aside = false;  ///< a `step-N.corrupt-*` directory
};

/// A checkpoint that restore passed over, and why.
struct skipped_checkpoint {
  uint64_t step = 0;
  std::filesystem::path path;
  std::string reason;
};

/// The outcome of a restore.
struct restored_checkpoint {
  bool found = false;  ///< false: no usable checkpoint (fresh start), not an error
  std::filesystem::path path;
  checkpoint_manifest manifest;
  std::vector<std::string> loaded;          ///< registered tensors filled in
  std::vector<std::string> unregistered;    ///< in the checkpoint but not registered: ignored
  std::vector<skipped_checkpoint> skipped;  ///< newer checkpoints that failed verification
  /// The counters and metadata the restoring rank takes (see
  /// checkpoint_store::set_restoring_rank; without it the committer's).
  rank_state own;
};

/// A tensor as stored in a checkpoint (for tools).
struct stored_tensor {
  std::string name;
  dtype type = dtype::f32;
  std::vector<int64_t> shape;
  uint64_t bytes = 0;
  std::string file;
};

/// Saves, lists, verifies and restores checkpoints under one directory.
/// Methods may be called from any thread but are not synchronised with each
/// other: one writer (see `checkpoint_writer`) plus readers of other steps.
/// `prepare_io` and `keep_io_warm` are the exception: safe alongside anything.
/// Copies share the I/O staging.
class checkpoint_store {
public:
  static constexpr uint64_t default_shard_bytes = 1ull << 30;

  /// `keep_last`: how many valid checkpoints to keep after a save (<= 0: all).
  explicit checkpoint_store(std::filesystem::path dir, int keep_last = 3);

  const std::filesystem::path& dir() const noexcept { return dir_; }
  /// Upper bound for one shard (a single larger tensor gets its own shard).
  void set_shard_bytes(uint64_t b) noexcept { shard_bytes_ = b ? b : 1; }
  uint64_t shard_bytes() const noexcept { return shard_bytes_; }
  /// Shards are written with O_DIRECT (falling back to buffered writes where
  /// the filesystem refuses it); false forces buffered writes. The files are
  /// byte-identical either way; this exists for tests and comparisons.
  void set_direct_io(bool on) noexcept { direct_io_ = on; }
  bool direct_io() const noexcept { return direct_io_; }
  /// A checkpoint that fails verification on restore_latest is moved aside
  /// (`step-N.corrupt-<t>`) once a full verification confirms the damage.
  /// A session's store does this: with sharded state each rank reads and
  /// verifies only the parts it restores, so the rank that finds a damaged
  /// part is the only one that knows; moving the step aside makes the whole
  /// group agree on the previous one at its next restart (the other ranks'
  /// restore of the damaged step is refused at the join).
  void set_aside_damaged_on_restore(bool on) noexcept { set_aside_damaged_ = on; }
  /// Restores resolve `restored_checkpoint::own` for this rank of a world
  /// of `world`: in a sharded checkpoint its own counters and metadata,
  /// whose file is read and verified with the tensors (a damaged one makes
  /// the step corrupt, as a damaged part does).
  void set_restoring_rank(uint32_t rank, int world) noexcept { restoring_ = std::make_pair(rank, world); }
  /// Signed checkpoints (runtime/checkpoint/signing.hpp): with a key, every
  /// manifest this store writes is signed with it, and every manifest it
  /// reads (listing, verifying, restoring) must carry its signature: an
  /// unsigned step, or one signed with another key, is invalid here and
  /// says so. Without one, nothing is signed or checked.
  void set_signing_key(std::optional<checkpoint_key> key) {
    key_ = key ? std::make_shared<const checkpoint_key>(std::move(*key)) : nullptr;
  }
  const checkpoint_key* signing_key() const noexcept { return key_.get(); }

  /// Faults in this store's O_DIRECT staging pair (two 64 MiB buffers kept
  /// for the life of the store, shared by its saves and restores) as far as
  /// a state of `state_bytes` will use it. A save or restore through a pair
  /// not used yet otherwise touches fresh pages on its critical path
  /// (0.3-1 GB/s here: 130-400 ms for 128 MiB). A session calls this from
  /// its checkpoint writer thread at attach. Idempotent; thread-safe, also
  /// against a save or restore in progress.
  void prepare_io(uint64_t state_bytes);
  /// Reads one byte per page of the prepared staging while no save or
  /// restore holds it, so a VM that hands idle memory back to its host does
  /// not reclaim the idle pages (a session's warmer thread calls it every
  /// 2 s with its snapshot buffers). Thread-safe, as `prepare_io`.
  void keep_io_warm();

  /// Writes and atomically commits `step-<meta.step>`, then prunes old ones.
  /// The tensors' bytes must not change until it returns. `wait` (set when
  /// the snapshot is still being captured): called before each piece of
  /// tensor bytes is read; a false answer fails the save before anything
  /// is committed.
  /// `gate`: asked before the rename; its error fails the save, nothing committed.
  result<save_stats> save(const std::vector<snapshot_tensor>& tensors, const checkpoint_meta& meta,
                          const capture_wait& wait = {}, const commit_gate& gate = {});

  /// Every `step-*` and leftover `.tmp-*` directory, oldest first, with a
  /// quick validity check (no checksums). Empty if the directory is missing.
  std::vector<checkpoint_info> list() const;
  /// The newest step that passes the quick check (0: none).
  uint64_t newest_valid_step() const;
  /// As `list`, but an unreadable directory is an error.
  result<std::vector<checkpoint_info>> try_list() const;

  /// Full check, every checksum included.
  status verify(uint64_t step) const;
  status verify(const std::filesystem::path& step_dir) const;

  /// Restores the newest checkpoint that verifies into `into` (host memory,
  /// or device memory through the registered device-copy hook). Checkpoints
  /// that fail verification are skipped (reported in `skipped`), never
  /// deleted (moved aside with set_aside_damaged_on_restore); only the
  /// files `into` is read from are read and verified (another rank's parts
  /// of a sharded checkpoint are not); a checkpoint that verifies but does not match `into` (name,
  /// dtype, shape) is an error. Nothing is written into `into` unless the
  /// whole checkpoint verified.
  ///
  /// One read of each file: O_DIRECT, hashed and scattered into `staging`
  /// on the way, then copied into `into` once every checksum matched.
  /// `staging`: one host buffer per tensor of `into`, same order, each at
  /// least that tensor's bytes (a session passes its pre-faulted snapshot
  /// buffers, see `snapshot_buffers::regions`); empty: allocated here.
  result<restored_checkpoint> restore_latest(const std::vector<tensor_ref>& into,
                                             const std::vector<void*>& staging = {}) const;
  /// Restores one specific step (it must verify).
  result<restored_checkpoint> restore(uint64_t step, const std::vector<tensor_ref>& into,
                                      const std::vector<void*>& staging = {}) const;

  /// The entries where `rank`'s counters and metadata differ from the
  /// committer's (its `ranks` entry, or its file, checked against the
  /// manifest's size and checksum); empty when none differ.
  result<rank_state> read_rank_state(const std::filesystem::path& step_dir, const checkpoint_manifest& m,
                                     uint32_t rank) const;

  /// Parses `grace-manifest.json` of a step directory.
  result<checkpoint_manifest> read_manifest(const std::filesystem::path& step_dir) const;
  /// Tensors of a step directory, from its shard headers (a node-local
  /// step: of the parts this directory holds).
  result<std::vector<stored_tensor>> read_tensors(const std::filesystem::path& step_dir) const;

  /// `.tmp-*` directories left by processes that are gone.
  std::vector<std::filesystem::path> stale_temporaries() const;
  /// Removes them, logging each (save does this first).
  void remove_stale_temporaries();

  /// `<dir>/step-<10-digit N>`.
  std::filesystem::path step_path(uint64_t step) const;

  // ------------------------------------------- sharded state: two phases
  // Every rank writes its own part of one logical checkpoint into a parts
  // directory shared by the ranks, `.parts-step-<N>-<tag>` (the tag names
  // the round, so a retried round never mixes with an abandoned one); one
  // rank commits once the coordination service knows every part is
  // durable. Layout and index: docs/CHECKPOINT-FORMAT.md.

  /// Phase 1, on every rank: writes this rank's slices (and, when
  /// `with_replicated`, the replicated tensors) as
  /// `rank-<R+1>-of-<W>.safetensors`, fsyncs it, then `part-<R>.json`
  /// (the file's checksum and where each slice sits, and with
  /// `with_rank_state` the counters and metadata of `meta` as this rank's
  /// own), fsynced last: its presence means the part is durable. Commits
  /// nothing.
  result<save_stats> save_part(const std::vector<snapshot_tensor>& tensors, const checkpoint_meta& meta,
                               const std::string& tag, uint32_t rank, bool with_replicated,
                               const capture_wait& wait = {}, bool with_rank_state = true);
  /// Phase 2, on one rank: checks that the parts of all `meta.world_size`
  /// ranks are there and tile every sharded tensor exactly, writes the
  /// global index and manifest (every part's file and checksum), renames
  /// the directory to `step-N` and fsyncs the parent. Then prunes.
  result<save_stats> commit_parts(const checkpoint_meta& meta, const std::string& tag);
  /// Node-local directories (a disk per node), phase 2 on one rank per
  /// node once every part is durable: `descriptions[r]` is rank r's part
  /// description (part_description, as its own node read it) and
  /// `holders[r]` the node whose directory holds rank r's part. Writes the
  /// global index and manifest (every part with its checksum and holder)
  /// beside this node's parts, checks the parts held here, and renames
  /// them to `step-<N>`. Every node's step then has the same index and
  /// manifest and the parts that node holds.
  result<save_stats> commit_node_parts(const checkpoint_meta& meta, const std::string& tag,
                                       const std::vector<std::string>& descriptions,
                                       const std::vector<int32_t>& holders, int32_t node);
  /// Rank `rank`'s part description of round `tag` of `step` in this
  /// directory (the text of its `part-<R>.json`): errc::failed when that
  /// part is not durable here.
  result<std::string> part_description(uint64_t step, const std::string& tag, uint32_t rank) const;
  /// Every part description durable in this directory's parts directory of
  /// round `tag` of `step` (none: an empty list). Once this node committed
  /// the round, the copies kept beside it for the other nodes' committers
  /// (`<parts directory>.desc`, see commit_node_parts).
  result<std::vector<std::string>> part_descriptions(uint64_t step, const std::string& tag) const;
  /// A node-local step's parts this directory lacks (each with the node
  /// the manifest names as its holder); errors: the step is not readable.
  result<std::vector<checkpoint_file>> absent_parts(uint64_t step) const;
  /// Moves `file` (a copy of one of step `step`'s absent parts, fetched
  /// from its holder or kept in a parts directory) into the step directory
  /// once its size and checksum match the manifest's entry of the same
  /// name; errc::invalid_input when they do not (the file is left where it
  /// is and the step untouched).
  status adopt_part(uint64_t step, const std::filesystem::path& file) const;
  /// A part durable in a parts directory (written, not committed here).
  struct prepared_part {
    uint64_t step = 0;
    std::string tag;
    std::string file;  ///< its data file's name
    std::string xxh3;  ///< its checksum, as its description gives it
  };
  /// Every durable part in this directory's parts directories.
  std::vector<prepared_part> prepared_parts() const;
  /// `<dir>/.parts-step-<N>-<tag>`.
  std::filesystem::path parts_path(uint64_t step, const std::string& tag) const;
  /// Removes every parts directory of a step at or below `step` (rounds
  /// that were abandoned or are superseded by a commit).
  void remove_parts_up_to(uint64_t step);
  /// Removes rank `rank`'s part (data file and description) from every parts
  /// directory of a step at or below `step`, and the directories left
  /// empty: one writer's clean-up in a directory others write too.
  void remove_rank_parts_up_to(uint64_t step, uint32_t rank, uint32_t world);

  /// Removes every valid committed checkpoint but the newest (never an
  /// invalid one: it is left for inspection). Returns how many went.
  int keep_only_newest();

private:
  /// Verifies and restores one step directory. `corrupt`: the failure is
  /// the checkpoint's (skip it), not the caller's.
  result<restored_checkpoint> load(const std::filesystem::path& step_dir, const std::vector<tensor_ref>& into,
                                   const std::vector<void*>& staging, bool& corrupt) const;
  result<restored_checkpoint> load_tensors(const std::filesystem::path& step_dir, ckpt_io::step_contents& c,
                                           const std::vector<tensor_ref>& into, const std::vector<void*>& staging,
                                           bool& corrupt) const;
  void prune(uint64_t committed_step);
  void set_aside_if_invalid(const std::filesystem::path& step_dir) const;

  std::filesystem::path dir_;
  int keep_last_;
  uint64_t shard_bytes_ = default_shard_bytes;
  bool direct_io_ = true;
  bool set_aside_damaged_ = false;
  std::optional<std::pair<uint32_t, int>> restoring_;  ///< set_restoring_rank
  std::shared_ptr<io_staging> staging_;  ///< O_DIRECT staging for saves and restores
  std::shared_ptr<const checkpoint_key> key_;  ///< set_signing_key
};

}  // namespace grace
