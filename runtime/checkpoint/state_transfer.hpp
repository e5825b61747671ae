#pragma once
/// Recovery in place (runtime/coordination/agreement.hpp): a donor's state,
/// straight from its memory to the members that need it, over the bulk
/// channel (kind `state`, the job's secret in the hello).
///
/// Every worker that can recover in place runs a `state_server` from its
/// attach on. It serves nothing until its trainer *arms* it with a round and
/// a step: the trainer is then waiting at a step boundary (or in its
/// collectives' rendezvous), so the registered tensors do not change while
/// they are read, and none is copied first. A request for another round or
/// step, or one that comes before the arm, waits for it up to the I/O
/// timeout and is then refused. `disarm()` waits for a transfer in flight.
///
///   client -> "GETS" u64 round u64 step                        (little-endian)
///   server -> u8 0, u32 n, n bytes of JSON header, then every tensor's bytes
///           | u8 1, u32 n, n bytes of text (why not)
///
/// The header names each tensor (name, dtype, shape, bytes, xxh3-64) and
/// carries the step's counters and metadata (blobs, base64). The receiver
/// checks the layout against its own registered tensors before a byte is
/// written into them, and every tensor's checksum after.

#include "runtime/base/error.hpp"
#include "runtime/base/tensor.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/net/bulk_channel.hpp"

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace grace {

/// What a donor serves while armed: borrowed tensors (host memory) and the
/// step's counters and metadata.
struct donor_state {
  uint64_t round = 0;
  uint64_t step = 0;
  std::vector<tensor_ref> tensors;
  rank_state meta;
};

class state_server {
public:
  /// Listens on `address` (an ephemeral port).
  static result<std::unique_ptr<state_server>> start(const std::string& address, const std::string& token,
                                                     std::chrono::milliseconds io_timeout);
  ~state_server();
  state_server(const state_server&) = delete;
  state_server& operator=(const state_server&) = delete;
  std::string endpoint() const { return server_->endpoint(); }

  /// Serves `s` from now on (trainer thread; its tensors stay unchanged
  /// until disarm()).
  void arm(donor_state s);
  /// Stops serving; returns once no transfer reads the tensors.
  void disarm();
  /// Transfers served since the start.
  uint64_t served() const;

private:
  state_server() = default;
  void handle(int fd, int stop_fd);
  /// The armed state if it is `round`/`step` (waits for the arm up to the
  /// I/O timeout); marks a transfer in flight. nullptr: refused, `why` says.
  const donor_state* begin_serving(uint64_t round, uint64_t step, std::string& why);
  void end_serving();

  std::chrono::milliseconds io_timeout_{10000};
  mutable std::mutex m_;
  std::condition_variable cv_;
  std::optional<donor_state> armed_;  ///< guarded by m_
  int in_flight_ = 0;                 ///< guarded by m_
  bool disarming_ = false;            ///< guarded by m_: disarm() waits for the transfers in flight
  uint64_t served_ = 0;               ///< guarded by m_
  std::unique_ptr<bulk_server> server_;
};

/// What a fetch brought besides the tensors' bytes.
struct fetched_state {
  rank_state meta;
  uint64_t bytes = 0;  ///< tensor bytes received
};

/// Takes round `round`'s state of `step` from the donor at `endpoint` into
/// `into` (the receiver's registered tensors, host memory: same names,
/// dtypes and shapes in the same order). On an error the tensors may hold
/// part of the donor's state: the caller must not use them.
result<fetched_state> fetch_state(const std::string& endpoint, const std::string& token, uint64_t round, uint64_t step,
                                  const std::vector<tensor_ref>& into, std::chrono::milliseconds timeout);

}  // namespace grace
