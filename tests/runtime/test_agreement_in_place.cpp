// Recovery in place in the agreement (runtime/coordination/agreement.hpp,
// "Recovery in place"): the round's outcome, replacements, the held notice
// and every fallback to the just-in-time save and restart.
#include "runtime/coordination/agreement.hpp"

#include <catch2/catch.hpp>

#include <optional>

using namespace grace;
using ty = agreement_action::type;

namespace {

agreement in_place_group(uint32_t n, uint64_t restored = 0) {
  agreement a(n);
  a.set_in_place(true);
  for (uint32_t r = 0; r < n; ++r) a.on_join(r, restored);
  return a;
}

std::optional<agreement_action> action_of(const actions& acts, ty t) {
  for (auto& a : acts)
    if (a.what == t) return a;
  return std::nullopt;
}

/// Rank `lost` dies; the survivors acknowledge `steps[r]`. Returns the
/// recover action.
agreement_action lose_and_ack(agreement& a, uint32_t lost, const std::vector<uint64_t>& steps) {
  auto out = a.on_member_lost(lost, 0, loss_reason::dead, "killed");
  REQUIRE(action_of(out, ty::peer_lost));
  auto p = action_of(out, ty::propose);
  REQUIRE(p);
  REQUIRE(p->kind == checkpoint_kind::jit);
  actions last;
  for (uint32_t r = 0; r < steps.size(); ++r)
    if (r != lost) last = a.on_ack(r, p->id, steps[r]);
  auto rec = action_of(last, ty::recover);
  REQUIRE(rec);
  return *rec;
}

}  // namespace

TEST_CASE("in place: a loss agrees on the most advanced survivor's step, which donates its state", "[agreement]") {
  auto a = in_place_group(4, 10);
  auto rec = lose_and_ack(a, 2, {30, 31, 0, 31});
  CHECK(rec.step == 31);
  CHECK(rec.saver == 1);  // ties: the lowest rank
  CHECK_FALSE(rec.to_one);
  CHECK(rec.replaced == std::vector<uint32_t>{2});
  CHECK(a.phase() == agreement_phase::recovering);
  CHECK(a.awaits_replacement(2));
  // Nothing is written and nobody is told to exit.
  CHECK_FALSE(action_of(a.on_recovered(0, rec.id), ty::committed));
}

TEST_CASE("in place: the replacement gets the order alone, and the round ends when every member recovered",
          "[agreement]") {
  auto a = in_place_group(3);
  auto rec = lose_and_ack(a, 1, {5, 0, 5});
  CHECK(a.on_recovered(0, rec.id).empty());
  auto j = a.on_replacement_join(1);
  auto one = action_of(j, ty::recover);
  REQUIRE(one);
  CHECK(one->to_one);
  CHECK(one->rank == 1);
  CHECK(one->step == 5);
  CHECK(one->saver == 0);
  CHECK(a.live().count(1));
  CHECK(a.on_recovered(2, rec.id).empty());
  auto done = a.on_recovered(1, rec.id);
  auto res = action_of(done, ty::resumed);
  REQUIRE(res);
  CHECK(res->step == 5);
  CHECK(a.phase() == agreement_phase::idle);
  CHECK(a.all_joined());
  // A second loss later is again a recovery in place.
  auto again = lose_and_ack(a, 2, {6, 7, 0});
  CHECK(again.step == 7);
  CHECK(again.saver == 1);
}

TEST_CASE("in place: a replacement that joins before the survivors agreed is ordered with them", "[agreement]") {
  auto a = in_place_group(3);
  auto out = a.on_member_lost(2, 0, loss_reason::dead, "killed");
  auto p = action_of(out, ty::propose);
  REQUIRE(p);
  CHECK(a.on_replacement_join(2).empty());
  CHECK_FALSE(a.live().count(2));  // not asked to acknowledge: it holds no state
  a.on_ack(0, p->id, 7);
  auto last = a.on_ack(1, p->id, 8);
  auto rec = action_of(last, ty::recover);
  REQUIRE(rec);
  CHECK(rec->step == 8);
  CHECK(a.live().count(2));  // the broadcast reaches it
  CHECK_FALSE(a.awaits_replacement(2));
}

TEST_CASE("in place: a second loss before the agreement is replaced too", "[agreement]") {
  auto a = in_place_group(4);
  auto out = a.on_member_lost(3, 0, loss_reason::dead, "killed");
  auto p = action_of(out, ty::propose);
  REQUIRE(p);
  a.on_ack(0, p->id, 4);
  auto second = a.on_member_lost(1, 0, loss_reason::hung, "frozen");
  CHECK(action_of(second, ty::peer_lost));
  auto last = a.on_ack(2, p->id, 4);
  auto rec = action_of(last, ty::recover);
  REQUIRE(rec);
  CHECK(rec->replaced == std::vector<uint32_t>{1, 3});
  CHECK(a.awaits_replacement(1));
  CHECK(a.awaits_replacement(3));
}

