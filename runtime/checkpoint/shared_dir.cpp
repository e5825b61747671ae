#include "runtime/checkpoint/shared_dir.hpp"

#include "runtime/net/job_token.hpp"
#include "runtime/base/posix_file.hpp"

#include <gloo/rendezvous/store.h>

#include <fcntl.h>
#include <unistd.h>

#include <fstream>
#include <optional>
#include <set>
#include <thread>

namespace grace {

namespace fs = std::filesystem;

namespace {

constexpr const char* probe_prefix = ".grace-shared-dir-i";
constexpr const char* verdict_ok = "ok";
constexpr const char* failed_mark = "!";  ///< a probe key holding why the probe could not be written

fs::path probe_file(const fs::path& dir, uint32_t incarnation, uint32_t rank) {
  return dir / (probe_prefix + std::to_string(incarnation) + "-r" + std::to_string(rank));
}

std::string key_of(const shared_dir_probe& p, const std::string& what) { return p.prefix + "/shared-dir/" + what; }

std::string read_text(const fs::path& f) {
  std::ifstream in(f, std::ios::binary);
  std::string s;
  std::getline(in, s);
  return s;
}

/// Store calls throw on a timeout or a broken group: a rendezvous that
/// failed (errc::disconnected: the group restarts, within the launcher's
/// limit on failed rendezvous in a row).
template <class F>
status guarded(const std::string& what, F&& f) {
  try {
    f();
    return {};
  } catch (const std::exception& e) {
    return error{errc::disconnected, "checkpoint directory check: " + what + ": " + e.what()};
  }
}

/// Writes `text` and a newline to `f` (created or truncated); empty on
/// success, else what failed. close() is checked: NFS reports some write
/// errors (a full quota) only there. A failed write leaves no file.
std::string write_text(const fs::path& f, const std::string& text) {
  int fd = ::open(f.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return "cannot create " + f.string() + ": " + errno_str(errno);
  const std::string line = text + "\n";
  std::string why;
  if (::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size()))
    why = "cannot write " + f.string() + ": " + errno_str(errno);
  if (::close(fd) != 0 && why.empty()) why = "cannot write " + f.string() + ": " + errno_str(errno);
  if (!why.empty()) {
    std::error_code ec;
    fs::remove(f, ec);
  }
  return why;
}

/// Ranks > 0: the probe file, then its nonce in the store. A rank that
/// cannot write its probe publishes why (prefixed with `failed_mark`)
/// instead of a nonce, so rank 0's verdict names it for every rank: the
/// directory is unusable for checkpoints, a configuration error, not a
/// reason to restart the group.
status write_probe(const shared_dir_probe& p, gloo::rendezvous::Store& kv) {
  auto nonce = random_token();
  if (!nonce) return nonce.err();
  std::error_code ec;
  fs::create_directories(p.dir, ec);
  const auto why = write_text(probe_file(p.dir, p.incarnation, p.rank), *nonce);
  const std::string value = why.empty() ? *nonce : failed_mark + why;
  return guarded("publishing this rank's probe",
                 [&] { kv.set(key_of(p, std::to_string(p.rank)), std::vector<char>(value.begin(), value.end())); });
}

/// Rank 0: which ranks' probe files its directory lacks (or holds with
/// another nonce) once `settle` has passed, and which ranks could not write
/// theirs.
result<probe_findings> check_probes(const shared_dir_probe& p, gloo::rendezvous::Store& kv) {
  std::vector<std::string> keys;
  for (uint32_t r = 1; r < p.world; ++r) keys.push_back(key_of(p, std::to_string(r)));
  // One deadline for all: the others wait for the verdict from when they
  // published, so rank 0 must not wait `timeout` per rank.
  if (auto st = guarded("waiting for every rank's probe", [&] { kv.wait(keys, p.timeout); }); !st) return st.err();
  probe_findings out;
  std::vector<std::pair<uint32_t, std::string>> expected;
  for (uint32_t r = 1; r < p.world; ++r) {
    std::string value;
    auto st = guarded("reading rank " + std::to_string(r) + "'s probe", [&] {
      auto v = kv.get(keys[r - 1]);
      value.assign(v.begin(), v.end());
    });
    if (!st) return st.err();
    if (value.rfind(failed_mark, 0) == 0)
      out.unwritable.emplace_back(r, value.substr(1));
    else
      expected.emplace_back(r, std::move(value));
  }
  const auto until = std::chrono::steady_clock::now() + p.settle;
  for (;;) {
    out.missing.clear();
    for (auto& [r, nonce] : expected)
      if (read_text(probe_file(p.dir, p.incarnation, r)) != nonce) out.missing.push_back(r);
    if (out.missing.empty() || std::chrono::steady_clock::now() >= until) return out;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

/// The probe files in `dir`: of every incarnation (a leftover of an older
/// one included), or of `incarnation` only.
void remove_probes(const fs::path& dir, std::optional<uint32_t> incarnation = std::nullopt) {
  const std::string prefix = probe_prefix + (incarnation ? std::to_string(*incarnation) + "-r" : std::string());
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec))
    if (it->path().filename().string().rfind(prefix, 0) == 0) {
      std::error_code e2;
      fs::remove(it->path(), e2);
    }
}

}  // namespace

std::string shared_dir_verdict(const probe_findings& f, uint32_t local_world, const fs::path& dir0) {
  if (!f.unwritable.empty()) {
    std::string out = "cannot write the checkpoint directory on every rank:";
    for (auto& [r, why] : f.unwritable) out += " rank " + std::to_string(r) + ": " + why + ";";
    out.back() = '.';
    return out + " every rank needs a writable checkpoint directory (its path, permissions and free space)";
  }
  if (f.missing.empty()) return "";
  std::string ranks, nodes;
  std::set<uint32_t> node_set;
  for (auto r : f.missing) {
    ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    if (local_world > 0) node_set.insert(r / local_world);
  }
  for (auto n : node_set) nodes += (nodes.empty() ? "" : ", ") + std::to_string(n);
  return "sharded state needs one checkpoint directory shared by every rank (each rank writes its part there and "
         "rank 0 commits them all), but the files that rank(s) " +
         ranks + (nodes.empty() ? "" : " (node " + nodes + ")") +
         " wrote into their checkpoint directory do not appear in rank 0's, " + dir0.string() +
         ": give every node the same shared directory (NFS or a parallel file system), or, if each node's is its "
         "own disk, say so with grace-launch --node-local-checkpoints (every node then commits its own parts)";
}

std::string node_local_verdict(const probe_findings& f, uint32_t node, uint32_t local_world, const fs::path& dir) {
  if (!f.unwritable.empty()) return shared_dir_verdict({{}, f.unwritable, {}}, local_world, dir);
  auto list = [&](const std::vector<uint32_t>& ranks) {
    std::string rs, ns;
    std::set<uint32_t> nodes;
    for (auto r : ranks) rs += (rs.empty() ? "" : ", ") + std::to_string(r), nodes.insert(r / local_world);
    for (auto n : nodes) ns += (ns.empty() ? "" : ", ") + std::to_string(n);
    return "rank(s) " + rs + " (node " + ns + ")";
  };
  if (!f.missing.empty())
    return "node-local checkpoint directories: the files that " + list(f.missing) +
           " wrote into their checkpoint directory do not appear in " + dir.string() + ", node " +
           std::to_string(node) + "'s: every rank of a node needs the same directory (the node's own disk)";
  if (!f.foreign.empty())
    return "node-local checkpoint directories were declared (--node-local-checkpoints), but node " +
           std::to_string(node) + "'s directory " + dir.string() + " also holds the files of " + list(f.foreign) +
           ": it is shared across nodes, where the nodes' separate commits would collide; drop "
           "--node-local-checkpoints (a shared directory needs none)";
  return "";
}

namespace {

/// Node-local directories, the first rank of a node: which of its node's
/// probes its directory lacks, and which other nodes' it holds.
result<probe_findings> node_findings(const shared_dir_probe& p, gloo::rendezvous::Store& kv) {
  std::vector<uint32_t> ranks;
  std::vector<std::string> keys;
  for (uint32_t r = 0; r < p.world; ++r)
    if (r != p.rank) ranks.push_back(r), keys.push_back(key_of(p, std::to_string(r)));
  if (auto st = guarded("waiting for every rank's probe", [&] { kv.wait(keys, p.timeout); }); !st) return st.err();
  probe_findings out;
  std::vector<std::pair<uint32_t, std::string>> mine, others;
  for (size_t i = 0; i < ranks.size(); ++i) {
    std::string value;
    auto st = guarded("reading rank " + std::to_string(ranks[i]) + "'s probe", [&] {
      auto v = kv.get(keys[i]);
      value.assign(v.begin(), v.end());
    });
    if (!st) return st.err();
    if (value.rfind(failed_mark, 0) == 0)
      out.unwritable.emplace_back(ranks[i], value.substr(1));
    else
      (ranks[i] / p.local_world == p.rank / p.local_world ? mine : others).emplace_back(ranks[i], std::move(value));
  }
  const auto until = std::chrono::steady_clock::now() + p.settle;
  for (;;) {
    out.missing.clear();
    for (auto& [r, nonce] : mine)
      if (read_text(probe_file(p.dir, p.incarnation, r)) != nonce) out.missing.push_back(r);
    if (out.missing.empty() || std::chrono::steady_clock::now() >= until) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  for (auto& [r, nonce] : others)
    if (read_text(probe_file(p.dir, p.incarnation, r)) == nonce) out.foreign.push_back(r);
  return out;
}

/// Waits for `key` and returns its value.
result<std::string> await_key(gloo::rendezvous::Store& kv, const std::string& key, std::chrono::milliseconds timeout,
                              const std::string& what) {
  std::string value;
  auto st = guarded(what, [&] {
    kv.wait({key}, timeout);
    auto v = kv.get(key);
    value.assign(v.begin(), v.end());
  });
  if (!st) return st.err();
  return value;
}

/// Node-local, rank 0: the first failing node's verdict, or ok.
result<std::string> overall_verdict(const shared_dir_probe& p, gloo::rendezvous::Store& kv) {
  const uint32_t nodes = (p.world + p.local_world - 1) / p.local_world;
  for (uint32_t n = 0; n < nodes; ++n) {
    auto v = await_key(kv, key_of(p, "node-" + std::to_string(n)), p.timeout + p.settle + std::chrono::seconds(5),
                       "waiting for node " + std::to_string(n) + "'s verdict");
    if (!v) return v.err();
    if (*v != verdict_ok) return v;
  }
  return std::string(verdict_ok);
}

}  // namespace

status check_node_local_directories(const shared_dir_probe& p, gloo::rendezvous::Store& kv) {
  if (p.world < 2 || p.local_world == 0) return {};
  if (auto st = write_probe(p, kv); !st) return st;
  auto publish = [&](const std::string& key, const std::string& v) {
    return guarded("publishing a verdict", [&] { kv.set(key_of(p, key), std::vector<char>(v.begin(), v.end())); });
  };
  const bool leader = p.rank % p.local_world == 0;
  if (leader) {
    auto found = node_findings(p, kv);
    if (!found) return found.err();
    const auto why = node_local_verdict(*found, p.rank / p.local_world, p.local_world, fs::absolute(p.dir));
    if (auto st = publish("node-" + std::to_string(p.rank / p.local_world), why.empty() ? verdict_ok : why); !st)
      return st;
  }
  if (p.rank == 0) {
    auto v = overall_verdict(p, kv);
    if (!v) return v.err();
    if (auto st = publish("verdict", *v); !st) return st;
  }
  auto verdict = await_key(kv, key_of(p, "verdict"), p.timeout + p.settle + std::chrono::seconds(10),
                           "waiting for rank 0's verdict");
  // Every probe was read once the verdict is out: the first rank here
  // removes its directory's (a failed check ends the group, and its
  // launcher may stop the others before they get here).
  remove_probes(p.dir, p.incarnation);
  if (leader) remove_probes(p.dir);  // older incarnations' leftovers
  if (!verdict) return verdict.err();
  if (*verdict != verdict_ok) return error{errc::invalid_input, *verdict};
  return {};
}

status check_shared_directory(const shared_dir_probe& p, gloo::rendezvous::Store& kv) {
  if (p.world < 2) return {};
  const auto verdict_key = key_of(p, "verdict");
  if (p.rank != 0) {
    if (auto st = write_probe(p, kv); !st) return st;
    std::string verdict;
    // Rank 0 waits up to `timeout` for every rank, then settles.
    auto st = guarded("waiting for rank 0's verdict", [&] {
      kv.wait({verdict_key}, p.timeout + p.settle + std::chrono::seconds(5));
      auto v = kv.get(verdict_key);
      verdict.assign(v.begin(), v.end());
    });
    // Rank 0 cannot, when it does not share this directory; the first rank
    // here removes every probe in it (the others may be stopped before).
    remove_probes(p.dir, p.incarnation);
    if (!st) return st;
    if (verdict != verdict_ok) return error{errc::invalid_input, verdict};
    return {};
  }
  auto found = check_probes(p, kv);
  if (!found) return found.err();
  remove_probes(p.dir);
  const auto why = shared_dir_verdict(*found, p.local_world, fs::absolute(p.dir));
  const std::string verdict = why.empty() ? verdict_ok : why;
  auto st = guarded("publishing the verdict",
                    [&] { kv.set(verdict_key, std::vector<char>(verdict.begin(), verdict.end())); });
  if (!st) return st;
  if (!why.empty()) return error{errc::invalid_input, why};
  return {};
}

}  // namespace grace
