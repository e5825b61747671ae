// The worker's step-boundary decisions (runtime/worker_policy): every row of
// its priority table, the waits and their deadlines, and the sequences the
// trainer walks through (ack -> agreed -> save -> commit -> stop).
#include "runtime/worker/worker_policy.hpp"

#include <catch2/catch.hpp>

using namespace grace;
using ty = worker_decision::type;

namespace {

constexpr int64_t ms = 1'000'000;

worker_policy_config cfg(uint32_t rank = 1, bool chief = false) {
  worker_policy_config c;
  c.rank = rank;
  c.is_chief = chief;
  c.restart_code = 42;
  c.fatal_code = 3;
  c.verdict_wait_ns = 100 * ms;
  c.save_wait_ns = 1000 * ms;
  return c;
}

boundary_input at(uint64_t completed, int64_t now = 0, boundary_mode mode = boundary_mode::step_start) {
  boundary_input in;
  in.completed = completed;
  in.mode = mode;
  in.mono_ns = now;
  in.wall_ns = now;
  return in;
}

checkpoint_order order(uint64_t id, uint64_t step, checkpoint_kind kind, bool agreed, uint32_t saver = 0,
                       bool exit_after = true) {
  checkpoint_order o;
  o.id = id;
  o.step = step;
  o.kind = kind;
  o.agreed = agreed;
  o.saver = saver;
  o.exit_after = exit_after;
  return o;
}

}  // namespace

TEST_CASE("worker_policy: nothing pending lowers the flag", "[policy]") {
  worker_policy p(cfg(), 0);
  control_state s;
  CHECK(p.next(s, at(5)).what == ty::run_clear);
}

TEST_CASE("worker_policy: a cluster error stops with the fatal code naming it", "[policy]") {
  worker_policy p(cfg(), 0);
  control_state s;
  s.failure = cluster_failure{2, 40, "rank 2 at step 40: boom"};
  s.order = order(1, 9, checkpoint_kind::jit, false);  // the error wins over anything else
  auto d = p.next(s, at(5));
  REQUIRE(d.what == ty::stop);
  CHECK(d.code == 3);
  CHECK(d.message == "cluster error: rank 2 at step 40: boom");
}

TEST_CASE("worker_policy: a proposal above the completed step runs on at it waits", "[policy]") {
  worker_policy p(cfg(), 0);
  control_state s;
  s.order = order(1, 10, checkpoint_kind::initial, false);
  CHECK(p.next(s, at(8)).what == ty::run);  // the flag stays up
  auto d = p.next(s, at(10, 5 * ms));
  REQUIRE(d.what == ty::wait);
  CHECK(d.reason == wait_reason::agreement);
  CHECK(d.deadline_ns == 105 * ms);
  CHECK(d.new_wait);
  auto again = p.next(s, at(10, 50 * ms));
  REQUIRE(again.what == ty::wait);
  CHECK_FALSE(again.new_wait);
  CHECK(again.deadline_ns == 105 * ms);  // one deadline for the whole wait
  auto late = p.next(s, at(10, 105 * ms));
  REQUIRE(late.what == ty::stop);
  CHECK(late.code == 42);
  CHECK(late.message.find("agreement #1") != std::string::npos);
  CHECK(late.message.find("100 ms") != std::string::npos);
}

TEST_CASE("worker_policy: the agreed step is reached once: the saver saves exit waits for the commit", "[policy]") {
  worker_policy saver(cfg(0, true), 0), other(cfg(1), 0);
  control_state s;
  s.order = order(3, 12, checkpoint_kind::initial, true, 0, true);
  CHECK(saver.next(s, at(11)).what == ty::run);
  auto d = saver.next(s, at(12));
  REQUIRE(d.what == ty::reach);
  CHECK(d.save);
  CHECK(d.sync);
  CHECK(d.step == 12);
  CHECK(d.kind == checkpoint_kind::initial);
  saver.reached(3);
  auto o = other.next(s, at(12));
  REQUIRE(o.what == ty::reach);
  CHECK_FALSE(o.save);
  other.reached(3);
  CHECK(saver.next(s, at(12)).reason == wait_reason::commit);
  CHECK(other.next(s, at(12)).what == ty::wait);
  s.committed = commit_info{3, 12, true};
  auto stop = other.next(s, at(12));
  REQUIRE(stop.what == ty::stop);
  CHECK(stop.code == 42);
  CHECK(stop.message == "preempted: checkpoint at step 12 committed, restart to resume");
}

