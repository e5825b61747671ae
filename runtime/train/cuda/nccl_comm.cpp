#include "runtime/train/cuda/nccl_comm.hpp"

#include "runtime/base/cancel_token.hpp"

#include <cuda_runtime_api.h>
#include <gloo/rendezvous/store.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/train/cuda/cuda_check.hpp"
#include "runtime/train/cuda/device.hpp"

namespace grace {

namespace {

using clock_type = std::chrono::steady_clock;

std::string nccl_text(ncclResult_t rc, ncclComm_t comm) {
  std::string s = ncclGetErrorString(rc);
  if (comm) {
    const char* last = ncclGetLastError(comm);
    if (last && *last) s += std::string(": ") + last;
  }
  return s;
}

/// Peer or network trouble means "reconnect/restart the group"; anything
/// else is a local failure.
errc nccl_errc(ncclResult_t rc) {
  return rc == ncclRemoteError || rc == ncclSystemError ? errc::disconnected : errc::failed;
}

/// Busy-poll briefly (a collective on a healthy fabric completes in
/// microseconds), then back off to at most 1 ms between polls.
class backoff {
public:
  void pause() {
    if (++polls_ < 64) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(delay_);
    if (delay_ < std::chrono::microseconds(1000)) delay_ *= 2;
  }

private:
  int polls_ = 0;
  std::chrono::microseconds delay_{20};
};

long long ms_since(clock_type::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - t).count();
}

}  // namespace

struct nccl_comm::impl {
  std::mutex mu;              ///< guards `comm` against abort() from another thread
  ncclComm_t comm = nullptr;  ///< null once aborted or destroyed
  cudaStream_t stream = nullptr;

  /// Aborts and forgets the communicator (caller holds `mu`).
  void abort_locked() noexcept {
    if (comm) {
      ncclCommAbort(comm);
      comm = nullptr;
    }
  }
};

