#include "runtime/checkpoint/checkpoint.hpp"

#include "runtime/base/mutants.hpp"
#include "runtime/checkpoint/checkpoint_io.hpp"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <deque>
#include <memory>
#include <optional>
#include <set>
#include <system_error>
#include <thread>
#include <unordered_map>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "runtime/checkpoint/device_copy.hpp"
#include "runtime/checkpoint/direct_io.hpp"
#include "runtime/base/events.hpp"
#include "runtime/checkpoint/manifest.hpp"
#include "runtime/base/posix_file.hpp"
#include "runtime/checkpoint/safetensors.hpp"

namespace grace {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace ckpt_io {

double now_unix() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

/// A checksum as the manifest records it: 16 lowercase hex digits.
std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

/// The manifest entry of a written file.
checkpoint_file file_entry(const hashed_file& f) { return {f.path().filename().string(), f.size(), hex64(f.digest())}; }

/// Checks one listed file's size and checksum, handing its bytes to `sink`.
/// `compare`: false only for the broken-on-purpose restore mutant.
status check_file(const fs::path& step_dir, const checkpoint_file& f, io_staging& io, const chunk_sink& sink,
                  bool compare) {
  const auto p = step_dir / f.name;
  auto h = stream_file(p, f.size, sink, io);
  if (!h) return h.err();
  if (compare && hex64(*h) != f.xxh3)
    return invalid_file(p, "checksum mismatch: xxh3 " + hex64(*h) + ", manifest says " + f.xxh3 + " (file corrupted)");
  return {};
}

chunk_sink scatter_into(const std::vector<target>& ts) {
  return [&ts, first = size_t(0)](uint64_t off, const unsigned char* p, size_t n) mutable {
    const uint64_t end = off + n;
    while (first < ts.size() && ts[first].end <= off) ++first;
    for (size_t k = first; k < ts.size() && ts[k].begin < end; ++k) {
      const auto& t = ts[k];
      const uint64_t b = std::max(t.begin, off), e = std::min(t.end, end);
      std::memcpy(t.dst + (b - t.begin), p + (b - off), static_cast<size_t>(e - b));
    }
  };
}

bool held_elsewhere(const fs::path& step_dir, const checkpoint_file& f) {
  if (f.node < 0) return false;
  std::error_code ec;
  return !fs::exists(fs::symlink_status(step_dir / f.name, ec));
}

status check_files(const fs::path& step_dir, const checkpoint_manifest& m, io_staging& io) {
  for (auto& f : m.files)
    if (!held_elsewhere(step_dir, f))
      if (auto st = check_file(step_dir, f, io); !st) return st;
  return {};
}

/// Manifest present and parsable; every listed file present with its size
/// (a node-local part held on another node may be absent).
result<checkpoint_manifest> quick_check(const checkpoint_store& store, const fs::path& d) {
  auto m = store.read_manifest(d);
  if (!m) return m.err();
  for (auto& f : m->files) {
    if (held_elsewhere(d, f)) continue;
    std::error_code ec;
    auto p = d / f.name;
    auto st = fs::status(p, ec);
    if (ec || !fs::is_regular_file(st)) return invalid_file(p, "missing");
    auto sz = fs::file_size(p, ec);
    if (ec) return invalid_file(p, "cannot stat: " + ec.message());
    if (sz != f.size)
      return invalid_file(p, "size " + std::to_string(sz) + " but the manifest says " + std::to_string(f.size) +
                                 " (truncated or partially written)");
  }
  return m;
}

}  // namespace ckpt_io
using namespace ckpt_io;

checkpoint_store::checkpoint_store(fs::path dir, int keep_last)
    : dir_(std::move(dir)), keep_last_(keep_last), staging_(std::make_shared<io_staging>()) {}

fs::path checkpoint_store::step_path(uint64_t step) const { return dir_ / step_dir_name(step); }

void checkpoint_store::prepare_io(uint64_t state_bytes) { staging_->prepare(state_bytes); }

void checkpoint_store::keep_io_warm() { staging_->keep_warm(); }

// ------------------------------------------------------------------ save

namespace {

/// Where each tensor of a save goes: whole tensors, in order, at most
/// `shard_bytes` per shard (a larger tensor gets a shard of its own).
struct shard_plan {
  std::vector<std::vector<size_t>> shards;  ///< indices into the tensors, per shard
  std::vector<safetensors::encoded_header> headers;
  std::vector<std::string> names;
  std::vector<uint64_t> stream_at;  ///< per tensor: where its bytes start in the snapshot's stream
};

/// Validates the tensors and lays them out, before the disk is touched.
result<shard_plan> plan_shards(const std::vector<snapshot_tensor>& tensors, uint64_t shard_bytes) {
  std::vector<safetensors::tensor_desc> descs;
  descs.reserve(tensors.size());
  std::set<std::string> names;
  for (auto& t : tensors) {
    if (t.bytes > 0 && !t.data) return error{errc::invalid_input, "tensor '" + t.name + "' has no data"};
    if (!names.insert(t.name).second) return error{errc::invalid_input, "duplicate tensor name '" + t.name + "'"};
    descs.push_back({t.name, t.type, t.shape, t.bytes});
  }
  shard_plan plan;
  uint64_t cur = 0, at = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    plan.stream_at.push_back(at);
    at += tensors[i].bytes;
    if (plan.shards.empty() || (!plan.shards.back().empty() && cur + tensors[i].bytes > shard_bytes)) {
      plan.shards.emplace_back();
      cur = 0;
    }
    plan.shards.back().push_back(i);
    cur += tensors[i].bytes;
  }
  if (plan.shards.empty()) plan.shards.emplace_back();  // an empty checkpoint still has one (empty) shard
  for (size_t s = 0; s < plan.shards.size(); ++s) {
    std::vector<safetensors::tensor_desc> sd;
    for (auto i : plan.shards[s]) sd.push_back(descs[i]);
    auto enc = safetensors::encode_header(sd, {{"format", "pt"}});
    if (!enc) return enc.err();
    plan.headers.push_back(std::move(*enc));
    plan.names.push_back(shard_file_name(s, plan.shards.size()));
  }
  return plan;
}

/// The private directory one save writes into: registered as active while
/// it exists, removed unless committed.
class tmp_step_dir {
public:
  tmp_step_dir(const fs::path& parent, uint64_t step) : name_(tmp_dir_name(step)), path_(parent / name_) {
    mark_temp_active(name_);
  }
  ~tmp_step_dir() {
    if (!keep_) {
      std::error_code e;
      fs::remove_all(path_, e);
    }
    mark_temp_inactive(name_);
  }
  tmp_step_dir(const tmp_step_dir&) = delete;
  tmp_step_dir& operator=(const tmp_step_dir&) = delete;

