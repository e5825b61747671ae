#pragma once
/// Warm spares (`grace-launch --standby`): a restart without a cold start.
///
/// A Python trainer spends most of a restart importing torch in a fresh
/// process. With --standby the launcher starts, while a group trains, one
/// spare process per local rank running the same command. The spare runs
/// until its first call into Grace (`import grace`, or a grace::session's
/// construction), says "ready" on a socket shared with the launcher, and
/// blocks there. When the group ends with the restart code, the launcher
/// hands each spare its worker environment (the new incarnation, the new
/// MASTER_PORT...) instead of forking a new process; the spare sets it and
/// goes on as that incarnation's worker. A spare the launcher no longer
/// needs sees its socket close and exits 0 without doing anything.
///
/// The program must not read its per-incarnation environment or do work
/// before that first call into Grace (docs/DEPLOY.md, "Warm spares").

#include "runtime/base/error.hpp"

#include <sys/types.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace grace {

using env_map = std::map<std::string, std::string>;

/// The environment variable naming a spare's end of its socket.
inline constexpr const char* standby_fd_variable = "GRACE_STANDBY_FD";

/// What the launcher sends a spare it releases: "KEY=VALUE\0" per variable,
/// then one more "\0".
std::string encode_release(const env_map& env);
/// The variables of a complete release message; an error names what is
/// malformed (no terminator, an entry without '=' or with an empty name).
result<env_map> decode_release(const std::string& bytes);

/// Worker side. Nothing when this process is not a spare (no
/// GRACE_STANDBY_FD, or it was taken already). A spare reports ready,
/// blocks until released, sets the variables it was given (setenv), drops
/// GRACE_STANDBY_FD and returns them. The launcher closing the socket
/// instead ends the process with exit 0; a malformed message is an error.
result<std::optional<env_map>> await_standby_release();

/// The environment of a child: `parent`'s entries (NAME=VALUE) with `env`
/// replacing or adding variables; GRACE_STANDBY_FD dropped unless kept (a
/// worker started from scratch never inherits one by mistake).
std::vector<std::string> child_environment(char** parent, const env_map& env, bool keep_standby_fd);
/// What a spare starts with: its worker's environment without what only
/// the release may give (incarnation, coordinator, secret, MASTER_ADDR/
/// PORT, restart count), so a program that breaks the rule and does work
/// before its first call into Grace fails instead of joining the running
/// group.
env_map spare_environment(env_map worker_env);

/// Starts `command` as a worker process: its own process group (a
/// terminal's Ctrl-C reaches the launcher only), default signal
/// dispositions, child_environment(environ, env, keep_fd >= 0), and
/// `keep_fd` (if >= 0) left open across exec. The child's pid, or -1
/// (errno set).
pid_t spawn_process(const std::vector<std::string>& command, const env_map& env, int keep_fd = -1);

/// What the launcher knows while a group runs, for when_to_start_spares.
struct spare_conditions {
  int spares = 0;                ///< spares started and not yet used
  bool started_for_this_group = false;  ///< once per group: spares that die are not started again
  bool group_intact = true;      ///< no worker exited yet
  bool stopping = false;         ///< a notice was forwarded: no restart will follow
  int restarts_left = 0;
  std::chrono::milliseconds group_age{0};
  std::chrono::milliseconds delay{0};  ///< --standby-delay-ms
};
/// Start the next incarnation's spares now: none exist nor were started
/// during this group (a spare that keeps dying must not fork-loop), the group runs
/// whole, a restart can still come, and the group is older than the delay
/// (so the spares' start does not slow the group's own).
bool should_start_spares(const spare_conditions& c) noexcept;

/// Launcher side: at most one spare per local rank.
class standby_pool {
public:
  using clock = std::chrono::steady_clock;
  /// `ready_wait`: how long a restart waits for spares still starting.
  standby_pool(std::vector<std::string> command, std::chrono::milliseconds ready_wait);
  ~standby_pool();
  standby_pool(const standby_pool&) = delete;
  standby_pool& operator=(const standby_pool&) = delete;

  /// Starts the spare of `local_rank` with `env` (plus GRACE_STANDBY_FD);
  /// its pid.
  result<pid_t> start(int local_rank, const env_map& env);
  /// Spares started and not yet released or lost.
  int count() const;
  /// The socket ends of spares not yet known ready (for poll), each with
  /// its local rank.
  std::vector<std::pair<int, int>> waiting_fds() const;
  /// Reads the ready byte of `local_rank`'s spare if it arrived. True when
  /// it became ready just now; a spare whose socket closed is dropped.
  bool check_ready(int local_rank);
  /// Spares that said ready.
  int ready_count() const;
  /// When a restart starting now stops waiting for spares (one deadline for
  /// the whole group).
  clock::time_point ready_deadline() const { return clock::now() + ready_wait_; }
  /// Hands the spare of `local_rank` its worker environment, waiting until
  /// `deadline` for one still starting. Its pid, or an error saying why it
  /// cannot be used (none, it died, it never got ready); a spare that
  /// cannot be used is killed.
  result<pid_t> release(int local_rank, const env_map& env, clock::time_point deadline);
  /// A child the launcher reaped: forgets it if it was a spare (true).
  bool reaped(pid_t pid);
  /// Kills every spare and reaps it.
  void discard();

private:
  struct spare {
    pid_t pid = -1;
    int fd = -1;
    bool ready = false;
  };
  void drop(int local_rank, bool kill);

  std::vector<std::string> command_;
  std::chrono::milliseconds ready_wait_;
  std::map<int, spare> spares_;
};

}  // namespace grace
