#include "runtime/membership.hpp"

#include <catch2/catch.hpp>

using namespace grace;

constexpr int64_t ms = 1'000'000;

TEST_CASE("membership: silence means dead, reported once", "[membership]") {
  membership m({5000 * ms, 0, 3.0});
  m.add(0, 0, 0);
  m.add(1, 0, 0);
  m.heartbeat(0, 4000 * ms, 10, 1 * ms);
  m.heartbeat(1, 1000 * ms, 10, 1 * ms);
  CHECK(m.check(5500 * ms).size() == 0 + 0);  // rank 1 silent for 4.5 s: still alive
  auto v = m.check(6500 * ms);
  REQUIRE(v.size() == 1);
  CHECK(v[0].rank == 1);
  CHECK(v[0].what == verdict::dead);
  CHECK(v[0].completed == 10);
  CHECK(m.check(6600 * ms).empty());
}

TEST_CASE("membership: alive but not progressing means hung", "[membership]") {
  membership m({5000 * ms, 2000 * ms, 3.0});
  m.add(0, 0, 5);
  m.add(1, 0, 5);
  for (int64_t t = 100; t <= 2500; t += 100) {
    m.heartbeat(0, t * ms, 5 + t / 100, 1 * ms);
    m.heartbeat(1, t * ms, 5, 1 * ms);  // talks, never advances
  }
  auto v = m.check(2500 * ms);
  REQUIRE(v.size() == 1);
  CHECK(v[0].rank == 1);
  CHECK(v[0].what == verdict::hung);
}

TEST_CASE("membership: much slower steps mean slow, not dead", "[membership]") {
  membership m({5000 * ms, 0, 3.0});
  for (uint32_t r = 0; r < 3; ++r) m.add(r, 0, 0);
  m.heartbeat(0, 100 * ms, 1, 10 * ms);
  m.heartbeat(1, 100 * ms, 1, 11 * ms);
  m.heartbeat(2, 100 * ms, 1, 80 * ms);
  auto v = m.check(200 * ms);
  REQUIRE(v.size() == 1);
  CHECK(v[0].rank == 2);
  CHECK(v[0].what == verdict::slow);
  CHECK(m.check(300 * ms).empty());  // reported on the transition only
  CHECK(m.size() == 3);
}
