// Node-local sharded checkpoints brought level between nodes before a group
// starts (runtime/checkpoint/node_local_sync.hpp): real checkpoint servers on loopback,
// one directory per node.
#include "runtime/checkpoint/node_local_sync.hpp"

#include "runtime/checkpoint/checkpoint_fetch.hpp"
#include "runtime/checkpoint/manifest.hpp"
#include "runtime/checkpoint/snapshot.hpp"
#include "runtime/net/bulk_channel.hpp"
#include "runtime/net/tcp.hpp"
#include "../temp_dir.hpp"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <atomic>
#include <numeric>
#include <optional>
#include <thread>

#include <unistd.h>

using namespace grace;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

constexpr uint32_t world = 4;  // two nodes of two ranks

/// Rank r's slice of `m` [8, 2] (rows 2r, 2r+1) and the replicated `w`.
struct rank_state_t {
  std::vector<float> m = std::vector<float>(4), w = std::vector<float>(3);
  std::vector<tensor_ref> refs(uint32_t r) {
    tensor_ref mr{"m", dtype::f32, {2, 2}, m.data()};
    mr.global_shape = {8, 2};
    mr.offsets = {static_cast<int64_t>(2 * r), 0};
    return {mr, {"w", dtype::f32, {3}, w.data()}};
  }
};

checkpoint_meta meta_of(uint64_t step) {
  checkpoint_meta m;
  m.step = step;
  m.world_size = world;
  return m;
}

/// Every rank writes its part of `step` into its node's directory; the
/// nodes in `commit_on` commit.
/// Rank r's part of `step` (its values derived from both) into `store`'s
/// parts directory of round "t<step>".
void write_part(checkpoint_store& store, uint64_t step, uint32_t r, bool with_replicated, bool with_state = false,
                uint64_t values_of = 0) {
  const uint64_t v = values_of ? values_of : step;  // the state saved (another one under this step's name)
  rank_state_t s;
  std::iota(s.m.begin(), s.m.end(), static_cast<float>(v * 100 + r * 4));
  std::fill(s.w.begin(), s.w.end(), static_cast<float>(v));
  auto refs = s.refs(r);
  snapshot_buffers b(refs);
  REQUIRE(b.capture(refs));
  REQUIRE(store.save_part(b.view(), meta_of(step), "t" + std::to_string(step), r, with_replicated, {}, with_state));
}

void save(const std::vector<fs::path>& nodes, uint64_t step, std::vector<int> commit_on = {0, 1}) {
  std::vector<std::string> descs;
  for (uint32_t r = 0; r < world; ++r) {
    checkpoint_store store(nodes[r / 2]);
    write_part(store, step, r, r == 0);
    descs.push_back(*store.part_description(step, "t" + std::to_string(step), r));
  }
  for (int n : commit_on)
    REQUIRE(checkpoint_store(nodes[n]).commit_node_parts(meta_of(step), "t" + std::to_string(step), descs,
                                                          {0, 0, 1, 1}, n));
}

/// Node 0's replica holders mirror node 1's parts (ranks 2 and 3) of
/// `step` into node 0's memory directory, as they would in memory.
void mirror(const fs::path& memory_dir, uint64_t step, uint64_t values_of = 0) {
  checkpoint_store memory(memory_dir, 0);
  memory.set_direct_io(false);
  for (uint32_t r = 2; r < world; ++r)
    write_part(memory, step, r, false, true, values_of);  // a replica holds what its source writes: no replicated tensor
}

level_config config(const fs::path& dir, std::vector<std::string> peers, uint32_t node) {
  level_config c;
  c.dir = dir;
  c.token = "tok";
  c.peers = std::move(peers);
  c.ranks = {2 * node, 2 * node + 1};
  c.world = world;
  c.io_timeout = 2000ms;
  c.roll_forward_wait = 1000ms;
  return c;
}

std::vector<std::string> said;
auto say = [](const std::string& l) { said.push_back(l); };