TEST_CASE("worker_policy: past the agreed step is a protocol violation", "[policy]") {
  worker_policy p(cfg(), 0);
  control_state s;
  s.order = order(3, 12, checkpoint_kind::initial, true);
  auto d = p.next(s, at(13));
  REQUIRE(d.what == ty::stop);
  CHECK(d.code == 3);
}

TEST_CASE("worker_policy: a grace-period save hands off and training continues: the chief proposes the final",
          "[policy]") {
  worker_policy chief(cfg(0, true), 0);
  control_state s;
  s.deadline_ns = 1000 * ms;
  s.order = order(1, 5, checkpoint_kind::initial, true, 0, false);
  auto d = chief.next(s, at(5, 0));
  REQUIRE(d.what == ty::reach);
  CHECK_FALSE(d.sync);  // the writer persists it while training continues
  chief.reached(1);
  chief.saved(5);
  auto g = chief.next(s, at(5, 0));
  REQUIRE(g.what == ty::continue_grace);
  CHECK(g.id == 1);
  s.order.reset();  // what continue_grace does to the control block
  // Not committed yet: keep the flag, keep training.
  CHECK(chief.next(s, at(6, 0)).what == ty::run);
  s.committed = commit_info{1, 5, false};
  for (int i = 0; i < 10; ++i) chief.step_time(10 * ms);
  chief.save_time(50 * ms);
  int64_t margin = chief.margin_ns();
  CHECK(margin == 2 * (2 * 10 * ms + 50 * ms) + 5 * ms);
  CHECK(chief.next(s, at(7, 1000 * ms - margin - 1)).what == ty::run);
  auto f = chief.next(s, at(8, 1000 * ms - margin));
  REQUIRE(f.what == ty::propose_final);
  CHECK(f.step == 9);
  CHECK(f.left_ns == margin);
  chief.proposed_final();
  CHECK(chief.next(s, at(9, 1000 * ms - margin + 1)).what == ty::run_clear);
  // A non-chief never proposes.
  worker_policy other(cfg(1), 0);
  CHECK(other.next(s, at(8, 999 * ms)).what == ty::run_clear);
}

TEST_CASE("worker_policy: a just-in-time round: acknowledge once then the saver saves and all wait", "[policy]") {
  worker_policy p(cfg(1), 0);
  control_state s;
  s.lost = loss_info{loss_kind::peer_dead, 2, 7, "dead"};
  s.order = order(4, 0, checkpoint_kind::jit, false);
  auto a = p.next(s, at(9, 0, boundary_mode::collective_failed));
  REQUIRE(a.what == ty::ack_jit);
  CHECK(a.id == 4);
  CHECK(a.step == 9);
  p.acked(4);
  CHECK(p.next(s, at(9, 0, boundary_mode::collective_failed)).reason == wait_reason::agreement);
  s.order = order(4, 9, checkpoint_kind::jit, true, 1, true);
  auto r = p.next(s, at(9, 0, boundary_mode::collective_failed));
  REQUIRE(r.what == ty::reach);
  CHECK(r.save);
  CHECK(r.sync);
  CHECK(r.kind == checkpoint_kind::jit);
  p.reached(4);
  p.saved(9);
  CHECK(p.next(s, at(9)).reason == wait_reason::commit);
  s.committed = commit_info{4, 9, true};
  auto stop = p.next(s, at(9));
  REQUIRE(stop.what == ty::stop);
  CHECK(stop.code == 42);
  CHECK(stop.message == "peer lost; just-in-time checkpoint at step 9 committed");
}

