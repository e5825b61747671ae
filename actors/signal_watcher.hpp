#pragma once
/// Watches for termination notices on one dedicated thread ("grace.signals"):
/// SIGTERM/SIGINT (blocked in every other thread the process starts; this
/// one unblocks them, so the kernel delivers them here at once; a handler
/// writes the number to a pipe the thread polls), and optional
/// watchers polled on an interval: a notice file appearing, a command that
/// exits 0, a user callback (the hook for cloud maintenance-event queries).
/// Each notice goes to the sink (the peer watcher) once per source.

#include "runtime/base/notice_source.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>

namespace grace {

struct notice_info {
  notice_source source;
  std::string detail;
  int64_t received_ns = 0;
  int64_t deadline_ns = 0;  ///< 0: no grace period
};

struct signal_watcher_config {
  std::string notice_file;
  std::string notice_command;
  std::function<bool()> callback;
  std::chrono::milliseconds poll_interval{1000};
  std::chrono::milliseconds grace_period{0};  ///< deadline = notice + grace period (0: none)
};

/// Blocks SIGTERM and SIGINT in the calling thread (and threads it starts
/// later). Call first thing in `main`, before any thread exists.
void block_termination_signals();

class signal_watcher {
public:
  using sink = std::function<void(const notice_info&)>;
  signal_watcher(signal_watcher_config cfg, sink out);
  ~signal_watcher();
  signal_watcher(const signal_watcher&) = delete;
  signal_watcher& operator=(const signal_watcher&) = delete;
  void stop();

private:
  void loop();
  signal_watcher_config cfg_;
  sink out_;
  std::atomic<bool> stop_{false};
  bool handlers_ = false;  ///< pipe and handlers installed: the thread may unblock the signals
  std::thread thread_;
};

}  // namespace grace
