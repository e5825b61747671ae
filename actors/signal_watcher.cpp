#include "actors/signal_watcher.hpp"

#include "runtime/base/events.hpp"

#include <spdlog/spdlog.h>

#include <cerrno>
#include <csignal>
#include <pthread.h>
#include <cstdlib>
#include <cstring>
#include <string>
#include <ctime>
#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

namespace grace {

namespace {
// Threads started before main (OpenBLAS starts its pool in a constructor)
// do not have the signals blocked; a signal delivered to one of them runs
// this handler, which only writes the signal number to a pipe.
int signal_pipe[2] = {-1, -1};

void on_signal(int sig) {
  int saved = errno;
  unsigned char b = static_cast<unsigned char>(sig);
  ssize_t n = ::write(signal_pipe[1], &b, 1);
  (void)n;
  errno = saved;
}

// The pipe is made once; the handlers are (re)installed by every watcher, so
// a handler that something else installed since (a test framework, an
// embedding interpreter) does not swallow the notice.
bool install_handlers() {
  static bool piped = ::pipe2(signal_pipe, O_CLOEXEC | O_NONBLOCK) == 0;
  if (!piped) return false;
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  return sigaction(SIGTERM, &sa, nullptr) == 0 && sigaction(SIGINT, &sa, nullptr) == 0;
}
// `sh -c command`, true when it exits 0. Not std::system: glibc's sets
// SIGINT to SIG_IGN for the whole process while the command runs, and this
// thread is the one SIGINT is delivered to, so a Ctrl-C meanwhile was lost.
// The child gets the default mask and dispositions.
bool run_notice_command(const std::string& command) {
  posix_spawnattr_t attr;
  if (posix_spawnattr_init(&attr) != 0) return false;
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGTERM);
  sigaddset(&defaults, SIGINT);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  const char* argv[] = {"sh", "-c", command.c_str(), nullptr};
  pid_t pid = -1;
  int rc = posix_spawn(&pid, "/bin/sh", nullptr, &attr, const_cast<char* const*>(argv), environ);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    spdlog::warn("notice command could not start: {}", std::strerror(rc));
    return false;
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return false;
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}
}  // namespace

void block_termination_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

signal_watcher::signal_watcher(signal_watcher_config cfg, sink out) : cfg_(std::move(cfg)), out_(std::move(out)) {
  block_termination_signals();
  handlers_ = install_handlers();
  if (!handlers_)
    spdlog::warn("no signal pipe or handler ({}): SIGTERM/SIGINT are polled every 50 ms", std::strerror(errno));
  thread_ = std::thread([this] { loop(); });
}

signal_watcher::~signal_watcher() { stop(); }

void signal_watcher::stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void signal_watcher::loop() {
  // The thread's first malloc makes its arena (mmap, munmap, mprotect):
  // done now rather than on the notice's path.
  void* volatile warm = std::malloc(64);
  std::free(warm);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  // Every thread the process starts after block_termination_signals() blocks
  // the signals; this one takes them. Without it a signal to a process with
  // no thread from before main (no BLAS pool) stayed pending until the next
  // poll timeout, up to 50 ms. The handler runs here, interrupts poll()
  // and leaves the byte that the next poll() reads. Without a handler the
  // default action would end the process: then stay blocked and poll.
  if (handlers_) pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
  // Named last: a thread with this name is ready (tests rely on it).
  pthread_setname_np(pthread_self(), "grace.signals");
  bool sent_signal = false, sent_file = false, sent_command = false, sent_callback = false;
  bool polling = !cfg_.notice_file.empty() || !cfg_.notice_command.empty() || cfg_.callback;
  auto next_poll = std::chrono::steady_clock::now();
  auto notify = [&](notice_source src, std::string detail) {
    notice_info n{src, std::move(detail), wall_ns(), 0};
    if (cfg_.grace_period.count() > 0)
      n.deadline_ns = n.received_ns + std::chrono::duration_cast<std::chrono::nanoseconds>(cfg_.grace_period).count();
    out_(n);
  };
  while (!stop_) {
    // Short waits keep stop() prompt; the signal itself wakes us at once.
    pollfd pfd{signal_pipe[0], POLLIN, 0};
    int sig = 0;
    int ready = ::poll(&pfd, 1, 50);
    if (ready > 0 || (ready < 0 && errno == EINTR)) {  // EINTR: the handler ran on this thread
      unsigned char b = 0;
      if (::read(signal_pipe[0], &b, 1) == 1) sig = b;
    }
    if (sig == 0) {
      timespec zero{0, 0};
      sig = sigtimedwait(&set, nullptr, &zero);
    }
    if (sig == SIGTERM || sig == SIGINT) {
      if (!sent_signal) {
        sent_signal = true;
        notify(notice_source::signal, sig == SIGTERM ? "SIGTERM" : "SIGINT");
      } else {
        spdlog::warn("{} again: the notice is already being handled", sig == SIGTERM ? "SIGTERM" : "SIGINT");
      }
    }
    if (!polling || std::chrono::steady_clock::now() < next_poll) continue;
    next_poll = std::chrono::steady_clock::now() + cfg_.poll_interval;
    struct stat sb;
    if (!sent_file && !cfg_.notice_file.empty() && ::stat(cfg_.notice_file.c_str(), &sb) == 0) {
      sent_file = true;
      notify(notice_source::file, "notice file " + cfg_.notice_file);
    }
    if (!sent_command && !cfg_.notice_command.empty() && run_notice_command(cfg_.notice_command)) {
      sent_command = true;
      notify(notice_source::command, "notice command exited 0: " + cfg_.notice_command);
    }
    if (!sent_callback && cfg_.callback) {
      bool fire = false;
      try {
        fire = cfg_.callback();
      } catch (const std::exception& e) {
        spdlog::warn("notice callback threw: {}", e.what());
      }
      if (fire) {
        sent_callback = true;
        notify(notice_source::callback, "notice callback");
      }
    }
  }
}

}  // namespace grace
