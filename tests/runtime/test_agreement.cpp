// The agreement state machine, exhaustively over event orders for a
// 3-member cluster: two notices, every member's acknowledgement, the save
// report and at most one death, in every interleaving; plus targeted cases.
#include "runtime/coordination/agreement.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <set>

using namespace grace;
using ty = agreement_action::type;

namespace {

agreement joined(uint32_t n) {
  agreement a(n);
  for (uint32_t r = 0; r < n; ++r) a.on_join(r, 0);
  return a;
}

// By value: the actions vector is usually a temporary.
std::optional<agreement_action> find(const actions& acts, ty t) {
  for (auto& a : acts)
    if (a.what == t) return a;
  return std::nullopt;
}

// ---- exhaustive exploration ------------------------------------------------

struct world {
  agreement machine{3};
  std::vector<uint64_t> started;  // step each member has started
  std::set<uint32_t> dead;
  std::vector<bool> claimed{false, false};
  std::map<uint64_t, agreement_action> proposals;  // id -> propose
  std::set<std::pair<uint32_t, uint64_t>> acked;   // (rank, id)
  std::optional<agreement_action> agreed;          // newest
  std::map<uint64_t, int> agreed_count;
  std::set<uint64_t> saved_ids;
  std::set<uint64_t> committed_ids;
  int wins = 0;
  bool death_done = false;
  std::map<std::pair<uint32_t, uint64_t>, uint64_t> ack_values;
};

struct explorer {
  uint32_t victim;  // who may die (3: nobody)
  size_t terminal_states = 0;
  size_t jit_saves = 0;
  size_t initial_saves = 0;

  void apply(world& w, const actions& acts) {
    for (auto& a : acts) {
      switch (a.what) {
        case ty::claim_reply:
          if (a.won) ++w.wins;
          break;
        case ty::propose: w.proposals[a.id] = a; break;
        case ty::agreed: {
          REQUIRE(w.proposals.count(a.id));
          ++w.agreed_count[a.id];
          REQUIRE(w.agreed_count[a.id] == 1);  // agreed once per id
          auto& p = w.proposals[a.id];
          REQUIRE(a.step >= p.step);
          // Every live member acknowledged; the agreed step is exactly the
          // largest acknowledgement (no member can stop earlier, none is
          // asked to go further), and never past a step anyone started + 1.
          uint64_t max_ack = 0, max_started = 0;
          for (uint32_t r = 0; r < 3; ++r) {
            max_started = std::max(max_started, w.started[r]);
            if (w.dead.count(r)) continue;
            auto it = w.ack_values.find({r, a.id});
            REQUIRE(it != w.ack_values.end());
            max_ack = std::max(max_ack, it->second);
          }
          REQUIRE(a.step == max_ack);
          REQUIRE(a.step <= max_started + 1);
          if (a.kind == checkpoint_kind::jit) {
            // Saver: the live member with the most completed steps, ties lowest rank.
            uint64_t best = 0;
            uint32_t who = 99;
            for (uint32_t r = 0; r < 3; ++r) {
              if (w.dead.count(r)) continue;
              auto v = w.ack_values.at({r, a.id});
              if (who == 99 || v > best) {
                best = v;
                who = r;
              }
            }
            REQUIRE(a.saver == who);
            REQUIRE(a.step == best);
          } else {
            REQUIRE(!w.dead.count(a.saver));
          }
          w.agreed = a;
          break;
        }
        case ty::committed:
          REQUIRE(w.saved_ids.count(a.id));
          w.committed_ids.insert(a.id);
          break;
        default: break;
      }
    }
  }

  void explore(world w) {
    REQUIRE(w.wins <= 1);
    bool any = false;
    auto branch = [&](const std::function<void(world&)>& f) {
      any = true;
      world next = w;
      f(next);
      explore(std::move(next));
    };
    // Two notices, on ranks 0 and 1.
    for (uint32_t c = 0; c < 2; ++c)
      if (!w.claimed[c] && !w.dead.count(c))
        branch([&](world& n) {
          n.claimed[c] = true;
          apply(n, n.machine.on_claim(c, n.started[c], 0));
        });
    // Acknowledgements of the newest proposal by live members.
    if (!w.proposals.empty()) {
      auto id = w.proposals.rbegin()->first;
      auto& p = w.proposals.rbegin()->second;
      for (uint32_t r = 0; r < 3; ++r) {
        if (w.dead.count(r) || w.acked.count({r, id})) continue;
        branch([&, r, id](world& n) {
          n.acked.insert({r, id});
          // jit: the completed step; otherwise max(lower bound, started).
          uint64_t v =
              p.kind == checkpoint_kind::jit ? n.started[r] - (r == 2 ? 1 : 0) : std::max(p.step, n.started[r]);
          n.ack_values[{r, id}] = v;
          apply(n, n.machine.on_ack(r, id, v));
        });
      }
    }
    // The saver reports.
    if (w.agreed && !w.saved_ids.count(w.agreed->id) && !w.dead.count(w.agreed->saver))
      branch([&](world& n) {
        n.saved_ids.insert(n.agreed->id);
        if (n.agreed->kind == checkpoint_kind::jit)
          ++jit_saves;
        else
          ++initial_saves;
        apply(n, n.machine.on_saved(n.agreed->saver, n.agreed->id, n.agreed->step, true, ""));
      });
    // One death, anywhere.
    if (victim < 3 && !w.death_done)
      branch([&](world& n) {
        n.death_done = true;
        n.dead.insert(victim);
        apply(n, n.machine.on_member_lost(victim, n.started[victim] - 1, loss_reason::dead, "dead: test"));
      });
    if (!any) {
      ++terminal_states;
      // Every run ends with a committed checkpoint and everyone stopping,
      // except a run where no notice came and nobody died.
      bool something = w.claimed[0] || w.claimed[1] || w.death_done;
      if (something) {
        REQUIRE(w.machine.phase() == agreement_phase::stopping);
        REQUIRE(!w.committed_ids.empty());
        REQUIRE(w.committed_ids.count(w.machine.current_id()));
      }
    }
  }
};

}  // namespace