TEST_CASE("worker_policy: the peer watcher's acknowledgement for an idle trainer is not repeated", "[policy]") {
  worker_policy p(cfg(1), 0);
  control_state s;
  s.order = order(4, 0, checkpoint_kind::jit, false);
  s.acked_for_trainer = 4;
  CHECK(p.next(s, at(9)).what == ty::wait);
  s.acked_for_trainer = 3;  // an older round: ours is still due
  CHECK(p.next(s, at(9)).what == ty::ack_jit);
}

TEST_CASE("worker_policy: a commit without a save (state already durable) stops the round", "[policy]") {
  worker_policy p(cfg(1), 20);
  control_state s;
  s.lost = loss_info{loss_kind::peer_dead, 2, 20, "dead"};
  s.order = order(2, 0, checkpoint_kind::jit, false);
  s.acked_for_trainer = 2;
  s.committed = commit_info{2, 20, true};
  auto d = p.next(s, at(20));
  REQUIRE(d.what == ty::stop);
  CHECK(d.code == 42);
  CHECK(d.message == "peer lost; just-in-time checkpoint at step 20 committed");
}

TEST_CASE("worker_policy: a lost peer waits for the verdict not for a fixed time", "[policy]") {
  worker_policy p(cfg(1), 0);
  control_state s;
  s.lost = loss_info{loss_kind::peer_dead, 3, 7, "dead: connection lost"};
  s.order = order(1, 8, checkpoint_kind::initial, true);  // superseded soon by the jit round
  auto d = p.next(s, at(7, 0));
  REQUIRE(d.what == ty::wait);
  CHECK(d.reason == wait_reason::verdict);
  CHECK(d.deadline_ns == 100 * ms);
  auto late = p.next(s, at(7, 100 * ms));
  REQUIRE(late.what == ty::stop);
  CHECK(late.code == 42);
  CHECK(late.message.rfind("rank 3 lost: dead: connection lost", 0) == 0);
}

TEST_CASE("worker_policy: a failed collective never runs the step again", "[policy]") {
  worker_policy p(cfg(1), 0);
  control_state s;
  s.order = order(1, 20, checkpoint_kind::initial, false);  // would say "run" at a normal boundary
  auto d = p.next(s, at(7, 0, boundary_mode::collective_failed));
  REQUIRE(d.what == ty::wait);
  CHECK(d.reason == wait_reason::verdict);
  auto late = p.next(s, at(7, 200 * ms, boundary_mode::collective_failed));
  REQUIRE(late.what == ty::stop);
  CHECK(late.message.find("step 8 failed in a collective") != std::string::npos);
}

TEST_CASE("worker_policy: the coordinator lost: the chief saves a newer step then everyone stops", "[policy]") {
  control_state s;
  s.coordinator_gone = true;
  worker_policy chief(cfg(0, true), 10);
  auto d = chief.next(s, at(14));
  REQUIRE(d.what == ty::save_own);
  CHECK(d.step == 14);
  chief.saved(14);
  auto stop = chief.next(s, at(14));
  REQUIRE(stop.what == ty::stop);
  CHECK(stop.code == 42);
  CHECK(stop.message == "coordination service lost");
  // Nothing newer than the restored step: nothing to save.
  worker_policy fresh(cfg(0, true), 14);
  CHECK(fresh.next(s, at(14)).what == ty::stop);
  worker_policy other(cfg(1), 10);
  CHECK(other.next(s, at(14)).what == ty::stop);
}

TEST_CASE("worker_policy: a periodic save that failed (its commit fenced) is saved alone once the service is lost", "[policy]") {
  control_state s;
  s.coordinator_gone = true;
  worker_policy chief(cfg(0, true), 40);
  chief.saved(60);  // the periodic save of step 60, handed to the writer
  CHECK(chief.next(s, at(60)).what == ty::stop);
  chief.save_failed(60);  // its commit was fenced: the service is gone
  auto d = chief.next(s, at(60));
  REQUIRE(d.what == ty::save_own);
  CHECK(d.step == 60);
  chief.saved(60);
  CHECK(chief.next(s, at(60)).what == ty::stop);
  // A failure of an older save changes nothing.
  worker_policy later(cfg(0, true), 40);
  later.saved(60);
  later.save_failed(50);
  CHECK(later.next(s, at(60)).what == ty::stop);
}

