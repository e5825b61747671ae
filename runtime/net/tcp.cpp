#include "runtime/net/tcp.hpp"

#include "runtime/base/posix_file.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace grace::tcp {

bool parse_endpoint(const std::string& ep, sockaddr_in& out) {
  auto colon = ep.rfind(':');
  if (colon == std::string::npos) return false;
  out = {};
  out.sin_family = AF_INET;
  int port = std::atoi(ep.c_str() + colon + 1);
  if (port <= 0 || port > 65535) return false;
  out.sin_port = htons(static_cast<uint16_t>(port));
  return ::inet_pton(AF_INET, ep.substr(0, colon).c_str(), &out.sin_addr) == 1;
}

void set_io_timeout(int fd, std::chrono::milliseconds t) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(t.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((t.count() % 1000) * 1000);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

result<int> connect_to(const std::string& ep, std::chrono::milliseconds timeout) {
  sockaddr_in to{};
  if (!parse_endpoint(ep, to)) return error{errc::invalid_input, "not an IPv4 address:port: '" + ep + "'"};
  fd_guard owned(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  const int fd = owned.fd;
  if (fd < 0) return error{errc::failed, std::string("socket: ") + std::strerror(errno)};
  auto fail = [&](const std::string& why) -> result<int> {
    return error{errc::disconnected, "connect " + ep + ": " + why};
  };
  if (::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0 && errno != EINPROGRESS)
    return fail(std::strerror(errno));
  pollfd p{fd, POLLOUT, 0};
  if (::poll(&p, 1, static_cast<int>(timeout.count())) != 1)
    return fail("no answer within " + std::to_string(timeout.count()) + " ms");
  int err = 0;
  socklen_t len = sizeof err;
  ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
  if (err) return fail(std::strerror(err));
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  set_io_timeout(fd, timeout);
  return owned.release();
}

bool send_all(int fd, const std::string& s) { return send_all(fd, s.data(), s.size()); }

bool send_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool recv_all(int fd, void* p, size_t n) {
  auto* c = static_cast<char*>(p);
  while (n > 0) {
    ssize_t r = ::recv(fd, c, n, 0);
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

result<std::pair<int, uint16_t>> listen_on(const std::string& address, int backlog) {
  sockaddr_in at{};
  if (!parse_endpoint(address + ":1", at)) return error{errc::invalid_input, "'" + address + "' is not an IPv4 address"};
  at.sin_port = 0;
  fd_guard owned(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  const int fd = owned.fd;
  if (fd < 0) return error{errc::failed, std::string("socket: ") + std::strerror(errno)};
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  socklen_t len = sizeof at;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&at), sizeof at) != 0 || ::listen(fd, backlog) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&at), &len) != 0) {
    return error{errc::failed, "cannot listen on " + address + ": " + std::strerror(errno)};
  }
  return std::make_pair(owned.release(), ntohs(at.sin_port));
}

void serve_until_stopped(int listen_fd, int stop_fd, const std::function<void(int)>& handle) {
  for (;;) {
    pollfd p[2] = {{listen_fd, POLLIN, 0}, {stop_fd, POLLIN, 0}};
    if (::poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (p[1].revents) return;
    fd_guard conn(::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC));
    if (conn.fd < 0) continue;
    handle(conn.fd);
  }
}

result<std::string> read_to_end(int fd, size_t max_bytes) {
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t r = ::recv(fd, buf, sizeof buf, 0);
    if (r == 0) return out;
    if (r < 0)
      return error{errc::disconnected, errno == EAGAIN || errno == EWOULDBLOCK
                                           ? std::string("read timed out")
                                           : std::string("read: ") + std::strerror(errno)};
    out.append(buf, static_cast<size_t>(r));
    if (out.size() > max_bytes)
      return error{errc::invalid_input, "reply larger than " + std::to_string(max_bytes) + " bytes"};
  }
}

}  // namespace grace::tcp
