#include "runtime/coordination/membership.hpp"

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

TEST_CASE("membership: the checker's own stall is not the members' silence", "[membership]") {
  membership_config c{1500 * ms, 0, 3.0};
  c.stall_after_ns = 750 * ms;
  c.check_interval_ns = 250 * ms;
  membership m(c);
  m.add(0, 0, 0);
  m.add(1, 0, 0);
  m.heartbeat(0, 200 * ms, 1, 1 * ms);
  m.heartbeat(1, 200 * ms, 1, 1 * ms);
  CHECK(m.check(250 * ms).empty());
  // Frozen from 250 ms to 3500 ms: nobody's heartbeats were read.
  CHECK(m.check(3500 * ms).empty());
  CHECK(m.last_stall_ns() == 3000 * ms);  // the gap less one check interval
  // After the thaw rank 0 is heard, rank 1 stays silent: dead once its
  // silence outside the stall passes dead-after (200 ms + 3000 ms + 1500 ms).
  m.heartbeat(0, 3600 * ms, 2, 1 * ms);
  CHECK(m.check(3750 * ms).empty());
  CHECK(m.last_stall_ns() == 0);
  CHECK(m.check(4000 * ms).empty());
  CHECK(m.check(4500 * ms).empty());
  m.heartbeat(0, 4600 * ms, 3, 1 * ms);
  auto v = m.check(4750 * ms);
  REQUIRE(v.size() == 1);
  CHECK(v[0].rank == 1);
  CHECK(v[0].what == verdict::dead);

  // Checks at their usual interval never count as a stall, however short
  // dead-after is: a silent member still dies.
  membership_config tight{400 * ms, 0, 3.0};
  tight.stall_after_ns = 750 * ms;
  tight.check_interval_ns = 250 * ms;
  membership t(tight);
  t.add(0, 0, 0);
  CHECK(t.check(250 * ms).empty());
  CHECK(t.check(500 * ms).size() == 1);

  // Without the setting (0) the same gap is silence.
  membership plain({1500 * ms, 0, 3.0});
  plain.add(0, 0, 0);
  CHECK(plain.check(250 * ms).empty());
  CHECK(plain.check(3500 * ms).size() == 1);
}
