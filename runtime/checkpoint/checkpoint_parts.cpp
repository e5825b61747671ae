// Sharded state in the checkpoint store: every rank's part (phase 1), the
// commit of all parts as one step (phase 2), and the restore that reslices
// stored parts into whatever slices the restoring ranks hold.
// Format: docs/CHECKPOINT-FORMAT.md.
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/checkpoint/checkpoint_io.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <map>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "runtime/checkpoint/device_copy.hpp"
#include "runtime/base/events.hpp"
#include "runtime/checkpoint/manifest.hpp"
#include "runtime/base/posix_file.hpp"

namespace grace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace ckpt_io;

namespace {

constexpr const char* parts_prefix = ".parts-step-";

std::string part_file_name(uint32_t rank, uint32_t world) { return rank_file_name(rank, world, ".safetensors"); }

std::string part_manifest_name(uint32_t rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "part-%05u.json", rank);
  return buf;
}

/// Tags are file-name material: letters, digits, '-', '_' only.
bool safe_tag(const std::string& t) {
  if (t.empty() || t.size() > 64) return false;
  for (char c : t)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') return false;
  return true;
}

/// The tensors of `tensors` this rank writes: its slices, and the
/// replicated ones when it writes those.
std::vector<snapshot_tensor> part_tensors(const std::vector<snapshot_tensor>& tensors, bool with_replicated) {
  std::vector<snapshot_tensor> out;
  for (auto& t : tensors)
    if (!t.global_shape.empty() || with_replicated) out.push_back(t);
  return out;
}

/// One part's description, as `part-<R>.json` records it (with
/// `with_state`, the rank's own counters and metadata).
json part_json(const checkpoint_meta& meta, uint32_t rank, const checkpoint_file& file,
               const std::vector<snapshot_tensor>& written, bool with_state) {
  json ts = json::array();
  for (auto& t : written) {
    json e{{"name", t.name}, {"dtype", dtype_name(t.type)}, {"shape", t.shape}};
    if (!t.global_shape.empty()) e["global_shape"] = t.global_shape, e["offsets"] = t.offsets;
    ts.push_back(std::move(e));
  }
  json j{{"format", "grace-part"},
         {"rank", rank},
         {"world_size", meta.world_size},
         {"step", meta.step},
         {"file", {{"name", file.name}, {"size", file.size}, {"xxh3", file.xxh3}}},
         {"tensors", std::move(ts)}};
  if (with_state) j["state"] = rank_state_to_json({meta.counters, meta.metadata});
  return j;
}

/// Writes the part's tensors as one safetensors file, streamed from the
/// snapshot, and fsyncs it.
result<checkpoint_file> write_part_file(const fs::path& p, const std::vector<snapshot_tensor>& ts, io_staging* io,
                                        const capture_wait& wait, const std::vector<uint64_t>& stream_at,
                                        save_stats& stats) {
  std::vector<safetensors::tensor_desc> descs;
  for (auto& t : ts) descs.push_back({t.name, t.type, t.shape, t.bytes});
  auto h = safetensors::encode_header(descs, {{"format", "pt"}});
  if (!h) return h.err();
  hashed_file f;
  auto written = timed(stats.write_seconds, [&]() -> status {
    if (auto st = f.open(p, h->file_size, io); !st) return st;
    if (auto st = f.write(h->bytes.data(), h->bytes.size()); !st) return st;
    for (size_t i = 0; i < ts.size(); ++i) {
      if (wait && !wait(stream_at[i] + ts[i].bytes))
        return error{errc::failed, "the snapshot of tensor '" + ts[i].name + "' failed while it was being written"};
      if (auto st = f.write(ts[i].data, ts[i].bytes); !st) return st;
    }
    return f.flush();
  });
  if (!written) return written.err();
  if (auto st = timed(stats.fsync_seconds, [&] { return f.finish(); }); !st) return st.err();
  return file_entry(f);
}

/// Where each tensor's bytes end in the snapshot's stream (for `wait`).
std::vector<uint64_t> stream_offsets(const std::vector<snapshot_tensor>& all, const std::vector<snapshot_tensor>& ts) {
  std::map<std::string, uint64_t> at;
  uint64_t off = 0;
  for (auto& t : all) at[t.name] = off, off += t.bytes;
  std::vector<uint64_t> out;
  for (auto& t : ts) out.push_back(at[t.name]);
  return out;
}

}  // namespace

fs::path checkpoint_store::parts_path(uint64_t step, const std::string& tag) const {
  return dir_ / (parts_prefix + std::to_string(step) + "-" + tag);
}

