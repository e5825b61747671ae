#include "runtime/launch/group_policy.hpp"

#include "runtime/base/exit_codes.hpp"

namespace grace {

exit_effect classify_exit(int code, int signal, int restart_code) {
  if (signal) return exit_effect::restart;
  if (code == 0) return exit_effect::finished;
  if (code == restart_code || code == exit_code::no_rendezvous) return exit_effect::restart;
  if (code == exit_code::usage) return exit_effect::usage;
  return exit_effect::fatal;
}

bool replace_in_place(const replace_conditions& c) {
  if (!c.in_place || c.group_ending || c.restarts >= c.max_restarts) return false;
  return c.effect == exit_effect::restart && c.signal != 0;
}

void group_end::add(exit_effect e, bool no_rendezvous, const std::string& describe) {
  if (e == exit_effect::finished) return;
  if (cause.empty()) cause = describe;
  switch (e) {
    case exit_effect::restart:
      restart = true;
      rendezvous_failed |= no_rendezvous;
      break;
    case exit_effect::usage: usage = true; [[fallthrough]];
    case exit_effect::fatal:
      if (!fatal) fatal_cause = describe;
      fatal = true;
      break;
    case exit_effect::finished: break;
  }
}

namespace {
std::string rendezvous_advice(const group_context& c) {
  if (c.level_problem.empty()) return c.rendezvous_hint;
  return "the node-local checkpoints could not be brought level (" + c.level_problem +
         "), so the ranks restored different steps and were refused; nothing was deleted: bring back the node "
         "that holds the missing parts (or its disk) and relaunch, or move the checkpoint directories aside to "
         "start over";
}
}  // namespace

launcher_decision decide_after_group(const group_end& g, const group_context& c, rendezvous_streak& streak) {
  if (g.fatal)
    return {false, true, g.usage ? exit_code::usage : exit_code::fatal, "fatal error, not restarting: " + g.fatal_cause};
  if (!g.restart)
    return {false, true, exit_code::success,
            c.notice_forwarded ? "all workers finished (a notice arrived at the very end)"
                               : "all " + std::to_string(c.nproc) + " workers finished"};
  if (c.notice_forwarded)
    return {false, true, c.restart_code, "preempted: workers saved and exited; restart this job to resume"};
  if (streak.group_ended(g.rendezvous_failed))
    return {false, true, exit_code::no_progress,
            "the group failed its rendezvous " + std::to_string(streak.count()) + " times in a row (last: " + g.cause +
                "): " + rendezvous_advice(c)};
  if (c.membership_change)
    return {true, false, 0, "the group grows: a node waited to join (a membership change, not counted as a restart)"};
  if (c.restarts >= c.max_restarts)
    return {false, true, exit_code::no_progress,
            "restarts exhausted (" + std::to_string(c.max_restarts) + "), last cause: " + g.cause};
  return {true, true, 0, g.cause};
}

std::string level_problem_after(const std::string& before, bool failed, const std::string& error,
                                bool heard_every_peer) {
  if (failed) return error;
  return heard_every_peer ? std::string() : before;
}

launcher_decision coordinator_gone(const std::string& where, int64_t waited_ms, uint64_t newest_step,
                                   int restart_code, const std::string& signal_name,
                                   const std::string& level_problem) {
  launcher_decision d;
  d.code = restart_code;
  std::string resume = !level_problem.empty()
                           ? "this node's checkpoints could not be brought level with the other nodes' (" +
                                 level_problem + "): it resumes only with the node that holds the missing parts"
                       : newest_step ? "it resumes from the newest committed checkpoint, step " +
                                           std::to_string(newest_step)
                                     : "there is no committed checkpoint yet: it starts over";
  if (!signal_name.empty())
    d.reason = "received " + signal_name + " while the coordination service at " + where +
               " was unreachable: nothing to save here (the workers have exited); " + resume + " when relaunched";
  else
    d.reason = "the coordination service at " + where + " is gone: unreachable for " +
               std::to_string(waited_ms / 1000) + " s after this node's group ended, and without it no step can be "
               "agreed; relaunch the job (with the node that hosts it): " + resume;
  return d;
}

}  // namespace grace