  status create() const {
    if (::mkdir(path_.c_str(), 0755) != 0)
      return error{errc::failed, path_.string() + ": cannot create: " + errno_str(errno)};
    return {};
  }
  const fs::path& path() const noexcept { return path_; }
  /// It became the checkpoint: leave it.
  void keep() noexcept { keep_ = true; }

private:
  std::string name_;
  fs::path path_;
  bool keep_ = false;
};

}  // namespace
namespace ckpt_io {
/// Writes a small in-memory file into the temp dir with checksum and fsync.
result<checkpoint_file> write_small(const fs::path& p, const std::string& text, save_stats& stats) {
  hashed_file f;
  auto written = timed(stats.write_seconds, [&]() -> status {
    if (auto s = f.open(p, text.size()); !s) return s;
    return f.write(text.data(), text.size());
  });
  if (!written) return written.err();
  if (auto s = timed(stats.fsync_seconds, [&] { return f.finish(); }); !s) return s.err();
  return file_entry(f);
}
}  // namespace ckpt_io
namespace {

/// The Hugging Face index of a save: which shard holds each tensor.
json index_for(const shard_plan& plan, const std::vector<snapshot_tensor>& tensors) {
  uint64_t tensor_total = 0;
  json weight_map = json::object();
  for (size_t s = 0; s < plan.shards.size(); ++s)
    for (auto i : plan.shards[s]) {
      tensor_total += tensors[i].bytes;
      weight_map[tensors[i].name] = plan.names[s];
    }
  return json{{"metadata", {{"total_size", tensor_total}}}, {"weight_map", weight_map}};
}

/// Writes one tensor's bytes; with `wait`, piece by piece as the snapshot
/// capture makes them available (`at`: the tensor's place in its stream).
status write_tensor(hashed_file& f, const snapshot_tensor& t, uint64_t at, const capture_wait& wait) {
  if (!wait) return f.write(t.data, t.bytes);
  constexpr size_t piece = 16u << 20;
  auto* p = static_cast<const unsigned char*>(t.data);
  for (size_t off = 0; off < t.bytes; off += piece) {
    size_t n = std::min(piece, t.bytes - off);
    if (!wait(at + off + n))
      return error{errc::failed, "the snapshot of tensor '" + t.name + "' failed while it was being written"};
    if (auto st = f.write(p + off, n); !st) return st;
  }
  return {};
}

/// Writes shard `s` of `plan` into `f` (opened here), up to but not
/// including its fsync.
status write_shard(hashed_file& f, const shard_plan& plan, size_t s, const std::vector<snapshot_tensor>& tensors,
                   const fs::path& tmp, io_staging* io, const capture_wait& wait) {
  const auto& h = plan.headers[s];
  if (auto st = f.open(tmp / plan.names[s], h.file_size, io); !st) return st;
  if (auto st = f.write(h.bytes.data(), h.bytes.size()); !st) return st;
  for (auto i : plan.shards[s])
    if (auto st = write_tensor(f, tensors[i], plan.stream_at[i], wait); !st) return st;
  return f.flush();
}

/// Writes the shards, streamed straight from the caller's buffers. Each
/// shard is fsynced only after the last one is written (all before the
/// manifest): the first fsync commits the journal and makes the host flush
/// the virtual disk's cache for every shard at once, the others find little
/// left to do. An fsync after each shard makes the disk flush at every
/// shard boundary, and writes slow down while it flushes (measurements:
/// docs/BENCHMARKS.md). At most `max_unsynced` files wait open, so tiny
/// shards cannot exhaust fds. `io`: O_DIRECT staging, null for buffered.
status write_shards(const shard_plan& plan, const std::vector<snapshot_tensor>& tensors, const fs::path& tmp,
                    io_staging* io, const capture_wait& wait, save_stats& stats) {
  constexpr size_t max_unsynced = 64;
  std::deque<hashed_file> unsynced;
  auto sync_oldest = [&]() -> status {
    auto st = timed(stats.fsync_seconds, [&] { return unsynced.front().finish(); });
    unsynced.pop_front();
    return st;
  };
  for (size_t s = 0; s < plan.shards.size(); ++s) {
    auto& f = unsynced.emplace_back();
    if (auto st = timed(stats.write_seconds, [&] { return write_shard(f, plan, s, tensors, tmp, io, wait); }); !st) return st;
    stats.files.push_back(file_entry(f));
    if (unsynced.size() >= max_unsynced)
      if (auto st = sync_oldest(); !st) return st;
  }
  while (!unsynced.empty())
    if (auto st = sync_oldest(); !st) return st;
  return {};
}

}  // namespace
namespace ckpt_io {
/// Writes the index, then the manifest (last: its presence means every
/// file before it is complete), and fsyncs the directory.
status write_index_and_manifest(const fs::path& tmp, const json& index, const checkpoint_meta& meta,
                                const checkpoint_key* key, save_stats& stats) {
  auto idx = write_small(tmp / index_file_name, index.dump(2) + "\n", stats);
  if (!idx) return idx.err();
  stats.files.push_back(*idx);
  checkpoint_manifest m;
  m.step = meta.step;
  m.world_size = meta.world_size;
  m.run_id = meta.run_id;
  m.incarnation = meta.incarnation;
  m.kind = meta.kind;
  m.wall_time = now_unix();
  m.counters = meta.counters;
  m.rank_files = meta.rank_files;
  m.metadata = meta.metadata;
  m.files = stats.files;
  m.format_version = m.node_local() ? 3 : m.rank_files.empty() ? 1 : 2;
  json mj = manifest_to_json(m);
  if (key) sign_manifest(mj, *key);
  auto man = write_small(tmp / manifest_file_name, mj.dump(2) + "\n", stats);
  if (!man) return man.err();
  if (auto st = timed(stats.fsync_seconds, [&] { return fsync_dir(tmp); }); !st) return st;
  for (auto& f : stats.files) stats.total_bytes += f.size;
  stats.total_bytes += man->size;
  return {};
}

/// Makes way for `final_path`: a valid checkpoint already there wins (true:
/// `stats` now describe it), an invalid one is renamed aside.
result<bool> settle_existing(const checkpoint_store& store, const fs::path& final_path, uint64_t step,
                             save_stats& stats) {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(final_path, ec))) return false;
  auto v = store.verify(final_path);
  if (v) {
    spdlog::info("checkpoint step {}: {} already exists and verifies; discarding the new copy", step,
                 final_path.string());
    auto existing = store.read_manifest(final_path);
    stats.path = final_path;
    stats.already_existed = true;
    if (existing) {
      stats.files = existing->files;
      stats.total_bytes = existing->total_bytes();
    }
    return true;
  }
  if (auto st = move_aside(final_path, v.err().message); !st) return st.err();
  return false;
}

