// The checkpoint directory check for sharded state (runtime/checkpoint/shared_dir.hpp):
// ranks in threads, Gloo's in-process HashStore as the rendezvous store.
#include "runtime/checkpoint/shared_dir.hpp"

#include "../temp_dir.hpp"

#include <catch2/catch.hpp>
#include <gloo/rendezvous/hash_store.h>

#include <fstream>
#include <set>
#include <thread>

using namespace grace;
using grace::testing::temp_dir;
namespace fs = std::filesystem;

namespace {

/// Runs the check on `dirs.size()` ranks at once, rank r in dirs[r].
/// Ranks in `stopped` only write their probe and publish it, as a rank its
/// launcher stops before it reads the verdict would.
std::vector<status> run_ranks(const std::vector<fs::path>& dirs, uint32_t local_world, bool node_local = false,
                              const std::set<uint32_t>& stopped = {}) {
  gloo::rendezvous::HashStore kv;
  std::vector<status> out(dirs.size());
  std::vector<std::thread> ts;
  for (uint32_t r : stopped) {
    fs::create_directories(dirs[r]);
    std::ofstream(dirs[r] / (".grace-shared-dir-i3-r" + std::to_string(r))) << "nonce\n";
    const std::string nonce = "nonce";
    kv.set("job/3/shared-dir/" + std::to_string(r), std::vector<char>(nonce.begin(), nonce.end()));
  }
  for (uint32_t r = 0; r < dirs.size(); ++r)
    if (!stopped.count(r)) ts.emplace_back([&, r] {
      shared_dir_probe p;
      p.dir = dirs[r];
      p.rank = r;
      p.world = static_cast<uint32_t>(dirs.size());
      p.incarnation = 3;
      p.local_world = local_world;
      p.prefix = "job/3";
      p.timeout = std::chrono::milliseconds(5000);
      p.settle = std::chrono::milliseconds(200);
      p.node_local = node_local;
      out[r] = node_local ? check_node_local_directories(p, kv) : check_shared_directory(p, kv);
    });
  for (auto& t : ts) t.join();
  return out;
}

size_t entries(const fs::path& d) {
  size_t n = 0;
  for (auto it = fs::directory_iterator(d); it != fs::directory_iterator(); ++it) ++n;
  return n;
}

}  // namespace

TEST_CASE("shared directory: one directory for every rank passes and leaves nothing behind", "[shared_dir]") {
  temp_dir d;
  fs::create_directories(d.path / "ck");
  std::ofstream(d.path / "ck" / ".grace-shared-dir-i1-r1") << "stale\n";  // an older incarnation's leftover
  auto st = run_ranks({d.path / "ck", d.path / "ck", d.path / "ck", d.path / "ck"}, 2);
  for (auto& s : st) CHECK(s);
  CHECK(entries(d.path / "ck") == 0);
}

TEST_CASE("shared directory: node-local directories stop every rank with the same error", "[shared_dir]") {
  temp_dir d;
  auto n0 = d.path / "node0", n1 = d.path / "node1";
  auto st = run_ranks({n0, n0, n1, n1}, 2);
  for (auto& s : st) {
    REQUIRE_FALSE(s);
    CHECK(s.err().code == errc::invalid_input);
    CHECK(s.err().message == st[0].err().message);
  }
  const auto& m = st[0].err().message;
  CHECK(m.find("rank(s) 2, 3 (node 1)") != std::string::npos);
  CHECK(m.find(fs::absolute(n0).string()) != std::string::npos);
  CHECK(m.find("grace-launch --node-local-checkpoints") != std::string::npos);
  CHECK(entries(n0) == 0);  // rank 0 cleaned its directory
}

TEST_CASE("shared directory: a rank stopped after its probe leaves no probe: its node's first rank removes it",
          "[shared_dir]") {
  temp_dir d;
  auto n0 = d.path / "node0", n1 = d.path / "node1";
  auto st = run_ranks({n0, n0, n1, n1}, 2, false, {3});
  for (uint32_t r = 0; r < 3; ++r) {
    REQUIRE_FALSE(st[r]);
    CHECK(st[r].err().message.find("rank(s) 2, 3 (node 1)") != std::string::npos);
  }
  CHECK(entries(n0) == 0);
  CHECK(entries(n1) == 0);  // rank 3's probe too
}

TEST_CASE("node-local directories: a rank stopped after its probe leaves no probe behind", "[shared_dir]") {
  temp_dir d;
  auto n0 = d.path / "node0", n1 = d.path / "node1";
  auto st = run_ranks({n0, n0, n1, n1}, 2, true, {1});
  for (uint32_t r : {0u, 2u, 3u}) CHECK(st[r]);
  CHECK(entries(n0) == 0);  // rank 1's probe too
  CHECK(entries(n1) == 0);
}

