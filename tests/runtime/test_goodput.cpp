#include "runtime/ops/goodput.hpp"
#include "runtime/ops/job_monitor.hpp"
#include "runtime/ops/metrics.hpp"

#include "../event_fixtures.hpp"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

using namespace grace;
using grace::testing::at_s;
using grace::testing::ev;

namespace {

/// Two groups: rank 1 is SIGKILLed at 10 s, the survivor saves just in
/// time, the group restarts from step 95 (6 steps behind the newest known
/// step, 101) and finishes at 20 s.
std::vector<event> timeline() {
  return {
      ev("group_started", 1, -1, 0),
      ev("first_step", 3, 0, 0, {{"step", 1}, {"ns", at_s(0.5)}}),
      ev("snapshot_done", 5, 0, 0, {{"step", 40}, {"kind", "periodic"}, {"ns", at_s(0.2)}}),
      ev("worker_exit", 10, -1, 0, {{"worker_rank", 1}, {"code", 137}, {"signal", 9}}),
      ev("peer_lost", 10.5, -1, 0, {{"lost_rank", 1}, {"step", 100}, {"verdict", "dead"}}),
      ev("agreed", 10.7, -1, 0, {{"id", 1}, {"step", 101}, {"kind", "jit"}}),
      ev("reached_agreed_step", 10.8, 0, 0, {{"step", 101}}),
      ev("snapshot_done", 10.9, 0, 0, {{"step", 101}, {"kind", "jit"}, {"ns", at_s(0.1)}}),
      ev("exit", 11.5, 0, 0, {{"step", 101}, {"code", 42}}),
      ev("worker_exit", 11.6, -1, 0, {{"worker_rank", 0}, {"code", 42}, {"signal", 0}}),
      ev("group_started", 12, -1, 1),
      ev("restored", 13.5, 0, 1, {{"step", 95}, {"ns", at_s(0.5)}}),
      ev("first_step", 14, 0, 1, {{"step", 96}, {"ns", at_s(0.1)}}),
      ev("finished", 20, 0, 1, {{"step", 200}}),
  };
}

}  // namespace

TEST_CASE("goodput: every second of a run with a failure is put to one cause", "[goodput]") {
  goodput_tracker t(0);
  std::optional<uint64_t> lost;
  for (auto& e : timeline()) {
    if (e.name == "worker_exit" && e.t_ns == at_s(10)) t.on_progress(1, 100, at_s(0.05), at_s(9.9));
    if (auto l = t.on_event(e)) lost = l;
    if (e.name == "worker_exit" && e.t_ns == at_s(11.6)) {
      t.group_ended();
      t.on_progress(0, 130, at_s(0.05), at_s(11.9));  // the next group's heartbeats, read before its restore
    }
  }
  REQUIRE(lost == 6u);
  auto a = t.account(at_s(21));
  CHECK(a.wall_s == Approx(21));
  CHECK(a.startup_s == Approx(2.5));     // launcher start to the first step
  CHECK(a.detection_s == Approx(0.5));   // the kill (its exit) to the verdict
  CHECK(a.agreement_s == Approx(0.2));   // the verdict to the agreed step
  CHECK(a.save_s == Approx(0.9));        // two snapshots and the wait for the commit
  CHECK(a.restart_s == Approx(1.8));     // 11.6 -> 12 between groups, 12 -> 13.4 to start
  CHECK(a.restore_s == Approx(0.5));
  CHECK(a.steps_recomputed == 6);
  CHECK(a.recompute_s == Approx(0.3));   // 6 steps of 50 ms
  CHECK(a.productive_s == Approx(13.2));
  CHECK(a.other_s == Approx(1.1));
  CHECK(a.faults == 1);
  CHECK(a.incarnations == 2);
  double sum = a.productive_s;
  for (auto& c : goodput_causes) sum += a.*c.seconds;
  CHECK(sum == Approx(a.wall_s));
}

TEST_CASE("goodput: a chief cut off from the job and running into the next group is not counted twice",
          "[goodput]") {
  // Host 0 (rank 0) is cut off at 10 s: the others save just in time and a
  // new group starts at 12 s, while the fenced chief runs on until its exit
  // at 25 s and writes a save wait that outlasts its group.
  goodput_tracker t(0);
  for (auto& e : {ev("group_started", 1, -1, 0), ev("first_step", 2, 0, 0, {{"ns", at_s(0.5)}}),
                  ev("worker_exit", 11, -1, 0, {{"worker_rank", 1}, {"code", 42}}),
                  ev("group_started", 12, -1, 1), ev("first_step", 13, 0, 1, {{"ns", at_s(0.1)}}),
                  ev("reached_agreed_step", 11.8, 0, 0, {{"step", 90}}),
                  ev("exit", 25, 0, 0, {{"step", 90}, {"code", 42}}),
                  ev("worker_exit", 25.1, -1, 0, {{"worker_rank", 0}, {"code", 42}}),
                  ev("finished", 30, 0, 1, {{"step", 300}})})
    t.on_event(e);
  auto a = t.account(at_s(30));
  CHECK(a.ratio() <= 1.0);
  CHECK(a.restart_s == Approx(0.9));              // group 1's start to its first step (group 0 counted to 12 s)
  CHECK(a.save_s == Approx(0.2));                 // the wait is clipped at the next group's start
  CHECK(a.productive_s == Approx(10.3 + 17.1));  // 1.5 -> 12 less the clipped wait, then 12.9 -> 30
  double sum = a.productive_s;
  for (auto& c : goodput_causes) sum += a.*c.seconds;
  CHECK(sum == Approx(a.wall_s));
}

