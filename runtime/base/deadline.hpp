#pragma once
/// Grace-period arithmetic: when must the final save be proposed? Pure
/// functions (the caller passes the clock), unit-tested.

#include <algorithm>
#include <cstdint>
#include <vector>

namespace grace {

/// 95th percentile of a sample window; 0 when empty.
inline int64_t p95(std::vector<int64_t> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, (v.size() * 95) / 100)];
}

/// Time to keep in hand before the deadline: `steps` steps still to run
/// (the one in flight on a peer and the agreed one: 2), plus the final save,
/// each at its p95, times a safety factor, plus a fixed allowance for the
/// agreement's round trips.
inline int64_t final_save_margin(const std::vector<int64_t>& step_ns, const std::vector<int64_t>& save_ns,
                                 double factor, int steps = 2, int64_t allowance_ns = 5'000'000) {
  return static_cast<int64_t>(factor * double(steps * p95(step_ns) + p95(save_ns))) + allowance_ns;
}

/// When the coordination service rescues a round its deadline would
/// otherwise cut off (runtime/coordination/agreement.hpp, "A save that respects its
/// deadline"): `rescue_ns` before the deadline it starts a just-in-time
/// round, `cutoff_ns` later it agrees among the acknowledgements it has.
/// The rescue needs room for the cutoff (half a step: survivors not stuck
/// answer within it), the save (its last measured time, half again for
/// noise) and an allowance for the round trips. The chief's final save,
/// proposed `final_save_margin` before the deadline (two steps and a save,
/// times the factor), has usually committed by then. When it has not, the
/// rescue's round reuses the save the chief may have in flight (the same
/// step on disk is reported, not written again), so acting early costs a
/// round trip, while acting late could cost the save.
struct rescue_timing {
  int64_t rescue_ns = 0;
  int64_t cutoff_ns = 0;
};
inline rescue_timing rescue_margins(int64_t slowest_step_ns, int64_t slowest_save_ns,
                                    int64_t allowance_ns = 10'000'000) {
  rescue_timing t;
  t.cutoff_ns = std::max<int64_t>(slowest_step_ns / 2, 1'000'000);
  t.rescue_ns = t.cutoff_ns + slowest_save_ns + slowest_save_ns / 2 + allowance_ns;
  return t;
}

/// True once the time left before the deadline is within the margin.
inline bool final_save_due(int64_t deadline_ns, int64_t now_ns, int64_t margin_ns) {
  return deadline_ns - now_ns <= margin_ns;
}

}  // namespace grace
