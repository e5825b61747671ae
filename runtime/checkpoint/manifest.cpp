#include "runtime/checkpoint/manifest.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <random>
#include <set>

#include <nlohmann/json.hpp>

#include "runtime/base/posix_file.hpp"

namespace grace {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* tmp_prefix = ".tmp-step-";
constexpr uint64_t max_json_bytes = 256u << 20;  ///< manifest / index size limit

/// Temp dirs this process is writing right now (see `mark_temp_active`).
/// Process-wide on purpose: it describes the process, not one store.
std::mutex active_mutex;
std::set<std::string> active_temps;

}  // namespace

// ----------------------------------------------------------------- names

std::string step_dir_name(uint64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%010" PRIu64, step);
  return buf;
}

bool parse_step_name(const std::string& name, uint64_t& step) {
  if (name.rfind("step-", 0) != 0 || name.size() <= 5 || name.size() > 5 + 20) return false;
  uint64_t v = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    char c = name[i];
    if (c < '0' || c > '9') return false;
    uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (UINT64_MAX - d) / 10) return false;
    v = v * 10 + d;
  }
  step = v;
  return true;
}

std::string tmp_dir_name(uint64_t step) {
  std::random_device rd;
  char rnd[16];
  std::snprintf(rnd, sizeof rnd, "%08x", static_cast<unsigned>(rd()));
  return tmp_prefix + std::to_string(step) + "-" + std::to_string(::getpid()) + "-" + rnd;
}

bool parse_tmp_name(const std::string& name, uint64_t& step, long& pid) {
  if (name.rfind(tmp_prefix, 0) != 0) return false;
  unsigned long long s = 0;
  long p = 0;
  char rnd[64];
  if (std::sscanf(name.c_str() + std::strlen(tmp_prefix), "%llu-%ld-%63s", &s, &p, rnd) != 3) return false;
  step = s;
  pid = p;
  return true;
}

bool pid_alive(long pid) {
  if (pid <= 0) return false;
  if (::kill(static_cast<pid_t>(pid), 0) == 0) return true;
  return errno == EPERM;
}

void mark_temp_active(const std::string& name) {
  std::lock_guard<std::mutex> lk(active_mutex);
  active_temps.insert(name);
}

void mark_temp_inactive(const std::string& name) {
  std::lock_guard<std::mutex> lk(active_mutex);
  active_temps.erase(name);
}

bool is_active_temp(const fs::path& p) {
  std::lock_guard<std::mutex> lk(active_mutex);
  return active_temps.count(p.filename().string()) > 0;
}

std::string shard_file_name(size_t index, size_t count) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", index + 1, count);
  return buf;
}

bool is_shard(const std::string& name) {
  const std::string suffix = ".safetensors";
  return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool safe_file_name(const std::string& n) {
  return !n.empty() && n != "." && n != ".." && n.find('/') == std::string::npos && n.find('\0') == std::string::npos;
}

// ------------------------------------------------------------------ JSON

result<json> read_json(const fs::path& p) {
  fd_guard f(open_no_follow(p, O_RDONLY));
  if (f.fd < 0) return invalid_file(p, open_failure(errno));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) return invalid_file(p, "cannot stat: " + errno_str(errno));
  if (!S_ISREG(st.st_mode)) return invalid_file(p, "not a regular file");
  if (static_cast<uint64_t>(st.st_size) > max_json_bytes)
    return invalid_file(p, "implausibly large (" + std::to_string(st.st_size) + " bytes)");
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < text.size()) {
    ssize_t r = ::read(f.fd, text.data() + got, text.size() - got);
    if (r < 0) {
      if (errno == EINTR) continue;
      return invalid_file(p, "read failed: " + errno_str(errno));
    }
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  text.resize(got);
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) return invalid_file(p, "not valid JSON");
  return j;
}