result<save_stats> checkpoint_store::save_part(const std::vector<snapshot_tensor>& tensors,
                                               const checkpoint_meta& meta, const std::string& tag, uint32_t rank,
                                               bool with_replicated, const capture_wait& wait,
                                               bool with_rank_state) {
  if (!safe_tag(tag)) return error{errc::invalid_input, "parts tag '" + tag + "' is not a safe file-name part"};
  if (meta.world_size < 1 || rank >= static_cast<uint32_t>(meta.world_size))
    return error{errc::invalid_input, "rank " + std::to_string(rank) + " is outside a world of " +
                                          std::to_string(meta.world_size)};
  const auto dir = parts_path(meta.step, tag);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return error{errc::failed, dir.string() + ": cannot create the parts directory: " + ec.message()};
  save_stats stats;
  stats.step = meta.step;
  stats.path = dir;
  const auto ts = part_tensors(tensors, with_replicated);
  const auto name = part_file_name(rank, static_cast<uint32_t>(meta.world_size));
  std::remove((dir / name).c_str());  // a retry of this rank's part in the same round
  std::remove((dir / part_manifest_name(rank)).c_str());
  auto file = write_part_file(dir / name, ts, direct_io_ ? staging_.get() : nullptr, wait, stream_offsets(tensors, ts),
                              stats);
  if (!file) return error{errc::failed, "part of rank " + std::to_string(rank) + ": " + file.err().message};
  stats.files.push_back(*file);
  stats.total_bytes = file->size;
  auto desc = write_small(dir / part_manifest_name(rank), part_json(meta, rank, *file, ts, with_rank_state).dump(1) + "\n", stats);
  if (!desc) return desc.err();
  if (auto st = timed(stats.fsync_seconds, [&] { return fsync_dir(dir); }); !st) return st.err();
  return stats;
}

namespace {

/// One rank's part as read back from its `part-<R>.json`.
struct part_desc {
  checkpoint_file file;
  json tensors;
  std::optional<rank_state> state;  ///< the rank's own counters and metadata, when recorded
};

/// The entries of `own` that the committer's `meta` does not hold as they
/// are (not which rank saved: every rank's differs and nobody restores it).
rank_state differing(const rank_state& own, const checkpoint_meta& meta) {
  rank_state d;
  for (auto& [k, v] : own.counters)
    if (auto it = meta.counters.find(k); it == meta.counters.end() || it->second != v) d.counters[k] = v;
  for (auto& [k, v] : own.metadata)
    if (k != "grace.saved_by_rank")
      if (auto it = meta.metadata.find(k); it == meta.metadata.end() || it->second != v) d.metadata[k] = v;
  return d;
}

/// A part description (`part-<R>.json`'s contents) checked against the
/// round it is meant for; `p` names it in errors.
result<part_desc> parse_part(const fs::path& p, const result<json>& j, uint32_t rank, const checkpoint_meta& meta) {
  if (!j) return error{errc::failed, "the part of rank " + std::to_string(rank) + " is not durable: " + j.err().message};
  try {
    if (j->at("step").get<uint64_t>() != meta.step || j->at("rank").get<uint32_t>() != rank ||
        j->at("world_size").get<int>() != meta.world_size)
      return invalid_file(p, "describes another step, rank or world size");
    part_desc d;
    auto& f = j->at("file");
    d.file = {f.at("name").get<std::string>(), f.at("size").get<uint64_t>(), f.at("xxh3").get<std::string>()};
    if (!safe_file_name(d.file.name) || !is_shard(d.file.name)) return invalid_file(p, "names an unsafe file");
    d.tensors = j->at("tensors");
    if (auto st = j->find("state"); st != j->end()) {
      rank_state rs;
      if (auto why = rank_state_from_json(*st, rs); !why.empty()) return invalid_file(p, "state: " + why);
      d.state = std::move(rs);
    }
    return d;
  } catch (const json::exception& e) {
    return invalid_file(p, std::string("malformed part description: ") + e.what());
  }
}

result<part_desc> read_part(const fs::path& dir, uint32_t rank, const checkpoint_meta& meta) {
  const auto p = dir / part_manifest_name(rank);
  return parse_part(p, read_json(p), rank, meta);
}

/// The global index from every rank's part: replicated tensors in
/// `weight_map` (exactly one writer each), sharded ones in `grace_sharded`.
result<json> index_from_parts(const std::vector<part_desc>& parts, int world) try {
  json wm = json::object(), sharded = json::object();
  uint64_t total = 0;
  for (auto& p : parts)
    for (auto& t : p.tensors) {
      auto name = t.at("name").get<std::string>();
      dtype ty;
      if (!parse_dtype(t.at("dtype").get<std::string>(), ty))
        return error{errc::invalid_input, "tensor '" + name + "': unknown dtype"};
      uint64_t n = dtype_size(ty);
      for (auto d : t.at("shape")) n *= d.get<uint64_t>();
      total += n;
      if (!t.contains("global_shape")) {
        if (wm.contains(name) || sharded.contains(name))
          return error{errc::invalid_input, "replicated tensor '" + name + "' was written by two ranks"};
        wm[name] = p.file.name;
        continue;
      }
      if (wm.contains(name)) return error{errc::invalid_input, "tensor '" + name + "' is both replicated and sharded"};
      auto& s = sharded[name];
      if (s.is_null()) s = json{{"dtype", t.at("dtype")}, {"shape", t.at("global_shape")}, {"parts", json::array()}};
      if (s["dtype"] != t.at("dtype") || s["shape"] != t.at("global_shape"))
        return error{errc::invalid_input, "sharded tensor '" + name + "': ranks disagree on its dtype or global shape"};
      s["parts"].push_back({{"file", p.file.name}, {"offsets", t.at("offsets")}, {"shape", t.at("shape")}});
    }
  return json{{"metadata", {{"total_size", total}, {"format", "grace-sharded"}, {"world_size", world}}},
              {"weight_map", wm},
              {"grace_sharded", sharded}};
} catch (const json::exception& e) {
  return error{errc::invalid_input, std::string("malformed part description: ") + e.what()};
}

/// Each rank's own counters and metadata, where they differ from the
/// committer's `m`, into a file of its own (listed in `stats.files` and
/// named in `m.rank_files`): every rank reads the manifest, but only its
/// own state file.
status write_rank_states(const fs::path& dir, const std::vector<part_desc>& parts, checkpoint_meta& m,
                         save_stats& stats) {
  const auto world = static_cast<uint32_t>(parts.size());
  m.rank_files.clear();
  for (uint32_t r = 0; r < world; ++r) {
    if (!parts[r].state) continue;
    auto d = differing(*parts[r].state, m);
    if (d.empty()) continue;
    const auto name = rank_state_file_name(r, world);
    auto f = write_small(dir / name, rank_state_to_json(d).dump(1) + "\n", stats);
    if (!f) return f.err();
    stats.files.push_back(*f);
    m.rank_files[r] = name;
  }
  return {};
}

/// Renames the parts directory to `step-N` (unless a valid one is there).
status commit_dir(const checkpoint_store& store, const fs::path& dir, uint64_t step, save_stats& stats) {
  const auto final_path = store.step_path(step);
  auto existed = settle_existing(store, final_path, step, stats);
  if (!existed) return existed.err();
  if (*existed) return {};
  if (::rename(dir.c_str(), final_path.c_str()) != 0)
    return error{errc::failed, dir.string() + ": cannot rename to " + final_path.string() + ": " + errno_str(errno)};
  stats.path = final_path;
  stats.committed_wall_ns = wall_ns();
  return timed(stats.fsync_seconds, [&] { return fsync_dir(store.dir()); });
}

}  // namespace

