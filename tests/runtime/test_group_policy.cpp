#include "runtime/group_policy.hpp"

#include <catch2/catch.hpp>

using namespace grace;

TEST_CASE("rendezvous streak: stops after N failed groups in a row", "[launcher]") {
  rendezvous_streak s(3);
  CHECK_FALSE(s.group_ended(true));
  CHECK_FALSE(s.group_ended(true));
  CHECK_FALSE(s.group_ended(false));  // a group that connected resets it
  CHECK(s.count() == 0);
  CHECK_FALSE(s.group_ended(true));
  CHECK_FALSE(s.group_ended(true));
  CHECK(s.group_ended(true));
  CHECK(s.count() == 3);
  rendezvous_streak never(0);
  for (int i = 0; i < 10; ++i) CHECK_FALSE(never.group_ended(true));
}

TEST_CASE("incarnation of a group on node > 0", "[launcher]") {
  // First start: join the coordinator's current group (a replacement host
  // joins the group that is waiting for it).
  CHECK(next_incarnation(std::nullopt, 0, 0u) == 0);
  CHECK(next_incarnation(std::nullopt, 0, 5u) == 5);
  // A normal restart, whether node 0 advanced already or not.
  CHECK(next_incarnation(4u, 0, 4u) == 5);
  CHECK(next_incarnation(4u, 0, 5u) == 5);
  // Cut off while the others restarted twice: catch up.
  CHECK(next_incarnation(2u, 0, 7u) == 7);
  // Restarted alone (counted 9) without reaching a coordinator still at 7:
  // the next group (never back into a group it may have been refused from).
  CHECK(next_incarnation(9u, 0, 7u) == 8);
  // The coordinator cannot be asked: count.
  CHECK(next_incarnation(4u, 0, std::nullopt) == 5);
  CHECK(next_incarnation(std::nullopt, 3, std::nullopt) == 3);
}