TEST_CASE("shared directory: the verdict names ranks and nodes", "[shared_dir]") {
  CHECK(shared_dir_verdict({}, 2, "/ck").empty());
  auto v = shared_dir_verdict({{1, 5, 6}, {}, {}}, 4, "/ck");
  CHECK(v.find("rank(s) 1, 5, 6 (node 0, 1)") != std::string::npos);
  CHECK(shared_dir_verdict({{3}, {}, {}}, 0, "/ck").find("rank(s) 3 wrote") != std::string::npos);  // nodes unknown
  auto w = shared_dir_verdict({{3}, {{1, "cannot create /x: Permission denied"}, {2, "cannot write /y: Disk quota exceeded"}}, {}}, 2, "/ck");
  CHECK(w == "cannot write the checkpoint directory on every rank: rank 1: cannot create /x: Permission denied; "
             "rank 2: cannot write /y: Disk quota exceeded. every rank needs a writable checkpoint directory (its "
             "path, permissions and free space)");
}

TEST_CASE("shared directory: a rank that cannot write its directory stops every rank with one error", "[shared_dir]") {
  temp_dir d;
  fs::create_directories(d.path / "ck");
  std::ofstream(d.path / "file") << "not a directory\n";
  auto bad = d.path / "file" / "ck";  // fails with ENOTDIR, also as root (permissions would not)
  auto st = run_ranks({d.path / "ck", d.path / "ck", bad, d.path / "ck"}, 2);
  for (auto& s : st) {
    REQUIRE_FALSE(s);
    CHECK(s.err().code == errc::invalid_input);  // exit 2: no restart
    CHECK(s.err().message == st[0].err().message);
  }
  const auto& m = st[0].err().message;
  CHECK(m.find("rank 2: cannot create " + (bad / ".grace-shared-dir-i3-r2").string() + ": Not a directory") !=
        std::string::npos);
  CHECK(m.find("rank 1") == std::string::npos);
  CHECK(entries(d.path / "ck") == 0);
}

TEST_CASE("shared directory: a rank that never reports fails the check with a timeout, not a hang", "[shared_dir]") {
  temp_dir d;
  gloo::rendezvous::HashStore kv;
  shared_dir_probe p;
  p.dir = d.path;
  p.world = 2;
  p.prefix = "job/0";
  p.timeout = std::chrono::milliseconds(300);
  auto st = check_shared_directory(p, kv);  // rank 0; rank 1 never comes
  REQUIRE_FALSE(st);
  CHECK(st.err().code == errc::disconnected);  // a failed rendezvous: restart (exit 45)
  CHECK(st.err().message.find("every rank's probe") != std::string::npos);
}

TEST_CASE("node-local directories: a directory per node passes and leaves nothing behind", "[shared_dir]") {
  temp_dir d;
  auto n0 = d.path / "node0", n1 = d.path / "node1", n2 = d.path / "node2";
  fs::create_directories(n1);
  std::ofstream(n1 / ".grace-shared-dir-i1-r3") << "stale\n";  // an older incarnation's leftover
  auto st = run_ranks({n0, n0, n1, n1, n2, n2}, 2, true);
  for (auto& s : st) CHECK(s);
  for (auto& n : {n0, n1, n2}) CHECK(entries(n) == 0);
}

TEST_CASE("node-local directories: a directory shared across nodes, or not within one, stops every rank",
          "[shared_dir]") {
  temp_dir d;
  auto n0 = d.path / "node0", n1 = d.path / "node1", other = d.path / "other";
  SECTION("shared across nodes") {
    auto st = run_ranks({n0, n0, n0, n0}, 2, true);
    for (auto& s : st) {
      REQUIRE_FALSE(s);
      CHECK(s.err().code == errc::invalid_input);
      CHECK(s.err().message == st[0].err().message);
    }
    CHECK(st[0].err().message.find("also holds the files of rank(s) 2, 3 (node 1)") != std::string::npos);
    CHECK(st[0].err().message.find("drop --node-local-checkpoints") != std::string::npos);
    CHECK(entries(n0) == 0);
  }
  SECTION("not shared within node 1") {
    auto st = run_ranks({n0, n0, n1, other}, 2, true);
    for (auto& s : st) {
      REQUIRE_FALSE(s);
      CHECK(s.err().message == st[0].err().message);
    }
    CHECK(st[0].err().message.find("rank(s) 3 (node 1)") != std::string::npos);
    CHECK(st[0].err().message.find(fs::absolute(n1).string() + ", node 1's") != std::string::npos);
  }
}

TEST_CASE("node-local directories: the verdicts name the ranks and nodes", "[shared_dir]") {
  CHECK(node_local_verdict({}, 1, 2, "/ck").empty());
  CHECK(node_local_verdict({{}, {}, {4, 5}}, 0, 2, "/ck").find("rank(s) 4, 5 (node 2)") != std::string::npos);
  CHECK(node_local_verdict({{3}, {}, {}}, 1, 2, "/ck").find("do not appear in /ck, node 1's") != std::string::npos);
  CHECK(node_local_verdict({{}, {{1, "cannot create /x: Permission denied"}}, {}}, 0, 2, "/ck")
            .find("rank 1: cannot create /x: Permission denied") != std::string::npos);
}