result<save_stats> checkpoint_store::commit_parts(const checkpoint_meta& meta, const std::string& tag) {
  if (!safe_tag(tag)) return error{errc::invalid_input, "parts tag '" + tag + "' is not a safe file-name part"};
  const auto dir = parts_path(meta.step, tag);
  std::vector<part_desc> parts;
  save_stats stats;
  stats.step = meta.step;
  for (int r = 0; r < meta.world_size; ++r) {
    auto p = read_part(dir, static_cast<uint32_t>(r), meta);
    if (!p) return p.err();
    std::error_code ec;
    if (fs::file_size(dir / p->file.name, ec) != p->file.size || ec)
      return invalid_file(dir / p->file.name, "missing or not the size its part description says");
    stats.files.push_back(p->file);
    parts.push_back(std::move(*p));
  }
  auto index = index_from_parts(parts, meta.world_size);
  if (!index) return index.err();
  auto m = meta;
  m.metadata["grace.format"] = "sharded";
  if (auto st = write_rank_states(dir, parts, m, stats); !st) return st.err();
  if (auto st = write_index_and_manifest(dir, *index, m, key_.get(), stats); !st) return st.err();
  // Checked as a reader will (every part's header, the parts tiling every
  // tensor) before it becomes a step.
  if (auto c = check_structure(*this, dir, *staging_); !c)
    return error{errc::invalid_input, "the parts of step " + std::to_string(meta.step) +
                                          " do not form a checkpoint: " + c.err().message};
  for (int r = 0; r < meta.world_size; ++r) std::remove((dir / part_manifest_name(r)).c_str());
  if (auto st = commit_dir(*this, dir, meta.step, stats); !st) return st.err();
  spdlog::info("checkpoint step {} committed from {} parts: {} ({} bytes)", meta.step, meta.world_size,
               stats.path.string(), stats.total_bytes);
  if (!stats.already_existed) prune(meta.step);
  // Older rounds are abandoned; another round of this step may still be
  // written (a periodic and an agreement's save of one step).
  if (meta.step > 0) remove_parts_up_to(meta.step - 1);
  return stats;
}

result<std::string> checkpoint_store::part_description(uint64_t step, const std::string& tag, uint32_t rank) const {
  if (!safe_tag(tag)) return error{errc::invalid_input, "parts tag '" + tag + "' is not a safe file-name part"};
  const auto p = parts_path(step, tag) / part_manifest_name(rank);
  auto j = read_json(p);
  if (!j) return error{errc::failed, "the part of rank " + std::to_string(rank) + " is not durable: " + j.err().message};
  return j->dump();
}

namespace {

/// Where a node-local commit keeps its nodes' part descriptions of a round
/// once the parts directory became the step: the other nodes' committers of
/// the same round may ask for them after this node's rename.
fs::path kept_descriptions_path(const fs::path& parts_dir) {
  auto p = parts_dir;
  p += ".desc";
  return p;
}

/// Links (or copies) the part descriptions in `dir` into its kept copy.
void keep_descriptions(const fs::path& dir, int world) {
  const auto kept = kept_descriptions_path(dir);
  std::error_code ec;
  fs::create_directories(kept, ec);
  for (int r = 0; r < world && !ec; ++r) {
    const auto name = part_manifest_name(static_cast<uint32_t>(r));
    if (!fs::exists(dir / name, ec)) continue;
    fs::remove(kept / name, ec);
    fs::create_hard_link(dir / name, kept / name, ec);
    if (ec) fs::copy_file(dir / name, kept / name, ec);
  }
  if (ec) spdlog::warn("checkpoint: could not keep the part descriptions of {}: {}", dir.string(), ec.message());
}

/// The part descriptions (`part-<R>.json`) in `dir` (none: an empty list).
result<std::vector<std::string>> read_part_descriptions(const fs::path& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const auto name = it->path().filename().string();
    unsigned rank = 0;
    char tail = 0;
    if (std::sscanf(name.c_str(), "part-%5u.jso%c", &rank, &tail) != 2 || tail != 'n' || name != part_manifest_name(rank))
      continue;
    auto j = read_json(it->path());
    if (!j) return error{errc::failed, j.err().message};
    out.push_back(j->dump());
  }
  return out;
}

}  // namespace