TEST_CASE("agreement: every interleaving of two notices, acks, a save and one death", "[agreement]") {
  // Synchronous workers differ by at most one step: try every combination.
  for (uint32_t victim = 0; victim <= 3; ++victim) {
    for (int mask = 0; mask < 8; ++mask) {
      world w;
      w.machine = joined(3);
      w.started = {10 + uint64_t(mask & 1), 10 + uint64_t((mask >> 1) & 1), 10 + uint64_t((mask >> 2) & 1)};
      explorer e{victim};
      e.explore(w);
      CAPTURE(victim, mask, e.terminal_states);
      REQUIRE(e.terminal_states > 0);
      if (victim == 3)
        REQUIRE(e.jit_saves == 0);
      else
        REQUIRE(e.jit_saves > 0);
    }
  }
}

TEST_CASE("agreement: first claim wins, the second defers", "[agreement]") {
  auto a = joined(3);
  auto first = a.on_claim(1, 5, 0);
  REQUIRE(find(first, ty::claim_reply)->won);
  auto p = find(first, ty::propose);
  REQUIRE(p);
  REQUIRE(p->step == 5);
  auto second = a.on_claim(2, 6, 0);
  REQUIRE_FALSE(find(second, ty::claim_reply)->won);
  REQUIRE(find(second, ty::claim_reply)->holder == 1);
  REQUIRE_FALSE(find(second, ty::propose));
}

TEST_CASE("agreement: agreed step is the maximum acknowledgement", "[agreement]") {
  auto a = joined(3);
  auto id = find(a.on_claim(0, 5, 0), ty::propose)->id;
  REQUIRE(a.on_ack(0, id, 5).empty());
  REQUIRE(a.on_ack(2, id, 6).empty());
  auto acts = a.on_ack(1, id, 5);
  auto ag = find(acts, ty::agreed);
  REQUIRE(ag);
  REQUIRE(ag->step == 6);
  REQUIRE(ag->saver == 0);
  REQUIRE(ag->exit_after);
  REQUIRE(a.phase() == agreement_phase::saving);
  auto c = a.on_saved(0, id, 6, true, "");
  REQUIRE(find(c, ty::committed));
  REQUIRE(a.phase() == agreement_phase::stopping);
}

TEST_CASE("agreement: a late ack of an old agreement is ignored", "[agreement]") {
  auto a = joined(2);
  auto id = find(a.on_claim(0, 3, 0), ty::propose)->id;
  a.on_ack(0, id, 3);
  a.on_ack(1, id, 3);
  REQUIRE(a.on_ack(1, id, 3).empty());
  REQUIRE(a.on_ack(1, id + 7, 3).empty());
  REQUIRE(a.phase() == agreement_phase::saving);
}

TEST_CASE("agreement: a notice before everyone joined waits for the membership", "[agreement]") {
  agreement a(2);
  a.on_join(0, 0);
  auto acts = a.on_claim(0, 0, 0);
  REQUIRE(find(acts, ty::claim_reply)->won);
  REQUIRE_FALSE(find(acts, ty::propose));
  REQUIRE(a.phase() == agreement_phase::waiting);
  auto j = a.on_join(1, 0);
  REQUIRE(find(j, ty::propose));
}

TEST_CASE("agreement: a member dying mid-agreement turns into a just-in-time save", "[agreement]") {
  auto a = joined(3);
  auto id = find(a.on_claim(0, 9, 0), ty::propose)->id;
  a.on_ack(0, id, 9);
  auto lost = a.on_member_lost(1, 8, loss_reason::dead, "dead: test");
  REQUIRE(find(lost, ty::peer_lost));
  auto jit = find(lost, ty::propose);
  REQUIRE(jit);
  REQUIRE(jit->kind == checkpoint_kind::jit);
  REQUIRE(a.on_ack(0, jit->id, 8).empty());
  auto ag = find(a.on_ack(2, jit->id, 9), ty::agreed);
  REQUIRE(ag);
  REQUIRE(ag->saver == 2);  // most completed steps
  REQUIRE(ag->step == 9);
}

TEST_CASE("agreement: jit ties go to the lowest rank", "[agreement]") {
  auto a = joined(4);
  auto p = find(a.on_member_lost(0, 4, loss_reason::dead, "dead"), ty::propose);
  a.on_ack(3, p->id, 5);
  a.on_ack(1, p->id, 5);
  auto ag = find(a.on_ack(2, p->id, 4), ty::agreed);
  REQUIRE(ag->saver == 1);
  REQUIRE(ag->step == 5);
}

