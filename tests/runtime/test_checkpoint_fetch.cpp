#include "runtime/checkpoint/checkpoint_fetch.hpp"

#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/checkpoint/snapshot.hpp"
#include "../temp_dir.hpp"

#include <catch2/catch.hpp>

#include <fstream>
#include <numeric>

using namespace grace;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

/// A checkpoint of one 1000-float tensor whose values depend on `step`.
void save_step(const fs::path& dir, uint64_t step) {
  std::vector<float> w(1000);
  std::iota(w.begin(), w.end(), static_cast<float>(step));
  checkpoint_store store(dir, 0);
  checkpoint_meta m;
  m.step = step;
  m.run_id = "fetch-test";
  REQUIRE(store.save({{"w", dtype::f32, {1000}, w.data(), w.size() * 4}}, m));
}

}  // namespace

TEST_CASE("checkpoint fetch: plan the newest step a peer has and we lack", "[fetch]") {
  std::vector<peer_checkpoints> peers = {{"a:1", {10, 20}}, {"b:2", {20, 30}}, {"c:3", {}}};
  auto p = plan_fetch(20, peers);
  REQUIRE(p);
  CHECK(p->step == 30);
  CHECK(p->endpoint == "b:2");
  CHECK_FALSE(plan_fetch(30, peers));
  CHECK_FALSE(plan_fetch(0, {}));
  CHECK(plan_fetch(0, peers)->step == 30);
}

TEST_CASE("checkpoint fetch: a peer's newest checkpoint is copied, verified and committed", "[fetch]") {
  grace::testing::temp_dir peer("grace-fetch-peer"), local("grace-fetch-local");
  save_step(peer.path, 10);
  save_step(peer.path, 20);
  auto server = checkpoint_server::start(peer.path, "127.0.0.1", "tok");
  REQUIRE(server);
  auto ep = (*server)->endpoint();

  auto steps = list_remote(ep, "tok", 2000ms);
  REQUIRE(steps);
  CHECK(*steps == std::vector<uint64_t>{10, 20});

  auto bytes = fetch_remote(ep, "tok", 20, local.path, 2000ms);
  REQUIRE(bytes);
  CHECK(*bytes > 4000);
  checkpoint_store store(local.path);
  CHECK(store.verify(20));
  CHECK(*fetch_remote(ep, "tok", 20, local.path, 2000ms) == 0);  // already there and valid
  for (auto& c : store.list()) CHECK_FALSE(c.temporary);         // no temporary left

  auto wrong = list_remote(ep, "other-job", 2000ms);
  REQUIRE_FALSE(wrong);
  CHECK(wrong.err().message.find("wrong job token") != std::string::npos);
  auto missing = fetch_remote(ep, "tok", 99, local.path, 2000ms);
  REQUIRE_FALSE(missing);
  CHECK(missing.err().message.find("no checkpoint step 99") != std::string::npos);
}

TEST_CASE("checkpoint fetch: a damaged copy on the peer is never committed", "[fetch]") {
  grace::testing::temp_dir peer("grace-fetch-peer"), local("grace-fetch-local");
  save_step(peer.path, 7);
  checkpoint_store pstore(peer.path);
  for (auto& e : fs::directory_iterator(pstore.step_path(7)))
    if (e.path().extension() == ".safetensors") {
      std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(static_cast<std::streamoff>(e.file_size() - 8));
      f.put('\x7f');
    }
  auto server = checkpoint_server::start(peer.path, "127.0.0.1", "tok");
  REQUIRE(server);
  auto r = fetch_remote((*server)->endpoint(), "tok", 7, local.path, 2000ms);
  REQUIRE_FALSE(r);
  CHECK(r.err().message.find("fetching step 7") != std::string::npos);
  CHECK_FALSE(fs::exists(checkpoint_store(local.path).step_path(7)));
  CHECK(checkpoint_store(local.path).list().empty());  // the temporary is gone too
}

TEST_CASE("checkpoint fetch: an unreachable peer is an error within the timeout", "[fetch]") {
  // A listening socket that never accepts would also do; a closed port
  // answers at once with a refusal.
  auto r = list_remote("127.0.0.1:1", "tok", 500ms);
  REQUIRE_FALSE(r);
  CHECK(r.err().code == errc::disconnected);
  CHECK_FALSE(list_remote("not-an-endpoint", "tok", 500ms));
}