result<std::vector<std::string>> checkpoint_store::part_descriptions(uint64_t step, const std::string& tag) const {
  if (!safe_tag(tag)) return error{errc::invalid_input, "parts tag '" + tag + "' is not a safe file-name part"};
  // The parts directory may become the step while it is read (this node's
  // commit renames it): its kept descriptions are linked before that.
  auto out = read_part_descriptions(parts_path(step, tag));
  if (!out || out->empty()) {
    auto kept = read_part_descriptions(kept_descriptions_path(parts_path(step, tag)));
    if (kept && !kept->empty()) return kept;
  }
  return out;
}

std::vector<checkpoint_store::prepared_part> checkpoint_store::prepared_parts() const {
  std::vector<prepared_part> out;
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir_, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const auto name = it->path().filename().string();
    if (name.rfind(parts_prefix, 0) != 0) continue;
    unsigned long long step = 0;
    int used = 0;
    if (std::sscanf(name.c_str() + std::strlen(parts_prefix), "%llu-%n", &step, &used) != 1 || used == 0) continue;
    const std::string tag = name.substr(std::strlen(parts_prefix) + static_cast<size_t>(used));
    if (!safe_tag(tag)) continue;
    auto descs = part_descriptions(step, tag);
    if (!descs) continue;
    for (auto& d : *descs) {
      auto j = json::parse(d, nullptr, false);
      if (!j.is_object() || !j.contains("file") || !j["file"].is_object() || !j["file"].contains("name") ||
          !j["file"]["name"].is_string())
        continue;
      auto file = j["file"]["name"].get<std::string>();
      std::error_code e2;
      if (safe_file_name(file) && fs::file_size(it->path() / file, e2) == j["file"].value("size", uint64_t(0)) && !e2)
        out.push_back({step, tag, file, j["file"].value("xxh3", std::string())});
    }
  }
  return out;
}

namespace {

/// Every rank's part from the descriptions the nodes exchanged; the parts
/// held on `node` must be here, with the size their description gives.
result<std::vector<part_desc>> node_parts(const fs::path& dir, const checkpoint_meta& meta,
                                          const std::vector<std::string>& descriptions,
                                          const std::vector<int32_t>& holders, int32_t node, save_stats& stats) {
  const auto world = static_cast<size_t>(meta.world_size);
  if (descriptions.size() != world || holders.size() != world)
    return error{errc::invalid_input, "a node-local commit needs a part description and a holder for each of the " +
                                          std::to_string(world) + " ranks"};
  std::vector<part_desc> parts;
  for (uint32_t r = 0; r < world; ++r) {
    const auto named = dir / ("rank " + std::to_string(r) + "'s part description");
    result<json> j = json::parse(descriptions[r], nullptr, false);
    if (j->is_discarded()) j = invalid_file(named, "not valid JSON");
    auto p = parse_part(named, j, r, meta);
    if (!p) return p.err();
    if (holders[r] < 0) return error{errc::invalid_input, "rank " + std::to_string(r) + "'s part has no holder node"};
    if (holders[r] == node) {
      std::error_code ec;
      if (fs::file_size(dir / p->file.name, ec) != p->file.size || ec)
        return invalid_file(dir / p->file.name, "missing or not the size its part description says");
    }
    stats.files.push_back(p->file);
    stats.files.back().node = holders[r];
    parts.push_back(std::move(*p));
  }
  return parts;
}

}  // namespace

result<save_stats> checkpoint_store::commit_node_parts(const checkpoint_meta& meta, const std::string& tag,
                                                       const std::vector<std::string>& descriptions,
                                                       const std::vector<int32_t>& holders, int32_t node) {
  if (!safe_tag(tag)) return error{errc::invalid_input, "parts tag '" + tag + "' is not a safe file-name part"};
  const auto dir = parts_path(meta.step, tag);
  save_stats stats;
  stats.step = meta.step;
  std::error_code ec;
  fs::create_directories(dir, ec);  // a node that holds no part still commits the index and manifest
  if (ec) return error{errc::failed, dir.string() + ": cannot create the parts directory: " + ec.message()};
  auto parts = node_parts(dir, meta, descriptions, holders, node, stats);
  if (!parts) return parts.err();
  auto index = index_from_parts(*parts, meta.world_size);
  if (!index) return index.err();
  auto m = meta;
  m.metadata["grace.format"] = "sharded";
  if (auto st = write_rank_states(dir, *parts, m, stats); !st) return st.err();
  if (auto st = write_index_and_manifest(dir, *index, m, key_.get(), stats); !st) return st.err();
  if (auto c = check_structure(*this, dir, *staging_); !c)
    return error{errc::invalid_input, "the parts of step " + std::to_string(meta.step) + " on node " +
                                          std::to_string(node) + " do not form a checkpoint: " + c.err().message};
  keep_descriptions(dir, meta.world_size);
  for (int r = 0; r < meta.world_size; ++r) std::remove((dir / part_manifest_name(r)).c_str());
  if (auto st = commit_dir(*this, dir, meta.step, stats); !st) return st.err();
  spdlog::info("checkpoint step {} committed on node {} (its parts of {}): {}", meta.step, node, meta.world_size,
               stats.path.string());
  if (!stats.already_existed) prune(meta.step);
  if (meta.step > 0) remove_parts_up_to(meta.step - 1);
  return stats;
}

