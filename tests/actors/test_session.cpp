// session's abort-handler discipline, end to end in local mode (one worker,
// the coordinator in-process): after a step error the ClusterError makes the
// peer watcher call the abort handler from an actor thread; run() must not
// return stop while that call is in flight, and never call it afterwards.
#include "runtime/grace.hpp"
#include "../temp_dir.hpp"

#include <catch2/catch.hpp>
#include <spdlog/spdlog.h>

#include <atomic>
#include <filesystem>
#include <random>
#include <stdexcept>

namespace fs = std::filesystem;
using namespace grace;

namespace {
struct temp_dir : grace::testing::temp_dir {
  temp_dir() : grace::testing::temp_dir("grace-session-test") {}
};
} // namespace

TEST_CASE("session: after a step error, run() returns stop with the abort handler disarmed", "[session]") {
  spdlog::set_level(spdlog::level::err);
  temp_dir dir;
  options o;
  o.checkpoint_dir = dir.path.string();
  o.cluster = cluster_config{};  // local mode
  session g(o);
  std::vector<float> w(8, 1.0f);
  g.register_tensor({"w", dtype::f32, {8}, w.data()});
  auto start = g.attach();
  REQUIRE(start.ok());

  std::atomic<int> entered{0}, returned{0};
  std::atomic<bool> torn_down{false}, called_after_stop{false};
  g.set_abort_handler([&] {
    entered++;
    if (torn_down) called_after_stop = true;  // would be a use after free in grace-train
    returned++;
  });
  REQUIRE(g.run([](uint64_t) {}) == step_result::ok);
  auto r = g.run([](uint64_t step) { throw std::runtime_error("injected at " + std::to_string(step)); });
  torn_down = true;  // the trainer destroys its communicator here
  CHECK(r == step_result::stop);
  CHECK(g.exit_code() == exit_code::fatal);
  CHECK(entered.load() == returned.load());  // no abort still running
  CHECK_FALSE(called_after_stop.load());
}
