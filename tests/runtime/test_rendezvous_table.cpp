// The coordination service's keys and barriers (runtime/rendezvous_table):
// set-once keys, waiting gets, timeouts, barriers, a broken group, a reset.
#include "runtime/coordination/rendezvous_table.hpp"

#include <catch2/catch.hpp>

using namespace grace;
using gty = rendezvous_table::get_result::type;

namespace {
std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
}  // namespace

TEST_CASE("rendezvous_table: keys are set once and a get finds them", "[rendezvous]") {
  rendezvous_table t;
  CHECK(t.set("a", bytes("1")).ok);
  auto again = t.set("a", bytes("2"));
  CHECK_FALSE(again.ok);
  CHECK(again.error == "already exists: a");
  auto g = t.get("a", 1, true);
  CHECK(g.what == gty::found);
  CHECK(g.value == bytes("1"));
  auto miss = t.get("b", 2, false);
  CHECK(miss.what == gty::failed);
  CHECK(miss.error == "not found: b");
}

TEST_CASE("rendezvous_table: a waiting get is answered by the set, once", "[rendezvous]") {
  rendezvous_table t;
  CHECK(t.get("k", 7, true).what == gty::pending);
  CHECK(t.get("k", 8, true).what == gty::pending);
  CHECK(t.get("other", 9, true).what == gty::pending);
  CHECK(t.pending_gets() == 3);
  auto s = t.set("k", bytes("v"));
  REQUIRE(s.woken.size() == 2);
  CHECK(s.woken[0].waiter == 7);
  CHECK(s.woken[1].waiter == 8);
  CHECK(s.woken[0].ok);
  CHECK(s.woken[1].value == bytes("v"));
  CHECK(t.pending_gets() == 1);
  CHECK_FALSE(t.expire(7));  // already answered: no second reply
  auto e = t.expire(9);
  REQUIRE(e);
  CHECK_FALSE(e->ok);
  CHECK(e->error == "timeout waiting for key other");
  CHECK(t.pending_gets() == 0);
}

TEST_CASE("rendezvous_table: a barrier releases everyone when the last rank arrives", "[rendezvous]") {
  rendezvous_table t;
  CHECK(t.arrive("b", 0, 3, 10).pending);
  CHECK(t.arrive("b", 0, 3, 11).released.empty());  // the same rank twice counts once
  auto mismatch = t.arrive("b", 1, 4, 12);
  CHECK_FALSE(mismatch.pending);
  CHECK(mismatch.error.find("count mismatch") != std::string::npos);
  CHECK(t.arrive("b", 1, 3, 13).released.empty());
  auto last = t.arrive("b", 2, 3, 14);
  REQUIRE(last.released.size() == 4);  // 10, 11, 13 and the last arrival itself
  CHECK(last.released.back().waiter == 14);
  for (auto& r : last.released) CHECK(r.ok);
  CHECK(t.pending_barriers() == 0);
  CHECK_FALSE(t.arrive("zero", 0, 0, 15).pending);
}

TEST_CASE("rendezvous_table: a broken group fails every wait now and every later one", "[rendezvous]") {
  rendezvous_table t;
  t.set("have", bytes("x"));
  t.get("k", 1, true);
  t.arrive("b", 0, 2, 2);
  auto failed = t.break_group("rank 3 lost");
  REQUIRE(failed.size() == 2);
  for (auto& r : failed) {
    CHECK_FALSE(r.ok);
    CHECK(r.error.rfind("rank 3 lost", 0) == 0);
  }
  CHECK(t.broken());
  auto later = t.get("k2", 3, true);
  CHECK(later.what == gty::failed);
  CHECK(later.error == "rank 3 lost; key k2 will not come");
  CHECK(t.get("have", 4, true).what == gty::found);  // what is there can still be read
  auto b = t.arrive("b2", 1, 2, 5);
  CHECK_FALSE(b.pending);
  CHECK(b.error == "rank 3 lost; barrier b2 cannot complete");
}