result<std::vector<checkpoint_file>> checkpoint_store::absent_parts(uint64_t step) const {
  auto c = check_structure(*this, step_path(step), *staging_);
  if (!c) return c.err();
  return c->absent;
}

status checkpoint_store::adopt_part(uint64_t step, const fs::path& file) const {
  const auto name = file.filename().string();
  auto absent = absent_parts(step);
  if (!absent) return absent.err();
  auto it = std::find_if(absent->begin(), absent->end(), [&](const checkpoint_file& f) { return f.name == name; });
  if (it == absent->end())
    return error{errc::invalid_input, name + " is not a part step " + std::to_string(step) + " lacks here"};
  if (auto st = check_file(file.parent_path(), *it, *staging_); !st)
    return error{errc::invalid_input, "copy of " + name + " for step " + std::to_string(step) + ": " + st.err().message};
  const auto dest = step_path(step) / name;
  if (::rename(file.c_str(), dest.c_str()) != 0)
    return error{errc::failed, file.string() + ": cannot move to " + dest.string() + ": " + errno_str(errno)};
  return fsync_dir(step_path(step));
}

void checkpoint_store::remove_rank_parts_up_to(uint64_t step, uint32_t rank, uint32_t world) {
  std::error_code ec;
  std::vector<fs::path> dirs;
  for (auto it = fs::directory_iterator(dir_, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    auto name = it->path().filename().string();
    unsigned long long s = 0;
    if (name.rfind(parts_prefix, 0) == 0 && std::sscanf(name.c_str() + std::strlen(parts_prefix), "%llu-", &s) == 1 &&
        s <= step)
      dirs.push_back(it->path());
  }
  for (auto& d : dirs) {
    std::error_code e2;
    fs::remove(d / part_file_name(rank, world), e2);
    fs::remove(d / part_manifest_name(rank), e2);
    if (fs::is_empty(d, e2) && !e2) fs::remove(d, e2);
  }
}

void checkpoint_store::remove_parts_up_to(uint64_t step) {
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir_, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    auto name = it->path().filename().string();
    if (name.rfind(parts_prefix, 0) != 0) continue;
    unsigned long long s = 0;
    if (std::sscanf(name.c_str() + std::strlen(parts_prefix), "%llu-", &s) != 1 || s > step) continue;
    std::error_code e2;
    fs::remove_all(it->path(), e2);
    if (!e2) spdlog::info("checkpoint: removed the parts of an abandoned or superseded round: {}", it->path().string());
  }
}

// ------------------------------------------------------------ verify