TEST_CASE("agreement: any death before the commit moves the save to the most advanced survivor", "[agreement]") {
  // The saver may not have reached the agreed step yet, and the agreed
  // step's collectives need every member: a non-saver's death during the
  // save starts a just-in-time round too (issue 13's SIGTERM + SIGKILL).
  auto a = joined(3);
  auto id = find(a.on_claim(2, 4, 0), ty::propose)->id;
  for (uint32_t r = 0; r < 3; ++r) a.on_ack(r, id, 4);
  REQUIRE(a.phase() == agreement_phase::saving);
  auto other = a.on_member_lost(1, 4, loss_reason::dead, "dead");
  auto jit = find(other, ty::propose);
  REQUIRE(jit);
  REQUIRE(jit->kind == checkpoint_kind::jit);
  // The old agreement's report is late now and changes nothing.
  REQUIRE(a.on_saved(0, id, 4, true, "").empty());
  a.on_ack(2, jit->id, 3);
  auto ag = find(a.on_ack(0, jit->id, 4), ty::agreed);
  REQUIRE(ag);
  REQUIRE(ag->saver == 0);
  REQUIRE(ag->step == 4);
  // The jit saver's own loss moves the save again; another's does not.
  REQUIRE_FALSE(find(a.on_member_lost(2, 3, loss_reason::dead, "dead"), ty::propose));
  auto again = find(a.on_member_lost(0, 4, loss_reason::dead, "dead"), ty::propose);
  REQUIRE_FALSE(again);  // nobody left: stopping
  REQUIRE(a.phase() == agreement_phase::stopping);
}

TEST_CASE("agreement: the saver dying during the save moves the save to a survivor", "[agreement]") {
  auto a = joined(3);
  auto id = find(a.on_claim(2, 4, 0), ty::propose)->id;
  for (uint32_t r = 0; r < 3; ++r) a.on_ack(r, id, 4);
  auto lost = a.on_member_lost(0, 4, loss_reason::dead, "dead");
  auto jit = find(lost, ty::propose);
  REQUIRE(jit);
  REQUIRE(jit->kind == checkpoint_kind::jit);
  a.on_ack(1, jit->id, 4);
  auto ag = find(a.on_ack(2, jit->id, 4), ty::agreed);
  REQUIRE(ag->saver == 1);
}

TEST_CASE("agreement: grace period keeps training, then a final save", "[agreement][grace]") {
  auto a = joined(2);
  const int64_t deadline = 1'000'000'000;
  auto id = find(a.on_claim(1, 3, deadline), ty::propose)->id;
  a.on_ack(0, id, 3);
  auto ag = find(a.on_ack(1, id, 4), ty::agreed);
  REQUIRE_FALSE(ag->exit_after);
  auto c = find(a.on_saved(0, id, 4, true, ""), ty::committed);
  REQUIRE_FALSE(c->exit_after);
  REQUIRE(a.phase() == agreement_phase::countdown);
  // A later notice with an earlier deadline shortens the countdown.
  auto upd = a.on_claim(0, 9, deadline / 2);
  REQUIRE_FALSE(find(upd, ty::claim_reply)->won);
  auto d = find(upd, ty::deadline_update);
  REQUIRE(d);
  REQUIRE(d->deadline_ns == deadline / 2);
  REQUIRE(d->rank == 0);
  // A later notice with a later deadline changes nothing.
  REQUIRE_FALSE(find(a.on_claim(1, 9, deadline * 2), ty::deadline_update));
  // Only the chief proposes the final save.
  REQUIRE(a.on_propose_final(1, 20).empty());
  auto fin = find(a.on_propose_final(0, 20), ty::propose);
  REQUIRE(fin->kind == checkpoint_kind::final);
  a.on_ack(0, fin->id, 20);
  auto fag = find(a.on_ack(1, fin->id, 21), ty::agreed);
  REQUIRE(fag->step == 21);
  REQUIRE(fag->exit_after);
  REQUIRE(find(a.on_saved(0, fin->id, 21, true, ""), ty::committed)->exit_after);
  REQUIRE(a.phase() == agreement_phase::stopping);
}

TEST_CASE("agreement: a death during the final agreement saves just in time", "[agreement][grace]") {
  auto a = joined(2);
  auto id = find(a.on_claim(0, 1, 100), ty::propose)->id;
  a.on_ack(0, id, 1);
  a.on_ack(1, id, 1);
  a.on_saved(0, id, 1, true, "");
  auto fin = find(a.on_propose_final(0, 7), ty::propose);
  a.on_ack(1, fin->id, 7);
  auto lost = a.on_member_lost(0, 6, loss_reason::dead, "dead");
  auto jit = find(lost, ty::propose);
  REQUIRE(jit->kind == checkpoint_kind::jit);
  auto ag = find(a.on_ack(1, jit->id, 7), ty::agreed);
  REQUIRE(ag->saver == 1);
  REQUIRE(ag->exit_after);
}