json manifest_to_json(const checkpoint_manifest& m) {
  json files = json::array();
  for (auto& f : m.files) {
    files.push_back({{"name", f.name}, {"size", f.size}, {"xxh3", f.xxh3}});
    if (f.node >= 0) files.back()["node"] = static_cast<uint32_t>(f.node);
  }
  std::time_t t = static_cast<std::time_t>(m.wall_time);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char iso[32];
  std::strftime(iso, sizeof iso, "%Y-%m-%dT%H:%M:%SZ", &tm);
  json j{{"format", "grace-checkpoint"},
              {"format_version", m.format_version},
              {"step", m.step},
              {"world_size", m.world_size},
              {"run_id", m.run_id},
              {"incarnation", m.incarnation},
              {"kind", to_string(m.kind)},
              {"wall_time", m.wall_time},
              {"wall_time_utc", iso},
              {"counters", m.counters},
              {"metadata", m.metadata},
              {"files", files}};
  if (!m.ranks.empty() || !m.rank_files.empty()) {
    json ranks = json::object();
    for (auto& [r, st] : m.ranks) ranks[std::to_string(r)] = rank_state_to_json(st);
    for (auto& [r, file] : m.rank_files) ranks[std::to_string(r)] = json{{"file", file}};
    j["ranks"] = std::move(ranks);
  }
  return j;
}

rank_state checkpoint_manifest::state_for(int world, const rank_state& own) const {
  rank_state out{counters, metadata};
  if (world != world_size) return out;
  for (auto& [k, v] : own.counters) out.counters[k] = v;
  for (auto& [k, v] : own.metadata) out.metadata[k] = v;
  return out;
}

std::string rank_file_name(uint32_t rank, uint32_t world, const char* suffix) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "rank-%05u-of-%05u%s", rank + 1, world, suffix);
  return buf;
}

std::string rank_state_file_name(uint32_t rank, uint32_t world) { return rank_file_name(rank, world, ".state.json"); }

json rank_state_to_json(const rank_state& s) { return json{{"counters", s.counters}, {"metadata", s.metadata}}; }

std::string rank_state_from_json(const json& j, rank_state& st) {
  if (!j.is_object()) return "counters and metadata are not an object";
  if (auto v = j.find("counters"); v != j.end()) {
    if (!v->is_object()) return "counters is not an object";
    for (auto& [k, c] : v->items()) {
      if (!c.is_number_integer() || (c.is_number_unsigned() && c.get<uint64_t>() > uint64_t(INT64_MAX)))
        return "counter '" + k + "' is not a 64-bit integer";
      st.counters[k] = c.get<int64_t>();
    }
  }
  if (auto v = j.find("metadata"); v != j.end()) {
    if (!v->is_object()) return "metadata is not an object";
    for (auto& [k, c] : v->items()) {
      if (!c.is_string()) return "metadata '" + k + "' is not a string";
      st.metadata[k] = c.get<std::string>();
    }
  }
  return "";
}