status move_aside(const fs::path& step_dir, const std::string& why) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(std::time(nullptr)));
  fs::path aside = step_dir;
  aside += std::string(corrupt_marker) + buf;
  spdlog::warn("checkpoint {} is invalid ({}); moving it aside to {}", step_dir.string(), why, aside.string());
  if (::rename(step_dir.c_str(), aside.c_str()) != 0 && errno != ENOENT)
    return error{errc::failed, step_dir.string() + ": cannot move invalid checkpoint aside: " + errno_str(errno)};
  return {};
}
}  // namespace ckpt_io
namespace {

/// Renames the temp dir to `step-N` and fsyncs the parent, unless a valid
/// `step-N` is there already.
status commit(const checkpoint_store& store, tmp_step_dir& tmp, uint64_t step, save_stats& stats) {
  const fs::path final_path = store.step_path(step);
  auto existed = settle_existing(store, final_path, step, stats);
  if (!existed) return existed.err();
  if (*existed) return {};
  if (::rename(tmp.path().c_str(), final_path.c_str()) != 0)
    return error{errc::failed,
                 tmp.path().string() + ": cannot rename to " + final_path.string() + ": " + errno_str(errno)};
  tmp.keep();
  stats.committed_wall_ns = wall_ns();
  if (auto st = timed(stats.fsync_seconds, [&] { return fsync_dir(store.dir()); }); !st) return st;
  stats.path = final_path;
  spdlog::info("checkpoint step {} committed: {} ({} files, {} bytes, write {:.3f}s, fsync {:.3f}s)", step,
               final_path.string(), stats.files.size() + 1, stats.total_bytes, stats.write_seconds,
               stats.fsync_seconds);
  return {};
}

}  // namespace

