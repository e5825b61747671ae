#pragma once
/// grace-launch's view of the job for its operators: it follows the events
/// file that the launcher, the coordination service and the workers append
/// to, takes the heartbeats the service accepts, keeps the Prometheus
/// metrics (runtime/metrics) and the goodput account (runtime/goodput),
/// serves /metrics over HTTP when asked, and persists the account beside
/// the checkpoints (grace-goodput.json), so that the account covers every
/// run of the job, a killed launcher's run included (to within a second).

#include "runtime/base/error.hpp"
#include "runtime/ops/goodput.hpp"

#include <filesystem>
#include <memory>
#include <string>

namespace grace {

struct monitor_config {
  std::filesystem::path checkpoint_dir;  ///< empty: the account is not persisted
  bool keeps_account = false;            ///< node 0: persists the job's account
  std::string metrics_host = "127.0.0.1";
  int metrics_port = 0;  ///< 0: no HTTP server
  std::string run_id;
};

/// The reason label of a group restart in grace_restarts_total.
const char* restart_reason(bool crashed, bool rendezvous_failed, bool member_lost);

class job_monitor {
public:
  /// Chooses the events file (GRACE_EVENTS_FILE, else grace-events.jsonl
  /// beside the checkpoints, else a temporary file) and exports it to this
  /// process and its children; binds the metrics port. Call before the
  /// first event is written.
  static result<std::unique_ptr<job_monitor>> start(const monitor_config& c);
  ~job_monitor();

  /// A heartbeat the coordination service accepted (its actor thread).
  void progress(uint32_t rank, uint64_t completed, int64_t last_step_ns);
  /// The group ended and starts again.
  void restart(bool crashed, bool rendezvous_failed);
  /// Reads the last events, persists and returns the job's account (every
  /// run so far, this one included). Stops following the file.
  goodput_account finish();
  /// Where the metrics are served ("" when not).
  std::string url() const;

  struct impl;

private:
  explicit job_monitor(std::unique_ptr<impl> d);
  std::unique_ptr<impl> d_;
};

}  // namespace grace
