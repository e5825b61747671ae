#include "runtime/ckpt_fetch.hpp"

#include "runtime/checkpoint.hpp"
#include "runtime/snapshot.hpp"
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
