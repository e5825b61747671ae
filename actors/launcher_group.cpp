#include "actors/launcher_parts.hpp"

#include "runtime/base/events.hpp"
#include "runtime/coordination/agreement.hpp"
#include "runtime/base/exit_codes.hpp"

#include <caf/actor_system.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <nlohmann/json.hpp>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <poll.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

namespace grace::launch {

std::string describe(const worker_proc& w) {
  if (w.signal) return "killed by signal " + std::to_string(w.signal) + " (" + strsignal(w.signal) + ")";
  return "exit code " + std::to_string(w.code);
}

status launcher::start_group() {
  group_.workers.assign(o_.nproc, worker_proc{});
  const auto spares_deadline = group_.spares ? group_.spares->ready_deadline() : standby_pool::clock::now();
  for (int i = 0; i < o_.nproc; ++i) {
    int rank = rank_of(i);
    group_.workers[i].rank = rank;
    group_.workers[i].pid = start_worker(i, worker_environment(rank, i), spares_deadline);
    if (group_.workers[i].pid < 0) return error{errc::failed, std::string("fork failed: ") + std::strerror(errno)};
  }
  nlohmann::json pids = nlohmann::json::object();
  for (auto& w : group_.workers) pids[std::to_string(w.rank)] = w.pid;
  emit_event("group_started", {{"incarnation", shape_.incarnation}, {"workers", o_.nproc}, {"pids", pids}});
  return {};
}

/// A worker of the group: its spare if one is usable (--standby), else a
/// new process.
pid_t launcher::start_worker(int local_rank, const env_map& env, standby_pool::clock::time_point spares_deadline) {
  if (group_.spares && group_.spares->count() > 0) {
    auto pid = group_.spares->release(local_rank, env, spares_deadline);
    if (pid) {
      emit_event("standby_released", {{"worker_rank", rank_of(local_rank)}, {"pid", *pid}});
      return *pid;
    }
    say("local rank " + std::to_string(local_rank) + ": spare not used (" + pid.err().message +
        "): starting the worker from scratch");
  }
  return spawn_process(o_.command, env);
}

/// Starts one spare per local rank for the next incarnation. Their
/// environment is this incarnation's; the release replaces it.
void launcher::start_spares() {
  nlohmann::json pids = nlohmann::json::object();
  for (int i = 0; i < o_.nproc; ++i) {
    const int rank = rank_of(i);
    auto pid = group_.spares->start(i, spare_environment(worker_environment(rank, i)));
    if (!pid) {
      say("spares not started: " + pid.err().message);
      group_.spares->discard();
      return;
    }
    pids[std::to_string(rank)] = *pid;
  }
  group_.spares_said_ready = false;
  emit_event("standby_started", {{"for_incarnation", shape_.incarnation + 1}, {"pids", pids}});
}

/// --standby, while the group runs: starts the spares --standby-delay-ms
/// after the group started (while it is intact and a restart may still
/// come), and notes when they are all ready.
void launcher::watch_spares(bool group_intact, std::chrono::steady_clock::time_point started) {
  if (!group_.spares) return;
  spare_conditions c;
  c.spares = group_.spares->count();
  c.started_for_this_group = group_.spares_for == shape_.incarnation;
  c.group_intact = group_intact;
  c.stopping = group_.notice_forwarded;
  c.restarts_left = o_.max_restarts - shape_.restarts;
  c.group_age = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started);
  c.delay = o_.standby_delay;
  if (should_start_spares(c)) {
    group_.spares_for = shape_.incarnation;
    start_spares();
  }
  for (auto& [rank, fd] : group_.spares->waiting_fds()) group_.spares->check_ready(rank);
  if (!group_.spares_said_ready && group_.spares->count() == o_.nproc && group_.spares->ready_count() == o_.nproc) {
    group_.spares_said_ready = true;
    emit_event("standby_ready", {{"for_incarnation", shape_.incarnation + 1}, {"spares", o_.nproc}});
    say(std::to_string(o_.nproc) + " spare(s) ready for a restart");
  }
}

/// Declared dead by the coordinator: kill our own worker now (never a
/// worker another launcher started, never one of an older group).
void launcher::kill_declared_dead() {
  for (auto& v : group_.verdicts->take()) {
    if (v.incarnation != shape_.incarnation) continue;
    for (auto& w : group_.workers) {
      if (w.rank != static_cast<int>(v.rank) || w.exited || w.killed_lost) continue;
      // A replacement (recovery in place) is killed only on a verdict about
      // itself: the one about the process it replaced may come after it
      // started. (A command behind a wrapper joins with another pid: its
      // replacement then ends by the exit timeout instead.)
      if (w.replacement && v.pid && static_cast<uint32_t>(w.pid) != v.pid) continue;
      w.killed_lost = true;
      say("rank " + std::to_string(w.rank) + " declared lost by the coordinator (" + v.why + "): killing it");
      emit_event("kill_lost", {{"worker_rank", w.rank}, {"why", v.why}});
      ::kill(w.pid, SIGKILL);
    }
  }
}