result<std::unique_ptr<nccl_comm>> nccl_comm::connect(std::shared_ptr<gloo::rendezvous::Store> store,
                                                      std::string prefix, int rank, int size, int device,
                                                      std::chrono::milliseconds timeout,
                                                      std::shared_ptr<cancel_token> cancel) {
  if (!store) return error{errc::invalid_input, "nccl_comm: no rendezvous store given"};
  if (size < 1 || rank < 0 || rank >= size)
    return error{errc::invalid_input,
                 "nccl_comm: rank " + std::to_string(rank) + " out of range for size " + std::to_string(size)};
  if (timeout.count() <= 0) return error{errc::invalid_input, "nccl_comm: timeout must be positive"};
  std::string why;
  const int devices = cuda_device_count(&why);
  if (devices == 0) return error{errc::invalid_input, "nccl_comm: no CUDA device (" + why + ")"};
  if (device < 0 || device >= devices)
    return error{errc::invalid_input, "nccl_comm: device " + std::to_string(device) + " out of range (" +
                                          std::to_string(devices) + " visible)"};

  const auto start = clock_type::now();
  const auto deadline = start + timeout;
  std::unique_ptr<nccl_comm> c(new nccl_comm());
  c->impl_ = std::make_unique<impl>();
  c->rank_ = rank;
  c->size_ = size;
  c->device_ = device;
  c->timeout_ = timeout;

  cudaError_t crc = cudaSetDevice(device);
  if (crc == cudaSuccess) crc = cudaStreamCreateWithFlags(&c->impl_->stream, cudaStreamNonBlocking);
  if (crc != cudaSuccess)
    return error{errc::failed, "nccl_comm: device " + std::to_string(device) + ": " + cuda_detail::describe(crc)};

  // The unique id travels through the coordination service's store, like
  // Gloo's rendezvous; the store blocks until the chief has published it.
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  const std::string key = prefix + "nccl-id";
  try {
    if (rank == 0) {
      const ncclResult_t rc = ncclGetUniqueId(&id);
      if (rc != ncclSuccess) return error{nccl_errc(rc), "nccl_comm: ncclGetUniqueId: " + nccl_text(rc, nullptr)};
      const char* p = reinterpret_cast<const char*>(&id);
      store->set(key, std::vector<char>(p, p + sizeof(id)));
    } else {
      store->wait({key}, timeout);
      const std::vector<char> bytes = store->get(key);
      if (bytes.size() != sizeof(id))
        return error{errc::failed, "nccl_comm: store key '" + key + "' holds " + std::to_string(bytes.size()) +
                                       " bytes, expected " + std::to_string(sizeof(id)) +
                                       " (an ncclUniqueId from an incompatible NCCL?)"};
      std::memcpy(&id, bytes.data(), sizeof(id));
    }
  } catch (const std::exception& e) {
    if (clock_type::now() >= deadline)
      return error{errc::overloaded, "nccl_comm: rank " + std::to_string(rank) + ": no NCCL id from rank 0 within " +
                                         std::to_string(timeout.count()) + " ms (" + e.what() + ")"};
    return error{errc::disconnected, std::string("nccl_comm: rendezvous store: ") + e.what()};
  }

  // Non-blocking init: returns at once; completion is polled against the
  // deadline so a missing peer cannot hang us.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t rc = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  if (rc != ncclSuccess && rc != ncclInProgress) {
    const std::string text = nccl_text(rc, comm);
    if (comm) ncclCommAbort(comm);
    return error{nccl_errc(rc), "nccl_comm: ncclCommInitRankConfig: " + text};
  }
  backoff wait;
  for (;;) {
    ncclResult_t state = ncclSuccess;
    rc = ncclCommGetAsyncError(comm, &state);
    if (rc != ncclSuccess) state = rc;
    if (state == ncclSuccess) break;
    if (state != ncclInProgress) {
      const std::string text = nccl_text(state, comm);
      ncclCommAbort(comm);
      return error{nccl_errc(state),
                   "nccl_comm: init of rank " + std::to_string(rank) + "/" + std::to_string(size) + ": " + text};
    }
    if (cancel && cancel->cancelled()) {
      ncclCommAbort(comm);
      return error{errc::disconnected, "nccl_comm: init of rank " + std::to_string(rank) + "/" + std::to_string(size) +
                                           ": aborted during the rendezvous (a peer was lost)"};
    }
    if (clock_type::now() >= deadline) {
      ncclCommAbort(comm);
      return error{errc::overloaded, "nccl_comm: init of rank " + std::to_string(rank) + "/" + std::to_string(size) +
                                         " did not complete within " + std::to_string(timeout.count()) +
                                         " ms (peers missing?); communicator aborted"};
    }
    wait.pause();
  }
  c->impl_->comm = comm;
  return c;
}

nccl_comm::~nccl_comm() {
  if (!impl_) return;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->comm) {
      cudaSetDevice(device_);
      bool clean = false;
      if (!failed_.load() && !aborted_.load() && ncclCommFinalize(impl_->comm) == ncclSuccess) {
        // Flush bounded by the timeout (at most 5 s); otherwise abort.
        const auto deadline =
            clock_type::now() + std::min<std::chrono::milliseconds>(timeout_, std::chrono::seconds(5));
        backoff wait;
        for (;;) {
          ncclResult_t state = ncclSuccess;
          if (ncclCommGetAsyncError(impl_->comm, &state) != ncclSuccess) break;
          if (state == ncclSuccess) {
            clean = true;
            break;
          }
          if (state != ncclInProgress || clock_type::now() >= deadline) break;
          wait.pause();
        }
      }
      if (clean)
        ncclCommDestroy(impl_->comm);
      else
        ncclCommAbort(impl_->comm);
      impl_->comm = nullptr;
    }
  }
  if (impl_->stream) cudaStreamDestroy(impl_->stream);
}

void nccl_comm::abort() {
  if (aborted_.exchange(true, std::memory_order_acq_rel)) return;
  std::lock_guard<std::mutex> lock(impl_->mu);
  // Usually called from a watcher thread: act on this comm's device, then
  // leave that thread's current device as it was.
  int previous = -1;
  const bool had_device = cudaGetDevice(&previous) == cudaSuccess;
  cudaSetDevice(device_);
  impl_->abort_locked();
  if (had_device) cudaSetDevice(previous);
}