TEST_CASE("goodput: a run without faults loses only its startup and saves", "[goodput]") {
  goodput_tracker t(0);
  t.on_event(ev("group_started", 0.5, -1, 0));
  t.on_event(ev("first_step", 1.2, 0, 0, {{"ns", at_s(0.2)}}));
  t.on_event(ev("snapshot_done", 3, 0, 0, {{"ns", at_s(0.25)}}));
  t.on_event(ev("finished", 11, 0, 0, {{"step", 500}}));
  auto a = t.account(at_s(11));
  CHECK(a.startup_s == Approx(1.0));
  CHECK(a.save_s == Approx(0.25));
  CHECK(a.productive_s == Approx(9.75));
  CHECK(a.faults == 0);
  CHECK(a.steps_recomputed == 0);
  CHECK(a.ratio() == Approx(9.75 / 11));
}

TEST_CASE("goodput: a restore with nothing lost costs no recomputation", "[goodput]") {
  goodput_tracker t(0);
  t.on_event(ev("exit", 5, 1, 0, {{"step", 120}}));
  t.group_ended();
  CHECK(t.on_event(ev("restored", 7, 0, 1, {{"step", 120}, {"ns", at_s(0.1)}})) == 0u);
  CHECK(t.high_water() == 120);
}

TEST_CASE("goodput: accounts add up across runs and survive JSON", "[goodput]") {
  goodput_tracker t(0);
  for (auto& e : timeline()) t.on_event(e);
  auto one = t.account(at_s(21));
  auto sum = one;
  sum += one;
  CHECK(sum.runs == 2);
  CHECK(sum.wall_s == Approx(42));
  CHECK(sum.restart_s == Approx(2 * one.restart_s));
  auto back = goodput_account::from_json(sum.to_json());
  CHECK(back.wall_s == Approx(sum.wall_s));
  CHECK(back.productive_s == Approx(sum.productive_s));
  CHECK(back.detection_s == Approx(sum.detection_s));
  CHECK(back.steps_recomputed == sum.steps_recomputed);
  CHECK(back.runs == 2);
  // A damaged file reads as an empty account, never a crash.
  CHECK(goodput_account::from_json(nlohmann::json::array()).wall_s == 0);
  CHECK(goodput_account::from_json({{"wall_s", "x"}, {"lost_s", 3}}).wall_s == 0);
}

TEST_CASE("goodput: restart reasons", "[goodput]") {
  CHECK(std::string(restart_reason(false, false, false)) == "preempted");
  CHECK(std::string(restart_reason(true, false, false)) == "crash");
  CHECK(std::string(restart_reason(true, false, true)) == "member_lost");
  CHECK(std::string(restart_reason(false, true, true)) == "rendezvous");
}

TEST_CASE("metrics: events and heartbeats become Prometheus series", "[metrics]") {
  job_metrics m;
  goodput_tracker t(0);
  m.on_progress(0, 10, at_s(0.02));
  m.on_progress(0, 10, at_s(0.02));  // no progress: no new step-time sample
  m.on_progress(0, 12, at_s(0.03));
  m.on_event(ev("claim", 1, -1, 0, {{"by", 4294967295u}, {"source", 4}}), {});
  m.on_event(ev("agreed", 1.25, -1, 0, {{"id", 3}, {"step", 50}, {"kind", "preemption"}}), {});
  m.on_event(ev("committed", 2.25, -1, 0, {{"id", 3}, {"step", 50}}), {});
  m.on_event(ev("committed_local", 2.2, 0, 0, {{"step", 50}, {"kind", "preemption"}, {"bytes", 4096}, {"write_ns", 5}}),
             {});
  m.on_event(ev("committed_local", 3, 0, 0, {{"step", 60}, {"kind", "periodic"}, {"bytes", 1000}, {"write_ns", 5}}),
             {});
  m.on_event(ev("save_failed", 4, 0, 0, {{"step", 70}, {"kind", "periodic"}, {"error", "disk full"}}), {});
  m.on_event(ev("peer_lost", 5, -1, 0, {{"lost_rank", 2}, {"verdict", "hung"}}), {});
  m.on_event(ev("restored", 6, 0, 1, {{"step", 60}, {"ns", at_s(0.4)}}), 3);
  m.on_event(ev("finished", 9, 1, 1, {{"step", 99}}), {});
  m.on_restart("member_lost");
  goodput_account a;
  a.wall_s = 10;
  a.productive_s = 8;
  a.restart_s = 2;
  m.set_goodput(a);
  auto text = m.text();
  auto has = [&](const std::string& line) {
    INFO(line);
    CHECK(text.find(line + "\n") != std::string::npos);
  };
  has("grace_completed_step{rank=\"0\"} 12");
  has("grace_completed_step{rank=\"1\"} 99");
  has("grace_step_duration_seconds_count{rank=\"0\"} 2");
  has("grace_notices_total{source=\"launcher\"} 1");
  has("grace_agreements_total{kind=\"preemption\"} 1");
  has("grace_agreement_latency_seconds_sum{kind=\"preemption\"} 0.25");
  has("grace_save_commit_seconds_sum{kind=\"preemption\"} 1");
  has("grace_saves_total{kind=\"periodic\",outcome=\"committed\"} 1");
  has("grace_saves_total{kind=\"periodic\",outcome=\"failed\"} 1");
  has("grace_save_bytes_total{kind=\"preemption\"} 4096");
  has("grace_members_lost_total{verdict=\"hung\"} 1");
  has("grace_restores_total 1");
  has("grace_steps_lost_total 3");
  has("grace_restarts_total{reason=\"member_lost\"} 1");
  has("grace_goodput_ratio 0.8");
  has("grace_lost_seconds{cause=\"restart\"} 2");
}
