#include "runtime/checkpoint/save_interval.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <unistd.h>

using namespace grace;

namespace {

const double work = 30 * 24 * 3600.0;  // a month of training
const double restart = 120;

/// The brute force: the interval minimising the expected wall time, over a
/// grid 0.1% apart from 1 s to ten MTBFs.
double brute_force_optimum(double cost, double mtbf) {
  double best = 1, best_t = expected_wall_time(work, 1, cost, restart, mtbf);
  for (double t = 1; t < 10 * mtbf; t *= 1.001) {
    double w = expected_wall_time(work, t, cost, restart, mtbf);
    if (w < best_t) best_t = w, best = t;
  }
  return best;
}

/// Expected time lost to failures and saves (wall time beyond the work).
double lost(double interval, double cost, double mtbf) {
  return expected_wall_time(work, interval, cost, restart, mtbf) - work;
}

failure_history sampled(double mtbf, int failures, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> life(1 / mtbf);
  failure_history h;
  for (int i = 0; i < failures; ++i) h.gaps_s.push_back(life(rng));
  return h;
}

}  // namespace

TEST_CASE("save interval: Daly's rule is within 10% of the brute-force optimum", "[save_interval]") {
  for (double mtbf : {600.0, 3600.0, 86400.0}) {
    for (double cost : {0.5, 5.0, 60.0}) {
      double chosen = daly_interval(cost, mtbf), best = brute_force_optimum(cost, mtbf);
      INFO("mtbf " << mtbf << " cost " << cost << " chosen " << chosen << " optimum " << best);
      CHECK(std::abs(chosen - best) <= 0.10 * best);
      CHECK(lost(chosen, cost, mtbf) <= 1.001 * lost(best, cost, mtbf));
    }
  }
  CHECK(daly_interval(10, 4) == 4);  // a save costlier than two MTBFs: save once per MTBF
  CHECK(daly_interval(0, 3600) == 0);
}

TEST_CASE("save interval: from simulated failures the expected lost time is within 10% of the optimum",
          "[save_interval]") {
  const double prior = 6 * 3600;
  for (double mtbf : {600.0, 3600.0, 36000.0}) {
    for (uint64_t seed = 1; seed <= 20; ++seed) {
      save_interval si(prior, sampled(mtbf, 8, seed));
      REQUIRE(si.seconds() == 0);  // nothing measured yet: save early to measure
      si.on_save_cost(5'000'000'000);
      double chosen = si.seconds(), best = brute_force_optimum(5, mtbf);
      INFO("mtbf " << mtbf << " seed " << seed << " estimated " << si.mtbf_s() << " chosen " << chosen << " optimum "
                   << best);
      CHECK(lost(chosen, 5, mtbf) <= 1.10 * lost(best, 5, mtbf));
    }
  }
}

TEST_CASE("save interval: adapts when the failure rate changes", "[save_interval]") {
  auto h = sampled(36000, 8, 7);
  save_interval calm(6 * 3600, h);
  calm.on_save_cost(5'000'000'000);
  auto storm = sampled(900, 8, 8);  // then failures forty times as often
  h.gaps_s.insert(h.gaps_s.end(), storm.gaps_s.begin(), storm.gaps_s.end());
  save_interval now(6 * 3600, h);
  now.on_save_cost(5'000'000'000);
  INFO("calm " << calm.seconds() << " storm " << now.seconds());
  CHECK(now.seconds() < calm.seconds() / 4);
  CHECK(lost(now.seconds(), 5, 900) <= 1.10 * lost(brute_force_optimum(5, 900), 5, 900));
}

TEST_CASE("save interval: the prior until failures are seen, then the observed run time", "[save_interval]") {
  failure_history none;
  CHECK(estimate_mtbf(none, 3600) == 3600);
  none.open_s = 7200;  // two hours without a failure: the estimate grows
  CHECK(estimate_mtbf(none, 3600) == 10800);
  failure_history two{{100, 300}, 0};
  CHECK(estimate_mtbf(two, 3600) == 200);
  two.open_s = 400;  // the running gap adds run time, not a failure
  CHECK(estimate_mtbf(two, 3600) == 400);
  failure_history many{{1, 1, 1, 1, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000}, 0};
  CHECK(estimate_mtbf(many, 3600, 8) == 1000);  // only the last eight gaps

  save_interval si(3600, {});
  si.on_save_cost(1'000'000'000);
  si.on_save_cost(9'000'000'000);  // an outlier
  si.on_save_cost(2'000'000'000);
  CHECK(si.seconds() == Approx(daly_interval(2, 3600)));  // the median cost
  si.set_running(3600);
  CHECK(si.mtbf_s() == 7200);
}

TEST_CASE("save interval: the launcher's failure history file", "[save_interval]") {
  char tmpl[] = "/tmp/grace-failures-XXXXXX";
  int fd = ::mkstemp(tmpl);
  REQUIRE(fd >= 0);
  ::close(fd);
  {
    std::ofstream f(tmpl);
    f << "{\"start\":true}\n{\"run_s\":100,\"failure\":false}\n"  // a preemption: run time only
      << "{\"start\":true}\n{\"run_s\":50,\"failure\":true}\n"    // a failure after 150 s in all
      << "not json\n"                                             // a damaged line: skipped
      << "{\"start\":true}\n"                                     // its launcher was killed
      << "{\"start\":true}\n{\"run_s\":30,\"failure\":false}\n"
      << "{\"start\":true}\n";  // the running incarnation
  }
  auto h = read_failure_history(tmpl);
  REQUIRE(h.gaps_s.size() == 2);
  CHECK(h.gaps_s[0] == 150);
  CHECK(h.gaps_s[1] == 0);
  CHECK(h.open_s == 30);
  std::remove(tmpl);
  auto missing = read_failure_history("/nonexistent/grace-failures.jsonl");
  CHECK(missing.gaps_s.empty());
  CHECK(missing.open_s == 0);
}

TEST_CASE("save backoff: a failed periodic save is retried after a doubling delay, reset by a success",
          "[save_interval]") {
  const int64_t s = 1'000'000'000;
  save_backoff b(1 * s, 4 * s);
  CHECK_FALSE(b.pending());
  CHECK_FALSE(b.due(100 * s));
  CHECK(b.failed(10 * s) == 1 * s);
  CHECK(b.pending());
  CHECK_FALSE(b.due(10 * s + s - 1));
  CHECK(b.due(11 * s));
  CHECK(b.failed(11 * s) == 2 * s);
  CHECK(b.failed(13 * s) == 4 * s);
  CHECK(b.failed(17 * s) == 4 * s);  // capped
  CHECK(b.failures() == 4);
  CHECK_FALSE(b.due(20 * s));
  CHECK(b.due(21 * s));
  b.succeeded();
  CHECK_FALSE(b.pending());
  CHECK(b.failed(30 * s) == 1 * s);  // from the first delay again
}
