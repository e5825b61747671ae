#pragma once
/// Reading the events file (runtime/base/events.hpp) back: the failure harness,
/// the launcher's metrics and the goodput account follow it as it grows.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace grace {

/// One JSON line of the events file.
struct event {
  std::string name;
  int64_t t_ns = 0;
  int64_t pid = 0;
  int64_t rank = -1;  ///< -1: the launcher or the coordination service (it writes 2^32-1)
  int64_t incarnation = 0;
  nlohmann::json j;
  int64_t step() const { return j.contains("step") && j["step"].is_number() ? j["step"].get<int64_t>() : -1; }
  /// A numeric field, or `fallback` when absent or not a number.
  int64_t num(const char* field, int64_t fallback = 0) const {
    auto it = j.find(field);
    return it != j.end() && it->is_number() ? it->get<int64_t>() : fallback;
  }
  std::string str(const char* field) const {
    auto it = j.find(field);
    return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
  }
};

/// Parses one line; false for a torn or foreign line.
bool parse_event(const std::string& line, event& out);

/// Reads events appended to `path` since `offset` (complete lines only;
/// `offset` moves past them). Torn or foreign lines are skipped.
std::vector<event> read_events(const std::filesystem::path& path, uint64_t& offset);

}  // namespace grace