namespace {

/// World 2, a node each: rank r writes its rows of `m` [4, 2] (rank 0 also
/// the replicated `w`) into `dirs[r]`. `commit_on`: the nodes that commit.
void save_node_local(const std::vector<fs::path>& dirs, uint64_t step, std::vector<int> commit_on = {0, 1}) {
  std::vector<std::string> descs;
  std::vector<float> w(3, 7.f);
  for (uint32_t r = 0; r < 2; ++r) {
    std::vector<float> m(4);
    std::iota(m.begin(), m.end(), static_cast<float>(step * 100 + r * 4));
    tensor_ref mr{"m", dtype::f32, {2, 2}, m.data()};
    mr.global_shape = {4, 2};
    mr.offsets = {static_cast<int64_t>(2 * r), 0};
    std::vector<tensor_ref> refs{mr, {"w", dtype::f32, {3}, w.data()}};
    snapshot_buffers b(refs);
    REQUIRE(b.capture(refs));
    checkpoint_store store(dirs[r]);
    checkpoint_meta meta;
    meta.step = step;
    meta.world_size = 2;
    REQUIRE(store.save_part(b.view(), meta, "t", r, r == 0));
    descs.push_back(*store.part_description(step, "t", r));
  }
  checkpoint_meta meta;
  meta.step = step;
  meta.world_size = 2;
  for (int n : commit_on) REQUIRE(checkpoint_store(dirs[n]).commit_node_parts(meta, "t", descs, {0, 1}, n));
}

}  // namespace

TEST_CASE("checkpoint fetch: a node-local step without its parts, then each part from the node holding it",
          "[fetch][node-local]") {
  grace::testing::temp_dir d("grace-fetch-nl");
  const std::vector<fs::path> nodes{d.path / "node0", d.path / "node1"};
  save_node_local(nodes, 30);
  auto s0 = checkpoint_server::start(nodes[0], "127.0.0.1", "tok");
  auto s1 = checkpoint_server::start(nodes[1], "127.0.0.1", "tok");
  REQUIRE(s0);
  REQUIRE(s1);
  const auto fresh = d.path / "replacement";
  REQUIRE(fetch_remote((*s1)->endpoint(), "tok", 30, fresh, 2000ms, /*with_parts=*/false));
  checkpoint_store store(fresh);
  CHECK(store.verify(30));
  auto absent = store.absent_parts(30);
  REQUIRE(absent);
  REQUIRE(absent->size() == 2);
  CHECK(absent->at(0).node == 0);
  CHECK(absent->at(1).node == 1);
  // Node 1 does not hold rank 0's part: a clear error, the step untouched.
  auto wrong = fetch_part((*s1)->endpoint(), "tok", 30, "rank-00001-of-00002.safetensors", fresh, 2000ms);
  REQUIRE_FALSE(wrong);
  CHECK(wrong.err().message.find("rank-00001-of-00002.safetensors") != std::string::npos);
  CHECK(store.absent_parts(30)->size() == 2);
  REQUIRE(fetch_part((*s0)->endpoint(), "tok", 30, "rank-00001-of-00002.safetensors", fresh, 2000ms));
  REQUIRE(fetch_part((*s1)->endpoint(), "tok", 30, "rank-00002-of-00002.safetensors", fresh, 2000ms));
  CHECK(store.absent_parts(30)->empty());
  CHECK(store.verify(30));
  std::vector<float> m(8, -1.f), w(3, -1.f);
  tensor_ref whole{"m", dtype::f32, {4, 2}, m.data()};
  REQUIRE(store.restore_latest({whole, {"w", dtype::f32, {3}, w.data()}}));
  CHECK(m == std::vector<float>{3000, 3001, 3002, 3003, 3004, 3005, 3006, 3007});
  for (auto& c : store.list()) CHECK_FALSE(c.temporary);
  auto again = fetch_part((*s0)->endpoint(), "tok", 30, "rank-00001-of-00002.safetensors", fresh, 2000ms);
  REQUIRE_FALSE(again);  // nothing left to fetch
  CHECK(again.err().code == errc::invalid_input);
}

TEST_CASE("checkpoint fetch: a node that missed the commit adopts its durable parts under a peer's manifest",
          "[fetch][node-local]") {
  grace::testing::temp_dir d("grace-fetch-nl");
  const std::vector<fs::path> nodes{d.path / "node0", d.path / "node1"};
  save_node_local(nodes, 40, {0});  // node 1 wrote its part but never committed
  checkpoint_store node1(nodes[1]);
  CHECK(node1.newest_valid_step() == 0);
  const auto part = node1.parts_path(40, "t") / "rank-00002-of-00002.safetensors";
  REQUIRE(fs::exists(part));
  auto s0 = checkpoint_server::start(nodes[0], "127.0.0.1", "tok");
  REQUIRE(s0);
  REQUIRE(fetch_remote((*s0)->endpoint(), "tok", 40, nodes[1], 2000ms, /*with_parts=*/false));
  // A damaged copy is refused and left where it is.
  const auto bad = d.path / "rank-00002-of-00002.safetensors";
  fs::copy_file(part, bad);
  {
    std::fstream f(bad, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('\x55');
  }
  auto refused = node1.adopt_part(40, bad);
  REQUIRE_FALSE(refused);
  CHECK(refused.err().message.find("checksum mismatch") != std::string::npos);
  CHECK(fs::exists(bad));
  REQUIRE(node1.adopt_part(40, part));
  CHECK_FALSE(fs::exists(part));
  CHECK(node1.verify(40));
  auto absent = node1.absent_parts(40);
  REQUIRE(absent->size() == 1);
  CHECK(absent->at(0).name == "rank-00001-of-00002.safetensors");
  CHECK(absent->at(0).node == 0);
}