/// A checkpoint server's stand-in that passes every request on to the real
/// one, but answers the first `fail` requests "FILES <step>" with an error:
/// a peer whose server is busy or restarting when the leveling asks it.
class flaky_files_proxy {
public:
  flaky_files_proxy(std::string upstream, uint64_t step, int fail)
      : upstream_(std::move(upstream)), files_("FILES " + std::to_string(step)), fail_(fail) {
    bulk_config c;
    c.address = "127.0.0.1";
    c.token = "tok";
    c.io_timeout = 2000ms;
    auto s = bulk_server::start(c, [this](int fd, int) { pass_on(fd); });
    REQUIRE(s);
    server_ = std::move(*s);
  }
  std::string endpoint() const { return server_->endpoint(); }
  int refused() const { return refused_; }

private:
  void pass_on(int fd) {
    std::string line;
    char ch = 0;
    while (line.size() < 4096 && tcp::recv_all(fd, &ch, 1) && ch != '\n') line += ch;
    if (line == files_ && refused_ < fail_) {
      ++refused_;
      tcp::send_all(fd, "ERR busy\n");
      return;
    }
    auto up = bulk_connect(upstream_, bulk_kind::checkpoint, "tok", 2000ms);
    if (!up) return;
    if (tcp::send_all(up->fd, line + "\n"))
      if (auto answer = tcp::read_to_end(up->fd, 64 << 20)) tcp::send_all(fd, *answer);
  }
  std::string upstream_, files_;
  int fail_;
  std::atomic<int> refused_{0};
  std::unique_ptr<bulk_server> server_;  ///< last: stops first
};

}  // namespace

TEST_CASE("node-local level: the newest step every part of which some node holds", "[node-local]") {
  std::map<uint64_t, std::set<std::string>> needed{{10, {"a", "b"}}, {20, {"a", "b"}}, {30, {"a", "b"}}};
  CHECK(newest_restorable(needed, {{10, {"a", "b"}}, {20, {"a", "b", "x"}}, {30, {"a"}}}) == 20u);
  CHECK_FALSE(newest_restorable(needed, {{30, {"b"}}}));
  CHECK_FALSE(newest_restorable({}, {}));
}

TEST_CASE("node-local level: the parts a node's ranks read", "[node-local]") {
  checkpoint_manifest m;
  m.world_size = 4;
  for (uint32_t r = 0; r < 4; ++r) m.files.push_back({rank_file_name(r, 4, ".safetensors"), 1, "0", int32_t(r / 2)});
  m.files.push_back({index_file_name, 1, "0"});
  nlohmann::json index{{"weight_map", {{"w", "rank-00001-of-00004.safetensors"}}}};
  CHECK(parts_needed_here(m, index, {2, 3}, 4) == std::set<std::string>{"rank-00001-of-00004.safetensors",
                                                                       "rank-00003-of-00004.safetensors",
                                                                       "rank-00004-of-00004.safetensors"});
  CHECK(parts_needed_here(m, index, {0, 1}, 4) == std::set<std::string>{"rank-00001-of-00004.safetensors",
                                                                       "rank-00002-of-00004.safetensors"});
  CHECK(parts_needed_here(m, index, {0}, 2).size() == 4);  // another world size reslices from every part
}

TEST_CASE("node-local level: a replacement node takes the manifest and the parts its ranks read", "[node-local]") {
  grace::testing::temp_dir d("grace-level");
  const std::vector<fs::path> nodes{d.path / "node0", d.path / "node1"};
  save(nodes, 10);
  save(nodes, 20);
  auto s0 = checkpoint_server::start(nodes[0], "127.0.0.1", "tok");
  auto s1 = checkpoint_server::start(nodes[1], "127.0.0.1", "tok");
  REQUIRE(s0);
  REQUIRE(s1);
  const auto fresh = d.path / "replacement";
  auto got = level_node_local(config(fresh, {(*s0)->endpoint(), (*s1)->endpoint()}, 1), say);
  REQUIRE(got);
  CHECK(got->step == 20);
  checkpoint_store store(fresh);
  CHECK(store.newest_valid_step() == 20);
  auto absent = store.absent_parts(20);
  REQUIRE(absent);
  REQUIRE(absent->size() == 1);  // rank 1's part: its ranks do not read it
  CHECK(absent->at(0).name == "rank-00002-of-00004.safetensors");
  rank_state_t s;
  auto refs = s.refs(3);
  REQUIRE(store.restore_latest(refs));
  CHECK(s.m == std::vector<float>{2012, 2013, 2014, 2015});
  CHECK(s.w == std::vector<float>{20, 20, 20});
  // Level already: nothing more to do.
  REQUIRE(level_node_local(config(fresh, {(*s0)->endpoint(), (*s1)->endpoint()}, 1), say));
  CHECK(store.absent_parts(20)->size() == 1);
}

TEST_CASE("node-local level: a node that missed the commit rolls its durable parts forward", "[node-local]") {
  grace::testing::temp_dir d("grace-level");
  const std::vector<fs::path> nodes{d.path / "node0", d.path / "node1"};
  save(nodes, 10);
  save(nodes, 20, {0});  // node 1 was killed before its commit
  auto s0 = checkpoint_server::start(nodes[0], "127.0.0.1", "tok");
  REQUIRE(s0);
  checkpoint_store store(nodes[1]);
  CHECK(store.newest_valid_step() == 10);
  auto got = level_node_local(config(nodes[1], {(*s0)->endpoint()}, 1), say);
  REQUIRE(got);
  CHECK(got->step == 20);
  CHECK(store.newest_valid_step() == 20);
  CHECK(store.verify(20));
  CHECK(fs::exists(store.step_path(20) / "rank-00004-of-00004.safetensors"));
}