TEST_CASE("rendezvous_table: a new incarnation starts empty and whole", "[rendezvous]") {
  rendezvous_table t;
  t.set("old/key", bytes("x"));
  t.get("old/other", 1, true);
  t.break_group("lost");
  auto replies = t.reset("the group restarted");
  CHECK(replies.empty());  // the broken group's waiters were answered already
  CHECK_FALSE(t.broken());
  CHECK(t.keys() == 0);
  t.get("new/k", 2, true);
  auto r = t.reset("the group restarted");
  REQUIRE(r.size() == 1);
  CHECK(r[0].error == "the group restarted (waiting for key new/k)");
}

TEST_CASE("rendezvous_table: what a member can make it hold is bounded, and a refusal changes nothing",
          "[rendezvous][limits]") {
  rendezvous_table::limits lim;
  lim.key_bytes = 8;
  lim.value_bytes = 16;
  lim.keys = 3;
  lim.total_bytes = 40;
  lim.pending_gets = 2;
  lim.barriers = 1;
  lim.barrier_count = 4;
  rendezvous_table t(lim);
  auto refused = [](const std::string& error, const std::string& what) {
    INFO(error);
    CHECK(error.find("limit: " + what) == 0);
  };
  refused(t.set("012345678", bytes("v")).error, "key too long");
  refused(t.set("k", std::vector<uint8_t>(17)).error, "value too large");
  CHECK(t.keys() == 0);
  CHECK(t.set("a", std::vector<uint8_t>(16)).ok);
  CHECK(t.set("b", std::vector<uint8_t>(16)).ok);
  refused(t.set("c", std::vector<uint8_t>(16)).error, "keys and values take too many bytes");  // 51 > 40
  CHECK(t.set("c", bytes("x")).ok);
  refused(t.set("d", bytes("x")).error, "too many keys");
  CHECK(t.keys() == 3);
  CHECK(t.get("c", 1, false).what == gty::found);  // what was stored is intact

  refused(t.get("012345678", 1, true).error, "key too long");
  CHECK(t.get("w1", 1, true).what == gty::pending);
  CHECK(t.get("w2", 2, true).what == gty::pending);
  auto third = t.get("w3", 3, true);
  CHECK(third.what == gty::failed);
  refused(third.error, "too many gets waiting");
  CHECK(t.pending_gets() == 2);

  refused(t.arrive("b1", 0, 5, 10).error, "barrier count");
  refused(t.arrive("012345678", 0, 2, 10).error, "barrier name too long");
  CHECK(t.arrive("b1", 0, 2, 10).pending);
  CHECK(t.arrive("b1", 1, 2, 11).released.size() == 2);  // an existing barrier still completes
  CHECK(t.arrive("b2", 0, 2, 12).pending);
  refused(t.arrive("b3", 0, 2, 13).error, "too many barriers waiting");
  CHECK(t.pending_barriers() == 1);

  t.reset("next incarnation");  // a new incarnation has the whole budget again
  CHECK(t.set("a", std::vector<uint8_t>(16)).ok);
  CHECK(t.set("b", std::vector<uint8_t>(16)).ok);
}

TEST_CASE("rendezvous_table: a group mended in place answers waits again and keeps its keys", "[rendezvous]") {
  rendezvous_table t;
  t.set("inc/gloo/0", bytes("a"));
  t.break_group("rank 1 lost");
  CHECK(t.get("inc/r5/gloo/1", 1, true).what == gty::failed);
  t.mend();
  CHECK_FALSE(t.broken());
  CHECK(t.get("inc/gloo/0", 2, true).what == gty::found);
  auto wait = t.get("inc/r5/gloo/1", 3, true);
  CHECK(wait.what == gty::pending);
  auto set = t.set("inc/r5/gloo/1", bytes("b"));
  REQUIRE(set.woken.size() == 1);
  CHECK(set.woken[0].ok);
}
