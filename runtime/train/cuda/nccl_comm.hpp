#pragma once
/// GPU collectives over NCCL, with the same contract as gloo_comm
/// (runtime/train/gloo_comm.hpp): every failure is an error value, every call is
/// bounded by the timeout, and `abort()` from another thread unblocks a
/// collective stuck on a dead peer.
///
/// Rendezvous: rank 0 creates the ncclUniqueId and publishes it in the
/// coordination service's store under `prefix + "nccl-id"`; the others wait
/// for the key (bounded by the timeout). One nccl_comm is one rendezvous:
/// after an error or an abort it is unusable; connect a new one under a fresh
/// prefix (store keys are never deleted).
///
/// NCCL runs in non-blocking mode (ncclConfig_t::blocking = 0): init and
/// collectives return at once and this class polls ncclCommGetAsyncError and
/// the stream against the deadline, so neither init nor a collective can hang
/// the trainer, and ncclCommAbort cannot block behind them.
///
/// Threading: one thread (the trainer) calls connect/allreduce; any thread may
/// call `abort()` / `aborted()`. Destruction must not race `abort()`.
///
/// Plain C++ header (pimpl): no CUDA or NCCL header is included.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "runtime/base/error.hpp"

namespace gloo {
namespace rendezvous {
class Store;
}  // namespace rendezvous
}  // namespace gloo

namespace grace {

class cancel_token;

class nccl_comm {
public:
  /// Joins the NCCL communicator of `size` ranks on CUDA device `device`.
  /// Errors: invalid_input (bad rank/size/device/timeout), overloaded (the
  /// unique id or the peers did not arrive within `timeout`), disconnected
  /// (the store or a peer failed), failed (a local CUDA/NCCL error).
  /// With `cancel`, a raised token ends the init's polling at once
  /// (errc::disconnected): arm the session's abort handler with it.
  static result<std::unique_ptr<nccl_comm>> connect(std::shared_ptr<gloo::rendezvous::Store> store, std::string prefix,
                                                    int rank, int size, int device, std::chrono::milliseconds timeout,
                                                    std::shared_ptr<cancel_token> cancel = nullptr);

  ~nccl_comm();
  nccl_comm(const nccl_comm&) = delete;
  nccl_comm& operator=(const nccl_comm&) = delete;

  /// In-place sum over all ranks of `n` floats at `device_data` (device
  /// memory on this comm's device). Returns when the result is in place.
  /// The caller's stream must be idle on that buffer (mlp_cuda's calls
  /// return with its stream idle). n == 0 is a no-op.
  /// Errors: disconnected (aborted, or a peer/network failure), overloaded
  /// (no completion within the timeout; the communicator is then aborted),
  /// failed (a local CUDA/NCCL error).
  status allreduce_sum(float* device_data, size_t n);

  /// Aborts the communicator (ncclCommAbort): a collective blocked in
  /// allreduce_sum returns errc::disconnected promptly, later calls fail at
  /// once. Safe from any thread, more than once.
  void abort();
  bool aborted() const noexcept { return aborted_.load(std::memory_order_acquire); }

  /// True while allreduce_sum is running (for watchdogs and tests).
  bool in_flight() const noexcept { return in_flight_.load(std::memory_order_acquire); }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  int device() const noexcept { return device_; }
  std::chrono::milliseconds timeout() const noexcept { return timeout_; }

private:
  nccl_comm() = default;
  /// Aborts after a failure in allreduce_sum, lets the aborted kernels exit
  /// (bounded) so the buffer is not written after the return, and names it.
  status fail_collective(errc code, size_t n, const std::string& what);
  /// Polls until the enqueued collective ran, a peer fails, this comm is
  /// aborted, or `deadline` passes.
  status await_collective(size_t n, std::chrono::steady_clock::time_point start,
                          std::chrono::steady_clock::time_point deadline);
  struct impl;
  std::unique_ptr<impl> impl_;
  int rank_ = 0;
  int size_ = 1;
  int device_ = 0;
  std::chrono::milliseconds timeout_{0};
  std::atomic<bool> aborted_{false};
  std::atomic<bool> failed_{false};
  std::atomic<bool> in_flight_{false};
};

}  // namespace grace