result<save_stats> checkpoint_store::save(const std::vector<snapshot_tensor>& tensors, const checkpoint_meta& meta,
                                          const capture_wait& wait, const commit_gate& gate) {
  auto plan = plan_shards(tensors, shard_bytes_);
  if (!plan) return plan.err();
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) return error{errc::failed, dir_.string() + ": cannot create checkpoint directory: " + ec.message()};
  remove_stale_temporaries();
  tmp_step_dir tmp(dir_, meta.step);
  if (auto st = tmp.create(); !st) return st.err();

  save_stats stats;
  stats.step = meta.step;
  status st = write_shards(*plan, tensors, tmp.path(), direct_io_ ? staging_.get() : nullptr, wait, stats);
  if (st) {
    auto whole = meta;
    whole.rank_files.clear();  // a commit of parts names them; a whole-state save has none
    st = write_index_and_manifest(tmp.path(), index_for(*plan, tensors), whole, key_.get(), stats);
  }
  if (st && gate) st = gate();
  if (st) st = commit(*this, tmp, meta.step, stats);
  if (!st) {
    spdlog::error("checkpoint step {}: save failed: {}", meta.step, st.err().message);
    return error{errc::failed, st.err().message};
  }
  if (!stats.already_existed) prune(meta.step);
  return stats;
}

int checkpoint_store::keep_only_newest() {
  auto all = list();
  std::vector<const checkpoint_info*> valid;
  for (auto& c : all)
    if (c.valid && !c.temporary && !c.set_aside) valid.push_back(&c);
  std::sort(valid.begin(), valid.end(), [](auto* a, auto* b) { return a->step > b->step; });
  // The one kept must restore: checksums verified, not only the quick check.
  const checkpoint_info* newest = nullptr;
  for (auto* c : valid)
    if (verify(c->path)) {
      newest = c;
      break;
    }
  if (!newest) return 0;
  int removed = 0;
  for (auto* cp : valid) {
    auto& c = *cp;
    if (c.step >= newest->step) continue;  // the kept one, or newer ones that failed to verify (inspection)
    std::error_code ec;
    fs::remove_all(c.path, ec);
    if (ec) {
      spdlog::warn("checkpoint {}: cannot remove it to make room: {}", c.path.string(), ec.message());
      continue;
    }
    spdlog::warn("checkpoint {}: removed to make room (the newest, step {}, is kept)", c.path.string(), newest->step);
    ++removed;
  }
  return removed;
}

void checkpoint_store::prune(uint64_t committed_step) {
  if (keep_last_ <= 0) return;
  auto all = list();
  std::vector<const checkpoint_info*> valid;
  for (auto& c : all) {
    if (c.temporary || c.set_aside) continue;
    if (c.valid) {
      valid.push_back(&c);
    } else if (c.step < committed_step) {
      spdlog::warn("checkpoint {}: invalid ({}); leaving it in place for inspection", c.path.string(), c.reason);
    }
  }
  std::sort(valid.begin(), valid.end(),
            [](const checkpoint_info* a, const checkpoint_info* b) { return a->step > b->step; });
  for (size_t i = static_cast<size_t>(keep_last_); i < valid.size(); ++i) {
    if (valid[i]->step >= committed_step) continue;
    std::error_code ec;
    fs::remove_all(valid[i]->path, ec);
    if (ec)
      spdlog::warn("checkpoint {}: cannot remove old checkpoint: {}", valid[i]->path.string(), ec.message());
    else
      spdlog::info("checkpoint {}: removed (keep_last={})", valid[i]->path.string(), keep_last_);
  }
}

// ------------------------------------------------------------------ list

namespace {

/// The entry names of `dir` (opendir/readdir rather than
/// directory_iterator: errno gives the message).
result<std::vector<std::string>> entry_names(const fs::path& dir) {
  std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), &::closedir);
  if (!d) return invalid_file(dir, "cannot read checkpoint directory: " + errno_str(errno));
  std::vector<std::string> names;
  errno = 0;
  while (auto* e = ::readdir(d.get())) names.emplace_back(e->d_name);
  if (errno) return invalid_file(dir, "cannot read checkpoint directory: " + errno_str(errno));
  return names;
}

/// A `step-N` directory, quick-checked.
void describe_step(const checkpoint_store& store, uint64_t step, checkpoint_info& info) {
  info.step = step;
  auto m = quick_check(store, info.path);
  if (!m) {
    info.reason = m.err().message;
    return;
  }
  info.valid = true;
  info.kind = to_string(m->kind);
  info.total_bytes = m->total_bytes();
  if (m->step != step) {
    info.valid = false;
    info.reason = "manifest says step " + std::to_string(m->step);
  }
}

