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

/// True once the time left before the deadline is within the margin.
inline bool final_save_due(int64_t deadline_ns, int64_t now_ns, int64_t margin_ns) {
  return deadline_ns - now_ns <= margin_ns;
}

} // namespace grace
