// The signal watcher's thread is the one that takes SIGTERM/SIGINT: every
// thread started after block_termination_signals() blocks them, so without
// that a signal to a process with no thread from before main stayed pending
// until the watcher's next poll timeout.
#include "actors/signal_watcher.hpp"

#include <catch2/catch.hpp>

#include <csignal>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace fs = std::filesystem;
using namespace grace;

namespace {
// SigBlk of a thread of this process, from /proc.
std::optional<unsigned long long> blocked_mask(const fs::path& task) {
  std::ifstream in(task / "status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("SigBlk:", 0) == 0) return std::stoull(line.substr(7), nullptr, 16);
  return std::nullopt;
}

std::optional<fs::path> thread_named(const std::string& name) {
  for (const auto& t : fs::directory_iterator("/proc/self/task")) {
    std::ifstream comm(t.path() / "comm");
    std::string n;
    std::getline(comm, n);
    if (n == name) return t.path();
  }
  return std::nullopt;
}

constexpr unsigned long long bit(int sig) { return 1ull << (sig - 1); }

struct notices {
  std::mutex m;
  std::condition_variable cv;
  std::vector<notice_info> got;
  signal_watcher::sink sink() {
    return [this](const notice_info& n) {
      std::lock_guard<std::mutex> g(m);
      got.push_back(n);
      cv.notify_all();
    };
  }
  bool wait_for(size_t count, std::chrono::seconds limit) {
    std::unique_lock<std::mutex> lk(m);
    return cv.wait_for(lk, limit, [&] { return got.size() >= count; });
  }
};
} // namespace

TEST_CASE("signal_watcher: its thread takes SIGTERM and SIGINT, the thread that made it blocks them", "[signals]") {
  notices seen;
  signal_watcher w({}, seen.sink());
  std::optional<fs::path> task;
  for (int i = 0; i < 500 && !task; ++i) {
    task = thread_named("grace.signals");
    if (!task) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  REQUIRE(task);
  auto watcher_mask = blocked_mask(*task);
  auto own_mask = blocked_mask("/proc/thread-self");
  REQUIRE(watcher_mask);
  REQUIRE(own_mask);
  CHECK((*watcher_mask & bit(SIGTERM)) == 0);
  CHECK((*watcher_mask & bit(SIGINT)) == 0);
  CHECK((*own_mask & bit(SIGTERM)) != 0);
  CHECK((*own_mask & bit(SIGINT)) != 0);
}

TEST_CASE("signal_watcher: SIGTERM to the process becomes one notice; a repeat does not", "[signals]") {
  notices seen;
  signal_watcher w({}, seen.sink());
  // A thread started after the watcher inherits the blocked signals.
  std::thread other([] { std::this_thread::sleep_for(std::chrono::milliseconds(200)); });
  REQUIRE(::kill(::getpid(), SIGTERM) == 0);
  REQUIRE(seen.wait_for(1, std::chrono::seconds(10)));
  REQUIRE(::kill(::getpid(), SIGTERM) == 0);
  other.join();
  w.stop();
  std::lock_guard<std::mutex> g(seen.m);
  REQUIRE(seen.got.size() == 1);
  CHECK(seen.got[0].source == notice_source::signal);
  CHECK(seen.got[0].detail == "SIGTERM");
  CHECK(seen.got[0].received_ns > 0);
  CHECK(seen.got[0].deadline_ns == 0);
}