TEST_CASE("in place: a loss during the recovery falls back to the just-in-time save and restart", "[agreement]") {
  auto a = in_place_group(3, 2);
  auto rec = lose_and_ack(a, 2, {9, 9, 0});
  auto out = a.on_member_lost(0, 9, loss_reason::dead, "killed");  // the donor
  auto p = action_of(out, ty::propose);
  REQUIRE(p);
  CHECK(p->kind == checkpoint_kind::jit);
  CHECK(p->id > rec.id);
  CHECK_FALSE(a.awaits_replacement(2));
  auto agreed = action_of(a.on_ack(1, p->id, 9), ty::agreed);
  REQUIRE(agreed);
  CHECK(agreed->exit_after);
  CHECK(agreed->saver == 1);
  CHECK(agreed->step == 9);
  // The replacement that comes too late is refused like any late joiner.
  CHECK(a.join_refusal(2, 0));
}

TEST_CASE("in place: a replacement that never comes ends in the just-in-time save", "[agreement]") {
  auto a = in_place_group(2);
  lose_and_ack(a, 1, {12, 0});
  auto out = a.on_replace_timeout();
  auto lost = action_of(out, ty::peer_lost);
  REQUIRE(lost);
  CHECK(lost->rank == 1);
  auto p = action_of(out, ty::propose);
  REQUIRE(p);
  auto agreed = action_of(a.on_ack(0, p->id, 12), ty::agreed);
  REQUIRE(agreed);
  CHECK(agreed->exit_after);
  CHECK(a.on_replace_timeout().empty());
}

TEST_CASE("in place: a member leaving with an error during the recovery falls back", "[agreement]") {
  auto a = in_place_group(3);
  lose_and_ack(a, 1, {3, 0, 3});
  auto p = action_of(a.on_leave(2, 42), ty::propose);
  REQUIRE(p);
  CHECK(p->kind == checkpoint_kind::jit);
  CHECK(a.phase() == agreement_phase::jit_collect);
}

TEST_CASE("in place: a notice during the recovery is held and claimed once the group resumed", "[agreement]") {
  auto a = in_place_group(2);
  auto rec = lose_and_ack(a, 1, {3, 0});
  auto reply = action_of(a.on_claim(0, 4, 0), ty::claim_reply);
  REQUIRE(reply);
  CHECK_FALSE(reply->won);
  a.on_replacement_join(1);
  a.on_recovered(0, rec.id);
  auto out = a.on_recovered(1, rec.id);
  CHECK(action_of(out, ty::resumed));
  CHECK_FALSE(action_of(out, ty::claim_reply));
  auto p = action_of(out, ty::propose);
  REQUIRE(p);
  CHECK(p->kind == checkpoint_kind::initial);
  CHECK(p->step == 4);
  CHECK(a.phase() == agreement_phase::proposing);
}

TEST_CASE("in place: not with sharded state, not while a round runs, not when switched off", "[agreement]") {
  SECTION("sharded") {
    auto a = in_place_group(3);
    a.set_parts(true);
    auto out = a.on_member_lost(1, 0, loss_reason::dead, "killed");
    auto p = action_of(out, ty::propose);
    REQUIRE(p);
    a.on_ack(0, p->id, 5);
    auto last = a.on_ack(2, p->id, 5);
    CHECK_FALSE(action_of(last, ty::recover));
    CHECK_FALSE(a.awaits_replacement(1));
  }
  SECTION("a preemption round in flight") {
    auto a = in_place_group(3);
    a.on_claim(0, 5, 0);
    auto out = a.on_member_lost(1, 0, loss_reason::dead, "killed");
    auto p = action_of(out, ty::propose);
    REQUIRE(p);
    a.on_ack(0, p->id, 5);
    CHECK(action_of(a.on_ack(2, p->id, 5), ty::agreed));
  }
  SECTION("off") {
    agreement a(2);
    a.on_join(0, 0);
    a.on_join(1, 0);
    auto p = action_of(a.on_member_lost(1, 0, loss_reason::dead, "killed"), ty::propose);
    REQUIRE(p);
    CHECK(action_of(a.on_ack(0, p->id, 5), ty::agreed));
  }
}

TEST_CASE("in place: reports of another round, or from a non-member, change nothing", "[agreement]") {
  auto a = in_place_group(3);
  auto rec = lose_and_ack(a, 2, {1, 1, 0});
  CHECK(a.on_recovered(0, rec.id + 1).empty());
  CHECK(a.on_recovered(2, rec.id).empty());  // not yet a member again
  CHECK(a.on_replacement_join(0).empty());   // nobody awaits rank 0
  CHECK(a.phase() == agreement_phase::recovering);
}

TEST_CASE("in place: the chief is not replaced: its loss saves and restarts", "[agreement]") {
  SECTION("alone") {
    auto a = in_place_group(3);
    auto p = action_of(a.on_member_lost(0, 0, loss_reason::dead, "killed"), ty::propose);
    REQUIRE(p);
    a.on_ack(1, p->id, 5);
    CHECK(action_of(a.on_ack(2, p->id, 5), ty::agreed));
    CHECK_FALSE(a.awaits_replacement(0));
  }
  SECTION("during a recovery's round, with a replacement joined early") {
    auto a = in_place_group(3);
    auto first = action_of(a.on_member_lost(2, 0, loss_reason::dead, "killed"), ty::propose);
    REQUIRE(first);
    a.on_replacement_join(2);
    auto out = a.on_member_lost(0, 0, loss_reason::dead, "killed");
    auto p = action_of(out, ty::propose);
    REQUIRE(p);
    CHECK(p->id > first->id);
    CHECK(a.live().count(2));  // the early replacement takes part and stops with the rest
    a.on_ack(1, p->id, 5);
    CHECK(action_of(a.on_ack(2, p->id, 0), ty::agreed));
  }
}
