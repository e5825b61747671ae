#include "runtime/checkpoint/node_local_sync.hpp"

#include "runtime/checkpoint/checkpoint_fetch.hpp"
#include "runtime/base/events.hpp"
#include "runtime/checkpoint/manifest.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <ctime>
#include <thread>

#include <fcntl.h>
#include <unistd.h>

namespace grace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::optional<uint64_t> newest_restorable(const std::map<uint64_t, std::set<std::string>>& needed,
                                          const std::map<uint64_t, std::set<std::string>>& available) {
  for (auto it = needed.rbegin(); it != needed.rend(); ++it) {
    auto a = available.find(it->first);
    if (a != available.end() && std::includes(a->second.begin(), a->second.end(), it->second.begin(), it->second.end()))
      return it->first;
  }
  return std::nullopt;
}

std::set<std::string> parts_needed_here(const checkpoint_manifest& m, const json& index,
                                        const std::vector<uint32_t>& ranks, uint32_t world) {
  std::set<std::string> parts, out;
  for (auto& f : m.files)
    if (f.node >= 0) parts.insert(f.name);
  if (static_cast<uint32_t>(m.world_size) != world) return parts;
  for (auto r : ranks) {
    auto own = rank_file_name(r, world, ".safetensors");
    if (parts.count(own)) out.insert(own);
  }
  if (auto wm = index.find("weight_map"); wm != index.end() && wm->is_object())
    for (auto& [name, file] : wm->items())
      if (file.is_string() && parts.count(file.get<std::string>())) out.insert(file.get<std::string>());
  return out;
}