/// The listing entry for directory entry `name`; nothing when it is not a
/// checkpoint, a set-aside one or a temporary.
std::optional<checkpoint_info> describe_entry(const checkpoint_store& store, const std::string& name) {
  checkpoint_info info;
  info.path = store.dir() / name;
  uint64_t step = 0;
  long pid = 0;
  std::error_code ec;
  if (parse_step_name(name, step) && fs::is_symlink(fs::symlink_status(info.path, ec))) {
    info.step = step;
    info.reason = "a symbolic link, refused: a step directory must be inside the checkpoint directory";
    return info;
  } else if (parse_step_name(name, step)) {
    describe_step(store, step, info);
  } else if (name.rfind("step-", 0) == 0 && name.find(corrupt_marker) != std::string::npos) {
    parse_step_name(name.substr(0, name.find(corrupt_marker)), info.step);
    info.set_aside = true;
    info.reason = "set aside as corrupt when a new checkpoint took its name";
  } else if (parse_tmp_name(name, step, pid)) {
    info.step = step;
    info.temporary = true;
    info.reason = std::string("leftover temporary from pid ") + std::to_string(pid) +
                  (pid_alive(pid) ? " (still running or in progress)" : " (process gone)");
  } else {
    return std::nullopt;
  }
  if (info.total_bytes == 0 && !info.temporary) {
    // Sizes from the directory itself, for the listing.
    std::error_code ec;
    for (auto it = fs::directory_iterator(info.path, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
      std::error_code e2;
      auto sz = it->file_size(e2);
      if (!e2) info.total_bytes += sz;
    }
  }
  return info;
}

}  // namespace

uint64_t checkpoint_store::newest_valid_step() const {
  uint64_t n = 0;
  for (auto& c : list())
    if (c.valid && !c.temporary && !c.set_aside) n = std::max(n, c.step);
  return n;
}

result<std::vector<checkpoint_info>> checkpoint_store::try_list() const {
  std::vector<checkpoint_info> out;
  std::error_code ec;
  auto st = fs::status(dir_, ec);
  if (ec && ec != std::errc::no_such_file_or_directory)
    return invalid_file(dir_, "cannot access checkpoint directory: " + ec.message());
  if (!fs::exists(st)) return out;
  if (!fs::is_directory(st)) return invalid_file(dir_, "not a directory");
  auto names = entry_names(dir_);
  if (!names) return names.err();
  for (auto& name : *names)
    if (auto info = describe_entry(*this, name)) out.push_back(std::move(*info));
  std::sort(out.begin(), out.end(), [](const checkpoint_info& a, const checkpoint_info& b) {
    return a.step != b.step ? a.step < b.step : a.path < b.path;
  });
  return out;
}

std::vector<checkpoint_info> checkpoint_store::list() const {
  auto r = try_list();
  if (!r) {
    spdlog::warn("checkpoint list: {}", r.err().message);
    return {};
  }
  return std::move(r).value();
}

result<checkpoint_manifest> checkpoint_store::read_manifest(const fs::path& step_dir) const {
  auto p = step_dir / manifest_file_name;
  auto j = read_json(p);
  if (!j) {
    if (j.err().message == p.string() + ": missing")
      return invalid_file(p, "missing (checkpoint incomplete, or not a Grace checkpoint)");
    return j.err();
  }
  if (key_)
    if (auto why = manifest_signature_problem(*j, *key_); !why.empty()) return invalid_file(p, why);
  return manifest_from_json(p, *j);
}

result<std::vector<stored_tensor>> checkpoint_store::read_tensors(const fs::path& step_dir) const {
  auto m = read_manifest(step_dir);
  if (!m) return m.err();
  std::vector<stored_tensor> out;
  for (auto& f : m->files) {
    if (!is_shard(f.name) || held_elsewhere(step_dir, f)) continue;  // another node's part: its header is there
    auto h = safetensors::read_header(step_dir / f.name);
    if (!h) return h.err();
    for (auto& t : h->tensors) out.push_back({t.name, t.type, t.shape, t.bytes(), f.name});
  }
  return out;
}

// ---------------------------------------------------------------- verify

namespace {

/// Every `weight_map` entry of the index at `ip` names the shard that holds
/// the tensor (or a part this directory lacks, held on another node).
status check_index(const fs::path& ip, const step_contents& c) {
  const auto& shards = c.shards;
  auto j = read_json(ip);
  if (!j) return j.err();
  auto wm = j->find("weight_map");
  if (wm == j->end() || !wm->is_object()) return invalid_file(ip, "no weight_map object");
  std::map<std::string, std::string> where;
  for (auto& s : shards)
    for (auto& t : s.h.tensors) where[t.name] = s.file->name;
  for (auto& [name, file] : wm->items()) {
    if (!file.is_string()) return invalid_file(ip, "weight_map entry '" + name + "' is not a string");
    if (c.absent_holder(file.get<std::string>())) continue;
    auto it = where.find(name);
    if (it == where.end() || it->second != file.get<std::string>())
      return invalid_file(
          ip, "weight_map says '" + name + "' is in " + file.get<std::string>() + ", which does not hold it");
  }
  return {};
}

}  // namespace
namespace ckpt_io {

/// Manifest, directory name, every listed file present, every shard header
/// valid, the index agreeing with the shards. A header or index that does
/// not parse is first checked against its checksum: "file corrupted" says
/// more than the parse error it causes.
result<step_contents> check_structure(const checkpoint_store& store, const fs::path& step_dir, io_staging& io) {
  std::error_code ec;
  if (fs::is_symlink(fs::symlink_status(step_dir, ec)))
    return invalid_file(step_dir, "a symbolic link, refused: a step directory must be inside the checkpoint directory");
  auto m = store.read_manifest(step_dir);
  if (!m) return m.err();
  uint64_t name_step = 0;
  if (parse_step_name(step_dir.filename().string(), name_step) && name_step != m->step)
    return invalid_file(step_dir, "directory is step " + std::to_string(name_step) + " but the manifest says " +
                                      std::to_string(m->step));
  step_contents out;
  out.manifest = std::move(*m);
  const checkpoint_file* index = nullptr;
  for (auto& f : out.manifest.files) {
    auto p = step_dir / f.name;
    if (held_elsewhere(step_dir, f)) {
      out.absent.push_back(f);
      continue;
    }
    std::error_code ec;
    auto st = fs::symlink_status(p, ec);
    if (fs::is_symlink(st)) return invalid_file(p, open_failure(ELOOP));
    if (!fs::is_regular_file(st)) return invalid_file(p, fs::exists(st) ? "not a regular file" : "missing");
    if (f.name == index_file_name) index = &f;
    if (!is_shard(f.name)) continue;
    auto h = safetensors::read_header(p);
    if (!h) {
      if (auto c = check_file(step_dir, f, io); !c) return c.err();
      return h.err();
    }
    out.shards.push_back({&f, std::move(*h)});
  }
  if (index) {
    const auto ip = step_dir / index_file_name;
    auto st = check_index(ip, out);
    if (st) {
      auto j = read_json(ip);
      st = j ? check_sharded_index(ip, *j, out) : status(j.err());
    }
    if (!st) {
      if (auto c = check_file(step_dir, *index, io); !c) return c.err();
      return st.err();
    }
  }
  return out;
}

}  // namespace ckpt_io