TEST_CASE("node-local level: a step a part of which is gone is set aside for the one before", "[node-local]") {
  grace::testing::temp_dir d("grace-level");
  const std::vector<fs::path> nodes{d.path / "node0", d.path / "node1"};
  save(nodes, 10);
  save(nodes, 20, {0});
  fs::remove_all(checkpoint_store(nodes[1]).parts_path(20, "t20"));  // node 1's parts of 20: lost
  auto s1 = checkpoint_server::start(nodes[1], "127.0.0.1", "tok");
  REQUIRE(s1);
  auto got = level_node_local(config(nodes[0], {(*s1)->endpoint()}, 0), say);
  REQUIRE(got);
  CHECK(got->step == 10);
  checkpoint_store store(nodes[0]);
  CHECK(store.newest_valid_step() == 10);
  bool aside = false;
  for (auto& c : store.list()) aside |= c.set_aside && c.step == 20;
  CHECK(aside);  // kept for inspection, never deleted
}

TEST_CASE("node-local level: a host lost with its disk is restored from the parts mirrored in a peer's memory",
          "[node-local]") {
  grace::testing::temp_dir d("grace-level");
  const std::vector<fs::path> nodes{d.path / "node0", d.path / "node1"};
  const auto memory = d.path / "node0-memory";
  save(nodes, 10);
  save(nodes, 20);
  mirror(memory, 20);
  fs::remove_all(nodes[1]);  // node 1 lost with its disk; no just-in-time save was made
  auto s0 = checkpoint_server::start(nodes[0], "127.0.0.1", "tok", 2000ms, memory);
  REQUIRE(s0);
  auto listed = list_mirrored_remote((*s0)->endpoint(), "tok", 2000ms);
  REQUIRE(listed);
  CHECK(listed->size() == 2);
  auto on0 = config(nodes[0], {}, 0);
  on0.memory_dir = memory;
  const auto fresh = d.path / "replacement";
  std::optional<result<leveled>> replacement;
  std::thread t([&] {  // its own log: `said` is the main thread's
    std::vector<std::string> lines;
    replacement = level_node_local(config(fresh, {(*s0)->endpoint()}, 1),
                                   [&](const std::string& l) { lines.push_back(l); });
  });
  auto got0 = level_node_local(on0, say);  // node 0 levels at the same time
  t.join();
  REQUIRE(got0);
  CHECK(got0->step == 20);
  for (auto part : {"rank-00003-of-00004.safetensors", "rank-00004-of-00004.safetensors"})
    CHECK(fs::exists(checkpoint_store(nodes[0]).step_path(20) / part));  // adopted from memory, verified
  REQUIRE(replacement);
  INFO((*replacement ? std::string() : replacement->err().message));
  REQUIRE(*replacement);
  CHECK((*replacement)->step == 20);
  checkpoint_store store(fresh);
  CHECK(store.newest_valid_step() == 20);
  CHECK(fs::exists(store.step_path(20) / "rank-00003-of-00004.safetensors"));
  CHECK(fs::exists(store.step_path(20) / "rank-00004-of-00004.safetensors"));
  rank_state_t s;
  auto refs = s.refs(3);
  REQUIRE(store.restore_latest(refs));
  CHECK(s.m == std::vector<float>{2012, 2013, 2014, 2015});
  CHECK(s.w == std::vector<float>{20, 20, 20});
}

TEST_CASE("node-local level: parts mirrored in memory are not copied to disk while a disk holds them",
          "[node-local]") {
  grace::testing::temp_dir d("grace-level");
  const std::vector<fs::path> nodes{d.path / "node0", d.path / "node1"};
  const auto memory = d.path / "node0-memory";
  save(nodes, 20);
  mirror(memory, 20);
  auto s1 = checkpoint_server::start(nodes[1], "127.0.0.1", "tok");
  REQUIRE(s1);
  auto c = config(nodes[0], {(*s1)->endpoint()}, 0);
  c.memory_dir = memory;
  auto got = level_node_local(c, say);
  REQUIRE(got);
  CHECK(got->step == 20);
  auto absent = checkpoint_store(nodes[0]).absent_parts(20);
  REQUIRE(absent);
  CHECK(absent->size() == 2);  // node 1's parts stay on node 1 only
}

