// The checkpoint writer actor on a real actor system (it is detached: its
// own thread): saves answered in order, each as a message with the outcome
// and durations; the buffers are the writer's until it answered; a failed
// save is an answer too, never a lost one.
#include "actors/checkpoint_writer.hpp"
#include "runtime/base/events.hpp"
#include "actors/actor_runtime.hpp"
#include "../temp_dir.hpp"

#include <catch2/catch.hpp>
#include <caf/actor_system.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <filesystem>
#include <fstream>
#include <vector>

using namespace grace;
namespace fs = std::filesystem;

namespace {

checkpoint_meta meta(uint64_t step) {
  checkpoint_meta m;
  m.step = step;
  m.kind = checkpoint_kind::periodic;
  return m;
}

struct tensors {
  std::vector<float> w = std::vector<float>(64);
  std::vector<tensor_ref> refs() { return {{"w", dtype::f32, {64}, w.data()}}; }
  void fill(float v) {
    for (size_t i = 0; i < w.size(); ++i) w[i] = v + float(i);
  }
};

}  // namespace

TEST_CASE("checkpoint writer: saves are answered in order with their outcome", "[writer]") {
  spdlog::set_level(spdlog::level::err);
  grace::testing::temp_dir td("grace-writer-test");
  checkpoint_store store(td.path / "ck", 10);
  tensors t;
  auto set_a = std::make_shared<snapshot_buffers>(t.refs());
  auto set_b = std::make_shared<snapshot_buffers>(t.refs());
  actor_runtime rt;
  checkpoint_writer_config cfg;
  cfg.store = &store;
  auto writer = spawn_checkpoint_writer(rt.sys(), cfg);
  caf::scoped_actor self{rt.sys()};
  std::vector<std::vector<float>> expected;
  for (uint64_t step = 1; step <= 4; ++step) {
    auto& set = step % 2 ? set_a : set_b;  // two sets: capture one while the other is written
    t.fill(float(step) * 100);
    REQUIRE(set->capture(t.refs()).ok());
    expected.push_back(t.w);
    set->set_busy(true);
    self->send(writer, save_atom::value, save_request{set, meta(step), 0, 1234});
    if (step % 2 == 0) {
      for (uint64_t want : {step - 1, step}) {
        self->receive([&](save_outcome& o) {
          CHECK(o.step == want);
          CHECK(o.ok);
          CHECK(o.snap_ns == 1234);
          CHECK(o.write_ns > 0);
          CHECK(o.stats.path == store.step_path(want));
        });
      }
      CHECK_FALSE(set_a->busy());  // released with the answer
      CHECK_FALSE(set_b->busy());
    }
  }
  for (uint64_t step = 1; step <= 4; ++step) {
    tensors back;
    REQUIRE(store.restore(step, back.refs()).ok());
    CHECK(back.w == expected[step - 1]);
  }
  caf::anon_send_exit(writer, caf::exit_reason::user_shutdown);
}

TEST_CASE("checkpoint writer: a failed save is answered with its error", "[writer]") {
  spdlog::set_level(spdlog::level::off);
  grace::testing::temp_dir td("grace-writer-test");
  fs::create_directories(td.path);
  std::ofstream(td.path / "file") << "x";  // the checkpoint directory is a file
  checkpoint_store store(td.path / "file", 10);
  tensors t;
  auto set = std::make_shared<snapshot_buffers>(t.refs());
  REQUIRE(set->capture(t.refs()).ok());
  actor_runtime rt;
  checkpoint_writer_config cfg;
  cfg.store = &store;
  auto writer = spawn_checkpoint_writer(rt.sys(), cfg);
  caf::scoped_actor self{rt.sys()};
  set->set_busy(true);
  self->send(writer, save_atom::value, save_request{set, meta(7), 0, 0});
  self->receive([&](save_outcome& o) {
    CHECK(o.step == 7);
    CHECK_FALSE(o.ok);
    CHECK_FALSE(o.error.empty());
  });
  CHECK_FALSE(set->busy());
  caf::anon_send_exit(writer, caf::exit_reason::user_shutdown);
}

TEST_CASE("checkpoint writer: an overlapped save waits for the capture it writes", "[writer]") {
  spdlog::set_level(spdlog::level::err);
  grace::testing::temp_dir td("grace-writer-test");
  checkpoint_store store(td.path / "ck", 10);
  tensors t;
  t.fill(1);
  auto set = std::make_shared<snapshot_buffers>(t.refs());
  REQUIRE(set->capture(t.refs()).ok());  // stale bytes the writer must not write
  actor_runtime rt;
  checkpoint_writer_config cfg;
  cfg.store = &store;
  auto writer = spawn_checkpoint_writer(rt.sys(), cfg);
  caf::scoped_actor self{rt.sys()};
  t.fill(500);
  set->begin_capture();
  set->set_busy(true);
  save_request req{set, meta(9), 0, 0};
  req.overlapped = true;
  // The capture "began" an hour ago: a save_ns counted from there covers
  // the hour, one counted from anything the writer saw itself does not.
  constexpr int64_t an_hour_ns = 3600'000'000'000;
  req.begin_ns = mono_ns() - an_hour_ns;
  self->send(writer, save_atom::value, req);
  // Copy only once the writer waits for the bytes (30 s: a hang guard).
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (set->waiters() == 0 && std::chrono::steady_clock::now() < give_up) std::this_thread::yield();
  const bool writer_waited = set->waiters() > 0;
  REQUIRE(set->copy_in(t.refs()).ok());
  REQUIRE(writer_waited);
  self->receive([&](save_outcome& o) {
    INFO("save_ns " << o.save_ns << ", snap_ns " << o.snap_ns << ", write_ns " << o.write_ns);
    CHECK(o.ok);
    CHECK(o.snap_ns == set->capture_ns());
    CHECK(o.save_ns >= an_hour_ns);  // counted from the capture's start
    CHECK(o.write_ns == o.save_ns - o.snap_ns);
  });
  CHECK_FALSE(set->busy());
  tensors back;
  REQUIRE(store.restore(9, back.refs()).ok());
  CHECK(back.w == t.w);
  caf::anon_send_exit(writer, caf::exit_reason::user_shutdown);
}