TEST_CASE("worker_policy: the coordinator lost during a just-in-time round: the saver's save comes first", "[policy]") {
  control_state s;
  s.order = order(5, 14, checkpoint_kind::jit, true, 0, true);
  s.coordinator_gone = true;
  worker_policy chief(cfg(0, true), 10);
  chief.acked(5);
  auto d = chief.next(s, at(14));
  REQUIRE(d.what == ty::reach);
  CHECK(d.save);
  chief.reached(5);
  chief.saved(14);
  auto stop = chief.next(s, at(14));
  REQUIRE(stop.what == ty::stop);
  CHECK(stop.message == "coordination service lost");
  // Unagreed round and coordinator gone: the chief saves its own step.
  control_state u;
  u.order = order(6, 0, checkpoint_kind::jit, false);
  u.coordinator_gone = true;
  worker_policy c2(cfg(0, true), 10);
  c2.acked(6);
  CHECK(c2.next(u, at(12)).what == ty::save_own);
}

TEST_CASE("worker_policy: an error of the step's own waits for its broadcast then stops fatally", "[policy]") {
  worker_policy p(cfg(2), 0);
  control_state s;
  auto in = at(39, 0, boundary_mode::own_error);
  in.error = "boom";
  auto d = p.next(s, in);
  REQUIRE(d.what == ty::wait);
  CHECK(d.reason == wait_reason::cluster_error);
  s.failure = cluster_failure{2, 40, "rank 2 at step 40: boom"};
  auto stop = p.next(s, in);
  REQUIRE(stop.what == ty::stop);
  CHECK(stop.code == 3);
  CHECK(stop.message == "error in step 40 on rank 2: boom");
  // No broadcast in time: the same stop, at the deadline.
  worker_policy q(cfg(2), 0);
  control_state none;
  q.next(none, in);
  in.mono_ns = 100 * ms;
  auto late = q.next(none, in);
  REQUIRE(late.what == ty::stop);
  CHECK(late.code == 3);
  CHECK(late.message.rfind("error in step 40 on rank 2: boom", 0) == 0);
}

TEST_CASE("worker_policy: a commit wait is bounded by the save timeout", "[policy]") {
  worker_policy p(cfg(1), 0);
  control_state s;
  s.order = order(3, 12, checkpoint_kind::initial, true, 0, true);
  p.reached(3);
  auto d = p.next(s, at(12, 0));
  REQUIRE(d.reason == wait_reason::commit);
  CHECK(d.deadline_ns == 1000 * ms);
  CHECK(p.next(s, at(12, 999 * ms)).what == ty::wait);
  auto late = p.next(s, at(12, 1000 * ms));
  REQUIRE(late.what == ty::stop);
  CHECK(late.message.find("was not committed") != std::string::npos);
}

TEST_CASE("worker_policy: a new wait gets a new deadline", "[policy]") {
  worker_policy p(cfg(1), 0);
  control_state s;
  s.order = order(1, 10, checkpoint_kind::initial, false);
  CHECK(p.next(s, at(10, 0)).deadline_ns == 100 * ms);
  s.order = order(1, 10, checkpoint_kind::initial, true, 0, true);
  p.reached(1);
  auto d = p.next(s, at(10, 90 * ms));
  REQUIRE(d.reason == wait_reason::commit);
  CHECK(d.new_wait);
  CHECK(d.deadline_ns == 1090 * ms);
}

TEST_CASE("worker_policy: a just-in-time round without a lost peer is the deadline rescue", "[policy][grace]") {
  worker_policy p(cfg(1), 0);
  control_state s;
  s.deadline_ns = 1000 * ms;
  s.order = order(4, 0, checkpoint_kind::jit, false);
  auto a = p.next(s, at(9, 0, boundary_mode::collective_failed));
  REQUIRE(a.what == ty::ack_jit);
  p.acked(4);
  s.order = order(4, 9, checkpoint_kind::jit, true, 0, true);
  s.committed = commit_info{4, 9, true};
  auto stop = p.next(s, at(9));
  REQUIRE(stop.what == ty::stop);
  CHECK(stop.code == 42);
  CHECK(stop.message == "deadline near; just-in-time checkpoint at step 9 committed");
}

