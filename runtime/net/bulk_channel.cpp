#include "runtime/net/bulk_channel.hpp"

#include "runtime/net/job_token.hpp"
#include "runtime/net/tcp.hpp"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace grace {

namespace {

constexpr char bulk_magic[4] = {'G', 'R', 'B', 'K'};
constexpr uint8_t bulk_version = 1;
constexpr uint16_t max_hello_token = 4096;
constexpr size_t max_hello_reply = 256;

/// The reason a hello on `fd` is refused, or "" when it passes.
std::string check_hello(int fd, const bulk_config& c) {
  unsigned char head[8];
  if (!tcp::recv_all(fd, head, sizeof head)) return "no hello";
  if (std::memcmp(head, bulk_magic, 4) != 0) return "not a Grace bulk channel hello";
  if (head[4] != bulk_version) return "bulk channel version " + std::to_string(head[4]) + ", expected " +
                                     std::to_string(bulk_version);
  if (head[5] != static_cast<uint8_t>(c.kind))
    return std::string("this is the ") + to_string(c.kind) + " channel, not kind " + std::to_string(head[5]);
  const uint16_t len = static_cast<uint16_t>(head[6] | (head[7] << 8));
  if (len > max_hello_token) return "job token too long";
  std::string token(len, '\0');
  if (!tcp::recv_all(fd, token.data(), len)) return "no hello";
  if (!constant_time_equal(token, c.token)) return "wrong job token";
  return {};
}

/// Says why, then drops what the peer already sent (at most 64 KiB, without
/// waiting): closing with unread bytes would reset the connection, and the
/// peer could lose the answer.
void refuse(int fd, const std::string& why) {
  tcp::send_all(fd, "ERR " + why + "\n");
  ::shutdown(fd, SHUT_WR);
  char sink[4096];
  for (size_t drained = 0; drained < (64u << 10);) {
    ssize_t r = ::recv(fd, sink, sizeof sink, MSG_DONTWAIT);
    if (r <= 0) break;
    drained += static_cast<size_t>(r);
  }
}

/// One line of at most max_hello_reply bytes, without its '\n'.
result<std::string> read_reply(int fd) {
  std::string s;
  char ch;
  while (s.size() < max_hello_reply) {
    ssize_t r = ::recv(fd, &ch, 1, 0);
    if (r <= 0) return error{errc::disconnected, r == 0 ? "closed during the hello" : std::strerror(errno)};
    if (ch == '\n') return s;
    s.push_back(ch);
  }
  return error{errc::invalid_input, "hello reply too long"};
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

std::string bulk_hello(bulk_kind k, const std::string& token) {
  std::string h(bulk_magic, sizeof bulk_magic);
  h.push_back(static_cast<char>(bulk_version));
  h.push_back(static_cast<char>(k));
  const auto len = static_cast<uint16_t>(std::min<size_t>(token.size(), UINT16_MAX));
  h.push_back(static_cast<char>(len & 0xff));
  h.push_back(static_cast<char>(len >> 8));
  h.append(token, 0, len);
  return h;
}

result<std::unique_ptr<bulk_server>> bulk_server::start(bulk_config c, handler handle) {
  std::unique_ptr<bulk_server> s(new bulk_server());
  s->cfg_ = std::move(c);
  s->handle_ = std::move(handle);
  auto l = tcp::listen_on(s->cfg_.address, s->cfg_.backlog);
  if (!l) return error{errc::failed, std::string(to_string(s->cfg_.kind)) + " channel: " + l.err().message};
  s->listen_.reset(l->first);
  s->port_ = l->second;
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

void bulk_server::serve() {
  tcp::serve_until_stopped(listen_.fd, stop_.fd(), [this](int fd) {
    tcp::set_io_timeout(fd, cfg_.io_timeout);
    if (auto why = check_hello(fd, cfg_); !why.empty()) {
      refuse(fd, why);
      if (cfg_.on_refused) cfg_.on_refused(why);
      return;
    }
    if (tcp::send_all(fd, "OK\n")) handle_(fd, stop_.fd());
  });
}

result<fd_guard> bulk_connect(const std::string& endpoint, bulk_kind k, const std::string& token,
                              std::chrono::milliseconds timeout) {
  auto fd = tcp::connect_to(endpoint, timeout);
  if (!fd) return fd.err();
  fd_guard conn(*fd);
  if (!tcp::send_all(conn.fd, bulk_hello(k, token)))
    return error{errc::disconnected, endpoint + ": the hello could not be sent"};
  auto reply = read_reply(conn.fd);
  if (!reply) return error{reply.err().code, endpoint + ": " + reply.err().message};
  if (*reply == "OK") return conn;
  if (reply->rfind("ERR ", 0) == 0) return error{errc::invalid_input, endpoint + ": " + reply->substr(4)};
  return error{errc::invalid_input, endpoint + ": not a Grace bulk channel"};
}

}  // namespace grace