status checkpoint_store::verify(uint64_t step) const { return verify(step_path(step)); }

status checkpoint_store::verify(const fs::path& step_dir) const {
  auto c = check_structure(*this, step_dir, *staging_);
  if (!c) return c.err();
  return check_files(step_dir, c->manifest, *staging_);
}

// --------------------------------------------------------------- restore

namespace {

/// A stored tensor: which shard, and its header entry.
struct located {
  size_t shard;
  const safetensors::tensor_entry* e;
};
using tensor_index = std::unordered_map<std::string, located>;

tensor_index index_tensors(const step_contents& c) {
  tensor_index by_name;
  for (size_t s = 0; s < c.shards.size(); ++s)
    for (auto& e : c.shards[s].h.tensors) by_name[e.name] = located{s, &e};
  return by_name;
}

/// Checks the request against the checkpoint before a byte is written into
/// the caller's memory, so a mismatch leaves the registered tensors
/// untouched. A mismatch in a checkpoint that fails its checksums is
/// corruption (skip it), otherwise the caller's error (`corrupt` false).
status check_request(const fs::path& step_dir, const step_contents& c, const tensor_index& by_name,
                     const std::vector<tensor_ref>& into, const std::vector<void*>& staging, io_staging& io,
                     bool& corrupt) {
  auto caller_error = [&](error e) -> error {
    if (auto v = check_files(step_dir, c.manifest, io); !v) return v.err();
    corrupt = false;
    return e;
  };
  if (!staging.empty() && staging.size() != into.size()) {
    corrupt = false;
    return error{errc::invalid_input, "restore staging has " + std::to_string(staging.size()) + " buffers for " +
                                          std::to_string(into.size()) + " tensors"};
  }
  for (auto& t : into) {
    auto it = by_name.find(t.name);
    if (it == by_name.end())
      return caller_error(invalid_file(step_dir, "registered tensor '" + t.name + "' is missing from the checkpoint"));
    auto& e = *it->second.e;
    if (e.type != t.type || e.shape != t.shape)
      return caller_error(invalid_file(step_dir, "tensor '" + t.name + "': expected " + dtype_name(t.type) + " " +
                                                     shape_str(t.shape) + ", checkpoint has " + dtype_name(e.type) +
                                                     " " + shape_str(e.shape)));
    if (t.memory == memory_kind::device && !device_copy_available()) {
      corrupt = false;
      return error{errc::failed, "tensor '" + t.name +
                                     "': device tensors need the CUDA backend (this process has not "
                                     "registered its device copy; see runtime/checkpoint/device_copy.hpp)"};
    }
    if (!t.data && e.bytes() > 0) {
      corrupt = false;
      return error{errc::invalid_input, "tensor '" + t.name + "' has no " +
                                            (t.memory == memory_kind::device ? "device" : "host") +
                                            " memory to restore into"};
    }
  }
  return {};
}

/// A registered tensor's bytes within one shard file.
/// Where the registered tensors' bytes land while the files are read.
struct read_plan {
  std::unique_ptr<unsigned char[]> own;      ///< when the caller passed no staging
  std::vector<unsigned char*> dst;           ///< per tensor of `into`
  std::vector<std::vector<target>> targets;  ///< per shard, by file offset
};

read_plan plan_reads(const step_contents& c, const tensor_index& by_name, const std::vector<tensor_ref>& into,
                     const std::vector<void*>& staging) {
  read_plan plan;
  plan.dst.resize(into.size());
  if (staging.empty()) {
    size_t total = 0;
    for (auto& t : into) total += static_cast<size_t>(by_name.at(t.name).e->bytes());
    plan.own.reset(new unsigned char[total + 1]);
    size_t at = 0;
    for (size_t i = 0; i < into.size(); ++i) {
      plan.dst[i] = plan.own.get() + at;
      at += static_cast<size_t>(by_name.at(into[i].name).e->bytes());
    }
  } else {
    for (size_t i = 0; i < into.size(); ++i) plan.dst[i] = static_cast<unsigned char*>(staging[i]);
  }
  plan.targets.resize(c.shards.size());
  for (size_t i = 0; i < into.size(); ++i) {
    auto& l = by_name.at(into[i].name);
    if (l.e->bytes() == 0) continue;
    const uint64_t base = c.shards[l.shard].h.data_start;
    plan.targets[l.shard].push_back({base + l.e->begin, base + l.e->end, plan.dst[i]});
  }
  for (auto& t : plan.targets)
    std::sort(t.begin(), t.end(), [](const target& a, const target& b) { return a.begin < b.begin; });
  return plan;
}

/// One pass over every file: read (O_DIRECT), hash, and scatter the
/// registered tensors' bytes into the staging buffers.
status read_and_scatter(const fs::path& step_dir, const step_contents& c, const read_plan& plan, bool compare,
                        io_staging& io) {
  for (auto& f : c.manifest.files) {
    chunk_sink sink;
    bool shard = false;
    for (size_t s = 0; s < c.shards.size(); ++s)
      if (c.shards[s].file == &f) {
        shard = true;
        if (!plan.targets[s].empty()) sink = scatter_into(plan.targets[s]);
      }
    // A shard none of our tensors comes from (another rank's part of a
    // sharded checkpoint) is read and verified by the rank that needs it.
    if ((shard && !sink) || c.absent_holder(f.name)) continue;
    if (auto st = check_file(step_dir, f, io, sink, compare); !st) return st;
  }
  return {};
}

/// Copies n bytes, on two threads when it is large (restores end with one
/// copy of the whole state; one core does not saturate memory here).
void copy_large(void* dst, const void* src, size_t n) {
  constexpr size_t parallel_min = 32u << 20;
  if (n < parallel_min || std::thread::hardware_concurrency() < 2) {
    std::memcpy(dst, src, n);
    return;
  }
  const size_t first = (n / 2) & ~size_t(4095);
  std::thread t([=] { std::memcpy(dst, src, first); });
  std::memcpy(static_cast<char*>(dst) + first, static_cast<const char*>(src) + first, n - first);
  t.join();
}

/// Moves the verified bytes from staging into the caller's tensors.
result<restored_checkpoint> copy_out(const fs::path& step_dir, step_contents& c, const tensor_index& by_name,
                                     const std::vector<tensor_ref>& into, const read_plan& plan) {
  restored_checkpoint out;
  std::set<std::string> registered;
  for (size_t i = 0; i < into.size(); ++i) {
    auto& t = into[i];
    registered.insert(t.name);
    const size_t bytes = static_cast<size_t>(by_name.at(t.name).e->bytes());
    if (bytes > 0) {
      if (t.memory == memory_kind::device) {
        if (auto st = device_copy_to_device(t.data, plan.dst[i], bytes, t.device); !st)
          return error{st.err().code, "tensor '" + t.name + "': " + st.err().message};
      } else if (t.data != plan.dst[i]) {
        copy_large(t.data, plan.dst[i], bytes);
      }
    }
    out.loaded.push_back(t.name);
  }
  for (auto& [name, l] : by_name)
    if (!registered.count(name)) out.unregistered.push_back(name);
  std::sort(out.unregistered.begin(), out.unregistered.end());
  out.found = true;
  out.path = step_dir;
  out.manifest = std::move(c.manifest);
  return out;
}

/// Restores compare every file's checksum; only the failure harness's
/// mutant turns that off (runtime/base/mutants.hpp).
bool verify_checksums() { return !mutants::active().restore_without_checksums; }

}  // namespace