namespace ckpt_io {

namespace {

std::vector<int64_t> dims_of(const json& j) {
  std::vector<int64_t> v;
  for (auto& d : j) v.push_back(d.get<int64_t>());
  return v;
}

/// Parts that tile `shape` exactly: each inside it, no two overlapping, and
/// together as many elements as the whole.
std::string tiling_problem(const std::vector<int64_t>& shape,
                           const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>& boxes) {
  uint64_t whole = 1, sum = 0;
  for (auto d : shape) whole *= static_cast<uint64_t>(d);
  for (size_t i = 0; i < boxes.size(); ++i) {
    auto& [off, ext] = boxes[i];
    if (off.size() != shape.size() || ext.size() != shape.size()) return "a part has the wrong number of dimensions";
    uint64_t n = 1;
    for (size_t d = 0; d < shape.size(); ++d) {
      if (off[d] < 0 || ext[d] < 0 || off[d] + ext[d] > shape[d]) return "a part lies outside the global shape";
      n *= static_cast<uint64_t>(ext[d]);
    }
    sum += n;
    for (size_t k = 0; k < i; ++k) {
      bool meet = n > 0;
      for (size_t d = 0; d < shape.size() && meet; ++d)
        meet = std::max(off[d], boxes[k].first[d]) < std::min(off[d] + ext[d], boxes[k].first[d] + boxes[k].second[d]);
      if (meet) return "two parts overlap";
    }
  }
  if (sum != whole) return "the parts cover " + std::to_string(sum) + " of " + std::to_string(whole) + " elements";
  return "";
}

}  // namespace

status check_sharded_index(const fs::path& ip, const json& index, const step_contents& c) {
  auto it = index.find("grace_sharded");
  if (it == index.end()) return {};
  if (!it->is_object()) return invalid_file(ip, "grace_sharded is not an object");
  std::map<std::string, const safetensors::header*> by_file;
  for (auto& s : c.shards) by_file[s.file->name] = &s.h;
  try {
    for (auto& item : it->items()) {
      const std::string name = item.key();  // a plain variable: the lambda below captures it
      const json& t = item.value();
      dtype ty;
      if (!parse_dtype(t.at("dtype").get<std::string>(), ty)) return invalid_file(ip, "'" + name + "': unknown dtype");
      const auto shape = dims_of(t.at("shape"));
      std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> boxes;
      for (auto& p : t.at("parts")) {
        auto file = p.at("file").get<std::string>();
        auto ext = dims_of(p.at("shape"));
        auto h = by_file.find(file);
        if (h == by_file.end() && !c.absent_holder(file))
          return invalid_file(ip, "'" + name + "': part in " + file + ", not a listed shard");
        if (h != by_file.end()) {
          auto e = std::find_if(h->second->tensors.begin(), h->second->tensors.end(),
                                [&](const safetensors::tensor_entry& x) { return x.name == name; });
          if (e == h->second->tensors.end() || e->type != ty || e->shape != ext)
            return invalid_file(ip, "'" + name + "': " + file + " does not hold the part the index describes");
        }
        boxes.emplace_back(dims_of(p.at("offsets")), std::move(ext));
      }
      if (auto why = tiling_problem(shape, boxes); !why.empty()) return invalid_file(ip, "'" + name + "': " + why);
    }
  } catch (const json::exception& e) {
    return invalid_file(ip, std::string("malformed grace_sharded entry: ") + e.what());
  }
  return {};
}

// ----------------------------------------------------------- restore

bool needs_reslice(const fs::path& step_dir, const std::vector<tensor_ref>& into) {
  for (auto& t : into)
    if (t.sharded()) return true;
  auto j = read_json(step_dir / index_file_name);
  return j && j->contains("grace_sharded");
}

namespace {

/// One stored piece of a tensor: the file, its header entry and its box.
struct stored_part {
  const shard_layout* shard;
  const safetensors::tensor_entry* entry;
  std::vector<int64_t> offsets;
};
/// A piece in a file this directory lacks (node-local checkpoints): its
/// box, when the index gives one (a whole tensor's has none: it meets
/// every slice).
struct absent_part {
  std::string file;
  int32_t node = -1;
  std::vector<int64_t> offsets, shape;
};
struct stored_global {
  dtype type = dtype::f32;
  std::vector<int64_t> shape;
  std::vector<stored_part> parts;
  std::vector<absent_part> elsewhere;
};

const safetensors::tensor_entry* entry_in(const shard_layout& s, const std::string& name) {
  for (auto& e : s.h.tensors)
    if (e.name == name) return &e;
  return nullptr;
}

/// Every tensor of the checkpoint as a global tensor made of parts (a
/// whole tensor is one part at the origin).
result<std::map<std::string, stored_global>> stored_globals(const fs::path& step_dir, const step_contents& c) {
  std::map<std::string, stored_global> out;
  auto ip = step_dir / index_file_name;
  auto j = read_json(ip);
  if (!j) return j.err();
  std::map<std::string, const shard_layout*> by_file;
  for (auto& s : c.shards) by_file[s.file->name] = &s;
  static const json none = json::object();
  auto section = [&](const char* key) -> const json& {
    auto it = j->find(key);
    return it != j->end() && it->is_object() ? *it : none;
  };
  try {
    for (auto& [name, file] : section("weight_map").items()) {
      if (auto node = c.absent_holder(file.get<std::string>())) {
        out[name].elsewhere.push_back({file.get<std::string>(), *node, {}, {}});
        continue;
      }
      auto s = by_file.at(file.get<std::string>());
      auto e = entry_in(*s, name);
      if (!e) return invalid_file(ip, "'" + name + "' is not in " + file.get<std::string>());
      out[name] = {e->type, e->shape, {{s, e, std::vector<int64_t>(e->shape.size(), 0)}}, {}};
    }
    for (auto& [name, t] : section("grace_sharded").items()) {
      auto& g = out[name];
      parse_dtype(t.at("dtype").get<std::string>(), g.type);
      g.shape = dims_of(t.at("shape"));
      for (auto& p : t.at("parts")) {
        if (auto node = c.absent_holder(p.at("file").get<std::string>())) {
          g.elsewhere.push_back({p.at("file").get<std::string>(), *node, dims_of(p.at("offsets")), dims_of(p.at("shape"))});
          continue;
        }
        auto s = by_file.at(p.at("file").get<std::string>());
        auto e = entry_in(*s, name);
        if (!e) return invalid_file(ip, "'" + name + "' is not in " + s->file->name);
        g.parts.push_back({s, e, dims_of(p.at("offsets"))});
      }
    }
  } catch (const std::exception& e) {
    return invalid_file(ip, std::string("index does not match the shards: ") + e.what());
  }
  return out;
}

/// Assembles the registered tensor `t` (its slice, or all of it) from the
/// stored parts that overlap it, into `dst` (t.bytes()).
std::vector<int64_t> offsets_of(const tensor_ref& t) {
  return t.sharded() ? t.offsets : std::vector<int64_t>(t.shape.size(), 0);
}

/// Does stored part `p` hold any element of the caller's tensor `t`?
bool meets(const stored_part& p, const tensor_ref& t) {
  const auto my_off = offsets_of(t);
  for (size_t d = 0; d < my_off.size(); ++d)
    if (std::max(p.offsets[d], my_off[d]) >= std::min(p.offsets[d] + p.entry->shape[d], my_off[d] + t.shape[d]))
      return false;
  return true;
}

status assemble(const fs::path& step_dir, const stored_global& g, const tensor_ref& t, unsigned char* dst) {
  const auto my_off = offsets_of(t);
  uint64_t got = 0;
  std::vector<unsigned char> buf;
  for (auto& p : g.parts) {
    if (!meets(p, t)) continue;
    buf.resize(static_cast<size_t>(p.entry->bytes()));
    auto file = step_dir / p.shard->file->name;
    if (auto st = safetensors::read_tensor(file, p.shard->h, *p.entry, buf.data()); !st) return st;
    got += copy_overlap(buf.data(), p.offsets, p.entry->shape, dst, my_off, t.shape, dtype_size(t.type));
  }
  if (got != t.numel())
    return invalid_file(step_dir, "tensor '" + t.name + "': the stored parts cover " + std::to_string(got) + " of " +
                                      std::to_string(t.numel()) + " elements of this slice");
  return {};
}

/// The caller's tensor against the stored global tensor (caller's error).
std::string mismatch(const tensor_ref& t, const stored_global& g) {
  if (auto why = slice_problem(t); !why.empty()) return why;
  const auto& global = t.sharded() ? t.global_shape : t.shape;
  if (g.type == t.type && g.shape == global) return "";
  return "tensor '" + t.name + "': expected " + dtype_name(t.type) + " " + shape_str(global) +
         (t.sharded() ? " (global)" : "") + ", checkpoint has " + dtype_name(g.type) + " " + shape_str(g.shape);
}

/// Where the caller's slices come from: byte ranges of the files streamed
/// at verification (parts split along the first dimension), or tensors
/// assembled part by part after it (any other slicing).
struct slice_plan {
  std::vector<std::vector<unsigned char>> own;  ///< per tensor, when the caller passed no staging
  std::vector<unsigned char*> dst;              ///< per tensor: its bytes until every slice is in
  std::vector<uint64_t> covered;                ///< per tensor: elements the targets fill
  std::vector<bool> by_part;                    ///< per tensor: assembled part by part
  std::map<const checkpoint_file*, std::vector<target>> targets;
  std::set<const checkpoint_file*> needed;      ///< files read and verified
};

/// Rows [lo, hi) of dimension 0 where part `p` and the caller's `t` meet,
/// when both hold whole rows of the global tensor (a split along the first
/// dimension: one contiguous byte range in each); nullopt otherwise.
std::optional<std::pair<int64_t, int64_t>> row_overlap(const stored_part& p, const tensor_ref& t,
                                                        const std::vector<int64_t>& global) {
  if (t.shape.empty()) return std::nullopt;
  const auto my_off = offsets_of(t);
  for (size_t d = 1; d < global.size(); ++d)
    if (p.offsets[d] != 0 || my_off[d] != 0 || p.entry->shape[d] != global[d] || t.shape[d] != global[d])
      return std::nullopt;
  return std::make_pair(std::max(p.offsets[0], my_off[0]),
                        std::min(p.offsets[0] + p.entry->shape[0], my_off[0] + t.shape[0]));
}

/// Adds the byte ranges tensor `i` takes from the parts it meets, or marks
/// it to be assembled part by part.
void plan_slice(slice_plan& plan, size_t i, const stored_global& g, const tensor_ref& t) {
  const auto my_off = offsets_of(t);
  uint64_t row_elems = 1;
  for (size_t d = 1; d < g.shape.size(); ++d) row_elems *= static_cast<uint64_t>(g.shape[d]);
  const uint64_t row_bytes = row_elems * dtype_size(t.type);
  std::vector<std::pair<const checkpoint_file*, target>> ranges;
  for (auto& p : g.parts) {
    if (!meets(p, t)) continue;
    plan.needed.insert(p.shard->file);
    auto rows = row_overlap(p, t, g.shape);
    if (!rows) {
      plan.by_part[i] = true;
      continue;
    }
    const uint64_t from = p.shard->h.data_start + p.entry->begin +
                          static_cast<uint64_t>(rows->first - p.offsets[0]) * row_bytes;
    const uint64_t n = static_cast<uint64_t>(rows->second - rows->first) * row_bytes;
    ranges.push_back({p.shard->file, {from, from + n, plan.dst[i] + static_cast<uint64_t>(rows->first - my_off[0]) * row_bytes}});
    plan.covered[i] += static_cast<uint64_t>(rows->second - rows->first) * row_elems;
  }
  if (plan.by_part[i]) return;
  for (auto& [f, r] : ranges) plan.targets[f].push_back(r);
}

slice_plan plan_slices(const std::map<std::string, stored_global>& globals, const std::vector<tensor_ref>& into,
                       const std::vector<void*>& staging) {
  slice_plan plan;
  plan.own.resize(into.size());
  plan.dst.resize(into.size());
  plan.covered.assign(into.size(), 0);
  plan.by_part.assign(into.size(), false);
  for (size_t i = 0; i < into.size(); ++i) {
    if (staging.empty()) {
      plan.own[i].resize(into[i].bytes());
      plan.dst[i] = plan.own[i].data();
    } else {
      plan.dst[i] = static_cast<unsigned char*>(staging[i]);
    }
    plan_slice(plan, i, globals.at(into[i].name), into[i]);
  }
  for (auto& [f, ts] : plan.targets)
    std::sort(ts.begin(), ts.end(), [](const target& a, const target& b) { return a.begin < b.begin; });
  return plan;
}

/// Reads and verifies the files the plan needs (scattering their targets
/// on the way) and every file that is not a shard (the index). Another
/// rank's parts are its own to read and verify (a rank that finds its part
/// damaged moves the step aside, see set_aside_damaged_on_restore).
status verify_needed(const fs::path& step_dir, const step_contents& c, const slice_plan& plan, bool compare,
                     io_staging& io) {
  for (auto& f : c.manifest.files) {
    if (c.absent_holder(f.name)) continue;
    const bool shard = std::any_of(c.shards.begin(), c.shards.end(), [&](const shard_layout& s) { return s.file == &f; });
    if (shard && !plan.needed.count(&f)) continue;
    auto t = plan.targets.find(&f);
    chunk_sink sink = t == plan.targets.end() ? chunk_sink{} : scatter_into(t->second);
    if (auto st = check_file(step_dir, f, io, sink, compare); !st) return st;
  }
  return {};
}

/// A node-local checkpoint: the first caller's tensor that needs a part
/// this directory lacks (grace-launch fetches those before a group
/// starts), as an error naming the file and the node holding it.
std::optional<error> needs_absent_part(const fs::path& step_dir, const std::map<std::string, stored_global>& globals,
                                       const std::vector<tensor_ref>& into) {
  for (auto& t : into) {
    auto g = globals.find(t.name);
    if (g == globals.end()) continue;
    const auto my_off = offsets_of(t);
    for (auto& a : g->second.elsewhere) {
      bool meet = true;
      for (size_t d = 0; d < a.offsets.size() && d < my_off.size() && d < t.shape.size() && meet; ++d)
        meet = std::max(a.offsets[d], my_off[d]) < std::min(a.offsets[d] + a.shape[d], my_off[d] + t.shape[d]);
      if (meet)
        return error{errc::failed, step_dir.string() + ": tensor '" + t.name + "' needs " + a.file + ", held on node " +
                                       std::to_string(a.node) + " and not in this directory (copy it here first)"};
    }
  }
  return std::nullopt;
}

/// The caller's tensors against the stored ones: its error, or nullopt.
std::optional<error> caller_problem(const fs::path& step_dir, const std::map<std::string, stored_global>& globals,
                                    const std::vector<tensor_ref>& into) {
  for (auto& t : into) {
    auto g = globals.find(t.name);
    if (g == globals.end())
      return invalid_file(step_dir, "registered tensor '" + t.name + "' is missing from the checkpoint");
    if (auto why = mismatch(t, g->second); !why.empty()) return invalid_file(step_dir, why);
    if (!t.data && t.bytes() > 0)
      return error{errc::invalid_input, "tensor '" + t.name + "' has no memory to restore into"};
  }
  return std::nullopt;
}

}  // namespace

result<restored_checkpoint> load_resliced(const fs::path& step_dir, step_contents& c,
                                          const std::vector<tensor_ref>& into, const std::vector<void*>& staging,
                                          bool compare, io_staging& io, bool& corrupt) {
  corrupt = true;
  auto globals = stored_globals(step_dir, c);
  if (!globals) return globals.err();
  if (auto absent = needs_absent_part(step_dir, *globals, into)) {
    corrupt = false;
    return *absent;
  }
  // A caller's error counts only once the files it would read verified (a
  // damaged checkpoint is skipped, whatever else is wrong with it).
  auto problem = caller_problem(step_dir, *globals, into);
  if (problem) {
    if (auto st = check_files(step_dir, c.manifest, io); !st) return st.err();
    corrupt = false;
    return *problem;
  }
  if (!staging.empty() && staging.size() != into.size()) {
    corrupt = false;
    return error{errc::invalid_input, "restore staging has " + std::to_string(staging.size()) + " buffers for " +
                                          std::to_string(into.size()) + " tensors"};
  }
  auto plan = plan_slices(*globals, into, staging);
  if (auto st = verify_needed(step_dir, c, plan, compare, io); !st) return st.err();
  corrupt = false;
  for (size_t i = 0; i < into.size(); ++i) {
    auto& t = into[i];
    if (plan.by_part[i]) {
      if (auto st = assemble(step_dir, globals->at(t.name), t, plan.dst[i]); !st) return st.err();
    } else if (plan.covered[i] != t.numel()) {
      return invalid_file(step_dir, "tensor '" + t.name + "': the stored parts cover " +
                                        std::to_string(plan.covered[i]) + " of " + std::to_string(t.numel()) +
                                        " elements of this slice");
    }
  }
  // Every slice complete: only now do the bytes reach the caller's memory.
  restored_checkpoint out;
  for (size_t i = 0; i < into.size(); ++i) {
    auto& t = into[i];
    const size_t bytes = static_cast<size_t>(t.bytes());
    if (t.memory == memory_kind::device) {
      if (auto st = device_copy_to_device(t.data, plan.dst[i], bytes, t.device); !st)
        return error{st.err().code, "tensor '" + t.name + "': " + st.err().message};
    } else if (bytes > 0 && t.data != plan.dst[i]) {
      std::memcpy(t.data, plan.dst[i], bytes);
    }
    out.loaded.push_back(t.name);
  }
  std::set<std::string> registered;
  for (auto& t : into) registered.insert(t.name);
  for (auto& [name, g] : *globals)
    if (!registered.count(name)) out.unregistered.push_back(name);
  out.found = true;
  out.path = step_dir;
  out.manifest = std::move(c.manifest);
  return out;
}

}  // namespace ckpt_io

}  // namespace grace
