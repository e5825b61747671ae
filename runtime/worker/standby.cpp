#include "runtime/worker/standby.hpp"

#include "runtime/base/posix_file.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace grace {

std::string encode_release(const env_map& env) {
  std::string out;
  for (auto& [k, v] : env) {
    out += k;
    out += '=';
    out += v;
    out += '\0';
  }
  out += '\0';
  return out;
}

result<env_map> decode_release(const std::string& bytes) {
  env_map env;
  size_t at = 0;
  for (;;) {
    size_t end = bytes.find('\0', at);
    if (end == std::string::npos) return error{errc::invalid_input, "standby release: no terminating NUL"};
    if (end == at) {
      if (end + 1 != bytes.size()) return error{errc::invalid_input, "standby release: bytes after the terminator"};
      return env;
    }
    std::string entry = bytes.substr(at, end - at);
    size_t eq = entry.find('=');
    if (eq == std::string::npos || eq == 0)
      return error{errc::invalid_input, "standby release: entry without a NAME= ('" + entry.substr(0, 40) + "')"};
    env[entry.substr(0, eq)] = entry.substr(eq + 1);
    at = end + 1;
  }
}

namespace {

/// The whole release message from `fd` (up to its terminator); nothing on
/// EOF before it.
std::optional<std::string> read_release(int fd) {
  std::string got;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return std::nullopt;
    got.append(buf, static_cast<size_t>(n));
    if (got == std::string(1, '\0') || (got.size() >= 2 && got.compare(got.size() - 2, 2, std::string(2, '\0')) == 0))
      return got;
  }
}