TEST_CASE("node-local level: without the mirrored parts a host lost with its disk leaves nothing restorable",
          "[node-local]") {
  grace::testing::temp_dir d("grace-level");
  const std::vector<fs::path> nodes{d.path / "node0", d.path / "node1"};
  save(nodes, 10);
  save(nodes, 20);
  fs::remove_all(nodes[1]);
  auto got = level_node_local(config(nodes[0], {}, 0), say);
  REQUIRE_FALSE(got);
  CHECK(got.err().message.find("no checkpoint has every part on some node") != std::string::npos);
  CHECK(checkpoint_store(nodes[0]).newest_valid_step() == 20);  // nothing set aside: kept for a node that may come back
}

TEST_CASE("node-local level: a peer that does not list a step's files once is asked again", "[node-local]") {
  // Node 1's server fails node 0's first question about step 110's files
  // (busy, or restarting with its launcher). Taken as "node 1 holds none of
  // them", step 110 looked incomplete: node 0 chose 100 and set its whole
  // step 110 aside. Asked again, it says, and 110 is the step.
  grace::testing::temp_dir d("grace-level");
  const std::vector<fs::path> nodes{d.path / "node0", d.path / "node1"};
  save(nodes, 100);
  save(nodes, 110);
  auto s1 = checkpoint_server::start(nodes[1], "127.0.0.1", "tok");
  REQUIRE(s1);
  flaky_files_proxy busy((*s1)->endpoint(), 110, 1);
  auto got = level_node_local(config(nodes[0], {busy.endpoint()}, 0), say);
  REQUIRE(got);
  CHECK(busy.refused() == 1);
  CHECK(got->step == 110);
  CHECK(checkpoint_store(nodes[0]).newest_valid_step() == 110);
}

TEST_CASE("node-local level: a peer that never lists a step's files sets nothing aside", "[node-local]") {
  grace::testing::temp_dir d("grace-level");
  const std::vector<fs::path> nodes{d.path / "node0", d.path / "node1"};
  save(nodes, 100);
  save(nodes, 110);
  auto s1 = checkpoint_server::start(nodes[1], "127.0.0.1", "tok");
  REQUIRE(s1);
  flaky_files_proxy down((*s1)->endpoint(), 110, 1000);
  auto got = level_node_local(config(nodes[0], {down.endpoint()}, 0), say);
  REQUIRE_FALSE(got);
  CHECK(got.err().message.find("did not list its files of step 110") != std::string::npos);
  CHECK(checkpoint_store(nodes[0]).newest_valid_step() == 110);  // nothing set aside on a guess
}

TEST_CASE("node-local level: an empty node whose peer does not answer learns nothing", "[node-local]") {
  // A replacement host with an empty disk that finds the node holding the
  // parts gone: nothing to restore here, and the result says the peers
  // were not all heard (the launcher keeps what an earlier leveling found).
  grace::testing::temp_dir d("grace-level");
  auto got = level_node_local(config(d.path / "replacement", {"127.0.0.1:1"}, 1), say);
  REQUIRE(got);
  CHECK(got->step == 0);
  CHECK_FALSE(got->heard_every_peer);
  auto alone = level_node_local(config(d.path / "alone", {}, 0), say);
  REQUIRE(alone);
  CHECK(alone->heard_every_peer);
}

TEST_CASE("node-local level: a mirror of another state of the same step does not count", "[node-local]") {
  grace::testing::temp_dir d("grace-level");
  const std::vector<fs::path> nodes{d.path / "node0", d.path / "node1"};
  const auto memory = d.path / "node0-memory";
  save(nodes, 10);
  save(nodes, 20);
  mirror(memory, 10);
  mirror(memory, 20, 19);  // an earlier incarnation's step 20: other values, another checksum
  fs::remove_all(nodes[1]);
  auto s0 = checkpoint_server::start(nodes[0], "127.0.0.1", "tok", 2000ms, memory);
  REQUIRE(s0);
  auto on0 = config(nodes[0], {}, 0);
  on0.memory_dir = memory;
  auto got0 = level_node_local(on0, say);
  REQUIRE(got0);
  CHECK(got0->step == 10);  // 20 set aside: its parts 2 and 3 exist nowhere
  const auto fresh = d.path / "replacement";
  auto got = level_node_local(config(fresh, {(*s0)->endpoint()}, 1), say);
  REQUIRE(got);
  CHECK(got->step == 10);
  rank_state_t st;
  auto refs = st.refs(2);
  REQUIRE(checkpoint_store(fresh).restore_latest(refs));
  CHECK(st.m == std::vector<float>{1008, 1009, 1010, 1011});
}
