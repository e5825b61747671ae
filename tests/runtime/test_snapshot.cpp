// Overlapped capture: a writer waits on the snapshot's progress and never
// reads a byte before the copy put it there; a capture that fails part way
// fails the save that was writing it, and nothing is committed.
// Whether the writer already waits when the copy starts is decided by an
// event (snapshot_buffers::waiters), never by a sleep.
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/checkpoint/device_copy.hpp"
#include "runtime/checkpoint/snapshot.hpp"
#include "../bounded_call.hpp"
#include "../temp_dir.hpp"

#include <catch2/catch.hpp>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <new>
#include <thread>
#include <vector>

using namespace grace;

namespace {

/// Two tensors of 12 MiB and 4 MiB: the copy publishes its progress in
/// pieces, so a writer can see part of it.
struct state {
  std::vector<uint8_t> a = std::vector<uint8_t>(12u << 20);
  std::vector<uint8_t> b = std::vector<uint8_t>(4u << 20);
  std::vector<tensor_ref> refs() {
    return {{"a", dtype::u8, {int64_t(a.size())}, a.data()}, {"b", dtype::u8, {int64_t(b.size())}, b.data()}};
  }
  void fill(uint8_t v) {
    std::memset(a.data(), v, a.size());
    std::memset(b.data(), v + 1, b.size());
  }
};

checkpoint_meta meta_for(uint64_t step) {
  checkpoint_meta m;
  m.step = step;
  m.world_size = 1;
  m.run_id = "snap";
  return m;
}

status failing_copy(void*, const void*, size_t, int) { return error{errc::failed, "device lost"}; }

/// Waits until a thread sleeps in `buf.wait_captured`. False only if none
/// does within 30 s: a hang guard, not a timing.
bool writer_waits(const snapshot_buffers& buf) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (buf.waiters() == 0) {
    if (std::chrono::steady_clock::now() > give_up) return false;
    std::this_thread::yield();
  }
  return true;
}

}  // namespace

TEST_CASE("snapshot: a waiting writer wakes only for bytes already copied", "[snapshot]") {
  state s;
  s.fill(7);
  snapshot_buffers buf(s.refs());
  const uint64_t total = buf.total_bytes();
  CHECK(buf.wait_captured(total));  // nothing in progress: nothing to wait for
  REQUIRE(buf.check(s.refs()).ok());
  buf.begin_capture();
  std::atomic<bool> copied{false};
  auto waiter = std::async(std::launch::async, [&] {
    bool ok = buf.wait_captured(total);
    return ok && copied.load();
  });
  REQUIRE(writer_waits(buf));  // asleep on bytes not copied yet (else it returned already)
  CHECK(waiter.wait_for(std::chrono::seconds(0)) == std::future_status::timeout);
  copied = true;
  REQUIRE(buf.copy_in(s.refs()).ok());
  CHECK(waiter.get());
  CHECK(buf.waiters() == 0);
  auto v = buf.view();
  CHECK(static_cast<const uint8_t*>(v[0].data)[(12u << 20) - 1] == 7);
  CHECK(static_cast<const uint8_t*>(v[1].data)[0] == 8);
  CHECK(buf.capture_ns() > 0);
  CHECK_FALSE(buf.capture_failed());
}

TEST_CASE("snapshot: a save overlapping its capture writes the captured bytes", "[snapshot][checkpoint]") {
  spdlog::set_level(spdlog::level::err);
  grace::testing::temp_dir td("grace-snap-test");
  checkpoint_store store(td.path / "ck", 10);
  state s;
  s.fill(1);
  snapshot_buffers buf(s.refs());
  REQUIRE(buf.capture(s.refs()).ok());  // the buffers hold the old state
  s.fill(42);
  buf.begin_capture();
  std::vector<uint64_t> asked;
  auto save = std::async(std::launch::async, [&] {
    return store.save(buf.view(), meta_for(3), [&](uint64_t n) {
      asked.push_back(n);
      return buf.wait_captured(n);
    });
  });
  const bool overlapped = writer_waits(buf);  // the writer waits for bytes the copy has yet to put there
  REQUIRE(buf.copy_in(s.refs()).ok());
  REQUIRE(save.get().ok());
  REQUIRE(overlapped);
  // Pieces in stream order, ending at the whole snapshot.
  REQUIRE(asked.size() >= 2);
  CHECK(std::is_sorted(asked.begin(), asked.end()));
  CHECK(asked.back() == buf.total_bytes());
  state back;
  REQUIRE(store.restore(3, back.refs()).ok());
  CHECK(back.a == s.a);
  CHECK(back.b == s.b);
}

TEST_CASE("snapshot: a capture that fails part way fails the overlapping save", "[snapshot][checkpoint]") {
  spdlog::set_level(spdlog::level::off);
  grace::testing::temp_dir td("grace-snap-test");
  checkpoint_store store(td.path / "ck", 10);
  state s;
  s.fill(5);
  snapshot_buffers first(s.refs());
  REQUIRE(first.capture(s.refs()).ok());
  REQUIRE(store.save(first.view(), meta_for(1)).ok());

  // The second tensor lives on a "device" whose copy fails.
  register_device_copy(failing_copy, failing_copy);
  auto refs = s.refs();
  refs[1].memory = memory_kind::device;
  snapshot_buffers buf(refs);
  REQUIRE(buf.check(refs).ok());
  buf.begin_capture();
  auto save = std::async(std::launch::async,
                         [&] { return store.save(buf.view(), meta_for(2), [&](uint64_t n) { return buf.wait_captured(n); }); });
  const bool overlapped = writer_waits(buf);  // the failure comes while the writer waits
  auto st = buf.copy_in(refs);
  register_device_copy(nullptr, nullptr);
  CHECK(st.err().message.find("device lost") != std::string::npos);
  CHECK(buf.capture_failed());
  auto r = save.get();
  REQUIRE(overlapped);
  REQUIRE_FALSE(r.ok());
  // Tensor a or b: the writer may wake for a's bytes only after the failure.
  INFO(r.err().message);
  CHECK(r.err().message.find("failed while it was being written") != std::string::npos);
  CHECK(store.newest_valid_step() == 1);
  CHECK_FALSE(std::filesystem::exists(store.step_path(2)));
  CHECK(store.verify(1).ok());
}

namespace {
status throwing_copy(void*, const void*, size_t, int) { throw std::bad_alloc(); }
}  // namespace

TEST_CASE("snapshot: a capture that throws still releases a waiting writer", "[snapshot]") {
  state s;
  register_device_copy(throwing_copy, throwing_copy);
  auto refs = s.refs();
  refs[0].memory = memory_kind::device;
  auto buf = std::make_shared<snapshot_buffers>(refs);
  buf->begin_capture();
  // A hang guard: if the throw left the waiter asleep, the test fails below
  // instead of hanging.
  grace::testing::bounded_call<bool> waiter([buf] { return buf->wait_captured(buf->total_bytes()); });
  const bool waiting = writer_waits(*buf);
  CHECK_THROWS_AS(buf->copy_in(refs), std::bad_alloc);
  register_device_copy(nullptr, nullptr);
  REQUIRE(waiting);
  INFO("the waiter still sleeps after the capture threw");
  auto woke = waiter.get();
  REQUIRE(woke.has_value());
  CHECK_FALSE(*woke);
  CHECK(buf->capture_failed());
}
