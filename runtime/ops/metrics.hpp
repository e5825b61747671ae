#pragma once
/// The job's Prometheus metrics, kept by grace-launch (runtime/job_monitor)
/// from the events its workers and the coordination service already write
/// and from the heartbeats the service receives: nothing is added to the
/// trainer's step. Names follow Prometheus conventions (grace_ prefix,
/// base units, _total counters); the README ("Metrics and goodput") lists them.

#include "runtime/base/event_reader.hpp"
#include "runtime/ops/goodput.hpp"

#include <memory>
#include <string>

namespace prometheus {
class Registry;
}

namespace grace {

class job_metrics {
public:
  job_metrics();
  ~job_metrics();
  job_metrics(const job_metrics&) = delete;
  job_metrics& operator=(const job_metrics&) = delete;

  /// One event from the events file. `steps_lost`: what the goodput tracker
  /// found the event cost (a restore after a failure).
  void on_event(const event& e, std::optional<uint64_t> steps_lost);
  /// A heartbeat the coordination service accepted.
  void on_progress(uint32_t rank, uint64_t completed, int64_t last_step_ns);
  /// The launcher starts the group again; `reason` is one word
  /// (preempted, failure, member_lost...).
  void on_restart(const std::string& reason);
  /// The job's account so far (all runs).
  void set_goodput(const goodput_account& a);

  std::shared_ptr<prometheus::Registry> registry() const;
  /// The text exposition format, as a scrape would see it.
  std::string text() const;

private:
  struct impl;
  std::unique_ptr<impl> d_;
};

}  // namespace grace
