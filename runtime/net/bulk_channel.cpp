#include "runtime/net/bulk_channel.hpp"

#include "runtime/net/hmac.hpp"
#include "runtime/net/job_token.hpp"
#include "runtime/net/tcp.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>

namespace grace {

namespace {

using clock = std::chrono::steady_clock;

constexpr char bulk_magic[4] = {'G', 'R', 'B', 'K'};
constexpr uint8_t bulk_version = 2;
constexpr size_t nonce_bytes = 16;
constexpr size_t proof_bytes = 32;
constexpr size_t hello_bytes = 6 + nonce_bytes;  // magic, version, kind, nonce
constexpr size_t max_hello_reply = 256;

/// 16 fresh bytes from getrandom.
std::string fresh_nonce() {
  std::string n(nonce_bytes, '\0');
  size_t got = 0;
  while (got < n.size()) {
    ssize_t r = ::getrandom(n.data() + got, n.size() - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) throw std::runtime_error(std::string("getrandom: ") + std::strerror(errno));
    got += static_cast<size_t>(r);
  }
  return n;
}

std::string header(bulk_kind k) {
  std::string h(bulk_magic, sizeof bulk_magic);
  h.push_back(static_cast<char>(bulk_version));
  h.push_back(static_cast<char>(k));
  return h;
}

/// Says why, then drops what the peer already sent (at most 64 KiB, without
/// waiting): closing with unread bytes would reset the connection, and the
/// peer could lose the answer.
void drain_and_shut(int fd) {
  ::shutdown(fd, SHUT_WR);
  char sink[4096];
  for (size_t drained = 0; drained < (64u << 10);) {
    ssize_t r = ::recv(fd, sink, sizeof sink, MSG_DONTWAIT);
    if (r <= 0) break;
    drained += static_cast<size_t>(r);
  }
}

/// One line of at most max_hello_reply bytes, without its '\n'.
result<std::string> read_reply(int fd, std::string s = {}) {
  char ch;
  while (s.size() < max_hello_reply) {
    ssize_t r = ::recv(fd, &ch, 1, 0);
    if (r <= 0) return error{errc::disconnected, r == 0 ? "closed during the hello" : std::strerror(errno)};
    if (ch == '\n') return s;
    s.push_back(ch);
  }
  return error{errc::invalid_input, "hello reply too long"};
}

std::string peer_address(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return "?";
  char buf[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &a.sin_addr, buf, sizeof buf);
  return buf;
}

}  // namespace

const char* to_string(bulk_kind k) noexcept {
  switch (k) {
    case bulk_kind::checkpoint: return "checkpoint";
    case bulk_kind::replica: return "replica";
    case bulk_kind::state: return "state";
  }
  return "unknown";
}

std::string bulk_channel_key(const std::string& secret) { return hmac_sha256(secret, "grace bulk channel v2"); }

std::string bulk_proof(const std::string& key, const char* side, bulk_kind k, const std::string& nonce_c,
                       const std::string& nonce_s) {
  return hmac_sha256(key, std::string(side) + '\0' + static_cast<char>(k) + nonce_c + nonce_s);
}

std::string bulk_client_hello(bulk_kind k, const std::string& key, const std::string& nonce_c,
                              const std::string& nonce_s) {
  return header(k) + nonce_c + bulk_proof(key, "client", k, nonce_c, nonce_s);
}

// ------------------------------------------------------------ the handshake

bulk_handshake::bulk_handshake(bulk_kind kind, std::string key, std::string server_nonce)
    : kind_(kind), key_(std::move(key)), nonce_s_(std::move(server_nonce)) {}

std::string bulk_handshake::server_hello() const { return header(kind_) + nonce_s_; }

bulk_handshake::state bulk_handshake::refuse(std::string why, std::string& out) {
  why_ = std::move(why);
  out += "ERR " + why_ + "\n";
  return state_ = state::refused;
}

bulk_handshake::state bulk_handshake::feed(const char* p, size_t n, std::string& out) {
  if (state_ != state::reading) return state_;
  buf_.append(p, n);
  const size_t have = std::min(buf_.size(), sizeof bulk_magic);
  if (std::memcmp(buf_.data(), bulk_magic, have) != 0) return refuse("not a Grace bulk channel hello", out);
  if (buf_.size() > 4 && static_cast<uint8_t>(buf_[4]) != bulk_version)
    return refuse("bulk channel version " + std::to_string(static_cast<uint8_t>(buf_[4])) + ", expected " +
                      std::to_string(bulk_version), out);
  if (buf_.size() > 5 && static_cast<uint8_t>(buf_[5]) != static_cast<uint8_t>(kind_))
    return refuse(std::string("this is the ") + to_string(kind_) + " channel, not kind " +
                      std::to_string(static_cast<uint8_t>(buf_[5])), out);
  if (buf_.size() < hello_bytes + proof_bytes) return state_;
  if (buf_.size() > hello_bytes + proof_bytes) return refuse("bytes past the handshake before its answer", out);
  const std::string nonce_c = buf_.substr(6, nonce_bytes);
  if (!constant_time_equal(buf_.substr(hello_bytes), bulk_proof(key_, "client", kind_, nonce_c, nonce_s_)))
    return refuse("wrong job token", out);
  out += "OK" + bulk_proof(key_, "server", kind_, nonce_c, nonce_s_);
  return state_ = state::passed;
}

// ------------------------------------------------------------------ server

/// One connection in the gate.
struct bulk_server::pending {
  fd_guard fd;
  std::string peer;
  clock::time_point deadline;
  bulk_handshake hs;
};

result<std::unique_ptr<bulk_server>> bulk_server::start(bulk_config c, handler handle) {
  std::unique_ptr<bulk_server> s(new bulk_server());
  s->cfg_ = std::move(c);
  s->key_ = bulk_channel_key(s->cfg_.token);
  s->handle_ = std::move(handle);
  auto l = tcp::listen_on(s->cfg_.address, s->cfg_.backlog);
  if (!l) return error{errc::failed, std::string(to_string(s->cfg_.kind)) + " channel: " + l.err().message};
  s->listen_.reset(l->first);
  s->port_ = l->second;
  ::fcntl(s->listen_.fd, F_SETFL, ::fcntl(s->listen_.fd, F_GETFL) | O_NONBLOCK);
  if (!s->stop_.ok())
    return error{errc::failed, std::string(to_string(s->cfg_.kind)) + " channel: pipe: " +
                                   std::strerror(s->stop_.error_number())};
  s->thread_ = std::thread([p = s.get()] { p->serve(); });
  return s;
}

bulk_server::~bulk_server() {
  stop_.wake();
  if (thread_.joinable()) thread_.join();
}

void bulk_server::refused(const std::string& why) {
  ++refusals_;
  if (cfg_.on_refused) cfg_.on_refused(why);
}

/// A connection past a bound is told so and closed at once.
void bulk_server::accept_one(std::vector<pending>& open) {
  fd_guard conn(::accept4(listen_.fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
  if (conn.fd < 0) return;
  std::string peer = peer_address(conn.fd);
  const auto from_peer = static_cast<size_t>(
      std::count_if(open.begin(), open.end(), [&](const pending& p) { return p.peer == peer; }));
  if (open.size() >= cfg_.max_pending || from_peer >= cfg_.max_pending_per_peer) {
    const std::string why = open.size() >= cfg_.max_pending ? "too many handshakes in progress"
                                                            : "too many handshakes in progress from " + peer;
    (void)::send(conn.fd, ("ERR " + why + "\n").data(), why.size() + 5, MSG_NOSIGNAL | MSG_DONTWAIT);
    refused(why);
    return;
  }
  const auto limit = std::min(cfg_.handshake_timeout, cfg_.io_timeout);
  bulk_handshake hs(cfg_.kind, key_, fresh_nonce());
  const std::string hello = hs.server_hello();
  (void)::send(conn.fd, hello.data(), hello.size(), MSG_NOSIGNAL | MSG_DONTWAIT);  // fits a fresh socket's buffer
  open.push_back(pending{std::move(conn), std::move(peer), clock::now() + limit, std::move(hs)});
}

/// A connection whose handshake passed (its "OK" and proof sent):
/// blocking again, bounded by the I/O timeout, handed to the handler.
void bulk_server::pass(int fd) {
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  tcp::set_io_timeout(fd, cfg_.io_timeout);
  handle_(fd, stop_.fd());
}

void bulk_server::serve() {
  std::vector<pending> open;
  for (;;) {
    std::vector<pollfd> p{{listen_.fd, POLLIN, 0}, {stop_.fd(), POLLIN, 0}};
    auto now = clock::now();
    int wait_ms = -1;
    for (auto& c : open) {
      p.push_back({c.fd.fd, POLLIN, 0});
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(c.deadline - now).count();
      wait_ms = wait_ms < 0 ? int(std::max<long long>(left, 0)) : std::min(wait_ms, int(std::max<long long>(left, 0)));
    }
    if (::poll(p.data(), p.size(), wait_ms) < 0 && errno != EINTR) return;
    if (p[1].revents) return;
    std::vector<pending> next;
    std::vector<fd_guard> passed;
    now = clock::now();
    for (size_t i = 0; i < open.size(); ++i) {
      auto& c = open[i];
      std::string out;
      bool closed = false;
      if (p[i + 2].revents) {
        char buf[256];
        ssize_t r = ::recv(c.fd.fd, buf, sizeof buf, 0);
        if (r > 0) c.hs.feed(buf, static_cast<size_t>(r), out);
        else if (r == 0 || (errno != EAGAIN && errno != EINTR)) closed = true;
      }
      if (!out.empty()) (void)::send(c.fd.fd, out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      const auto st = c.hs.current();
      if (st == bulk_handshake::state::passed) {
        passed.push_back(std::move(c.fd));
      } else if (st == bulk_handshake::state::refused) {
        drain_and_shut(c.fd.fd);
        refused(c.hs.why());
      } else if (closed) {
        refused("closed during the hello (a client without this job's secret, or not a Grace client?)");
      } else if (now >= c.deadline) {
        const std::string why = "no hello";
        (void)::send(c.fd.fd, ("ERR " + why + "\n").data(), why.size() + 5, MSG_NOSIGNAL | MSG_DONTWAIT);
        drain_and_shut(c.fd.fd);
        refused(why);
      } else {
        next.push_back(std::move(c));
      }
    }
    open = std::move(next);
    // Handlers run one at a time; the time they take is not the waiting
    // handshakes' fault.
    const auto t0 = clock::now();
    for (auto& fd : passed) pass(fd.fd);
    const auto spent = clock::now() - t0;
    for (auto& c : open) c.deadline += spent;
    if (p[0].revents)
      for (int k = 0; k < 16; ++k) {
        const size_t before = open.size();
        const uint64_t refused_before = refusals_;
        accept_one(open);
        if (open.size() == before && refusals_ == refused_before) break;  // nothing more to accept
      }
  }
}

// ------------------------------------------------------------------ client

namespace {

/// The rest of an "ERR <why>\n" whose first 4 bytes were read.
error refusal(int fd, const std::string& endpoint) {
  auto why = read_reply(fd);
  return error{errc::invalid_input, endpoint + ": " + (why ? *why : why.err().message)};
}

}  // namespace

result<fd_guard> bulk_connect(const std::string& endpoint, bulk_kind k, const std::string& token,
                              std::chrono::milliseconds timeout) {
  auto fd = tcp::connect_to(endpoint, timeout);
  if (!fd) return fd.err();
  fd_guard conn(*fd);
  std::string hello(hello_bytes, '\0');
  if (!tcp::recv_all(conn.fd, hello.data(), 4)) return error{errc::disconnected, endpoint + ": closed during the hello"};
  if (hello.compare(0, 4, "ERR ") == 0) return refusal(conn.fd, endpoint);
  if (std::memcmp(hello.data(), bulk_magic, 4) != 0 || !tcp::recv_all(conn.fd, hello.data() + 4, hello.size() - 4) ||
      static_cast<uint8_t>(hello[4]) != bulk_version)
    return error{errc::invalid_input, endpoint + ": not a Grace bulk channel (version " +
                                          std::to_string(bulk_version) + ")"};
  if (static_cast<uint8_t>(hello[5]) != static_cast<uint8_t>(k))
    return error{errc::invalid_input, endpoint + ": this is the " +
                                          to_string(static_cast<bulk_kind>(static_cast<uint8_t>(hello[5]))) +
                                          " channel, not the " + to_string(k) + " channel"};
  const std::string nonce_s = hello.substr(6), nonce_c = fresh_nonce(), key = bulk_channel_key(token);
  if (!tcp::send_all(conn.fd, bulk_client_hello(k, key, nonce_c, nonce_s)))
    return error{errc::disconnected, endpoint + ": the hello could not be sent"};
  std::string reply(2 + proof_bytes, '\0');
  if (!tcp::recv_all(conn.fd, reply.data(), 4)) return error{errc::disconnected, endpoint + ": closed during the hello"};
  if (reply.compare(0, 4, "ERR ") == 0) return refusal(conn.fd, endpoint);
  if (reply.compare(0, 2, "OK") != 0 || !tcp::recv_all(conn.fd, reply.data() + 4, reply.size() - 4))
    return error{errc::invalid_input, endpoint + ": not a Grace bulk channel"};
  if (!constant_time_equal(reply.substr(2), bulk_proof(key, "server", k, nonce_c, nonce_s)))
    return error{errc::invalid_input, endpoint + ": wrong job token: the server could not prove this job's secret "
                                                 "(another job's server, or not a Grace server); nothing sent"};
  return conn;
}

}  // namespace grace
