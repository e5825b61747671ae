// Warm spares (runtime/worker/standby.hpp): the release message, and the pool
// driving real spare processes (bash speaking the protocol: "R" on the
// socket, then the release read to EOF). The spare side in a real program
// (await_standby_release in a forked child) is tested here too; grace-launch
// with grace-train and with the PyTorch trainer in tests/integration/standby.sh.
#include "runtime/worker/standby.hpp"

#include "../temp_dir.hpp"

#include <catch2/catch.hpp>

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

using namespace grace;
using namespace std::chrono_literals;

namespace {

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int wait_exit(pid_t pid) {
  int st = 0;
  REQUIRE(::waitpid(pid, &st, 0) == pid);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/// A spare in bash: ready, then the release into `out`.
std::vector<std::string> bash_spare(const std::filesystem::path& out) {
  return {"/bin/bash", "-c", "printf R >&$GRACE_STANDBY_FD; cat <&$GRACE_STANDBY_FD > '" + out.string() + "'"};
}

/// True once `pid` was reaped (by the pool): it ended.
bool reaped(pid_t pid) { return ::waitpid(pid, nullptr, WNOHANG) == -1 && errno == ECHILD; }

/// A forked child acting as a spare: GRACE_STANDBY_FD names its end of a
/// socketpair, then `body` runs (await_standby_release and what follows;
/// its return value is the exit code). The parent gets the pid and its end,
/// after reading the spare's ready byte.
struct forked_spare {
  pid_t pid;
  int fd;
};
template <class Body>
forked_spare fork_spare(Body body) {
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(sv[0]);
    ::setenv(standby_fd_variable, std::to_string(sv[1]).c_str(), 1);
    ::_exit(body());
  }
  ::close(sv[1]);
  char c = 0;
  REQUIRE(::read(sv[0], &c, 1) == 1);
  CHECK(c == 'R');
  return {pid, sv[0]};
}

}  // namespace

TEST_CASE("standby release: encoded variables decode to the same map", "[standby]") {
  env_map env{{"GRACE_INCARNATION", "3"}, {"MASTER_PORT", "29511"}, {"EMPTY", ""}, {"EQ", "a=b"}};
  auto d = decode_release(encode_release(env));
  REQUIRE(d);
  CHECK(*d == env);
  auto none = decode_release(encode_release({}));
  REQUIRE(none);
  CHECK(none->empty());
}

TEST_CASE("standby release: malformed messages are errors naming the fault", "[standby]") {
  CHECK_FALSE(decode_release(std::string("A=1", 3)));                       // no terminator
  CHECK_FALSE(decode_release(std::string("A=1\0", 4)));                     // no final NUL
  CHECK_FALSE(decode_release(std::string("=1\0\0", 4)));                    // empty name
  auto r = decode_release(std::string("NOEQUALS\0\0", 10));
  REQUIRE_FALSE(r);
  CHECK(r.err().message.find("NOEQUALS") != std::string::npos);
  CHECK_FALSE(decode_release(std::string("A=1\0\0B=2\0\0", 11)));           // bytes after the end
}

TEST_CASE("standby pool: a ready spare gets the worker's environment and runs on", "[standby]") {
  testing::temp_dir dir("grace-standby");
  standby_pool pool(bash_spare(dir.path / "release"), 10s);
  REQUIRE(pool.start(0, {{"GRACE_RANK", "0"}}));
  CHECK(pool.count() == 1);
  auto waiting = pool.waiting_fds();
  REQUIRE(waiting.size() == 1);
  pollfd p{waiting[0].second, POLLIN, 0};
  REQUIRE(::poll(&p, 1, 30000) == 1);  // its ready byte arrived (30 s: a hang guard only)
  CHECK(pool.check_ready(0));
  REQUIRE(pool.ready_count() == 1);
  env_map env{{"GRACE_INCARNATION", "1"}, {"MASTER_PORT", "29500"}};
  auto pid = pool.release(0, env, pool.ready_deadline());
  REQUIRE(pid);
  CHECK(pool.count() == 0);
  CHECK(wait_exit(*pid) == 0);
  auto got = decode_release(slurp(dir.path / "release"));
  REQUIRE(got);
  CHECK(*got == env);
}

