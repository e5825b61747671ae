#pragma once
/// Blocking TCP for Grace's small side channels (checkpoint transfer between
/// nodes, the etcd gateway): every call is bounded by a timeout, so a lost
/// host or a partition never hangs the caller.

#include "runtime/base/error.hpp"

#include <chrono>
#include <functional>
#include <string>
#include <utility>

struct sockaddr_in;

namespace grace::tcp {

/// "a.b.c.d:port" as an IPv4 socket address; false when it is not one.
bool parse_endpoint(const std::string& endpoint, sockaddr_in& out);

/// Each later read or write on `fd` gives up after `t`.
void set_io_timeout(int fd, std::chrono::milliseconds t);

/// A socket connected to "a.b.c.d:port" within `timeout`, whose later reads
/// and writes each time out after `timeout` too. The caller closes it.
result<int> connect_to(const std::string& endpoint, std::chrono::milliseconds timeout);

/// Sends all of `s` (or `n` bytes at `p`); false on an error or a timeout.
bool send_all(int fd, const std::string& s);
bool send_all(int fd, const char* p, size_t n);

/// Reads exactly `n` bytes into `p`; false on an error, a timeout or an
/// early close.
bool recv_all(int fd, void* p, size_t n);

/// A plain value's bytes (host order: both ends are this program), appended
/// to a message being built / read from `fd` (recv_all).
template <class T>
void append_raw(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}
template <class T>
bool recv_raw(int fd, T& v) {
  return recv_all(fd, &v, sizeof v);
}

/// A listening socket on "a.b.c.d" and an ephemeral port: (fd, port). The
/// caller closes it.
result<std::pair<int, uint16_t>> listen_on(const std::string& address, int backlog = 16);

/// Accepts connections on `listen_fd` one at a time and hands each to
/// `handle` (then closes it) until `stop_fd` becomes readable or polling
/// fails: the accept loop of Grace's small servers.
void serve_until_stopped(int listen_fd, int stop_fd, const std::function<void(int)>& handle);

/// Reads until the peer closes, at most `max_bytes` (an error past that).
result<std::string> read_to_end(int fd, size_t max_bytes);

}  // namespace grace::tcp