TEST_CASE("agreement: an error report fails the cluster once, naming its origin", "[agreement]") {
  auto a = joined(3);
  auto e = a.on_error(2, 17, "boom");
  auto ce = find(e, ty::cluster_error);
  REQUIRE(ce);
  REQUIRE(ce->rank == 2);
  REQUIRE(ce->step == 17);
  REQUIRE(ce->message == "boom");
  REQUIRE(a.phase() == agreement_phase::failed);
  REQUIRE(a.on_error(1, 17, "consequence").empty());
  REQUIRE(find(a.on_member_lost(1, 17, loss_reason::dead, "dead"), ty::peer_lost));
  REQUIRE(a.phase() == agreement_phase::failed);
}

TEST_CASE("agreement: a failed save is a cluster error", "[agreement]") {
  auto a = joined(1);
  auto id = find(a.on_claim(0, 2, 0), ty::propose)->id;
  a.on_ack(0, id, 2);
  auto e = find(a.on_saved(0, id, 2, false, "No space left on device"), ty::cluster_error);
  REQUIRE(e);
  REQUIRE(e->message.find("No space left") != std::string::npos);
}

TEST_CASE("agreement: claims after a member finished are not started", "[agreement]") {
  auto a = joined(2);
  a.on_leave(1, 0);
  REQUIRE(a.phase() == agreement_phase::finishing);
  auto acts = a.on_claim(0, 50, 0);
  REQUIRE_FALSE(find(acts, ty::claim_reply)->won);
  REQUIRE_FALSE(find(acts, ty::propose));
}

TEST_CASE("agreement: the launcher can claim", "[agreement]") {
  auto a = joined(2);
  auto acts = a.on_claim(launcher_rank, 0, 0);
  REQUIRE(find(acts, ty::claim_reply)->won);
  auto p = find(acts, ty::propose);
  a.on_ack(0, p->id, 12);
  auto ag = find(a.on_ack(1, p->id, 11), ty::agreed);
  REQUIRE(ag->step == 12);
  REQUIRE(ag->saver == 0);
}

TEST_CASE("agreement: a round a frozen member holds is rescued before its deadline", "[agreement][grace]") {
  // A notice with a grace period; rank 2 freezes before it acknowledges.
  auto a = joined(3);
  const int64_t deadline = 5'000'000'000;
  auto id = find(a.on_claim(1, 7, deadline), ty::propose)->id;
  a.on_ack(0, id, 7);
  a.on_ack(1, id, 8);
  REQUIRE(a.phase() == agreement_phase::proposing);
  REQUIRE(a.needs_rescue());
  REQUIRE(a.on_cutoff().empty());  // nothing collected yet: no cutoff
  auto r = find(a.on_rescue(), ty::propose);
  REQUIRE(r);
  CHECK(r->kind == checkpoint_kind::jit);
  CHECK(a.on_rescue().empty());  // once
  a.on_ack(0, r->id, 7);
  a.on_ack(1, r->id, 7);
  // Rank 2 never answers: the cutoff agrees among the acks received.
  auto ag = find(a.on_cutoff(), ty::agreed);
  REQUIRE(ag);
  CHECK(ag->step == 7);
  CHECK(ag->saver == 0);
  CHECK(ag->exit_after);
  CHECK_FALSE(a.needs_rescue());  // a just-in-time save is under way
  auto c = find(a.on_saved(0, r->id, 7, true, ""), ty::committed);
  REQUIRE(c);
  CHECK(a.phase() == agreement_phase::stopping);
}

TEST_CASE("agreement: no rescue without a deadline or once committed", "[agreement][grace]") {
  auto a = joined(2);
  auto id = find(a.on_claim(1, 3, 0), ty::propose)->id;  // no grace period
  CHECK_FALSE(a.needs_rescue());
  CHECK(a.on_rescue().empty());
  a.on_ack(0, id, 3);
  a.on_ack(1, id, 3);
  a.on_saved(0, id, 3, true, "");
  CHECK(a.on_rescue().empty());
  // With a deadline: the countdown after the first save needs the rescue
  // armed; the committed final save does not.
  auto b = joined(2);
  auto bid = find(b.on_claim(1, 3, 1000), ty::propose)->id;
  b.on_ack(0, bid, 3);
  b.on_ack(1, bid, 3);
  b.on_saved(0, bid, 3, true, "");
  REQUIRE(b.phase() == agreement_phase::countdown);
  CHECK(b.needs_rescue());
  auto fin = find(b.on_propose_final(0, 9), ty::propose);
  b.on_ack(0, fin->id, 9);
  b.on_ack(1, fin->id, 9);
  b.on_saved(0, fin->id, 9, true, "");
  CHECK(b.phase() == agreement_phase::stopping);
  CHECK_FALSE(b.needs_rescue());
}

