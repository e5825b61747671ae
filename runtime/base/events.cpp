#include "runtime/base/events.hpp"

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fcntl.h>
#include <unistd.h>

namespace grace {

namespace {
std::atomic<uint32_t> event_rank{0};
std::atomic<uint32_t> event_incarnation{0};

int events_fd() {
  static int fd = [] {
    const char* path = std::getenv("GRACE_EVENTS_FILE");
    if (!path || !*path) return -1;
    int f = ::open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (f < 0) spdlog::warn("cannot open GRACE_EVENTS_FILE {}: events go to the log only", path);
    return f;
  }();
  return fd;
}
}  // namespace

int64_t wall_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int64_t mono_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void set_event_identity(uint32_t rank, uint32_t incarnation) {
  event_rank = rank;
  event_incarnation = incarnation;
}

void emit_event(const std::string& name, const nlohmann::json& fields) {
  nlohmann::json j = {{"event", name},
                      {"t_ns", wall_ns()},
                      {"pid", ::getpid()},
                      {"rank", event_rank.load()},
                      {"incarnation", event_incarnation.load()}};
  if (fields.is_object())
    for (auto& [k, v] : fields.items()) j[k] = v;
  // Strings in events come from messages and command lines: bytes that are
  // not UTF-8 are replaced (U+FFFD), never thrown about (an exception here
  // would end the coordination service's actor).
  auto line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  spdlog::debug("event {}", line);
  int fd = events_fd();
  if (fd >= 0) {
    line.push_back('\n');
    ssize_t n = ::write(fd, line.data(), line.size());
    (void)n;
  }
}

}  // namespace grace
