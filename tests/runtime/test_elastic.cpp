#include "runtime/coordination/elastic.hpp"

#include <catch2/catch.hpp>

using namespace grace;

namespace {
constexpr int64_t ms = 1'000'000;
using reply = group_planner::reply;

group_planner planner(uint32_t min, uint32_t max, int64_t wait_ms = 2000) {
  planner_config c;
  c.min_nodes = min;
  c.max_nodes = max;
  c.nproc = 2;
  c.wait_ns = wait_ms * ms;
  return group_planner(c);
}
}  // namespace

TEST_CASE("node range: N or MIN:MAX, and clear errors", "[elastic]") {
  auto one = parse_node_range("3");
  REQUIRE(one);
  CHECK(one->min == 3);
  CHECK(one->max == 3);
  CHECK_FALSE(one->elastic());
  auto r = parse_node_range("2:4");
  REQUIRE(r);
  CHECK(r->min == 2);
  CHECK(r->max == 4);
  CHECK(r->elastic());
  for (const char* bad : {"", ":", "2:", ":3", "0:2", "3:2", "a", "1:b", "-1:2", "2:5000", "1.5", "2:3:4"}) {
    auto b = parse_node_range(bad);
    REQUIRE_FALSE(b);
    CHECK(b.err().message.find("--nnodes") != std::string::npos);
  }
  CHECK(parse_node_range("3:2").err().message.find("MIN must not exceed MAX") != std::string::npos);
}

TEST_CASE("a group plan numbers ranks by slot", "[elastic]") {
  group_plan p;
  p.nproc = 2;
  p.nodes = {0, 2, 5};
  CHECK(p.world_size() == 6);
  CHECK(p.slot_of(2) == 1u);
  CHECK_FALSE(p.slot_of(1));
  CHECK(p.node_of_rank(0) == 0);
  CHECK(p.node_of_rank(3) == 2);
  CHECK(p.node_of_rank(5) == 5);
  CHECK_FALSE(p.node_of_rank(6));
  CHECK(p.describe() == "nodes 0, 2, 5 (6 workers)");
}

TEST_CASE("every node asked: the full group at once", "[elastic]") {
  auto g = planner(2, 3);
  g.enter(0, 0);
  CHECK(g.ask(1, "10.0.0.2", 0).what == reply::wait);
  CHECK_FALSE(g.decide(1 * ms));
  CHECK(g.ask(0, "10.0.0.1", 0).what == reply::wait);
  CHECK_FALSE(g.decide(2 * ms));  // two of three: rule c waits
  CHECK(g.ask(2, "10.0.0.3", 0).what == reply::wait);
  auto p = g.decide(3 * ms);
  REQUIRE(p);
  CHECK(p->nodes == std::vector<int32_t>{0, 1, 2});
  CHECK(p->hosts == std::vector<std::string>{"10.0.0.1", "10.0.0.2", "10.0.0.3"});
  CHECK(p->incarnation == 0);
  CHECK_FALSE(g.decide(4 * ms));  // once
  auto a = g.ask(1, "10.0.0.2", 0);
  CHECK(a.what == reply::plan);
  CHECK(a.plan.slot_of(1) == 1u);
}

TEST_CASE("a node that does not come back: the group shrinks after the wait", "[elastic]") {
  auto g = planner(2, 3, 2000);
  g.enter(0, 0);
  for (int32_t n : {0, 1, 2}) g.ask(n, "h" + std::to_string(n), 0);
  REQUIRE(g.decide(0));
  // Incarnation 0 ends (node 2 lost): the survivors ask for the next one
  // before the service entered it.
  CHECK(g.ask(1, "h1", 1).what == reply::wait);
  CHECK_FALSE(g.growth_due());  // a member of the group asking for the next is no newcomer
  g.enter(1, 100 * ms);
  CHECK(g.ask(0, "h0", 1).what == reply::wait);
  CHECK_FALSE(g.decide(1000 * ms));  // node 2 was in the previous group: waited for
  CHECK(g.progress() == "2 of 3 nodes ready (0, 1), at least 2 needed");
  auto p = g.decide(2100 * ms);
  REQUIRE(p);
  CHECK(p->nodes == std::vector<int32_t>{0, 1});
  CHECK(p->world_size() == 4);
  // The next restart of this smaller group waits for nobody (rule b).
  g.ask(0, "h0", 2);
  g.ask(1, "h1", 2);
  g.enter(2, 3000 * ms);
  auto q = g.decide(3000 * ms);
  REQUIRE(q);
  CHECK(q->nodes == std::vector<int32_t>{0, 1});
}