namespace {

/// Optional `counters` and `metadata` objects of `j` into `st`.
status parse_state(const fs::path& p, const json& j, rank_state& st) {
  if (auto why = rank_state_from_json(j, st); !why.empty()) return invalid_file(p, "manifest " + why);
  return {};
}

/// The optional `counters`, `metadata` and `ranks` objects (after the
/// scalars: a rank must be below the world size).
status parse_maps(const fs::path& p, const json& j, checkpoint_manifest& m) {
  rank_state top;
  if (auto st = parse_state(p, j, top); !st) return st;
  m.counters = std::move(top.counters);
  m.metadata = std::move(top.metadata);
  auto v = j.find("ranks");
  if (v == j.end()) return {};
  if (!v->is_object()) return invalid_file(p, "manifest ranks is not an object");
  for (auto& [k, r] : v->items()) {
    char* end = nullptr;
    const unsigned long rank = std::strtoul(k.c_str(), &end, 10);
    if (k.empty() || k.size() > 10 || *end != '\0' || !std::isdigit(static_cast<unsigned char>(k[0])) ||
        m.world_size < 1 || rank >= static_cast<unsigned long>(m.world_size))
      return invalid_file(p, "manifest ranks has an entry '" + k + "' that is not a rank of the world");
    if (!r.is_object()) return invalid_file(p, "manifest ranks entry '" + k + "' is not an object");
    if (auto f = r.find("file"); f != r.end()) {
      const auto want = rank_state_file_name(static_cast<uint32_t>(rank), static_cast<uint32_t>(m.world_size));
      if (m.format_version < 2 || !f->is_string() || *f != want || r.size() != 1)
        return invalid_file(p, "manifest ranks entry '" + k + "' must be {\"file\": \"" + want +
                                   "\"} (in format_version 2 and later)");
      m.rank_files[static_cast<uint32_t>(rank)] = want;
      continue;
    }
    if (auto st = parse_state(p, r, m.ranks[static_cast<uint32_t>(rank)]); !st) return st;
  }
  return {};
}

/// The required `files` list.
status parse_files(const fs::path& p, const json& j, checkpoint_manifest& m) {
  auto v = j.find("files");
  if (v == j.end() || !v->is_array()) return invalid_file(p, "manifest has no files list");
  for (auto& f : *v) {
    if (!f.is_object() || !f.contains("name") || !f["name"].is_string() || !f.contains("size") ||
        !f["size"].is_number_unsigned() || !f.contains("xxh3") || !f["xxh3"].is_string())
      return invalid_file(p, "manifest has a malformed files entry");
    checkpoint_file cf{f["name"].get<std::string>(), f["size"].get<uint64_t>(), f["xxh3"].get<std::string>()};
    if (!safe_file_name(cf.name)) return invalid_file(p, "manifest names an unsafe file '" + cf.name + "'");
    if (auto n = f.find("node"); n != f.end()) {
      if (m.format_version < 3 || !n->is_number_unsigned() || n->get<uint64_t>() > uint64_t(INT32_MAX) ||
          !is_shard(cf.name))
        return invalid_file(p, "manifest files entry '" + cf.name +
                                   "' has a node that is not a node rank of a part (format_version 3 and later)");
      cf.node = static_cast<int32_t>(n->get<uint64_t>());
    }
    m.files.push_back(std::move(cf));
  }
  return {};
}

/// Everything but the maps and the files list.
status parse_scalars(const fs::path& p, const json& j, checkpoint_manifest& m) {
  auto need = [&](const char* k) -> const json* {
    auto it = j.find(k);
    return it == j.end() ? nullptr : &*it;
  };
  const json* v = need("format_version");
  if (!v || !v->is_number_integer()) return invalid_file(p, "manifest has no format_version");
  m.format_version = v->get<int>();
  if (m.format_version < 1 || m.format_version > checkpoint_manifest::current_format_version)
    return invalid_file(p, "unsupported manifest format_version " + std::to_string(m.format_version) +
                               " (this build reads up to " +
                               std::to_string(checkpoint_manifest::current_format_version) + ")");
  if (!(v = need("step")) || !v->is_number_unsigned()) return invalid_file(p, "manifest has no step");
  m.step = v->get<uint64_t>();
  if ((v = need("world_size")) && v->is_number_integer()) m.world_size = v->get<int>();
  if ((v = need("run_id")) && v->is_string()) m.run_id = v->get<std::string>();
  if ((v = need("incarnation")) && v->is_number_unsigned()) m.incarnation = v->get<uint64_t>();
  if (!(v = need("kind")) || !v->is_string() || !parse_checkpoint_kind(v->get<std::string>(), m.kind))
    return invalid_file(p, "manifest has no valid kind");
  if ((v = need("wall_time")) && v->is_number()) m.wall_time = v->get<double>();
  return {};
}

}  // namespace

result<checkpoint_manifest> manifest_from_json(const fs::path& p, const json& j) {
  if (!j.is_object()) return invalid_file(p, "manifest is not a JSON object");
  checkpoint_manifest m;
  try {
    for (auto part : {parse_scalars, parse_maps, parse_files})
      if (auto st = part(p, j, m); !st) return st.err();
    // Every rank's state file is listed, so a full verify checks it.
    for (auto& [r, name] : m.rank_files)
      if (std::none_of(m.files.begin(), m.files.end(), [&n = name](const checkpoint_file& f) { return f.name == n; }))
        return invalid_file(p, "manifest names " + name + " for rank " + std::to_string(r) + " but does not list it in files");
  } catch (const json::exception& e) {
    return invalid_file(p, std::string("malformed manifest: ") + e.what());
  }
  return m;
}

}  // namespace grace
