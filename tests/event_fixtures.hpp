#pragma once
// Events as an events file holds them, for the tests of what is computed
// from them (goodput, grace-chaos's verdicts).
#include "runtime/base/event_reader.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>

namespace grace::testing {

constexpr int64_t sec = 1000000000;
inline int64_t at_s(double seconds) { return static_cast<int64_t>(seconds * sec); }

/// An event at `t` seconds; rank -1 is the launcher or the coordination
/// service.
inline event ev(const char* name, double t, int64_t rank, int64_t inc,
                nlohmann::json fields = nlohmann::json::object()) {
  event e;
  e.name = name;
  e.t_ns = at_s(t);
  e.rank = rank;
  e.incarnation = inc;
  e.j = std::move(fields);
  return e;
}

}  // namespace grace::testing