TEST_CASE("fewer than MIN: no plan however long", "[elastic]") {
  auto g = planner(2, 3, 1000);
  g.enter(4, 0);
  g.ask(0, "h0", 4);
  CHECK_FALSE(g.decide(60'000 * ms));
  g.ask(2, "h2", 0);  // a launcher that counted from its own start joins the open plan
  auto p = g.decide(60'001 * ms);
  REQUIRE(p);
  CHECK(p->incarnation == 4);
  CHECK(p->nodes == std::vector<int32_t>{0, 2});
}

TEST_CASE("a newcomer is excluded, growth is due, and the next group has it", "[elastic]") {
  auto g = planner(1, 3, 1000);
  g.enter(3, 0);
  g.ask(0, "h0", 3);
  g.ask(1, "h1", 3);
  REQUIRE(g.decide(1000 * ms));
  CHECK_FALSE(g.growth_due());
  auto a = g.ask(2, "h2", 0);
  CHECK(a.what == reply::excluded);
  CHECK(a.incarnation == 3);
  CHECK(g.growth_due());
  CHECK(g.ask(2, "h2", 4).what == reply::wait);  // it asks for the next one
  // The grown group forms at once: every node asked (node 2 was counted
  // when it was excluded).
  g.ask(0, "h0", 4);
  g.enter(4, 5000 * ms);
  CHECK_FALSE(g.growth_due());
  g.ask(1, "h1", 4);
  auto p = g.decide(5000 * ms);
  REQUIRE(p);
  CHECK(p->nodes == std::vector<int32_t>{0, 1, 2});
  CHECK(p->hosts[2] == "h2");
}

TEST_CASE("a full group never grows", "[elastic]") {
  auto g = planner(1, 2, 1000);
  g.enter(0, 0);
  g.ask(0, "h0", 0);
  g.ask(1, "h1", 0);
  REQUIRE(g.decide(0));
  CHECK(g.ask(1, "h1", 0).what == reply::plan);
  CHECK_FALSE(g.growth_due());
}

TEST_CASE("a launcher gone before the plan is not counted", "[elastic]") {
  auto g = planner(2, 3, 1000);
  g.enter(0, 0);
  g.ask(0, "h0", 0);
  g.ask(1, "h1", 0);
  g.forget(1);
  CHECK_FALSE(g.decide(5000 * ms));  // one left: fewer than MIN
  g.ask(1, "h1b", 0);                // its replacement
  auto p = g.decide(5000 * ms);
  REQUIRE(p);
  CHECK(p->hosts == std::vector<std::string>{"h0", "h1b"});
}

TEST_CASE("a successor service adopts its predecessor's plan", "[elastic]") {
  auto g = planner(1, 3, 1000);
  group_plan old;
  old.incarnation = 7;
  old.nproc = 2;
  old.nodes = {1, 2};
  old.hosts = {"h1", "h2"};
  g.adopt(old);
  CHECK(g.ask(2, "h2", 7).what == reply::plan);
  CHECK(g.ask(0, "h0", 0).what == reply::excluded);
  // Node 1 (the old leader's host) is lost: the next group waits for it,
  // then forms without it, with the newcomer.
  g.enter(8, 0);
  g.ask(2, "h2", 8);
  CHECK_FALSE(g.decide(500 * ms));
  auto p = g.decide(1000 * ms);
  REQUIRE(p);
  CHECK(p->nodes == std::vector<int32_t>{0, 2});
}
