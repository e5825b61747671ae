#include "runtime/launch/group_policy.hpp"
#include "runtime/base/exit_codes.hpp"

#include <csignal>

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

TEST_CASE("a worker's exit: finished, restart, fatal or usage", "[launcher]") {
  CHECK(classify_exit(0, 0, 42) == exit_effect::finished);
  CHECK(classify_exit(42, 0, 42) == exit_effect::restart);
  CHECK(classify_exit(43, 0, 43) == exit_effect::restart);  // a configured restart code
  CHECK(classify_exit(42, 0, 43) == exit_effect::fatal);    // ... and then 42 is not one
  CHECK(classify_exit(45, 0, 42) == exit_effect::restart);  // failed rendezvous
  CHECK(classify_exit(137, SIGKILL, 42) == exit_effect::restart);
  CHECK(classify_exit(3, 0, 42) == exit_effect::fatal);
  CHECK(classify_exit(1, 0, 42) == exit_effect::fatal);
  CHECK(classify_exit(2, 0, 42) == exit_effect::usage);
}

namespace {
group_end ended(std::initializer_list<std::pair<int, int>> exits) {  // (code, signal) per worker
  group_end g;
  int rank = 0;
  for (auto [code, sig] : exits)
    g.add(classify_exit(code, sig, 42), code == 45, "rank " + std::to_string(rank++) + " code " + std::to_string(code));
  return g;
}
}  // namespace

TEST_CASE("after a group: stop with the right code or restart", "[launcher]") {
  group_context c;
  c.nproc = 4;
  c.max_restarts = 3;
  c.rendezvous_hint = "check the addresses";
  rendezvous_streak streak(2);
  SECTION("all finished: 0") {
    auto d = decide_after_group(ended({{0, 0}, {0, 0}, {0, 0}, {0, 0}}), c, streak);
    CHECK_FALSE(d.restart);
    CHECK(d.code == 0);
    CHECK(d.reason == "all 4 workers finished");
  }
  SECTION("a fatal exit beats restarts; a usage error is 2") {
    auto d = decide_after_group(ended({{42, 0}, {3, 0}, {0, 0}}), c, streak);
    CHECK_FALSE(d.restart);
    CHECK(d.code == exit_code::fatal);
    CHECK(d.reason == "fatal error, not restarting: rank 1 code 3");
    CHECK(decide_after_group(ended({{2, 0}}), c, streak).code == exit_code::usage);
  }
  SECTION("restart codes and signals restart, naming the first cause") {
    auto d = decide_after_group(ended({{0, 0}, {137, SIGKILL}, {42, 0}}), c, streak);
    CHECK(d.restart);
    CHECK(d.reason == "rank 1 code 137");
  }
  SECTION("a forwarded notice stops with the restart code") {
    c.notice_forwarded = true;
    c.restart_code = 42;
    auto d = decide_after_group(ended({{42, 0}, {42, 0}}), c, streak);
    CHECK_FALSE(d.restart);
    CHECK(d.code == 42);
    auto fin = decide_after_group(ended({{0, 0}}), c, streak);
    CHECK(fin.code == 0);  // finished before the notice mattered
  }
  SECTION("failed rendezvous in a row stop with 44, a good group resets the count") {
    CHECK(decide_after_group(ended({{45, 0}, {0, 0}}), c, streak).restart);
    CHECK(decide_after_group(ended({{42, 0}}), c, streak).restart);  // connected: reset
    CHECK(decide_after_group(ended({{45, 0}}), c, streak).restart);
    auto d = decide_after_group(ended({{45, 0}}), c, streak);
    CHECK_FALSE(d.restart);
    CHECK(d.code == exit_code::no_progress);
    CHECK(d.reason.find("failed its rendezvous 2 times in a row") != std::string::npos);
    CHECK(d.reason.find("check the addresses") != std::string::npos);
  }
  SECTION("failed rendezvous after a failed leveling name the leveling, not the addresses") {
    c.level_problem = "no checkpoint has every part on some node";
    CHECK(decide_after_group(ended({{45, 0}}), c, streak).restart);
    auto d = decide_after_group(ended({{45, 0}, {42, 0}}), c, streak);
    CHECK(d.code == exit_code::no_progress);
    CHECK(d.reason.find("could not be brought level (no checkpoint has every part on some node)") !=
          std::string::npos);
    CHECK(d.reason.find("check the addresses") == std::string::npos);
  }
  SECTION("restarts exhausted: 44") {
    c.restarts = 3;
    auto d = decide_after_group(ended({{42, 0}}), c, streak);
    CHECK_FALSE(d.restart);
    CHECK(d.code == exit_code::no_progress);
    CHECK(d.reason == "restarts exhausted (3), last cause: rank 0 code 42");
  }
  SECTION("a growth of an elastic group: restart, not counted, even with no restarts left") {
    c.restarts = 3;
    c.membership_change = true;
    auto d = decide_after_group(ended({{42, 0}, {42, 0}}), c, streak);
    CHECK(d.restart);
    CHECK_FALSE(d.counted);
    CHECK(d.reason.find("membership change") != std::string::npos);
    SECTION("... but a forwarded notice still stops the launcher") {
      c.notice_forwarded = true;
      CHECK_FALSE(decide_after_group(ended({{42, 0}}), c, streak).restart);
    }
  }
  SECTION("a restart after a failure is counted") {
    auto d = decide_after_group(ended({{42, 0}}), c, streak);
    CHECK(d.restart);
    CHECK(d.counted);
  }
}

