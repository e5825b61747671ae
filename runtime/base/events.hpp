#pragma once
/// Structured phase events: one JSON object per line, so the launcher, the
/// failure harness or a script can rebuild a timeline from the logs.
///
/// Every event carries `event`, `t_ns` (wall clock, ns since the Unix epoch),
/// `rank` and `incarnation`; the rest is per event (step, durations...). The
/// lines go to the "grace.events" spdlog logger (debug level) and, when
/// GRACE_EVENTS_FILE is set, are appended to that file with one write(2) each
/// (O_APPEND, so several processes can share the file).

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>

namespace grace {

/// Wall-clock nanoseconds since the Unix epoch.
int64_t wall_ns() noexcept;
/// Monotonic nanoseconds (durations).
int64_t mono_ns() noexcept;

/// Sets the identity stamped on every event of this process.
void set_event_identity(uint32_t rank, uint32_t incarnation);
/// Records one event.
void emit_event(const std::string& name, const nlohmann::json& fields);

}  // namespace grace
