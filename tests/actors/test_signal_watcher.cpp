// The signal watcher's thread is the one that takes SIGTERM/SIGINT: every
// thread started after block_termination_signals() blocks them, so without
// that a signal to a process with no thread from before main stayed pending
// until the watcher's next poll timeout.
#include "actors/signal_watcher.hpp"

#include <catch2/catch.hpp>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include <csignal>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <memory>
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

// Collects log lines; wait_for() blocks until one contains a text.
class line_sink : public spdlog::sinks::base_sink<std::mutex> {
public:
  bool wait_for(const std::string& text, std::chrono::seconds limit) {
    std::unique_lock<std::mutex> lk(m_);
    return cv_.wait_for(lk, limit, [&] {
      for (auto& l : lines_)
        if (l.find(text) != std::string::npos) return true;
      return false;
    });
  }

protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    {
      std::lock_guard<std::mutex> g(m_);
      lines_.emplace_back(msg.payload.data(), msg.payload.size());
    }
    cv_.notify_all();
  }
  void flush_() override {}

private:
  std::mutex m_;
  std::condition_variable cv_;
  std::vector<std::string> lines_;
};

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
}  // namespace

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

TEST_CASE("signal_watcher: SIGTERM sent twice becomes exactly one notice and one warning", "[signals]") {
  // The repeat is reported as a warning on the default logger: wait for it.
  auto sink = std::make_shared<line_sink>();
  auto old_logger = spdlog::default_logger();
  auto logger = std::make_shared<spdlog::logger>("signals-test", sink);
  spdlog::set_default_logger(logger);
  struct restore_logger {
    std::shared_ptr<spdlog::logger> old;
    ~restore_logger() { spdlog::set_default_logger(old); }
  } restore{old_logger};

  notices seen;
  signal_watcher w({}, seen.sink());
  REQUIRE(::kill(::getpid(), SIGTERM) == 0);
  REQUIRE(seen.wait_for(1, std::chrono::seconds(10)));
  REQUIRE(::kill(::getpid(), SIGTERM) == 0);
  REQUIRE(sink->wait_for("SIGTERM again", std::chrono::seconds(10)));
  w.stop();
  std::lock_guard<std::mutex> g(seen.m);
  REQUIRE(seen.got.size() == 1);
  CHECK(seen.got[0].source == notice_source::signal);
  CHECK(seen.got[0].detail == "SIGTERM");
  CHECK(seen.got[0].received_ns > 0);
  CHECK(seen.got[0].deadline_ns == 0);
}

TEST_CASE("signal_watcher: a notice command that exits 0 becomes a notice, SIGINT meanwhile is not lost", "[signals]") {
  // The command runs for a while; a SIGINT during it must still arrive
  // (std::system ignored SIGINT in the whole process while a command ran).
  signal_watcher_config cfg;
  cfg.notice_command = "sleep 0.3";
  cfg.poll_interval = std::chrono::milliseconds(10);
  notices seen;
  signal_watcher w(cfg, seen.sink());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // inside the first command
  REQUIRE(::kill(::getpid(), SIGINT) == 0);
  REQUIRE(seen.wait_for(2, std::chrono::seconds(10)));
  w.stop();
  std::lock_guard<std::mutex> g(seen.m);
  REQUIRE(seen.got.size() == 2);
  bool command = false, sigint = false;
  for (auto& n : seen.got) {
    if (n.source == notice_source::command) command = true;
    if (n.source == notice_source::signal && n.detail == "SIGINT") sigint = true;
  }
  CHECK(command);
  CHECK(sigint);
}
