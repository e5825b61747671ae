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
  INFO((c ? std::string() : c.err().message));
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
  CHECK(kind.err().message.find("this is the replica channel, not the checkpoint channel") != std::string::npos);
  auto why = e.refusals(2);
  CHECK(why == std::vector<std::string>{
                   "wrong job token",
                   "closed during the hello (a client without this job's secret, or not a Grace client?)"});
  CHECK(e.server->refusals() == 2);
  std::lock_guard<std::mutex> g(e.m);
  CHECK(e.served.empty());
}

namespace {

/// A raw connection to `ep`, past the server's 22-byte hello (kept).
struct raw_peer {
  fd_guard fd;
  std::string server_hello;
  explicit raw_peer(const std::string& ep) {
    auto c = tcp::connect_to(ep, 2000ms);
    REQUIRE(c);
    fd.reset(*c);
    server_hello = read(22);
  }
  /// Up to `n` bytes, fewer if the server closes.
  std::string read(size_t n) {
    std::string s(n, '\0');
    size_t got = 0;
    while (got < n) {
      ssize_t r = ::recv(fd.fd, s.data() + got, n - got, 0);
      if (r <= 0) break;
      got += static_cast<size_t>(r);
    }
    s.resize(got);
    return s;
  }
  std::string nonce() const { return server_hello.substr(6); }
};

const std::string test_secret = "job-secret-0123456789";

}  // namespace

TEST_CASE("bulk channel: garbage, an old version and a silent peer die at the gate", "[bulk]") {
  echo_server e(bulk_kind::checkpoint, 300ms);
  const auto ep = e.server->endpoint();
  auto raw = [&](const std::string& bytes) {
    raw_peer p(ep);
    CHECK(p.server_hello.substr(0, 6) == std::string("GRBK\x02\x01", 6));
    if (!bytes.empty()) REQUIRE(tcp::send_all(p.fd.fd, bytes));
    auto reply = tcp::read_to_end(p.fd.fd, 256);  // the server closes after its answer
    return reply ? *reply : std::string("(read failed)");
  };
  CHECK(raw("GET / HTTP/1.0\r\n\r\n") == "ERR not a Grace bulk channel hello\n");
  CHECK(raw(std::string("GRBK\x01\x01\xff\xff", 8)) == "ERR bulk channel version 1, expected 2\n");
  // Nothing at all: dropped after the deadline, and served again after.
  CHECK(raw("") == "ERR no hello\n");
  auto ok = bulk_connect(ep, bulk_kind::checkpoint, test_secret, 2000ms);
  REQUIRE(ok);
  CHECK(echo(ok->fd, "y") == "y");
  CHECK(e.refusals(3).size() == 3);
}

TEST_CASE("bulk channel: the secret never travels, and a recorded handshake replayed is refused", "[bulk]") {
  echo_server e(bulk_kind::state);
  const auto ep = e.server->endpoint();
  const std::string key = bulk_channel_key(test_secret);
  const std::string nonce_c(16, 'n');
  std::string recorded;
  {
    raw_peer p(ep);
    recorded = bulk_client_hello(bulk_kind::state, key, nonce_c, p.nonce());
    REQUIRE(tcp::send_all(p.fd.fd, recorded));
    const std::string ok = p.read(34);
    REQUIRE(ok.size() == 34);
    CHECK(ok.substr(0, 2) == "OK");
    CHECK(ok.substr(2) == bulk_proof(key, "server", bulk_kind::state, nonce_c, p.nonce()));
    CHECK(recorded.find(test_secret) == std::string::npos);
    CHECK(recorded.find(key) == std::string::npos);
  }
  raw_peer replay(ep);
  CHECK(replay.nonce() != std::string(16, '\0'));
  REQUIRE(tcp::send_all(replay.fd.fd, recorded));
  CHECK(replay.read(64) == "ERR wrong job token\n");
  CHECK(e.refusals(1) == std::vector<std::string>{"wrong job token"});
}

TEST_CASE("bulk channel: silent connections neither block a member nor exceed their bounds", "[bulk]") {
  bulk_config c;
  c.kind = bulk_kind::replica;
  c.address = "127.0.0.1";
  c.token = test_secret;
  c.io_timeout = 60000ms;
  c.handshake_timeout = 60000ms;  // the silent ones stay for the whole test
  c.max_pending = 40;
  c.max_pending_per_peer = 40;
  std::atomic<int> served{0};
  auto s = bulk_server::start(c, [&](int, int) { ++served; });
  REQUIRE(s);
  const auto ep = (*s)->endpoint();
  std::vector<std::unique_ptr<raw_peer>> silent;
  for (int i = 0; i < 39; ++i) {
    silent.push_back(std::make_unique<raw_peer>(ep));
    if (i % 2) REQUIRE(tcp::send_all(silent.back()->fd.fd, std::string("GRB", 3)));  // half a hello
  }
  // A member gets through while 39 handshakes hang (the 40th slot).
  auto member = bulk_connect(ep, bulk_kind::replica, test_secret, 5000ms);
  REQUIRE(member);
  member->reset();
  // Past the bound: refused at once, with the reason.
  raw_peer one_more(ep);
  auto past = tcp::connect_to(ep, 2000ms);
  REQUIRE(past);
  fd_guard past_fd(*past);
  auto reply = tcp::read_to_end(*past, 256);
  REQUIRE(reply);
  CHECK(reply->rfind("ERR too many handshakes in progress", 0) == 0);
  CHECK((*s)->refusals() >= 1);
  s->reset();
  CHECK(served == 1);
}

TEST_CASE("bulk channel: the handshake takes its bytes in any pieces", "[bulk]") {
  const std::string key = bulk_channel_key(test_secret);
  const std::string nonce_c(16, 'c'), nonce_s(16, 's');
  bulk_handshake hs(bulk_kind::checkpoint, key, nonce_s);
  CHECK(hs.server_hello() == std::string("GRBK\x02\x01", 6) + nonce_s);
  const std::string in = bulk_client_hello(bulk_kind::checkpoint, key, nonce_c, nonce_s);
  std::string out;
  for (size_t i = 0; i + 1 < in.size(); ++i)
    REQUIRE(hs.feed(&in[i], 1, out) == bulk_handshake::state::reading);
  CHECK(out.empty());
  CHECK(hs.feed(&in.back(), 1, out) == bulk_handshake::state::passed);
  CHECK(out == "OK" + bulk_proof(key, "server", bulk_kind::checkpoint, nonce_c, nonce_s));
  bulk_handshake greedy(bulk_kind::checkpoint, key, nonce_s);
  std::string out2;
  CHECK(greedy.feed((in + "LIST\n").data(), in.size() + 5, out2) == bulk_handshake::state::refused);
  CHECK(greedy.why() == "bytes past the handshake before its answer");
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
