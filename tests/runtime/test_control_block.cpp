// Tests for runtime/worker/control_block.hpp: the abort handler's disarm semantics. The
// peer watcher calls control_block::abort() from an actor thread while the
// trainer tears the communicator down after run() returned stop; disarm()
// is what makes that safe. Threads are ordered with promises, never sleeps.
#include <catch2/catch.hpp>

#include "runtime/worker/control_block.hpp"

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <thread>

using namespace grace;

TEST_CASE("control_block: abort calls the armed handler, and nothing when unarmed", "[control]") {
  control_block ctl;
  CHECK_FALSE(ctl.armed());
  ctl.abort();  // no handler: a no-op
  int calls = 0;
  ctl.set_abort_handler([&] { ++calls; });
  CHECK(ctl.armed());
  ctl.abort();
  ctl.abort();
  CHECK(calls == 2);
}

TEST_CASE("control_block: after disarm the handler is never called", "[control]") {
  control_block ctl;
  std::atomic<int> calls{0};
  ctl.set_abort_handler([&] { ++calls; });
  ctl.disarm();
  CHECK_FALSE(ctl.armed());
  for (int i = 0; i < 3; ++i) ctl.abort();
  CHECK(calls == 0);
  ctl.disarm();  // idempotent
  CHECK(calls == 0);
}

TEST_CASE("control_block: an abort in progress delays disarm until it returned", "[control]") {
  control_block ctl;
  std::promise<void> entered, release;
  auto release_f = release.get_future().share();
  std::atomic<bool> handler_returned{false};
  ctl.set_abort_handler([&, release_f] {
    entered.set_value();
    release_f.wait();  // the handler is "in the middle of closing sockets"
    handler_returned = true;
  });
  std::thread watcher([&] { ctl.abort(); });  // the peer watcher's actor thread
  entered.get_future().wait();

  std::atomic<bool> disarmed{false};
  bool returned_before_disarm = false;
  std::thread trainer([&] {
    ctl.disarm();
    returned_before_disarm = handler_returned.load();
    disarmed = true;
  });
  // The handler is released only once the trainer waits inside disarm()
  // (the block counts it under its lock): a disarm that did not wait is
  // never seen there, and the guard (30 s, only against a hang) fails.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (ctl.disarms_waiting() == 0 && std::chrono::steady_clock::now() < give_up) std::this_thread::yield();
  const bool disarm_waited = ctl.disarms_waiting() == 1;
  CHECK_FALSE(disarmed.load());  // cannot finish while the handler runs
  release.set_value();
  trainer.join();
  watcher.join();
  CHECK(disarm_waited);
  CHECK(disarmed.load());
  CHECK(returned_before_disarm);  // disarm returned only after the handler did
  CHECK_FALSE(ctl.armed());
}

TEST_CASE("control_block: the handler's captures are released by disarm, and later aborts never touch them",
          "[control]") {
  // The shape of the real race: the handler holds the communicator; aborts
  // keep arriving from another thread while the trainer disarms and
  // destroys it.
  control_block ctl;
  struct comm {
    std::atomic<int> aborts{0};
  };
  auto c = std::make_shared<comm>();
  std::weak_ptr<comm> weak = c;
  ctl.set_abort_handler([c] { c->aborts++; });
  std::atomic<bool> stop{false};
  std::thread hammer([&] {
    while (!stop) ctl.abort();
  });
  while (c->aborts.load() < 10) std::this_thread::yield();
  ctl.disarm();
  const int at_disarm = c->aborts.load();
  c.reset();
  CHECK(weak.expired());  // the handler's copy is gone: nothing can reach it
  for (int i = 0; i < 1000; ++i) ctl.abort();
  stop = true;
  hammer.join();
  CHECK(at_disarm >= 10);
}

TEST_CASE("control_block: a handler armed after a loss was posted is called at once", "[control]") {
  // The trainer arms its collective's abort after attach(); a peer lost
  // before that must still reach the collective (its rendezvous).
  control_block ctl;
  int calls = 0;
  ctl.set_abort_handler([&] { ++calls; });
  CHECK(calls == 0);  // nothing known yet
  ctl.post_loss({loss_kind::peer_dead, 2, 7, "dead"});
  ctl.set_abort_handler([&] { ++calls; });
  CHECK(calls == 1);
  ctl.set_abort_handler(nullptr);  // clearing never calls anything
  CHECK(calls == 1);
}

TEST_CASE("control_block: a recovery in place forgets the loss it covers, not a later one", "[control]") {
  control_block cb;
  cb.post_loss({loss_kind::peer_dead, 2, 10, "killed"});
  checkpoint_order jit;
  jit.id = 4;
  jit.kind = checkpoint_kind::jit;
  cb.post_order(jit);
  cb.post_recover({4, 11, 0, "127.0.0.1:1", "p/r4/", {2}});
  SECTION("the recovery ends: the group is whole again") {
    cb.end_recovery(4);
    auto s = cb.take_snapshot();
    CHECK_FALSE(s.lost);
    CHECK_FALSE(s.order);
    CHECK_FALSE(s.recover);
    // A handler armed now (the new communicator) is not aborted at once.
    int aborts = 0;
    cb.set_abort_handler([&] { ++aborts; });
    CHECK(aborts == 0);
  }
  SECTION("another rank lost before the recovery ended stays known") {
    cb.post_loss({loss_kind::peer_dead, 1, 11, "killed too"});
    cb.end_recovery(4);
    auto s = cb.take_snapshot();
    REQUIRE(s.lost);
    CHECK(s.lost->rank == 1);
  }
  SECTION("an order of another round is left alone") {
    cb.end_recovery(3);
    CHECK(cb.take_snapshot().recover);
  }
}
