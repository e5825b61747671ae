#pragma once
/// The checkpoint manifest (`grace-manifest.json`) as JSON, and the names
/// inside a checkpoint directory: `step-<10 digits>` for committed steps,
/// `.tmp-step-<N>-<pid>-<rand>` while one is written, `step-<N>.corrupt-<t>`
/// for one set aside. See runtime/checkpoint/checkpoint.hpp for the layout.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/base/error.hpp"

namespace grace {

/// The manifest of a step directory; written last.
inline constexpr const char* manifest_file_name = "grace-manifest.json";
/// The Hugging Face sharded index of a step directory.
inline constexpr const char* index_file_name = "model.safetensors.index.json";
/// Marks a step directory moved aside: `step-<N>.corrupt-<unix time>`.
inline constexpr const char* corrupt_marker = ".corrupt-";

/// `step-<10-digit N>`.
std::string step_dir_name(uint64_t step);
/// "step-0000000120" -> 120. Only all-digit suffixes.
bool parse_step_name(const std::string& name, uint64_t& step);

/// A fresh `.tmp-step-<N>-<pid>-<rand>` for this process.
std::string tmp_dir_name(uint64_t step);
/// ".tmp-step-<N>-<pid>-<rand>" -> step, pid.
bool parse_tmp_name(const std::string& name, uint64_t& step, long& pid);
/// Whether process `pid` exists (EPERM counts: it exists, not ours).
bool pid_alive(long pid);

/// Registers a temp dir (by name) this process is writing right now. A pid
/// alone cannot tell whether a `.tmp-*` dir is ours: in a container the
/// restarted trainer often gets the same pid as the one that crashed. The
/// set is process-wide, so every store in the process sees it.
void mark_temp_active(const std::string& name);
/// Unregisters it (written and renamed, or abandoned).
void mark_temp_inactive(const std::string& name);
/// Whether `p`'s name is registered as active.
bool is_active_temp(const std::filesystem::path& p);

/// `model-<index+1>-of-<count>.safetensors`, 5 digits each.
std::string shard_file_name(size_t index, size_t count);
/// Whether `name` is a shard (ends in `.safetensors`).
bool is_shard(const std::string& name);
/// A name a manifest may list: no path separators, not `.`/`..`, no NUL.
bool safe_file_name(const std::string& n);
/// `rank-<R+1>-of-<W><suffix>`, 5 digits each: a file of rank R's in a
/// sharded checkpoint.
std::string rank_file_name(uint32_t rank, uint32_t world, const char* suffix);
/// `rank-<R+1>-of-<W>.state.json`: rank R's own counters and metadata in a
/// sharded checkpoint (the entries that differ from the committer's).
std::string rank_state_file_name(uint32_t rank, uint32_t world);

/// Reads a small JSON file defensively (size-limited, no exceptions).
result<nlohmann::json> read_json(const std::filesystem::path& p);
/// The manifest as written to `grace-manifest.json`.
nlohmann::json manifest_to_json(const checkpoint_manifest& m);
/// A rank's counters and metadata as JSON: {"counters": {...}, "metadata":
/// {...}} (the manifest's top level and `ranks` entries, a part's `state`,
/// a replica transfer's state).
nlohmann::json rank_state_to_json(const rank_state& s);
/// The inverse, strict (integer counters, string metadata; both optional):
/// empty on success, else what is wrong.
std::string rank_state_from_json(const nlohmann::json& j, rank_state& s);
/// Parses a manifest read from `p` (named in errors).
result<checkpoint_manifest> manifest_from_json(const std::filesystem::path& p, const nlohmann::json& j);

}  // namespace grace
