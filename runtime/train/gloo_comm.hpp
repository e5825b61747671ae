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
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/base/error.hpp"

namespace gloo {
class Context;
namespace rendezvous {
class Store;
class PrefixStore;
}  // namespace rendezvous
namespace transport {
class Device;
class UnboundBuffer;
}  // namespace transport
}  // namespace gloo

namespace grace {

class cancel_token;

/// Many fields for a reason: the Gloo context with its store and device,
/// the abort machinery (flags, the operations in flight, the buffers of
/// aborted ones kept until the process ends) and scratch buffers reused
/// every step; an abort reads and changes them together.
class gloo_comm {
public:
  /// Rendezvous through `store` under `prefix` and connect a full mesh of
  /// TCP pairs bound to `iface_host`, the address this rank's peers are told
  /// to connect to: it must be reachable from every peer's host (a session
  /// chooses it: `session::cluster().host`, runtime/net/net_address.hpp).
  /// `timeout` bounds the rendezvous and every later collective. Errors:
  /// invalid_input for bad rank/size, disconnected or overloaded (timeout)
  /// when peers do not show up.
  ///
  /// With `cancel`, the mesh is set up on a helper thread and the call
  /// returns errc::disconnected as soon as the token is cancelled (arm the
  /// session's abort handler with it before connecting: a peer lost during
  /// the rendezvous then ends the wait at once instead of at the timeout).
  /// The abandoned helper keeps what it uses alive and never touches
  /// `store` again; it ends at Gloo's own timeout or with the process.
  static result<std::unique_ptr<gloo_comm>> connect(std::shared_ptr<gloo::rendezvous::Store> store, std::string prefix,
                                                    int rank, int size, std::chrono::milliseconds timeout,
                                                    std::string iface_host,
                                                    std::shared_ptr<cancel_token> cancel = nullptr);

  ~gloo_comm();
  gloo_comm(const gloo_comm&) = delete;
  gloo_comm& operator=(const gloo_comm&) = delete;

  /// In-place sum over all ranks: ring reduce-scatter + allgather written
  /// here on Gloo's unbound buffers (not gloo::allreduce), so an abort can
  /// wake every wait. Each chunk is reduced along one fixed path and then
  /// copied, so results are bit-identical across ranks, and for a fixed
  /// world size across runs. n == 0 is a no-op on every rank.
  status allreduce_sum(float* data, size_t n);
  /// Copies root's `data` to every rank.
  status broadcast(float* data, size_t n, int root);
  status barrier();

  /// Makes a collective blocked in another thread fail promptly (and every
  /// later one fail at once). Safe to call from any thread, more than once.
  /// The peers see the connections close and fail too.
  void abort();
  bool aborted() const noexcept { return aborted_.load(std::memory_order_acquire); }
  /// True while a collective has its buffers armed (from arm() to release()):
  /// an abort() from now on wakes it through those buffers, not the
  /// pre-check. Lets a test abort a collective that is surely under way
  /// instead of sleeping and hoping it is.
  bool in_collective() const;

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  std::chrono::milliseconds timeout() const noexcept { return timeout_; }

private:
  gloo_comm() = default;
  /// connectFullMesh on a helper thread; throws cancelled_error (private to
  /// the .cpp) when `cancel` is raised first.
  std::shared_ptr<gloo::Context> connect_abandonable(const std::string& prefix, std::chrono::milliseconds timeout,
                                                     std::shared_ptr<cancel_token> cancel);
  /// Maps the exception in flight (call inside a catch block only).
  error map_exception(const char* op, std::chrono::steady_clock::time_point start) const;
  status precheck(const char* op) const;
  /// Registers the running collective's buffers so abort() can wake their
  /// waits. False if the comm was aborted already (checked under the same
  /// lock abort() takes, so no abort is lost between check and wait).
  bool arm(std::initializer_list<gloo::transport::UnboundBuffer*> bufs);
  /// Unregisters them; on failure keeps them alive for the life of the
  /// process (Gloo's device thread may still signal a buffer with a pending
  /// operation, even after this communicator is gone).
  void release(std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>>& bufs, bool failed);
  /// The end of a failed collective: marks the comm failed, releases its
  /// buffers, closes every pair and maps the exception in flight.
  error fail(const char* op, std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>>& bufs,
             std::chrono::steady_clock::time_point start);
  void close_pairs();
  /// Waits for one completion with what is left of the collective's
  /// timeout; throws gloo::IoException when aborted (or Gloo's own on
  /// timeout / a closed pair).
  void wait_recv(gloo::transport::UnboundBuffer& b, std::chrono::steady_clock::time_point deadline);
  void wait_send(gloo::transport::UnboundBuffer& b, std::chrono::steady_clock::time_point deadline);

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
  mutable std::mutex active_m_;
  std::vector<gloo::transport::UnboundBuffer*> active_;  ///< guarded by active_m_
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> graveyard_;
  std::vector<float> scratch_;  ///< receive buffer of the reduce-scatter
  std::vector<char> tokens_;    ///< barrier bytes
};

}  // namespace grace
