#pragma once
/// The composition root: builds the actor system of a Grace process (worker
/// or launcher) and decides which actor runs where. Nothing else spawns.

#include "runtime/net/tls.hpp"

#include <chrono>
#include <cstddef>
#include <memory>

namespace caf {
class actor_system;
class actor_system_config;
}  // namespace caf

namespace grace {

struct system_options {
  /// Scheduler threads: few, so training keeps its cores (CAF would start
  /// max(cores, 4) polling threads).
  size_t scheduler_threads = 2;
  /// CAF's `sharing` policy: one queue and a condition variable. The default
  /// work-stealing policy polls (sleeping 50 us between attempts for 25 ms
  /// after any job), which delays every protocol hop when workers outnumber
  /// cores (measurements: docs/BENCHMARKS.md). Grace's actors are few and
  /// short-lived per message, so stealing buys nothing.
  bool sharing_scheduler = true;
  /// BASP worker threads of CAF's middleman (CAF's default is 1 on 2 cores).
  /// 0 deserializes an incoming message on the multiplexer thread and
  /// enqueues it to the actor directly: one thread handoff less per hop.
  /// Grace's messages are small, so there is nothing to parallelize
  /// (measurements: docs/BENCHMARKS.md).
  size_t middleman_workers = 0;
  /// CAF's node-level failure detection is off by default in 0.17; a frozen
  /// peer (SIGSTOP) is never noticed without it. Must match on every node.
  std::chrono::milliseconds middleman_heartbeat{500};
  std::chrono::milliseconds connection_timeout{5000};
  /// Certificates (checked: check_tls_files): when given, every connection
  /// of this system to or from another Grace process is mutual TLS.
  tls_files tls;
};

/// An actor system and the config it references (kept alive together).
class actor_runtime {
public:
  explicit actor_runtime(const system_options& opts = {});
  ~actor_runtime();
  caf::actor_system& sys() { return *sys_; }

private:
  std::unique_ptr<caf::actor_system_config> cfg_;
  std::unique_ptr<caf::actor_system> sys_;
};

}  // namespace grace