TEST_CASE("worker_policy: with failover the service moving is waited out, and nobody saves alone", "[policy][takeover]") {
  auto c = cfg(0, true);
  c.save_alone_without_coordinator = false;
  worker_policy chief(c, 10);
  control_state s;
  s.lost = loss_info{loss_kind::coordinator_moving, 0, 0, "the coordination service was lost and no successor took over"};
  auto d = chief.next(s, at(14, 0, boundary_mode::collective_failed));
  REQUIRE(d.what == ty::wait);
  CHECK(d.reason == wait_reason::verdict);
  // The successor's round arrives: acknowledge, then save as its saver.
  s.order = order(4'000'001, 0, checkpoint_kind::jit, false);
  auto a = chief.next(s, at(14, 10 * ms));
  REQUIRE(a.what == ty::ack_jit);
  CHECK(a.step == 14);
  // No successor in time: the wait ends with the restart code, naming why.
  worker_policy waiting(c, 10);
  control_state t = s;
  t.order.reset();
  REQUIRE(waiting.next(t, at(14, 0)).what == ty::wait);
  auto late = waiting.next(t, at(14, 500 * ms));
  REQUIRE(late.what == ty::stop);
  CHECK(late.code == 42);
  CHECK(late.message.find("no successor took over") != std::string::npos);
  // The service gone for good: the chief stops without writing.
  control_state g;
  g.coordinator_gone = true;
  worker_policy chief2(c, 10);
  auto stop = chief2.next(g, at(14));
  REQUIRE(stop.what == ty::stop);
  CHECK(stop.message == "coordination service lost");
}

TEST_CASE("worker_policy: the warm-up step stands in for the step time only until a second step is measured",
          "[policy]") {
  worker_policy p(cfg(0), 0);
  p.save_time(50 * ms);
  p.step_time(400 * ms);  // the first step after a start: rendezvous, first touches
  CHECK(p.margin_ns() == 2 * (2 * 400 * ms + 50 * ms) + 5 * ms);
  p.step_time(10 * ms);
  CHECK(p.margin_ns() == 2 * (2 * 10 * ms + 50 * ms) + 5 * ms);
  for (int i = 0; i < 70; ++i) p.step_time(10 * ms);
  CHECK(p.margin_ns() == 2 * (2 * 10 * ms + 50 * ms) + 5 * ms);
}

TEST_CASE("worker_policy: a recovery order is carried out, unless a newer round superseded it", "[policy]") {
  worker_policy p(cfg(), 10);
  control_state s;
  s.lost = loss_info{loss_kind::peer_dead, 2, 30, "killed"};
  s.order = order(7, 0, checkpoint_kind::jit, false);
  p.acked(7);
  s.recover = recover_order{7, 31, 0, "127.0.0.1:5", "run/0/r7/", {2}};
  auto d = p.next(s, at(30, 0, boundary_mode::collective_failed));
  CHECK(d.what == ty::recover);
  CHECK(d.id == 7);
  CHECK(d.step == 31);
  // The recovery failed over to a just-in-time round: that round rules.
  s.order = order(8, 0, checkpoint_kind::jit, false);
  CHECK(p.next(s, at(30)).what == ty::ack_jit);
}

TEST_CASE("worker_policy: a replacement waits for its recovery order, then trains", "[policy]") {
  auto c = cfg(2);
  c.replacement = true;
  worker_policy p(c, 0);
  control_state s;
  auto d = p.next(s, at(0, 0));
  REQUIRE(d.what == ty::wait);
  CHECK(d.reason == wait_reason::verdict);
  // No order within the verdict wait: it stops for a restart.
  auto late = p.next(s, at(0, 200 * ms));
  CHECK(late.what == ty::stop);
  CHECK(late.code == 42);
  s.recover = recover_order{3, 12, 0, "127.0.0.1:5", "p/", {2}};
  CHECK(p.next(s, at(0, 0)).what == ty::recover);
  p.recovered();
  s.recover.reset();
  CHECK(p.next(s, at(12, 0)).what == ty::run_clear);
}
