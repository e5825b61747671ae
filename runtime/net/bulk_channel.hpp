#pragma once
/// The bulk channel: the one transport for data between nodes outside the
/// coordination service (checkpoint files between launchers,
/// runtime/checkpoint/checkpoint_fetch.hpp; replicas between workers,
/// runtime/checkpoint/replica.hpp; a donor's state in a recovery in place,
/// runtime/checkpoint/state_transfer.hpp).
///
/// A server listens on one address and serves connections from its own
/// thread until it is destroyed. Every connection first passes the gate: a
/// mutual challenge-response over the job's secret, so the secret never
/// crosses the wire and a recorded handshake is worth nothing:
///
///   server -> "GRBK" u8 version u8 kind  nonce_s[16]             (at accept)
///          |  "ERR <why>\n" (past a bound) and the connection closes
///   client -> "GRBK" u8 version u8 kind  nonce_c[16]  proof_c[32]
///   server -> "OK" proof_s[32]  (then the kind's own requests, framed by
///                               its handler, once the client checked it)
///          |  "ERR <why>\n" and the connection closes
///
///   K       = HMAC-SHA256(secret, "grace bulk channel v2")
///   proof_c = HMAC-SHA256(K, "client" kind nonce_c nonce_s)
///   proof_s = HMAC-SHA256(K, "server" kind nonce_c nonce_s)
///
/// One round trip more than a plain connection.
/// nonce_s is fresh per connection (getrandom), so a replayed client
/// proof fails; the labels differ, so a server's proof is never a client's.
/// A client that cannot check proof_s talks to something that is not this
/// job's server and stops there. The gate holds many handshakes at once
/// (non-blocking, each with a deadline), bounded in total and per peer
/// address: garbage, oversized, silent, slow and half-open connections die
/// there without delaying a member's, before a byte reaches a handler. A
/// connection that passed gets the I/O timeout and the server's stop
/// descriptor (readable once the server stops), so that a handler waiting
/// on a slow peer ends with it; handlers run one at a time.
#include "runtime/base/error.hpp"
#include "runtime/base/posix_file.hpp"
#include "runtime/base/wake_pipe.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

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
  /// Longest time from accept to a passed handshake.
  std::chrono::milliseconds handshake_timeout{3000};
  /// Handshakes in progress at once, in total and from one peer address;
  /// a connection past a bound is refused at once.
  size_t max_pending = 64;
  size_t max_pending_per_peer = 8;
  /// Told why a hello was refused (for the log), on the server's thread.
  std::function<void(const std::string& why)> on_refused;
};

/// The server's side of one connection's handshake, fed the bytes as they
/// arrive: pure (no I/O), so that tests and the fuzzer drive it directly.
class bulk_handshake {
public:
  enum class state { reading, passed, refused };
  /// `key`: bulk_channel_key(secret); `server_nonce`: 16 fresh bytes.
  bulk_handshake(bulk_kind kind, std::string key, std::string server_nonce);
  /// What the server sends at accept, before anything arrives.
  std::string server_hello() const;
  /// Consumes `n` bytes; appends what to send to `out` ("OK" and the
  /// server's proof, or "ERR <why>\n"). A peer that sends more than the
  /// handshake before its answer is refused.
  state feed(const char* p, size_t n, std::string& out);
  state current() const noexcept { return state_; }
  const std::string& why() const noexcept { return why_; }

private:
  state refuse(std::string why, std::string& out);
  bulk_kind kind_;
  std::string key_, nonce_s_, buf_;
  state state_ = state::reading;
  std::string why_;
};

/// K of the handshake above, derived from the job's secret.
std::string bulk_channel_key(const std::string& secret);

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

  /// Connections refused by the gate so far (any reason).
  uint64_t refusals() const noexcept { return refusals_.load(); }

private:
  struct pending;
  bulk_server() = default;
  void serve();
  void accept_one(std::vector<pending>& open);
  void refused(const std::string& why);
  void pass(int fd);
  bulk_config cfg_;
  std::string key_;  ///< bulk_channel_key(cfg_.token), derived once
  handler handle_;
  fd_guard listen_;
  uint16_t port_ = 0;
  wake_pipe stop_;
  std::atomic<uint64_t> refusals_{0};
  std::thread thread_;
};

/// A connection to `endpoint`'s bulk server of kind `k` whose hello was
/// accepted, its reads and writes bounded by `timeout`; the error names
/// the endpoint and the server's reason (e.g. "wrong job token").
result<fd_guard> bulk_connect(const std::string& endpoint, bulk_kind k, const std::string& token,
                              std::chrono::milliseconds timeout);

/// The message a client sends once it has the server's nonce: its hello,
/// nonce and proof (exposed for tests that speak the channel byte by byte).
std::string bulk_client_hello(bulk_kind k, const std::string& key, const std::string& nonce_c,
                              const std::string& nonce_s);
/// A side's proof over both nonces ("server" or "client").
std::string bulk_proof(const std::string& key, const char* side, bulk_kind k, const std::string& nonce_c,
                       const std::string& nonce_s);

}  // namespace grace
