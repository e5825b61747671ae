#include "runtime/base/deadline.hpp"

#include <catch2/catch.hpp>

using namespace grace;

TEST_CASE("deadline: p95 of a window", "[deadline]") {
  CHECK(p95({}) == 0);
  CHECK(p95({7}) == 7);
  std::vector<int64_t> v;
  for (int i = 1; i <= 100; ++i) v.push_back(i);
  CHECK(p95(v) == 96);  // index 95 of 1..100
  v.push_back(10'000);  // one outlier moves p95 little
  CHECK(p95(v) < 100);
}

TEST_CASE("deadline: the final save is proposed when time left reaches the margin", "[deadline]") {
  const int64_t ms = 1'000'000;
  std::vector<int64_t> steps(20, 10 * ms), saves{200 * ms};
  auto margin = final_save_margin(steps, saves, 1.5, 2, 5 * ms);
  CHECK(margin == 335 * ms);  // 1.5 * (2 * 10 + 200) ms + 5 ms
  const int64_t deadline = 10'000 * ms;
  CHECK_FALSE(final_save_due(deadline, deadline - 336 * ms, margin));
  CHECK(final_save_due(deadline, deadline - 335 * ms, margin));
  CHECK(final_save_due(deadline, deadline + 5 * ms, margin));  // already late: propose at once
  // A shorter deadline (a later notice) makes it due earlier.
  CHECK(final_save_due(deadline / 2, deadline / 2 - 100 * ms, margin));
  // No measurements yet and no allowance: due only at the deadline.
  CHECK(final_save_margin({}, {}, 1.5, 2, 0) == 0);
}

TEST_CASE("deadline: the rescue leaves room for a save and acts after the chief's final proposal", "[deadline]") {
  const int64_t step = 20'000'000, save = 100'000'000;
  auto t = rescue_margins(step, save);
  CHECK(t.cutoff_ns == step / 2);
  CHECK(t.rescue_ns == step / 2 + save + save / 2 + 10'000'000);
  CHECK(t.rescue_ns - t.cutoff_ns >= save + save / 2);  // the save, with room to spare, after the cutoff
  std::vector<int64_t> steps(10, step), saves(3, save);
  CHECK(final_save_margin(steps, saves, 2.0) > t.rescue_ns);  // the chief proposes first
  // Nothing reported yet: small but positive.
  auto z = rescue_margins(0, 0);
  CHECK(z.cutoff_ns == 1'000'000);
  CHECK(z.rescue_ns == 11'000'000);
}
