#pragma once
/// CPU collectives over Gloo TCP, with every Gloo exception turned into an
/// error value and an abort that unblocks a collective stuck on a dead peer.
///
/// One gloo_comm is one rendezvous: after any error or an abort it is
/// unusable, and the caller connects a new one under a fresh store prefix
/// (store keys are never deleted).
///
/// Threading: one thread (the trainer) issues collectives; any other thread
/// may call `abort()` and `aborted()` concurrently. Destruction must not race
/// `abort()`: whoever may abort must hold the comm alive (e.g. a shared_ptr).

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "runtime/error.hpp"

namespace gloo {
class Context;
namespace rendezvous {
class Store;
class PrefixStore;
} // namespace rendezvous
namespace transport {
class Device;
} // namespace transport
} // namespace gloo

namespace grace {

class gloo_comm {
public:
  /// Rendezvous through `store` under `prefix` and connect a full mesh of
  /// TCP pairs bound to `iface_host`. `timeout` bounds the rendezvous and
  /// every later collective. Errors: invalid_input for bad rank/size,
  /// disconnected or overloaded (timeout) when peers do not show up.
  static result<std::unique_ptr<gloo_comm>> connect(
      std::shared_ptr<gloo::rendezvous::Store> store, std::string prefix, int rank, int size,
      std::chrono::milliseconds timeout, std::string iface_host = "127.0.0.1");

  ~gloo_comm();
  gloo_comm(const gloo_comm&) = delete;
  gloo_comm& operator=(const gloo_comm&) = delete;

  /// In-place sum over all ranks (ring algorithm). For a fixed world size
  /// the summation order is fixed, so results are bit-identical across runs
  /// and across ranks. n == 0 is a no-op on every rank.
  status allreduce_sum(float* data, size_t n);
  /// Copies root's `data` to every rank.
  status broadcast(float* data, size_t n, int root);
  status barrier();

  /// Makes a collective blocked in another thread fail promptly (and every
  /// later one fail at once). Safe to call from any thread, more than once.
  /// The peers see the connections close and fail too.
  void abort();
  bool aborted() const noexcept { return aborted_.load(std::memory_order_acquire); }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  std::chrono::milliseconds timeout() const noexcept { return timeout_; }

private:
  gloo_comm() = default;
  /// Maps the exception in flight (call inside a catch block only).
  error map_exception(const char* op, std::chrono::steady_clock::time_point start) const;
  status precheck(const char* op) const;

  int rank_ = 0;
  int size_ = 1;
  std::chrono::milliseconds timeout_{0};
  uint32_t next_tag_ = 0;
  std::atomic<bool> aborted_{false};
  std::atomic<bool> failed_{false};
  std::shared_ptr<gloo::rendezvous::Store> store_;
  std::unique_ptr<gloo::rendezvous::PrefixStore> prefix_store_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> context_;
};

} // namespace grace