/// SIGTERM/SIGINT: the first is forwarded as one notice (a claim carrying
/// the grace period's deadline); a second kills the workers.
void launcher::read_signals() {
  signalfd_siginfo si;
  while (::read(sfd_, &si, sizeof(si)) == sizeof(si)) {
    if (si.ssi_signo == SIGCHLD) continue;
    if (group_.notice_forwarded) {
      say(std::string(strsignal(si.ssi_signo)) + " again: stopping workers now");
      for (auto& w : group_.workers)
        if (!w.exited) ::kill(w.pid, SIGKILL);
      continue;
    }
    group_.notice_forwarded = true;
    int64_t deadline = o_.grace_period.count() > 0
                           ? wall_ns() + std::chrono::duration_cast<std::chrono::nanoseconds>(o_.grace_period).count()
                           : 0;
    say(std::string("received ") + strsignal(si.ssi_signo) + ": forwarding a notice to the workers" +
        (deadline ? " (grace period " + std::to_string(o_.grace_period.count()) + " ms)" : ""));
    caf::scoped_actor self{rt_->sys()};  // a sender: the service accepts a launcher's notice from launchers only
    self->send(svc_.coord, make<proto::Claim>([&](auto b) {
                     auto n = b.initNotice();
                     n.setRank(launcher_rank);
                     n.setSource(proto::NoticeSource::LAUNCHER);
                     n.setDetail(std::string("launcher received ") + strsignal(si.ssi_signo));
                     n.setReceivedNs(wall_ns());
                     n.setDeadlineNs(deadline);
                     b.setStartedStep(0);
                   }));
  }
}

/// Collects exited workers. A process exit is a verdict for the
/// coordinator: it may not have seen this worker at all yet (it died
/// restoring or joining), and a member that left on purpose first is
/// ignored there. The first exit that is not a success starts the exit
/// timeout for the rest.
void launcher::reap(group_end& g, std::optional<std::chrono::steady_clock::time_point>& kill_at, int& live) {
  int status = 0;
  pid_t pid;
  while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
    if (group_.spares && group_.spares->reaped(pid)) {
      worker_proc spare;
      spare.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      spare.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
      say("a spare exited before it was needed (" + describe(spare) + "); its worker will start from scratch");
      continue;
    }
    for (auto& w : group_.workers) {
      if (w.pid != pid || w.exited) continue;
      w.exited = true;
      --live;
      if (WIFEXITED(status))
        w.code = WEXITSTATUS(status);
      else if (WIFSIGNALED(status)) {
        w.signal = WTERMSIG(status);
        w.code = 128 + w.signal;
      }
      emit_event("worker_exit", {{"worker_rank", w.rank}, {"pid", w.pid}, {"code", w.code}, {"signal", w.signal}});
      g.crashed |= w.signal != 0;
      auto effect = classify_exit(w.code, w.signal, o_.restart_code);
      if (effect == exit_effect::finished) break;
      tell_worker_exited(rt_->sys(), svc_.coord, static_cast<uint32_t>(w.rank), shape_.incarnation, w.code);
      if (replace_lost(w, effect, g.restart || g.fatal || group_.notice_forwarded || kill_at.has_value())) {
        ++live;
        break;
      }
      g.add(effect, w.code == exit_code::no_rendezvous, "rank " + std::to_string(w.rank) + " " + describe(w));
      if (!kill_at) kill_at = std::chrono::steady_clock::now() + o_.exit_timeout;
    }
  }
}

bool launcher::replace_lost(worker_proc& w, exit_effect effect, bool group_ending) {
  replace_conditions c;
  c.in_place = o_.in_place;
  c.effect = effect;
  c.signal = w.signal;
  c.group_ending = group_ending;
  c.restarts = shape_.restarts;
  c.max_restarts = o_.max_restarts;
  if (!replace_in_place(c)) return false;
  const int local = static_cast<int>(&w - group_.workers.data());
  auto env = worker_environment(w.rank, local);
  env["GRACE_REPLACEMENT"] = "1";
  const bool spare = group_.spares && group_.spares->count() > 0;
  const pid_t pid = start_worker(local, env, standby_pool::clock::now());
  if (pid < 0) {
    say("rank " + std::to_string(w.rank) + ": no replacement (fork failed: " + std::strerror(errno) + ")");
    return false;
  }
  ++shape_.restarts;
  say("rank " + std::to_string(w.rank) + " " + describe(w) + ": replacement pid " + std::to_string(pid) +
      " takes its place, the others train on (replacement " + std::to_string(shape_.restarts) + "/" +
      std::to_string(o_.max_restarts) + ")");
  emit_event("worker_replaced",
             {{"worker_rank", w.rank}, {"old_pid", w.pid}, {"pid", pid}, {"spare", spare}, {"code", w.code}});
  const int rank = w.rank;
  w = worker_proc{};
  w.rank = rank;
  w.pid = pid;
  w.replacement = true;
  return true;
}

/// Waits for the whole group; a worker still running --exit-timeout-ms
/// after the first exit that was not a success is killed.
group_end launcher::watch_group() {
  group_end g;
  std::optional<std::chrono::steady_clock::time_point> kill_at;
  int live = o_.nproc;
  const auto started = std::chrono::steady_clock::now();
  group_.running = true;
  while (live > 0) {
    pollfd pfds[3] = {{sfd_, POLLIN, 0}, {group_.verdicts->wake.fd(), POLLIN, 0}, {svc_.elector ? svc_.elector->fd() : -1, POLLIN, 0}};
    int pr = ::poll(pfds, 3, 200);
    if (svc_.elector) take_leadership_events();
    kill_declared_dead();
    if (pr > 0 && (pfds[0].revents & POLLIN)) read_signals();
    reap(g, kill_at, live);
    watch_spares(live == o_.nproc && !kill_at, started);
    if (kill_at && std::chrono::steady_clock::now() > *kill_at) {
      for (auto& w : group_.workers)
        if (!w.exited) {
          say("rank " + std::to_string(w.rank) + " did not exit in time: killing it");
          // An event, not only a line: tests order it against the restart
          // (a kill on the verdict must come first, never this one).
          emit_event("exit_timeout", {{"worker_rank", w.rank}});
          ::kill(w.pid, SIGKILL);
        }
      kill_at = std::chrono::steady_clock::now() + std::chrono::hours(1);
    }
  }
  group_.running = false;
  return g;
}

}  // namespace grace::launch
