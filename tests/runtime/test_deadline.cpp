#include "runtime/deadline.hpp"

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