TEST_CASE("a leveling problem lasts until a leveling hears every peer", "[launcher]") {
  using grace::level_problem_after;
  const std::string none_whole = "no checkpoint has every part on some node";
  CHECK(level_problem_after("", true, none_whole, false) == none_whole);
  // The node that held the parts is gone: its peer learned nothing new.
  CHECK(level_problem_after(none_whole, false, "", false) == none_whole);
  // Every peer answered and the directory is level: solved.
  CHECK(level_problem_after(none_whole, false, "", true).empty());
  CHECK(level_problem_after("", false, "", false).empty());
  CHECK(level_problem_after("old", true, "new", true) == "new");
}

TEST_CASE("coordination service gone: stop with the restart code, naming the checkpoint", "[launcher]") {
  auto d = grace::coordinator_gone("h0:29500", 30500, 150, 42);
  CHECK_FALSE(d.restart);
  CHECK(d.code == 42);
  CHECK(d.reason.find("h0:29500") != std::string::npos);
  CHECK(d.reason.find("unreachable for 30 s") != std::string::npos);
  CHECK(d.reason.find("step 150") != std::string::npos);
  auto none = grace::coordinator_gone("h0:29500", 1000, 0, 7);
  CHECK(none.code == 7);
  CHECK(none.reason.find("no committed checkpoint") != std::string::npos);
  auto sig = grace::coordinator_gone("h0:29500", 1000, 3, 42, "SIGTERM");
  CHECK(sig.code == 42);
  CHECK(sig.reason.find("received SIGTERM") != std::string::npos);
  CHECK(sig.reason.find("step 3") != std::string::npos);
  auto unlevel = grace::coordinator_gone("h0:29500", 1000, 0, 42, "", "no checkpoint has every part on some node");
  CHECK(unlevel.code == 42);
  CHECK(unlevel.reason.find("could not be brought level with the other nodes' (no checkpoint has every part") !=
        std::string::npos);
  CHECK(unlevel.reason.find("no committed checkpoint") == std::string::npos);
}

TEST_CASE("recovery in place: only a lost process of a group still training is replaced", "[launcher]") {
  replace_conditions c;
  c.in_place = true;
  c.effect = exit_effect::restart;
  c.signal = 9;
  c.max_restarts = 2;
  CHECK(replace_in_place(c));
  auto off = c;
  off.in_place = false;
  CHECK_FALSE(replace_in_place(off));
  auto chose = c;  // exit 42: the worker stops for a restart on purpose
  chose.signal = 0;
  CHECK_FALSE(replace_in_place(chose));
  auto ending = c;
  ending.group_ending = true;
  CHECK_FALSE(replace_in_place(ending));
  auto spent = c;
  spent.restarts = 2;
  CHECK_FALSE(replace_in_place(spent));
  auto fatal = c;
  fatal.effect = exit_effect::fatal;
  fatal.signal = 0;
  CHECK_FALSE(replace_in_place(fatal));
}
