#include "runtime/net/bulk_channel.hpp"

#include "runtime/net/tcp.hpp"

#include <catch2/catch.hpp>

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

using namespace grace;
using namespace std::chrono_literals;

namespace {

/// A server of `kind` whose handler echoes one line back, and what it saw.
struct echo_server {
  std::mutex m;
  std::condition_variable cv;
  std::vector<std::string> served;
  std::vector<std::string> refused;
  std::unique_ptr<bulk_server> server;

  explicit echo_server(bulk_kind kind, std::chrono::milliseconds io_timeout = 2000ms) {
    bulk_config c;
    c.kind = kind;
    c.address = "127.0.0.1";
    c.token = "job-secret-0123456789";
    c.io_timeout = io_timeout;
    c.on_refused = [this](const std::string& why) {
      std::lock_guard<std::mutex> g(m);
      refused.push_back(why);
      cv.notify_all();
    };
    auto s = bulk_server::start(c, [this](int fd, int) {
      char line[64] = {};
      ssize_t n = ::recv(fd, line, sizeof line - 1, 0);
      if (n > 0) tcp::send_all(fd, line, static_cast<size_t>(n));
      std::lock_guard<std::mutex> g(m);
      served.emplace_back(line, n > 0 ? static_cast<size_t>(n) : 0);
      cv.notify_all();
    });
    REQUIRE(s);
    server = std::move(*s);
  }

  /// Waits (a hang guard, not a timing) until `count` refusals were seen.
  std::vector<std::string> refusals(size_t count) {
    std::unique_lock<std::mutex> lk(m);
    cv.wait_for(lk, 10s, [&] { return refused.size() >= count; });
    return refused;
  }
};

std::string echo(int fd, const std::string& s) {
  REQUIRE(tcp::send_all(fd, s));
  std::string back(s.size(), '\0');
  REQUIRE(tcp::recv_all(fd, back.data(), back.size()));
  return back;
}

}  // namespace

TEST_CASE("bulk channel: a hello with the job's secret reaches the handler", "[bulk]") {
  echo_server e(bulk_kind::checkpoint);
  auto c = bulk_connect(e.server->endpoint(), bulk_kind::checkpoint, "job-secret-0123456789", 2000ms);
  REQUIRE(c);
  CHECK(echo(c->fd, "LIST\n") == "LIST\n");
  c->reset();
  // The server goes on to the next connection.
  auto again = bulk_connect(e.server->endpoint(), bulk_kind::checkpoint, "job-secret-0123456789", 2000ms);
  REQUIRE(again);
  CHECK(echo(again->fd, "x") == "x");
  CHECK(e.refusals(0).empty());
}

TEST_CASE("bulk channel: a wrong secret or another kind is refused before the handler", "[bulk]") {
  echo_server e(bulk_kind::replica);
  auto wrong = bulk_connect(e.server->endpoint(), bulk_kind::replica, "another-job", 2000ms);
  REQUIRE_FALSE(wrong);
  CHECK(wrong.err().message.find("wrong job token") != std::string::npos);
  CHECK(wrong.err().message.find(e.server->endpoint()) != std::string::npos);
  auto kind = bulk_connect(e.server->endpoint(), bulk_kind::checkpoint, "job-secret-0123456789", 2000ms);
  REQUIRE_FALSE(kind);
  CHECK(kind.err().message.find("this is the replica channel") != std::string::npos);
  auto why = e.refusals(2);
  CHECK(why == std::vector<std::string>{"wrong job token", "this is the replica channel, not kind 1"});
  std::lock_guard<std::mutex> g(e.m);
  CHECK(e.served.empty());
}

TEST_CASE("bulk channel: garbage, an oversized token and a silent peer die at the hello", "[bulk]") {
  echo_server e(bulk_kind::checkpoint, 300ms);
  const auto ep = e.server->endpoint();
  auto raw = [&](const std::string& bytes) {
    auto fd = tcp::connect_to(ep, 2000ms);
    REQUIRE(fd);
    fd_guard g(*fd);
    if (!bytes.empty()) REQUIRE(tcp::send_all(*fd, bytes));
    auto reply = tcp::read_to_end(*fd, 256);  // the server closes after its answer
    return reply ? *reply : std::string("(read failed)");
  };
  CHECK(raw("GET / HTTP/1.0\r\n\r\n") == "ERR not a Grace bulk channel hello\n");
  // A token length of 65535 is refused from the header alone.
  CHECK(raw(std::string("GRBK\x01\x01\xff\xff", 8)) == "ERR job token too long\n");
  // Nothing at all: dropped after the I/O timeout, and served again after.
  CHECK(raw("") == "ERR no hello\n");
  auto ok = bulk_connect(ep, bulk_kind::checkpoint, "job-secret-0123456789", 2000ms);
  REQUIRE(ok);
  CHECK(echo(ok->fd, "y") == "y");
  CHECK(e.refusals(3).size() == 3);
}

TEST_CASE("bulk channel: stopping the server ends a handler waiting on a peer", "[bulk]") {
  std::atomic<bool> handler_ended{false};
  bulk_config c;
  c.address = "127.0.0.1";
  c.token = "t";
  c.io_timeout = 60000ms;  // the stop, not the timeout, must end the wait
  auto s = bulk_server::start(c, [&](int fd, int stop_fd) {
    pollfd p[2] = {{fd, POLLIN, 0}, {stop_fd, POLLIN, 0}};
    ::poll(p, 2, -1);
    handler_ended = true;
  });
  REQUIRE(s);
  auto conn = bulk_connect((*s)->endpoint(), bulk_kind::checkpoint, "t", 2000ms);
  REQUIRE(conn);
  s->reset();  // joins the server's thread: returns only once the handler has
  CHECK(handler_ended);
}
