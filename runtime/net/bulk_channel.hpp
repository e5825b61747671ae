#pragma once
/// The bulk channel: the one transport for data between nodes outside the
/// coordination service (checkpoint files between launchers,
/// runtime/checkpoint/checkpoint_fetch.hpp; replicas between workers,
/// runtime/checkpoint/replica.hpp; a donor's state in a recovery in place,
/// runtime/checkpoint/state_transfer.hpp).
///
/// A server listens on one address and serves connections one at a time
/// from its own thread until it is destroyed. Every connection opens with a
/// hello that names the channel's kind and proves the job's secret:
///
///   client -> "GRBK" u8 version u8 kind u16 token_len token
///   server -> "OK\n"  (then the kind's own requests, framed by its handler)
///          |  "ERR <why>\n" and the connection closes
///
/// before a byte reaches the kind's handler. A hello that is malformed,
/// too long, for another kind or late (the I/O timeout) is refused the same
/// way. The handler gets the connection with the I/O timeout set and the
/// server's stop descriptor (readable once the server stops), so that a
/// handler waiting on a slow peer ends with it.

#include "runtime/base/error.hpp"
#include "runtime/base/posix_file.hpp"
#include "runtime/base/wake_pipe.hpp"

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

namespace grace {

enum class bulk_kind : uint8_t { checkpoint = 1, replica = 2, state = 3 };

/// "checkpoint" / "replica" / "state".
const char* to_string(bulk_kind k) noexcept;

struct bulk_config {
  bulk_kind kind = bulk_kind::checkpoint;
  std::string address;  ///< the IPv4 address to listen on (an ephemeral port)
  std::string token;    ///< the job's secret every hello must carry
  std::chrono::milliseconds io_timeout{10000};
  int backlog = 16;
  /// Told why a hello was refused (for the log), on the server's thread.
  std::function<void(const std::string& why)> on_refused;
};

class bulk_server {
public:
  /// `handle(fd, stop_fd)`: one accepted connection whose hello passed.
  using handler = std::function<void(int fd, int stop_fd)>;
  static result<std::unique_ptr<bulk_server>> start(bulk_config c, handler handle);
  /// Stops serving: the thread is woken, a handler's wait on `stop_fd`
  /// ends, and the thread is joined.
  ~bulk_server();
  bulk_server(const bulk_server&) = delete;
  bulk_server& operator=(const bulk_server&) = delete;
  uint16_t port() const noexcept { return port_; }
  /// "address:port"
  std::string endpoint() const { return cfg_.address + ":" + std::to_string(port_); }

private:
  bulk_server() = default;
  void serve();
  bulk_config cfg_;
  handler handle_;
  fd_guard listen_;
  uint16_t port_ = 0;
  wake_pipe stop_;
  std::thread thread_;
};

/// A connection to `endpoint`'s bulk server of kind `k` whose hello was
/// accepted, its reads and writes bounded by `timeout`; the error names
/// the endpoint and the server's reason (e.g. "wrong job token").
result<fd_guard> bulk_connect(const std::string& endpoint, bulk_kind k, const std::string& token,
                              std::chrono::milliseconds timeout);

/// The hello a client sends (exposed for tests that speak the channel
/// byte by byte).
std::string bulk_hello(bulk_kind k, const std::string& token);

}  // namespace grace