namespace {

/// Parts mirrored in a node's memory: step -> part -> the checksums of its
/// copies there (an earlier incarnation's mirror of the same step may be
/// another state: only a copy with the manifest's checksum counts).
using mirrors = std::map<uint64_t, std::map<std::string, std::set<std::string>>>;

/// The parts of `m` among `held` whose checksum matches the manifest's.
std::set<std::string> matching(const checkpoint_manifest& m, const mirrors& held, uint64_t s) {
  std::set<std::string> out;
  auto it = held.find(s);
  if (it == held.end()) return out;
  for (auto& f : m.files)
    if (auto p = it->second.find(f.name); p != it->second.end() && p->second.count(f.xxh3)) out.insert(f.name);
  return out;
}

/// What one peer reported.
struct peer_view {
  std::string ep;
  std::set<uint64_t> steps;                             ///< committed, valid there
  std::map<uint64_t, std::set<std::string>> prepared;   ///< durable, not committed there
  mirrors mirrored;                                     ///< in its memory directory
  std::map<uint64_t, std::set<std::string>> files;      ///< of its committed steps, asked for when needed
};

struct views {
  checkpoint_store store;
  std::set<uint64_t> steps;                            ///< committed here
  std::map<uint64_t, std::set<std::string>> prepared;  ///< durable here, not committed
  mirrors mirrored;                                    ///< in this node's memory directory
  std::vector<peer_view> peers;
};

views gather(const level_config& c) {
  views v{checkpoint_store(c.dir, 0), {}, {}, {}, {}};
  v.store.set_signing_key(c.key);
  for (auto& i : v.store.list())
    if (i.valid && !i.temporary && !i.set_aside) v.steps.insert(i.step);
  for (auto& p : v.store.prepared_parts()) v.prepared[p.step].insert(p.file);
  if (!c.memory_dir.empty())
    for (auto& p : checkpoint_store(c.memory_dir, 0).prepared_parts()) v.mirrored[p.step][p.file].insert(p.xxh3);
  for (auto& ep : c.peers) {
    peer_view p{ep, {}, {}, {}, {}};
    auto steps = list_remote(ep, c.token, c.io_timeout);
    if (!steps) continue;  // unreachable: it contributes nothing
    p.steps.insert(steps->begin(), steps->end());
    if (auto prep = list_prepared_remote(ep, c.token, c.io_timeout))
      for (auto& [s, f] : *prep) p.prepared[s].insert(f);
    if (auto mir = list_mirrored_remote(ep, c.token, c.io_timeout))
      for (auto& m : *mir) p.mirrored[m.step][m.file].insert(m.xxh3);
    v.peers.push_back(std::move(p));
  }
  return v;
}

/// Step `s`'s manifest: ours, or the first peer's that has it.
std::optional<checkpoint_manifest> manifest_of(const level_config& c, views& v, uint64_t s) {
  if (v.steps.count(s))
    if (auto m = v.store.read_manifest(v.store.step_path(s))) return *m;
  for (auto& p : v.peers) {
    if (!p.steps.count(s)) continue;
    auto text = get_text_remote(p.ep, c.token, s, manifest_file_name, c.io_timeout);
    if (!text) continue;
    auto j = json::parse(*text, nullptr, false);
    if (j.is_discarded()) continue;
    if (c.key && !manifest_signature_problem(j, *c.key).empty()) continue;  // not this job's: never adopted
    if (auto m = manifest_from_json(p.ep + ": " + manifest_file_name, j)) return *m;
  }
  return std::nullopt;
}

/// The parts of `s` present in our committed copy.
std::set<std::string> present_here(views& v, uint64_t s) {
  std::set<std::string> out;
  if (!v.steps.count(s)) return out;
  auto m = v.store.read_manifest(v.store.step_path(s));
  auto absent = v.store.absent_parts(s);
  if (!m || !absent) return out;
  for (auto& f : m->files) out.insert(f.name);
  for (auto& f : *absent) out.erase(f.name);
  return out;
}

/// Refreshes what peer `p` holds of its committed step `s`, asking up to
/// three times (its server answers one connection at a time and may be
/// busy, or restarting with its launcher): nullptr when it would not say.
/// A peer that did not answer is not a peer without the files.
const std::set<std::string>* peer_files_or_null(const level_config& c, peer_view& p, uint64_t s) {
  auto& f = p.files[s];
  if (!p.steps.count(s)) return &f;
  for (int attempt = 0; attempt < 3; ++attempt) {
    if (attempt) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    if (auto l = list_files_remote(p.ep, c.token, s, c.io_timeout)) {
      f = std::move(*l);
      return &f;
    }
  }
  return nullptr;
}

/// The same where not knowing is the same as not having (a fetch that
/// tries the next peer, a mirror adopted whole and checked).
const std::set<std::string>& peer_files(const level_config& c, peer_view& p, uint64_t s) {
  if (auto* f = peer_files_or_null(c, p, s)) return *f;
  return p.files[s];
}

/// The newest committed step anyone has whose every part some node holds
/// (nullopt: none). An error when a peer that has a step would not list its
/// files: without its answer an older step would be chosen and the newer
/// ones set aside, though they may be whole.
result<std::optional<uint64_t>> choose(const level_config& c, views& v) {
  std::set<uint64_t> all = v.steps;
  for (auto& p : v.peers) all.insert(p.steps.begin(), p.steps.end());
  std::map<uint64_t, std::set<std::string>> needed, available;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    const uint64_t s = *it;
    auto m = manifest_of(c, v, s);
    if (!m) continue;
    for (auto& f : m->files) needed[s].insert(f.name);
    auto& a = available[s];
    auto here = present_here(v, s);
    a.insert(here.begin(), here.end());
    a.insert(v.prepared[s].begin(), v.prepared[s].end());
    auto mine = matching(*m, v.mirrored, s);
    a.insert(mine.begin(), mine.end());
    for (auto& p : v.peers) {
      auto* pf = peer_files_or_null(c, p, s);
      if (!pf)
        return error{errc::disconnected, "the checkpoint server at " + p.ep + " did not list its files of step " +
                                             std::to_string(s) + " (asked three times): nothing was set aside"};
      a.insert(pf->begin(), pf->end());
      a.insert(p.prepared[s].begin(), p.prepared[s].end());
      auto theirs = matching(*m, p.mirrored, s);
      a.insert(theirs.begin(), theirs.end());
    }
    // Every committed copy holds the index and state files: only parts count.
    for (auto& f : m->files)
      if (f.node < 0) a.insert(f.name);
    if (newest_restorable({{s, needed[s]}}, {{s, a}})) return std::optional<uint64_t>(s);
  }
  return std::optional<uint64_t>();
}