result<rank_state> checkpoint_store::read_rank_state(const fs::path& step_dir, const checkpoint_manifest& m,
                                                     uint32_t rank) const {
  if (auto inline_state = m.ranks.find(rank); inline_state != m.ranks.end()) return inline_state->second;
  auto named = m.rank_files.find(rank);
  if (named == m.rank_files.end()) return rank_state{};
  auto entry = std::find_if(m.files.begin(), m.files.end(), [&](const checkpoint_file& f) { return f.name == named->second; });
  if (entry == m.files.end())
    return invalid_file(step_dir / named->second, "rank " + std::to_string(rank) + "'s state file is not in the manifest's files");
  if (entry->size > (64u << 20)) return invalid_file(step_dir / entry->name, "a rank state file over 64 MiB");
  std::string text;
  auto keep = [&text](uint64_t, const unsigned char* p, size_t n) { text.append(reinterpret_cast<const char*>(p), n); };
  if (auto st = check_file(step_dir, *entry, *staging_, keep, verify_checksums()); !st) return st.err();
  auto j = json::parse(text, nullptr, false);
  rank_state out;
  if (j.is_discarded()) return invalid_file(step_dir / entry->name, "not JSON");
  if (auto why = rank_state_from_json(j, out); !why.empty()) return invalid_file(step_dir / entry->name, why);
  return out;
}

