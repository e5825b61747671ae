#pragma once
/// Exit codes: a contract between workers, the launcher and schedulers.
namespace grace::exit_code {
constexpr int success = 0;       ///< the run finished
constexpr int usage = 2;         ///< bad flags, configuration or input
constexpr int fatal = 3;         ///< an error in a step (a bug): do not restart
constexpr int restart = 42;      ///< preempted or a peer was lost: restart the group (configurable)
constexpr int unhealthy = 43;    ///< this node is unhealthy: restart elsewhere
constexpr int no_progress = 44;  ///< restarts exhausted or no progress: stop restarting
/// A worker could not join its group: the coordination service was
/// unreachable, or the collectives' rendezvous failed (often an address the
/// peers cannot reach). The launcher restarts the group, but stops with
/// no_progress after --max-rendezvous-failures such groups in a row.
constexpr int no_rendezvous = 45;
}  // namespace grace::exit_code

#include "runtime/base/error.hpp"

namespace grace {
/// The exit code for a worker whose session could not attach: bad
/// configuration or input stops (usage); an unreachable coordination
/// service is a failed rendezvous (no_rendezvous: the launcher retries and
/// gives up after several in a row); a join refused for now (the group lost
/// a member and is stopping, a stale incarnation) restarts.
constexpr int attach_failure_exit(errc e, int restart_code) noexcept {
  switch (e) {
    case errc::invalid_input: return exit_code::usage;
    case errc::disconnected: return exit_code::no_rendezvous;
    default: return restart_code;
  }
}
}  // namespace grace