/// Renames our committed steps above `keep` aside: a part of them exists
/// nowhere, so no rank may restore them.
void set_aside_above(views& v, uint64_t keep, const std::function<void(const std::string&)>& say) {
  for (auto s : v.steps) {
    if (s <= keep) continue;
    auto from = v.store.step_path(s);
    auto to = from;
    to += std::string(corrupt_marker) + std::to_string(std::time(nullptr)) + "-incomplete";
    std::error_code ec;
    fs::rename(from, to, ec);
    say("checkpoint step " + std::to_string(s) + " set aside as " + to.filename().string() +
        (ec ? " FAILED: " + ec.message() : "") + ": a part of it is on no node any more; step " +
        std::to_string(keep) + " is restored instead");
  }
}

/// Whether some node's disk holds part `name` of `s`, committed or durable.
bool on_a_disk(const level_config& c, views& v, uint64_t s, const std::string& name) {
  if (present_here(v, s).count(name) || v.prepared[s].count(name)) return true;
  for (auto& p : v.peers)
    if (peer_files(c, p, s).count(name) || p.prepared[s].count(name)) return true;
  return false;
}

/// Copies `from` (on the memory file system) into a temporary beside the
/// store and adopts it into step `s` (checked against its manifest).
status adopt_copy(views& v, uint64_t s, const fs::path& from) {
  const auto tmp = v.store.dir() / (".tmp-step-" + std::to_string(s) + "-" + std::to_string(::getpid()) + "-mirror");
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (!ec) fs::copy_file(from, tmp / from.filename(), ec);
  if (!ec) {  // durable before it is adopted
    int fd = ::open((tmp / from.filename()).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || ::fsync(fd) != 0) ec = std::error_code(errno, std::generic_category());
    if (fd >= 0) ::close(fd);
  }
  status st = ec ? status{error{errc::failed, "cannot copy " + from.string() + ": " + ec.message()}}
                 : v.store.adopt_part(s, tmp / from.filename());
  fs::remove_all(tmp, ec);
  return st;
}

/// The parts of `s` this node lacks that no disk holds any more but this
/// node's memory directory does: adopted into our committed copy, where
/// the peers that need them fetch them.
void adopt_mirrored(const level_config& c, views& v, uint64_t s, const std::function<void(const std::string&)>& say) {
  if (c.memory_dir.empty() || v.mirrored[s].empty()) return;
  auto m = v.store.read_manifest(v.store.step_path(s));
  if (!m) return;
  const auto usable = matching(*m, v.mirrored, s);
  checkpoint_store memory(c.memory_dir, 0);
  for (auto& p : memory.prepared_parts()) {
    if (p.step != s || !usable.count(p.file) || on_a_disk(c, v, s, p.file)) continue;
    auto f = std::find_if(m->files.begin(), m->files.end(), [&](auto& e) { return e.name == p.file; });
    if (f == m->files.end() || f->xxh3 != p.xxh3) continue;  // another incarnation's copy of this step
    auto st = adopt_copy(v, s, memory.parts_path(s, p.tag) / p.file);
    say(st ? "step " + std::to_string(s) + ": took " + p.file +
                 " from this node's memory (mirrored from a replica; no disk holds it any more)"
           : "step " + std::to_string(s) + ": the copy of " + p.file + " in this node's memory: " + st.err().message);
    if (st) emit_event("adopted_mirror", {{"step", s}, {"file", p.file}});
  }
}

