#pragma once
/// Where a preemption notice came from (messages/grace.capnp NoticeSource
/// has the same values, in the same order).

#include <cstdint>

namespace grace {

enum class notice_source : uint8_t { signal = 0, file = 1, command = 2, callback = 3, launcher = 4, test = 5 };

/// "signal", "file", ...: the names events, metrics and the Python module use.
inline const char* notice_source_name(int64_t v) {
  static const char* names[] = {"signal", "file", "command", "callback", "launcher", "test"};
  return v >= 0 && v < 6 ? names[v] : "unknown";
}
inline const char* notice_source_name(notice_source s) { return notice_source_name(static_cast<int64_t>(s)); }

}  // namespace grace
