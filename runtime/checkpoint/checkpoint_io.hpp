#pragma once
/// Internal to the checkpoint store (runtime/checkpoint/checkpoint.cpp and
/// runtime/checkpoint/checkpoint_parts.cpp): the file-level steps a save, a sharded
/// save's two phases and a restore share. Not part of the embedding API.

#include <chrono>
#include <optional>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/checkpoint/direct_io.hpp"
#include "runtime/checkpoint/safetensors.hpp"

namespace grace::ckpt_io {

double now_unix();

/// Runs `step`, adding the seconds it took to `seconds`.
template <class F>
status timed(double& seconds, F&& step) {
  const auto t0 = std::chrono::steady_clock::now();
  status st = step();
  seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

/// A checksum as the manifest records it: 16 lowercase hex digits.
std::string hex64(uint64_t v);
/// The manifest entry of a written file.
checkpoint_file file_entry(const hashed_file& f);

/// Checks one listed file's size and checksum, handing its bytes to `sink`.
/// `compare`: false only for the broken-on-purpose restore mutant.
status check_file(const std::filesystem::path& step_dir, const checkpoint_file& f, io_staging& io,
                  const chunk_sink& sink = {}, bool compare = true);
/// Every file of the manifest.
status check_files(const std::filesystem::path& step_dir, const checkpoint_manifest& m, io_staging& io);

/// Writes a small in-memory file with checksum and fsync.
result<checkpoint_file> write_small(const std::filesystem::path& p, const std::string& text, save_stats& stats);
/// Writes the index, then the manifest (listing stats.files and both), and
/// fsyncs the directory. `key`: signs the manifest (none: unsigned).
status write_index_and_manifest(const std::filesystem::path& tmp, const nlohmann::json& index,
                                const checkpoint_meta& meta, const checkpoint_key* key, save_stats& stats);
/// Renames an invalid step directory to `step-N.corrupt-<unix time>` (kept
/// for inspection, never restored). A directory already gone (another
/// rank moved it first) is not an error.
status move_aside(const std::filesystem::path& step_dir, const std::string& why);
/// Makes way for `final_path`: a valid checkpoint already there wins (true:
/// `stats` now describe it), an invalid one is renamed aside.
result<bool> settle_existing(const checkpoint_store& store, const std::filesystem::path& final_path, uint64_t step,
                             save_stats& stats);

struct shard_layout {
  const checkpoint_file* file;  ///< its manifest entry
  safetensors::header h;
};

/// A step directory checked down to, but not including, the file checksums.
struct step_contents {
  checkpoint_manifest manifest;
  std::vector<shard_layout> shards;
  /// Node-local sharded checkpoints: listed parts this directory lacks
  /// (held on another node's directory: `node`).
  std::vector<checkpoint_file> absent;
  /// The node holding `file` when this directory lacks it, else nothing.
  std::optional<int32_t> absent_holder(const std::string& file) const {
    for (auto& f : absent)
      if (f.name == file) return f.node;
    return std::nullopt;
  }
};

/// Manifest, directory name, files present, shard headers and the index
/// (sharded tensors' parts included) consistent.
result<step_contents> check_structure(const checkpoint_store& store, const std::filesystem::path& step_dir,
                                      io_staging& io);

/// The index's `grace_sharded` section agrees with the shard headers and
/// every sharded tensor's parts tile its global shape exactly (a part in a
/// file this directory lacks counts with the box the index gives it).
status check_sharded_index(const std::filesystem::path& ip, const nlohmann::json& index, const step_contents& c);

/// Whether a restore of `c` into `into` must reslice: the checkpoint holds
/// sharded tensors or a registered tensor is a slice.
bool needs_reslice(const std::filesystem::path& step_dir, const std::vector<tensor_ref>& into);

/// Bytes of a file, [begin, end) at absolute offsets, that land at `dst`
/// while the file is streamed.
struct target {
  uint64_t begin, end;
  unsigned char* dst;
};
/// A sink copying the pieces of `targets` (sorted by begin, disjoint) that
/// fall in each chunk read; `targets` must outlive it.
chunk_sink scatter_into(const std::vector<target>& targets);

/// Restores a step directory into `into`, each registered tensor (whole or
/// a slice of its global tensor) assembled from the stored parts that
/// overlap it. Only the files those parts are in are read (each once, when
/// the parts split the global tensor along its first dimension: verified
/// and scattered into `staging` in one pass) and verified. `staging` as for
/// checkpoint_store::restore_latest; `corrupt` as for checkpoint_store::load.
result<restored_checkpoint> load_resliced(const std::filesystem::path& step_dir, step_contents& c,
                                          const std::vector<tensor_ref>& into, const std::vector<void*>& staging,
                                          bool compare_checksums, io_staging& io, bool& corrupt);

}  // namespace grace::ckpt_io