/// Our committed copy of `s`: fetched from a peer without its parts when
/// we lack it, then our own durable parts adopted (roll-forward).
status ensure_step(const level_config& c, views& v, uint64_t s, bool node_local,
                   const std::function<void(const std::string&)>& say) {
  if (!v.steps.count(s)) {
    status got = error{errc::failed, "no peer has step " + std::to_string(s)};
    for (auto& p : v.peers)
      if (p.steps.count(s)) {
        auto r = fetch_remote(p.ep, c.token, s, c.dir, c.io_timeout, /*with_parts=*/!node_local,
                              c.key ? &*c.key : nullptr);
        got = r ? status{} : status{r.err()};
        if (r) break;
      }
    if (!got) return got;
    v.steps.insert(s);
  }
  auto absent = v.store.absent_parts(s);
  if (!absent) return absent.err();
  for (auto& p : v.store.prepared_parts()) {
    if (p.step != s) continue;
    if (std::none_of(absent->begin(), absent->end(), [&](const checkpoint_file& f) { return f.name == p.file; }))
      continue;
    auto st = v.store.adopt_part(s, v.store.parts_path(s, p.tag) / p.file);
    say(st ? "step " + std::to_string(s) + ": took this node's " + p.file + " from its parts directory"
           : "step " + std::to_string(s) + ": " + st.err().message);
  }
  adopt_mirrored(c, v, s, say);
  return {};
}

/// Fetches `name` of step `s` from a peer that has it committed, waiting
/// for a peer that holds it only durable to roll it forward.
status fetch_needed(const level_config& c, views& v, uint64_t s, const std::string& name) {
  const auto until = std::chrono::steady_clock::now() + c.roll_forward_wait;
  std::string last = "no node holds it";
  for (;;) {
    bool pending = false;
    for (auto& p : v.peers) {
      if (peer_files(c, p, s).count(name)) {
        auto r = fetch_part(p.ep, c.token, s, name, c.dir, c.io_timeout);
        if (r) return {};
        last = r.err().message;
      }
      pending |= p.prepared[s].count(name) > 0 || p.mirrored[s].count(name) > 0;  // adopted there, if it matches
    }
    if (!pending || std::chrono::steady_clock::now() >= until)
      return error{errc::failed, "step " + std::to_string(s) + ": cannot fetch " + name + ": " + last};
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    for (auto& p : v.peers)
      if (auto l = list_remote(p.ep, c.token, c.io_timeout)) p.steps.insert(l->begin(), l->end());
  }
}

}  // namespace

result<leveled> level_node_local(const level_config& c, const std::function<void(const std::string&)>& say) {
  auto v = gather(c);
  const bool heard_every_peer = v.peers.size() == c.peers.size();
  auto chosen = choose(c, v);
  if (!chosen) return chosen.err();
  auto target = *chosen;
  if (!target) {
    bool any = !v.steps.empty();
    for (auto& p : v.peers) any |= !p.steps.empty();
    const std::string why = "no checkpoint has every part on some node (" + std::to_string(v.peers.size()) +
                            " of " + std::to_string(c.peers.size()) + " other nodes' checkpoint servers answered)";
    if (any) return error{errc::failed, why};
    if (!heard_every_peer) say(why + "; the restore uses what this node has");
    return leveled{0, heard_every_peer};
  }
  set_aside_above(v, *target, say);
  auto tm = manifest_of(c, v, *target);
  if (auto st = ensure_step(c, v, *target, tm && tm->node_local(), say); !st) return st.err();
  auto m = v.store.read_manifest(v.store.step_path(*target));
  auto index = read_json(v.store.step_path(*target) / index_file_name);
  if (!m || !index) return error{errc::failed, "step " + std::to_string(*target) + ": manifest or index unreadable"};
  auto absent = v.store.absent_parts(*target);
  if (!absent) return absent.err();
  const auto want = parts_needed_here(*m, *index, c.ranks, c.world);
  for (auto& f : *absent) {
    if (!want.count(f.name)) continue;
    if (auto st = fetch_needed(c, v, *target, f.name); !st) return st.err();
    say("step " + std::to_string(*target) + ": fetched " + f.name + " (held on node " + std::to_string(f.node) + ")");
  }
  return leveled{*target, heard_every_peer};
}

}  // namespace grace