TEST_CASE("standby pool: release waits for a spare still starting", "[standby]") {
  testing::temp_dir dir("grace-standby");
  auto cmd = bash_spare(dir.path / "release");
  cmd[2] = "sleep 0.3; " + cmd[2];
  standby_pool pool(cmd, 10s);
  REQUIRE(pool.start(0, {}));
  auto pid = pool.release(0, {{"K", "v"}}, pool.ready_deadline());
  REQUIRE(pid);
  CHECK(wait_exit(*pid) == 0);
  CHECK(slurp(dir.path / "release") == std::string("K=v\0\0", 5));
}

TEST_CASE("standby pool: a spare that died or never got ready is not used", "[standby]") {
  SECTION("exited before it was needed") {
    standby_pool pool({"/bin/bash", "-c", "exit 3"}, 10s);
    REQUIRE(pool.start(0, {}));
    auto pid = pool.release(0, {}, pool.ready_deadline());
    REQUIRE_FALSE(pid);
    CHECK(pid.err().message.find("exited") != std::string::npos);
    CHECK(pool.count() == 0);
  }
  SECTION("not ready within the wait: killed") {
    standby_pool pool({"/bin/bash", "-c", "sleep 30"}, 200ms);
    auto spare = pool.start(0, {});
    REQUIRE(spare);
    const auto deadline = pool.ready_deadline();
    auto pid = pool.release(0, {}, deadline);
    REQUIRE_FALSE(pid);
    CHECK(pid.err().code == errc::overloaded);
    CHECK(pid.err().message.find("not ready") != std::string::npos);
    CHECK(pool.count() == 0);
    CHECK(reaped(*spare));  // killed: `sleep 30` would still run
  }
  SECTION("no spare for that rank") {
    standby_pool pool({"/bin/true"}, 1s);
    CHECK_FALSE(pool.release(2, {}, pool.ready_deadline()));
  }
}

TEST_CASE("standby: a spare the launcher no longer needs exits 0 without going on", "[standby]") {
  testing::temp_dir dir("grace-standby");
  const auto marker = dir.path / "went-on";
  auto spare = fork_spare([&] {
    (void)await_standby_release();
    std::ofstream(marker) << "x";
    return 9;
  });
  ::close(spare.fd);
  CHECK(wait_exit(spare.pid) == 0);
  CHECK_FALSE(std::filesystem::exists(marker));
}

TEST_CASE("standby: a released spare has the variables set and the descriptor variable gone", "[standby]") {
  auto spare = fork_spare([] {
    ::setenv("GRACE_INCARNATION", "0", 1);
    auto r = await_standby_release();
    bool ok = r && *r && (*r)->at("GRACE_INCARNATION") == "5" && std::string(std::getenv("GRACE_INCARNATION")) == "5" &&
              !std::getenv(standby_fd_variable);
    return ok ? 0 : 1;
  });
  auto msg = encode_release({{"GRACE_INCARNATION", "5"}});
  REQUIRE(::write(spare.fd, msg.data(), msg.size()) == static_cast<ssize_t>(msg.size()));
  ::close(spare.fd);
  CHECK(wait_exit(spare.pid) == 0);
}

TEST_CASE("standby: not a spare is nothing, a bad descriptor variable an error naming it", "[standby]") {
  ::unsetenv(standby_fd_variable);
  auto none = await_standby_release();
  REQUIRE(none);
  CHECK_FALSE(*none);
  ::setenv(standby_fd_variable, "x7", 1);
  auto bad = await_standby_release();
  REQUIRE_FALSE(bad);
  CHECK(bad.err().message.find("x7") != std::string::npos);
  CHECK_FALSE(std::getenv(standby_fd_variable));
  // An open descriptor that is not grace-launch's socket (inherited by
  // mistake): an error, not a silent exit 0.
  int fd = ::open("/dev/null", O_RDONLY);
  REQUIRE(fd >= 0);
  ::setenv(standby_fd_variable, std::to_string(fd).c_str(), 1);
  auto not_socket = await_standby_release();
  ::close(fd);
  REQUIRE_FALSE(not_socket);
  CHECK(not_socket.err().message.find("not a stream socket") != std::string::npos);
}

