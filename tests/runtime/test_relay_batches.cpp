// What a node relay batches and when (runtime/coordination/relay_batches.hpp).
#include "runtime/coordination/relay_batches.hpp"

#include <catch2/catch.hpp>

using namespace grace;
using outcome = relay_batches::ack_outcome;

TEST_CASE("relay batches: the newest beat of each member, members of the incarnation only", "[relay]") {
  relay_batches b;
  b.set_incarnation(3);
  CHECK_FALSE(b.add_member(0, 2));  // a worker of an older group
  CHECK(b.add_member(0, 3));
  CHECK(b.add_member(1, 3));
  b.beat({0, 3, 10, 5, 0});
  b.beat({0, 3, 11, 5, 0});  // replaces the older one
  b.beat({1, 2, 99, 5, 0});  // wrong incarnation
  b.beat({7, 3, 11, 5, 0});  // not a member
  auto beats = b.take_beats();
  REQUIRE(beats.size() == 1);
  CHECK(beats[0].rank == 0);
  CHECK(beats[0].completed == 11);
  CHECK(b.take_beats().empty());  // a silent member is not in the next batch
  b.set_incarnation(4);
  CHECK(b.members().empty());
}

TEST_CASE("relay batches: acks complete when every member acknowledged, a new id flushes the old", "[relay]") {
  relay_batches b;
  b.set_incarnation(0);
  for (uint32_t r : {4u, 5u, 6u}) b.add_member(r, 0);
  CHECK(b.ack({9, 8, 1}) == outcome::ignored);
  CHECK(b.ack({9, 4, 10}) == outcome::pending);
  CHECK(b.ack({9, 5, 11}) == outcome::pending);
  CHECK(b.acks_pending());
  CHECK(b.ack({9, 6, 10}) == outcome::complete);
  auto acks = b.take_acks();
  REQUIRE(acks.size() == 3);
  CHECK(acks[1].rank == 5);
  CHECK(acks[1].earliest == 11);
  CHECK_FALSE(b.acks_pending());
  // A member gone no longer holds the batch back.
  b.ack({10, 4, 12});
  b.remove_member(6);
  CHECK(b.ack({10, 5, 12}) == outcome::complete);
  b.take_acks();
  // A newer proposal: what the older one gathered is handed back to send first.
  b.ack({11, 4, 12});
  std::vector<relay_ack> older;
  CHECK(b.ack({12, 5, 13}, &older) == outcome::pending);
  REQUIRE(older.size() == 1);
  CHECK(older[0].id == 11);
  auto now = b.take_acks();
  REQUIRE(now.size() == 1);
  CHECK(now[0].id == 12);
}