result<restored_checkpoint> checkpoint_store::load(const fs::path& step_dir, const std::vector<tensor_ref>& into,
                                                   const std::vector<void*>& staging, bool& corrupt) const {
  corrupt = true;
  auto c = check_structure(*this, step_dir, *staging_);
  if (!c) return c.err();
  // The restoring rank's own counters and metadata: checked before any
  // tensor bytes move, like every file the restore reads.
  rank_state own;
  if (restoring_ && restoring_->second == c->manifest.world_size) {
    auto s = read_rank_state(step_dir, c->manifest, restoring_->first);
    if (!s) return s.err();
    own = std::move(*s);
  }
  auto r = load_tensors(step_dir, *c, into, staging, corrupt);
  if (r) r->own = r->manifest.state_for(restoring_ ? restoring_->second : c->manifest.world_size, own);
  return r;
}

result<restored_checkpoint> checkpoint_store::load_tensors(const fs::path& step_dir, step_contents& c,
                                                           const std::vector<tensor_ref>& into,
                                                           const std::vector<void*>& staging, bool& corrupt) const {
  if (needs_reslice(step_dir, into)) return load_resliced(step_dir, c, into, staging, verify_checksums(), *staging_, corrupt);
  const tensor_index by_name = index_tensors(c);
  if (auto st = check_request(step_dir, c, by_name, into, staging, *staging_, corrupt); !st) return st.err();
  // Only when every checksum matched do the bytes move on to the caller's tensors.
  const read_plan plan = plan_reads(c, by_name, into, staging);
  if (auto st = read_and_scatter(step_dir, c, plan, verify_checksums(), *staging_); !st) return st.err();
  corrupt = false;
  return copy_out(step_dir, c, by_name, into, plan);
}

void checkpoint_store::set_aside_if_invalid(const fs::path& step_dir) const {
  std::error_code ec;
  if (!set_aside_damaged_ || !fs::exists(step_dir, ec)) return;  // gone: another rank moved it first
  // Confirmed by a full verification, so a transient read error never
  // moves a good checkpoint aside.
  auto v = verify(step_dir);
  if (v) return;
  if (auto st = move_aside(step_dir, v.err().message); !st) spdlog::warn("checkpoint: {}", st.err().message);
}

result<restored_checkpoint> checkpoint_store::restore_latest(const std::vector<tensor_ref>& into,
                                                             const std::vector<void*>& staging) const {
  auto all = try_list();
  if (!all) return all.err();
  std::vector<skipped_checkpoint> skipped;
  for (auto it = all->rbegin(); it != all->rend(); ++it) {
    if (it->temporary || it->set_aside) continue;
    bool corrupt = false;
    auto r = load(it->path, into, staging, corrupt);
    if (!r) {
      if (!corrupt) return r.err();
      spdlog::warn("checkpoint {}: skipped on restore: {}", it->path.string(), r.err().message);
      skipped.push_back({it->step, it->path, r.err().message});
      set_aside_if_invalid(it->path);
      continue;
    }
    r->skipped = std::move(skipped);
    spdlog::info("restored checkpoint step {} from {} ({} tensors, {} unregistered ignored, {} newer skipped)",
                 r->manifest.step, r->path.string(), r->loaded.size(), r->unregistered.size(), r->skipped.size());
    return r;
  }
  if (!skipped.empty())
    spdlog::error("checkpoint directory {}: {} checkpoint(s) present but none verifies; starting fresh", dir_.string(),
                  skipped.size());
  restored_checkpoint none;
  none.skipped = std::move(skipped);
  return none;
}

result<restored_checkpoint> checkpoint_store::restore(uint64_t step, const std::vector<tensor_ref>& into,
                                                      const std::vector<void*>& staging) const {
  auto p = step_path(step);
  std::error_code ec;
  if (!fs::exists(p, ec)) return invalid_file(p, "no checkpoint for step " + std::to_string(step));
  bool corrupt = false;
  return load(p, into, staging, corrupt);
}

// ----------------------------------------------------------- temporaries

std::vector<fs::path> checkpoint_store::stale_temporaries() const {
  std::vector<fs::path> out;
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir_, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    auto name = it->path().filename().string();
    uint64_t step = 0;
    long pid = 0;
    if (!parse_tmp_name(name, step, pid)) continue;
    bool ours = pid == static_cast<long>(::getpid());
    if (ours ? !is_active_temp(it->path()) : !pid_alive(pid)) out.push_back(it->path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

void checkpoint_store::remove_stale_temporaries() {
  if (mutants::active().keep_stale_temporaries) return;  // BROKEN ON PURPOSE (a mutant)
  for (auto& p : stale_temporaries()) {
    std::error_code ec;
    fs::remove_all(p, ec);
    if (ec)
      spdlog::warn("checkpoint: cannot remove stale temporary {}: {}", p.string(), ec.message());
    else
      spdlog::warn("checkpoint: removed stale temporary {} left by a crashed writer", p.string());
  }
}

}  // namespace grace