bool write_all(int fd, const std::string& bytes) {
  size_t at = 0;
  while (at < bytes.size()) {
    ssize_t n = ::send(fd, bytes.data() + at, bytes.size() - at, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    at += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

result<std::optional<env_map>> await_standby_release() {
  const char* v = std::getenv(standby_fd_variable);
  if (!v || !*v) return std::optional<env_map>{};
  char* end = nullptr;
  long fd = std::strtol(v, &end, 10);
  ::unsetenv(standby_fd_variable);
  int type = 0;
  socklen_t len = sizeof type;
  if (*end || fd < 0 || fd > INT32_MAX ||
      ::getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM)
    return error{errc::invalid_input, std::string(standby_fd_variable) + "=" + v +
                                          " is not a stream socket from grace-launch (a variable inherited by mistake?)"};
  const int s = static_cast<int>(fd);
  ::fcntl(s, F_SETFD, FD_CLOEXEC);
  auto bytes = [s] {
    fd_guard owned(s);
    if (!write_all(s, "R")) ::_exit(0);  // the launcher is gone: nothing to stand by for
    return read_release(s);
  }();
  if (!bytes) ::_exit(0);  // not needed (the job ended or the spare was discarded)
  auto env = decode_release(*bytes);
  if (!env) return env.err();
  for (auto& [k, val] : *env) ::setenv(k.c_str(), val.c_str(), 1);
  return std::optional<env_map>{std::move(*env)};
}

std::vector<std::string> child_environment(char** parent, const env_map& env, bool keep_standby_fd) {
  std::vector<std::string> out;
  for (char** e = parent; e && *e; ++e) {
    std::string entry(*e);
    const std::string name = entry.substr(0, entry.find('='));
    if (env.count(name) || (!keep_standby_fd && name == standby_fd_variable)) continue;
    out.push_back(std::move(entry));
  }
  for (auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

env_map spare_environment(env_map worker_env) {
  for (const char* v : {"GRACE_INCARNATION", "GRACE_COORDINATOR", "GRACE_TOKEN", "MASTER_ADDR", "MASTER_PORT",
                        "TORCHELASTIC_RESTART_COUNT"})
    worker_env.erase(v);
  return worker_env;
}

pid_t spawn_process(const std::vector<std::string>& command, const env_map& env, int keep_fd) {
  // Everything the child needs is built before fork: the launcher has
  // threads, and the child may only make async-signal-safe calls.
  const auto envs = child_environment(environ, env, keep_fd >= 0);
  std::vector<char*> envp, argv;
  for (auto& e : envs) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  for (auto& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid != 0) return pid;
  ::setpgid(0, 0);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::signal(SIGTERM, SIG_DFL);
  ::signal(SIGINT, SIG_DFL);
  if (keep_fd >= 0) ::fcntl(keep_fd, F_SETFD, 0);
  ::execvpe(argv[0], argv.data(), envp.data());
  const char* what = "grace-launch: cannot run the worker program: ";
  const char* why = std::strerror(errno);
  (void)!::write(2, what, std::strlen(what));
  (void)!::write(2, argv[0], std::strlen(argv[0]));
  (void)!::write(2, ": ", 2);
  (void)!::write(2, why, std::strlen(why));
  (void)!::write(2, "\n", 1);
  ::_exit(127);
}

bool should_start_spares(const spare_conditions& c) noexcept {
  return c.spares == 0 && !c.started_for_this_group && c.group_intact && !c.stopping && c.restarts_left > 0 && c.group_age >= c.delay;
}

standby_pool::standby_pool(std::vector<std::string> command, std::chrono::milliseconds ready_wait)
    : command_(std::move(command)), ready_wait_(ready_wait) {}

standby_pool::~standby_pool() { discard(); }

result<pid_t> standby_pool::start(int local_rank, const env_map& env) {
  drop(local_rank, true);
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    return error{errc::failed, std::string("socketpair for a spare: ") + std::strerror(errno)};
  env_map with = env;
  with[standby_fd_variable] = std::to_string(sv[1]);
  fd_guard ours(sv[0]);
  pid_t pid = [&] {
    fd_guard theirs(sv[1]);  // the child's end, closed here once it has it
    return spawn_process(command_, with, sv[1]);
  }();
  if (pid < 0) return error{errc::failed, std::string("fork for a spare: ") + std::strerror(errno)};
  spares_[local_rank] = spare{pid, ours.release(), false};
  return pid;
}

int standby_pool::count() const { return static_cast<int>(spares_.size()); }

int standby_pool::ready_count() const {
  int n = 0;
  for (auto& [r, s] : spares_) n += s.ready;
  return n;
}

std::vector<std::pair<int, int>> standby_pool::waiting_fds() const {
  std::vector<std::pair<int, int>> out;
  for (auto& [r, s] : spares_)
    if (!s.ready) out.emplace_back(r, s.fd);
  return out;
}

bool standby_pool::check_ready(int local_rank) {
  auto it = spares_.find(local_rank);
  if (it == spares_.end() || it->second.ready) return false;
  char c = 0;
  ssize_t n = ::recv(it->second.fd, &c, 1, MSG_DONTWAIT);
  if (n == 1 && c == 'R') return it->second.ready = true;
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return false;
  drop(local_rank, true);  // closed (it exited) or spoke out of turn
  return false;
}

result<pid_t> standby_pool::release(int local_rank, const env_map& env, clock::time_point deadline) {
  auto it = spares_.find(local_rank);
  if (it == spares_.end()) return error{errc::failed, "no spare"};
  while (!it->second.ready) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now());
    if (left.count() <= 0) {
      drop(local_rank, true);
      return error{errc::overloaded, "the spare was not ready within " + std::to_string(ready_wait_.count()) + " ms"};
    }
    pollfd p{it->second.fd, POLLIN, 0};
    ::poll(&p, 1, static_cast<int>(left.count()));
    if (!check_ready(local_rank) && spares_.find(local_rank) == spares_.end())
      return error{errc::disconnected, "the spare exited before it was needed"};
  }
  const pid_t pid = it->second.pid;
  const bool sent = write_all(it->second.fd, encode_release(env));
  ::close(it->second.fd);
  spares_.erase(it);
  if (!sent) {
    ::kill(pid, SIGKILL);
    return error{errc::disconnected, "the spare exited before it was needed"};
  }
  return pid;
}

bool standby_pool::reaped(pid_t pid) {
  for (auto& [r, s] : spares_)
    if (s.pid == pid) {
      s.pid = -1;
      drop(r, false);
      return true;
    }
  return false;
}

void standby_pool::drop(int local_rank, bool kill) {
  auto it = spares_.find(local_rank);
  if (it == spares_.end()) return;
  if (it->second.fd >= 0) ::close(it->second.fd);
  if (kill && it->second.pid > 0) {
    ::kill(-it->second.pid, SIGKILL);  // its process group: a wrapper's children too
    ::kill(it->second.pid, SIGKILL);   // in case it had not made its group yet
    ::waitpid(it->second.pid, nullptr, 0);
  }
  spares_.erase(it);
}

void standby_pool::discard() {
  while (!spares_.empty()) drop(spares_.begin()->first, true);
}

}  // namespace grace