TEST_CASE("agreement: a rescue does not wait for members already silent", "[agreement][grace]") {
  auto a = joined(3);
  auto id = find(a.on_claim(1, 7, 5'000'000'000), ty::propose)->id;
  a.on_ack(0, id, 7);
  auto r = find(a.on_rescue({2}), ty::propose);  // rank 2 stopped heartbeating
  REQUIRE(r);
  REQUIRE(a.on_ack(0, r->id, 7).empty());
  auto ag = find(a.on_ack(1, r->id, 7), ty::agreed);  // both others answered: agreed now
  REQUIRE(ag);
  CHECK(ag->step == 7);
  CHECK(ag->saver == 0);
  // A later round (the saver lost) waits for everyone live again.
  auto lost = find(a.on_member_lost(0, 7, loss_reason::dead, "dead"), ty::propose);
  REQUIRE(lost);
  CHECK(a.on_ack(1, lost->id, 7).empty());  // rank 2 is awaited again
}

TEST_CASE("agreement: members that restored different steps never train together", "[agreement]") {
  agreement a(3);
  REQUIRE_FALSE(a.join_refusal(0, 40));
  a.on_join(0, 40);
  auto why = a.join_refusal(1, 0);  // its node-local directory lacks step 40
  REQUIRE(why);
  CHECK(why->find("restored step 0 but the group restored step 40") != std::string::npos);
  CHECK(a.on_join(1, 0).empty());
  CHECK(a.live().size() == 1);  // refused: not a member
  CHECK_FALSE(a.join_refusal(1, 40));
}

TEST_CASE("agreement: a member refused for another restored step ends the group, which restarts",
          "[agreement]") {
  // Node 0's ranks restored step 153; node 1's, on a replacement disk that
  // was not brought level, restored nothing. Without ending the group,
  // ranks 0 and 1 would wait for 2 and 3 until their collectives time out.
  agreement a(4);
  a.on_join(0, 153);
  a.on_join(1, 153);
  REQUIRE(a.join_refusal(2, 0));
  REQUIRE(a.refusal_ends_group(0));
  CHECK_FALSE(a.refusal_ends_group(153));
  auto acts = a.on_member_lost(2, 0, loss_reason::dead, "not level");
  REQUIRE(find(acts, ty::peer_lost));
  auto p = find(acts, ty::propose);
  REQUIRE(p);
  CHECK(p->kind == checkpoint_kind::jit);
  REQUIRE(a.refusal_ends_group(0));  // rank 3 is refused during the round: lost as well
  a.on_member_lost(3, 0, loss_reason::dead, "not level");
  CHECK(a.on_ack(0, p->id, 153).empty());
  // The members that joined stop at their restored step, on disk already:
  // committed without a save, everyone exits to restart.
  auto c = find(a.on_ack(1, p->id, 153), ty::committed);
  REQUIRE(c);
  CHECK(c->step == 153);
  CHECK(a.phase() == agreement_phase::stopping);
  CHECK(a.join_refusal(2, 0));
  CHECK_FALSE(a.refusal_ends_group(0));  // already stopping: nothing more to end
}

TEST_CASE("agreement: takeover - survivors rejoin, the missing are lost, one jit round above the first id",
          "[agreement][takeover]") {
  agreement a(4, 5'000'000);
  CHECK(a.on_rejoin(1, 40).empty());
  CHECK(a.on_rejoin(2, 41).empty());
  CHECK(a.on_rejoin(3, 41).empty());
  CHECK(a.on_rejoin(9, 41).empty());  // out of range: ignored
  CHECK(a.live() == std::set<uint32_t>{1, 2, 3});
  // The rank that did not rejoin is declared lost: the jit round starts.
  auto acts = a.on_member_lost(0, 0, loss_reason::dead, "did not rejoin");
  auto p = find(acts, ty::propose);
  REQUIRE(p);
  CHECK(p->kind == checkpoint_kind::jit);
  CHECK(p->id == 5'000'001);
  CHECK(a.end_takeover().empty());  // already collecting
  CHECK(a.on_rejoin(0, 40).empty());
  CHECK_FALSE(a.live().count(0));  // lost in this incarnation: no way back
  a.on_ack(1, p->id, 40);
  a.on_ack(2, p->id, 41);
  auto agreed = find(a.on_ack(3, p->id, 41), ty::agreed);
  REQUIRE(agreed);
  CHECK(agreed->step == 41);  // rejoined steps are not durable: a save, by the lowest most advanced rank
  CHECK(agreed->saver == 2);
  CHECK(agreed->exit_after);
  auto c = find(a.on_saved(2, p->id, 41, true, ""), ty::committed);
  REQUIRE(c);
  CHECK(c->exit_after);
}

TEST_CASE("agreement: takeover with every rank back still ends in one jit round", "[agreement][takeover]") {
  agreement a(2, 3'000'000);
  a.on_rejoin(0, 7);
  a.on_rejoin(1, 7);
  auto p = find(a.end_takeover(), ty::propose);
  REQUIRE(p);
  CHECK(p->kind == checkpoint_kind::jit);
  CHECK(p->id > 3'000'000);
  a.on_ack(0, p->id, 7);
  auto agreed = find(a.on_ack(1, p->id, 7), ty::agreed);
  REQUIRE(agreed);
  CHECK(agreed->step == 7);
  CHECK(agreed->saver == 0);
  // Nobody rejoined: nothing to save, the group stops.
  agreement empty(2, 1);
  CHECK(empty.end_takeover().empty());
  CHECK(empty.phase() == agreement_phase::stopping);
}

// ---- sharded state: parts and their commit ----------------------------------

TEST_CASE("parts mode: every member saves, the saver commits once every part is durable", "[agreement][parts]") {
  auto a = joined(3);
  a.set_parts(true);
  a.on_claim(1, 5, 0);
  const auto id = a.current_id();
  actions last;
  for (uint32_t r = 0; r < 3; ++r) last = a.on_ack(r, id, 5);
  auto agreed = find(last, ty::agreed);
  REQUIRE(agreed);
  CHECK(agreed->all_save);
  CHECK(agreed->saver == 0);
  CHECK(a.on_saved(2, id, 5, true, "", true).empty());
  CHECK(a.on_saved(2, id, 5, true, "", true).empty());  // a repeated report changes nothing
  CHECK(a.on_saved(0, id, 5, true, "", true).empty());
  auto c = find(a.on_saved(1, id, 5, true, "", true), ty::commit_parts);
  REQUIRE(c);
  CHECK(c->rank == 0);
  CHECK(c->step == 5);
  auto done = find(a.on_saved(0, id, 5, true, ""), ty::committed);
  REQUIRE(done);
  CHECK(done->step == 5);
  CHECK(a.durable_step() == 5);
}

TEST_CASE("parts mode: a failed part fails the round, a loss before the commit saves nothing", "[agreement][parts]") {
  SECTION("failed part") {
    auto a = joined(2);
    a.set_parts(true);
    a.on_claim(0, 3, 0);
    a.on_ack(0, a.current_id(), 3);
    a.on_ack(1, a.current_id(), 3);
    auto e = find(a.on_saved(1, a.current_id(), 3, false, "disk full", true), ty::cluster_error);
    REQUIRE(e);
    CHECK(e->message.find("rank 1 could not save its part of step 3: disk full") != std::string::npos);
  }
  SECTION("loss after some parts") {
    auto a = joined(3);
    a.set_parts(true);
    a.on_claim(0, 3, 0);
    for (uint32_t r = 0; r < 3; ++r) a.on_ack(r, a.current_id(), 3);
    a.on_saved(0, a.current_id(), 3, true, "", true);
    a.on_saved(1, a.current_id(), 3, true, "", true);
    auto lost = a.on_member_lost(2, 3, loss_reason::dead, "killed");
    REQUIRE(find(lost, ty::propose));
    actions last;
    for (uint32_t r = 0; r < 2; ++r) last = a.on_ack(r, a.current_id(), 3);
    // Its part is gone: nothing can be written, the newest complete checkpoint stays.
    REQUIRE_FALSE(find(last, ty::agreed));
    auto c = find(last, ty::committed);
    REQUIRE(c);
    CHECK(c->exit_after);
    CHECK(c->step == 0);
  }
}

TEST_CASE("parts mode: periodic parts are committed per step by the chief", "[agreement][parts]") {
  auto a = joined(3);
  a.set_parts(true);
  CHECK(a.on_saved(1, 0, 10, true, "", true).empty());
  CHECK(a.on_saved(0, 0, 10, true, "", true).empty());
  CHECK(a.on_saved(1, 0, 20, true, "", true).empty());  // a rank one save ahead
  auto c = find(a.on_saved(2, 0, 10, true, "", true), ty::commit_parts);
  REQUIRE(c);
  CHECK(c->rank == 0);
  CHECK(c->id == 0);
  CHECK(c->step == 10);
  a.on_saved(0, 0, 10, true, "");
  CHECK(a.durable_step() == 10);
  // A failed part is not counted: no commit until that rank writes it again.
  a.on_saved(0, 0, 20, false, "disk full", true);
  CHECK(a.on_saved(2, 0, 20, true, "", true).empty());
  CHECK(find(a.on_saved(0, 0, 20, true, "", true), ty::commit_parts));
  a.on_saved(0, 0, 30, true, "", true);
  a.on_saved(1, 0, 30, true, "", true);
  CHECK(find(a.on_saved(2, 0, 30, true, "", true), ty::commit_parts));
  // Without parts mode a periodic report is ignored.
  auto plain = joined(2);
  CHECK(plain.on_saved(0, 0, 10, true, "", true).empty());
}

namespace {

replica_report copies(std::vector<uint64_t> kept, uint32_t of, std::vector<uint64_t> replica) {
  replica_report r;
  r.kept = std::move(kept);
  r.of = of;
  r.replica = std::move(replica);
  return r;
}

/// Four members with sharded state, rank 2 lost while training (a ring:
/// rank r holds rank r + 1's replica, so rank 1 holds rank 2's).
agreement lost_rank_2() {
  auto a = joined(4);
  a.set_parts(true);
  REQUIRE(find(a.on_member_lost(2, 7, loss_reason::dead, "killed"), ty::propose));
  return a;
}

}  // namespace

TEST_CASE("replicas: a lost member's part comes from its holder's replica", "[agreement][parts][replicas]") {
  auto a = lost_rank_2();
  const auto id = a.current_id();
  CHECK(a.on_ack(0, id, 8, copies({6, 7, 8}, 1, {7, 8})).empty());
  CHECK(a.on_ack(3, id, 7, copies({5, 6, 7}, 0, {6, 7})).empty());
  auto agreed = find(a.on_ack(1, id, 8, copies({6, 7, 8}, 2, {6, 7})), ty::agreed);
  REQUIRE(agreed);
  // Rank 3 completed 7 and rank 2's replica is whole at 7: the newest step
  // every part exists for.
  CHECK(agreed->step == 7);
  CHECK(agreed->from_kept);
  CHECK(agreed->all_save);
  CHECK(agreed->from_replica == std::vector<uint32_t>{2});
  CHECK(agreed->saver == 0);
  CHECK(agreed->exit_after);
  CHECK(a.on_saved(0, id, 7, true, "", true).empty());
  CHECK(a.on_saved(3, id, 7, true, "", true).empty());
  auto c = find(a.on_saved(1, id, 7, true, "", true), ty::commit_parts);
  REQUIRE(c);
  CHECK(c->rank == 0);
  CHECK(c->step == 7);
  auto done = find(a.on_saved(0, id, 7, true, ""), ty::committed);
  REQUIRE(done);
  CHECK(done->step == 7);
  CHECK(a.durable_step() == 7);
}

TEST_CASE("replicas: an older whole replica sets the step, none stops at the durable one",
          "[agreement][parts][replicas]") {
  SECTION("the newest transfer did not arrive") {
    auto a = lost_rank_2();
    const auto id = a.current_id();
    a.on_ack(0, id, 8, copies({6, 7, 8}, 1, {7, 8}));
    a.on_ack(3, id, 8, copies({6, 7, 8}, 0, {7, 8}));
    auto agreed = find(a.on_ack(1, id, 8, copies({6, 7, 8}, 2, {5, 6})), ty::agreed);
    REQUIRE(agreed);
    CHECK(agreed->step == 6);
  }
  SECTION("the copies are not above the durable step") {
    auto a = joined(4);
    a.set_parts(true);
    for (uint32_t r = 0; r < 4; ++r) a.on_saved(r, 0, 8, true, "", true);
    a.on_saved(0, 0, 8, true, "");
    REQUIRE(a.durable_step() == 8);
    a.on_member_lost(2, 8, loss_reason::dead, "killed");
    const auto id = a.current_id();
    a.on_ack(0, id, 8, copies({6, 7, 8}, 1, {7, 8}));
    a.on_ack(3, id, 8, copies({6, 7, 8}, 0, {7, 8}));
    auto c = find(a.on_ack(1, id, 8, copies({6, 7, 8}, 2, {7, 8})), ty::committed);
    REQUIRE(c);
    CHECK(c->step == 8);
  }
  SECTION("the holder's replica is of another member") {
    auto a = lost_rank_2();
    const auto id = a.current_id();
    a.on_ack(0, id, 8, copies({6, 7, 8}, 1, {7, 8}));
    a.on_ack(3, id, 8, copies({6, 7, 8}, 0, {7, 8}));
    auto last = a.on_ack(1, id, 8, copies({6, 7, 8}, 3, {7, 8}));
    REQUIRE_FALSE(find(last, ty::agreed));
    auto c = find(last, ty::committed);
    REQUIRE(c);
    CHECK(c->step == 0);
    CHECK(c->exit_after);
  }
  SECTION("a survivor without a kept copy of the step") {
    auto a = lost_rank_2();
    const auto id = a.current_id();
    a.on_ack(0, id, 8, copies({6, 7, 8}, 1, {7, 8}));
    a.on_ack(3, id, 8, copies({}, 0, {}));
    auto last = a.on_ack(1, id, 8, copies({6, 7, 8}, 2, {7, 8}));
    REQUIRE(find(last, ty::committed));
    REQUIRE_FALSE(find(last, ty::agreed));
  }
}

TEST_CASE("replicas: a part writer or the committer lost while writing stops at the durable step",
          "[agreement][parts][replicas]") {
  for (uint32_t victim : {0u, 3u}) {
    auto a = lost_rank_2();
    const auto id = a.current_id();
    a.on_ack(0, id, 8, copies({6, 7, 8}, 1, {7, 8}));
    a.on_ack(3, id, 8, copies({6, 7, 8}, 0, {7, 8}));
    REQUIRE(find(a.on_ack(1, id, 8, copies({6, 7, 8}, 2, {7, 8})), ty::agreed));
    a.on_saved(1, id, 8, true, "", true);
    auto c = find(a.on_member_lost(victim, 8, loss_reason::dead, "killed"), ty::committed);
    REQUIRE(c);
    CHECK(c->step == 0);
    CHECK(a.phase() == agreement_phase::stopping);
  }
  SECTION("a writer lost after its part is durable changes nothing") {
    auto a = lost_rank_2();
    const auto id = a.current_id();
    a.on_ack(0, id, 8, copies({6, 7, 8}, 1, {7, 8}));
    a.on_ack(3, id, 8, copies({6, 7, 8}, 0, {7, 8}));
    a.on_ack(1, id, 8, copies({6, 7, 8}, 2, {7, 8}));
    a.on_saved(3, id, 8, true, "", true);
    CHECK(a.on_member_lost(3, 8, loss_reason::dead, "killed").size() == 1);  // peer_lost only
    a.on_saved(1, id, 8, true, "", true);
    REQUIRE(find(a.on_saved(0, id, 8, true, "", true), ty::commit_parts));
  }
}

namespace {

std::vector<uint32_t> commit_ranks(const actions& acts) {
  std::vector<uint32_t> out;
  for (auto& a : acts)
    if (a.what == ty::commit_parts) out.push_back(a.rank);
  return out;
}

}  // namespace

TEST_CASE("node-local parts: every node's lowest rank commits, the round commits when all reported",
          "[agreement][parts][node-local]") {
  auto a = joined(4);  // nodes of two: {0, 1} and {2, 3}
  a.set_parts(true);
  a.set_node_local(2);
  a.on_claim(3, 5, 0);
  const auto id = a.current_id();
  actions last;
  for (uint32_t r = 0; r < 4; ++r) last = a.on_ack(r, id, 5);
  REQUIRE(find(last, ty::agreed));
  for (uint32_t r = 0; r < 3; ++r) CHECK(a.on_saved(r, id, 5, true, "", true).empty());
  auto orders = a.on_saved(3, id, 5, true, "", true);
  CHECK(commit_ranks(orders) == std::vector<uint32_t>{0, 2});
  CHECK(a.on_saved(1, id, 5, true, "").empty());  // not a committer
  CHECK(a.on_saved(2, id, 5, true, "").empty());  // node 1 committed, node 0 not yet
  CHECK(a.durable_step() == 0);
  CHECK(a.on_saved(2, id, 5, true, "").empty());  // a repeated report changes nothing
  auto done = find(a.on_saved(0, id, 5, true, ""), ty::committed);
  REQUIRE(done);
  CHECK(done->step == 5);
  CHECK(a.durable_step() == 5);
}

TEST_CASE("node-local parts: a node's failed commit fails the round, a committer lost before its report stops it",
          "[agreement][parts][node-local]") {
  auto agreed_round = [] {
    auto a = joined(4);
    a.set_parts(true);
    a.set_node_local(2);
    a.on_claim(0, 5, 0);
    for (uint32_t r = 0; r < 4; ++r) a.on_ack(r, a.current_id(), 5);
    for (uint32_t r = 0; r < 4; ++r) a.on_saved(r, a.current_id(), 5, true, "", true);
    return a;
  };
  SECTION("failed commit") {
    auto a = agreed_round();
    a.on_saved(0, a.current_id(), 5, true, "");
    auto e = find(a.on_saved(2, a.current_id(), 5, false, "no space left on device"), ty::cluster_error);
    REQUIRE(e);
    CHECK(e->message.find("no space left on device") != std::string::npos);
    CHECK(a.durable_step() == 0);
  }
  SECTION("committer lost") {
    auto a = agreed_round();
    a.on_saved(0, a.current_id(), 5, true, "");
    auto lost = a.on_member_lost(2, 5, loss_reason::dead, "killed");
    CHECK_FALSE(find(lost, ty::committed));  // never committed without node 1's commit
    CHECK(a.durable_step() == 0);
  }
}

TEST_CASE("node-local parts: periodic steps need every node's commit, and a replica's part is its writer's node's",
          "[agreement][parts][node-local]") {
  SECTION("periodic") {
    auto a = joined(4);
    a.set_parts(true);
    a.set_node_local(2);
    for (uint32_t r = 0; r < 3; ++r) a.on_saved(r, 0, 10, true, "", true);
    CHECK(commit_ranks(a.on_saved(3, 0, 10, true, "", true)) == std::vector<uint32_t>{0, 2});
    a.on_saved(0, 0, 10, true, "");
    CHECK(a.durable_step() == 0);
    a.on_saved(2, 0, 10, false, "disk full");
    CHECK(a.durable_step() == 0);
    a.on_saved(2, 0, 10, true, "");
    CHECK(a.durable_step() == 10);
  }
  SECTION("from a replica after a whole node was lost") {
    auto a = joined(4);
    a.set_parts(true);
    a.set_node_local(2);
    a.on_member_lost(2, 7, loss_reason::dead, "host lost");
    a.on_member_lost(3, 7, loss_reason::dead, "host lost");
    const auto id = a.current_id();
    // Rank 1 holds rank 2's replica, rank 0 holds rank 1's: rank 3's part is
    // nowhere, so no step above the durable one can be written.
    a.on_ack(0, id, 7, copies({6, 7}, 1, {6, 7}));
    auto last = a.on_ack(1, id, 7, copies({6, 7}, 2, {6, 7}));
    REQUIRE_FALSE(find(last, ty::agreed));
  }
  SECTION("a lost rank's part from its holder on the other node") {
    auto a = lost_rank_2();  // rank 1 (node 0) holds rank 2's replica
    a.set_node_local(2);
    const auto id = a.current_id();
    a.on_ack(0, id, 8, copies({6, 7, 8}, 1, {7, 8}));
    a.on_ack(3, id, 8, copies({6, 7, 8}, 0, {7, 8}));
    REQUIRE(find(a.on_ack(1, id, 8, copies({6, 7, 8}, 2, {7, 8})), ty::agreed));
    a.on_saved(0, id, 8, true, "", true);
    a.on_saved(1, id, 8, true, "", true);
    // Node 1's only live rank is 3: it commits node 1's part.
    CHECK(commit_ranks(a.on_saved(3, id, 8, true, "", true)) == std::vector<uint32_t>{0, 3});
    a.on_saved(3, id, 8, true, "");
    REQUIRE(find(a.on_saved(0, id, 8, true, ""), ty::committed));
    CHECK(a.durable_step() == 8);
  }
}