status nccl_comm::fail_collective(errc code, size_t n, const std::string& what) {
  failed_.store(true, std::memory_order_release);
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->abort_locked();
  }
  const auto drain_until = clock_type::now() + std::chrono::seconds(1);
  backoff drain;
  while (cudaStreamQuery(impl_->stream) == cudaErrorNotReady && clock_type::now() < drain_until) drain.pause();
  return error{code, "nccl allreduce of " + std::to_string(n) + " floats: " + what};
}

status nccl_comm::await_collective(size_t n, clock_type::time_point start, clock_type::time_point deadline) {
  const char* op = "nccl allreduce";
  backoff wait;
  for (;;) {
    if (aborted()) {
      // The abort makes NCCL's kernels exit; give the stream the rest of the
      // deadline to drain so the buffer is no longer written when we return.
      while (cudaStreamQuery(impl_->stream) == cudaErrorNotReady && clock_type::now() < deadline) wait.pause();
      return error{errc::disconnected, std::string(op) + ": aborted after " + std::to_string(ms_since(start)) + " ms"};
    }
    ncclResult_t state = ncclSuccess;
    {
      std::lock_guard<std::mutex> lock(impl_->mu);
      if (impl_->comm) {
        const ncclResult_t rc = ncclCommGetAsyncError(impl_->comm, &state);
        if (rc != ncclSuccess) state = rc;
        if (state != ncclSuccess && state != ncclInProgress) {
          const std::string text = nccl_text(state, impl_->comm);
          impl_->abort_locked();
          failed_.store(true, std::memory_order_release);
          return error{nccl_errc(state), std::string(op) + ": " + text};
        }
      }
    }
    if (state == ncclSuccess) {
      const cudaError_t crc = cudaStreamQuery(impl_->stream);
      if (crc == cudaSuccess) return status::success();
      if (crc != cudaErrorNotReady) return fail_collective(errc::failed, n, cuda_detail::describe(crc));
    }
    if (clock_type::now() >= deadline)
      return fail_collective(errc::overloaded, n,
                             "timed out after " + std::to_string(timeout_.count()) +
                                 " ms (a peer is stalled or gone); communicator aborted");
    wait.pause();
  }
}

status nccl_comm::allreduce_sum(float* device_data, size_t n) {
  const char* op = "nccl allreduce";
  if (aborted()) return error{errc::disconnected, std::string(op) + ": communicator was aborted"};
  if (failed_.load(std::memory_order_acquire))
    return error{errc::disconnected, std::string(op) + ": communicator failed earlier; connect a new one"};
  if (n == 0) return status::success();
  if (!device_data) return error{errc::invalid_input, std::string(op) + ": null buffer"};

  struct in_flight_guard {
    std::atomic<bool>& f;
    explicit in_flight_guard(std::atomic<bool>& x) : f(x) { f.store(true, std::memory_order_release); }
    ~in_flight_guard() { f.store(false, std::memory_order_release); }
  } guard(in_flight_);

  const auto start = clock_type::now();
  const cudaError_t crc = cudaSetDevice(device_);
  if (crc != cudaSuccess) return fail_collective(errc::failed, n, cuda_detail::describe(crc));
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (!impl_->comm) return error{errc::disconnected, std::string(op) + ": communicator was aborted"};
    const ncclResult_t rc = ncclAllReduce(device_data, device_data, n, ncclFloat, ncclSum, impl_->comm, impl_->stream);
    if (rc != ncclSuccess && rc != ncclInProgress) {
      const std::string text = nccl_text(rc, impl_->comm);
      impl_->abort_locked();
      failed_.store(true, std::memory_order_release);
      return error{nccl_errc(rc), std::string(op) + ": ncclAllReduce: " + text};
    }
  }
  return await_collective(n, start, start + timeout_);
}

}  // namespace grace