TEST_CASE("standby: spares start once the group is older than the delay, whole, with a restart to come", "[standby]") {
  spare_conditions c;
  c.restarts_left = 2;
  c.group_age = 3000ms;
  c.delay = 3000ms;
  CHECK(should_start_spares(c));
  auto with = [&](auto change) {
    spare_conditions d = c;
    change(d);
    return should_start_spares(d);
  };
  CHECK_FALSE(with([](spare_conditions& d) { d.group_age = 2999ms; }));   // the group is still starting
  CHECK_FALSE(with([](spare_conditions& d) { d.spares = 1; }));           // some exist already
  CHECK_FALSE(with([](spare_conditions& d) { d.group_intact = false; })); // the group is ending: too late
  CHECK_FALSE(with([](spare_conditions& d) { d.stopping = true; }));      // a notice: the job stops
  CHECK_FALSE(with([](spare_conditions& d) { d.restarts_left = 0; }));    // no restart can come
  CHECK_FALSE(with([](spare_conditions& d) { d.started_for_this_group = true; }));  // they died: no fork loop
}

TEST_CASE("standby: a spare starts without what only the release gives, children never inherit the descriptor", "[standby]") {
  env_map worker{{"GRACE_RANK", "3"}, {"RANK", "3"}, {"GRACE_INCARNATION", "2"}, {"GRACE_COORDINATOR", "h:1"},
                 {"GRACE_TOKEN", "secret"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "29500"},
                 {"TORCHELASTIC_RESTART_COUNT", "2"}, {"GRACE_CHECKPOINT_DIR", "/ck"}};
  CHECK(spare_environment(worker) == env_map{{"GRACE_RANK", "3"}, {"RANK", "3"}, {"GRACE_CHECKPOINT_DIR", "/ck"}});

  std::string a = "PATH=/bin", b = "GRACE_RANK=0", c = "GRACE_STANDBY_FD=9", d = "EMPTY=";
  char* parent[] = {a.data(), b.data(), c.data(), d.data(), nullptr};
  using v = std::vector<std::string>;
  CHECK(child_environment(parent, {{"GRACE_RANK", "5"}}, false) == v{"PATH=/bin", "EMPTY=", "GRACE_RANK=5"});
  CHECK(child_environment(parent, {}, true) == v{"PATH=/bin", "GRACE_RANK=0", "GRACE_STANDBY_FD=9", "EMPTY="});
}

TEST_CASE("standby pool: one deadline for the group, spares that are not ready do not add up", "[standby]") {
  // Each spare says ready only once its gate (a FIFO) is opened. Spare 0's
  // never is; spare 1's is opened after the group's deadline passed, and
  // the test waits until its ready byte is there. A second release that
  // waited again (a deadline of its own) would find spare 1 ready and use
  // it; with one deadline for the group it does not wait, so spare 1 counts
  // as not ready and is killed like spare 0.
  testing::temp_dir dir("grace-standby");
  std::filesystem::create_directories(dir.path);
  standby_pool pool({"/bin/bash", "-c", "read -r _ < \"$GATE\"; printf R >&$GRACE_STANDBY_FD; exec cat <&$GRACE_STANDBY_FD"},
                    300ms);
  std::vector<pid_t> pids;
  for (int r : {0, 1}) {
    const auto gate = dir.path / ("gate" + std::to_string(r));
    REQUIRE(::mkfifo(gate.c_str(), 0600) == 0);
    auto pid = pool.start(r, {{"GATE", gate.string()}});
    REQUIRE(pid);
    pids.push_back(*pid);
  }
  const auto deadline = pool.ready_deadline();
  auto first = pool.release(0, {}, deadline);
  REQUIRE_FALSE(first);
  CHECK(first.err().code == errc::overloaded);
  // The first release used up the group's wait; it gives up when less than
  // a millisecond is left (its poll counts in ms): let that pass too.
  while (standby_pool::clock::now() < deadline) std::this_thread::yield();

  std::ofstream(dir.path / "gate1") << "go\n";  // opens once spare 1 reads its gate
  int fd1 = -1;
  for (auto [rank, fd] : pool.waiting_fds())
    if (rank == 1) fd1 = fd;
  REQUIRE(fd1 >= 0);
  pollfd p{fd1, POLLIN, 0};
  REQUIRE(::poll(&p, 1, 30000) == 1);  // spare 1's ready byte arrived (30 s: a hang guard only)

  auto second = pool.release(1, {}, deadline);
  REQUIRE_FALSE(second);
  CHECK(second.err().code == errc::overloaded);
  CHECK(second.err().message.find("not ready") != std::string::npos);
  CHECK(pool.count() == 0);
  CHECK(reaped(pids[0]));
  CHECK(reaped(pids[1]));
}
