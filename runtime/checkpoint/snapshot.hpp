#pragma once
/// Snapshots: copy registered tensors into pre-allocated host buffers so the
/// training loop can continue while the checkpoint writer
/// (actors/checkpoint_writer.hpp) writes them to disk.
///
/// The buffers are allocated once and their pages touched up front: on VMs
/// that hand idle memory back to their host, copying into fresh (unfaulted)
/// memory is an order of magnitude slower than into warm pages, and the
/// snapshot copy is the part of a checkpoint that stalls training.

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/base/error.hpp"
#include "runtime/base/tensor.hpp"

namespace grace {

/// A read-only view of one tensor's bytes in host memory: what a checkpoint
/// save consumes. The bytes must stay unchanged until the save returns.
struct snapshot_tensor {
  std::string name;
  dtype type = dtype::f32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t bytes = 0;
  std::vector<int64_t> global_shape{};  ///< sharded: the global tensor's shape (empty: replicated)
  std::vector<int64_t> offsets{};       ///< sharded: this slice's place in it
};

/// Lets a writer start on a snapshot while it is still being captured.
/// `wait(n)` returns true once the first `n` bytes of the snapshot's
/// stream (every tensor's bytes in layout order, no padding) are in the
/// buffers, false when the capture failed first.
using capture_wait = std::function<bool(uint64_t)>;

/// Host buffers for one snapshot of a fixed set of registered tensors.
///
/// Each tensor gets its own 4096-aligned region (so O_DIRECT writes are
/// possible later). Not thread-safe: one thread captures; the writer thread
/// only reads, and `capture` refuses while a write of this set is in flight.
///
/// A capture either runs whole before the writer gets the set (`capture`),
/// or overlaps the write (`check`, `begin_capture`, hand the set to the
/// writer, `copy_in`): the copy publishes how far it got, and the writer
/// waits on `wait_captured` before it reads bytes, so the save takes the
/// longer of copy and write instead of their sum.
/// Many fields for a reason: the buffers and the capture's progress, which
/// the writer reads while the trainer's copy runs (atomics and one
/// condition variable), are one state shared by two threads.
class snapshot_buffers {
public:
  static constexpr size_t alignment = 4096;

  /// Allocates and pre-faults buffers matching `layout` (names, dtypes,
  /// shapes; the data pointers are not read). Throws std::bad_alloc.
  explicit snapshot_buffers(const std::vector<tensor_ref>& layout);
  ~snapshot_buffers();
  snapshot_buffers(const snapshot_buffers&) = delete;
  snapshot_buffers& operator=(const snapshot_buffers&) = delete;

  /// Copies the tensors' current bytes in. `tensors` must match the layout
  /// (same order, names, dtypes, shapes) -> otherwise errc::invalid_input.
  /// Device tensors are copied through runtime/checkpoint/device_copy.hpp (the CUDA
  /// backend's pinned side-stream copy once `register_cuda_device_copy()` ran);
  /// without a registered copy -> errc::failed, before any byte is copied.
  /// While a writer still owns this set -> errc::overloaded.
  status capture(const std::vector<tensor_ref>& tensors);

  /// The checks of `capture` without the copy: nothing is written.
  status check(const std::vector<tensor_ref>& tensors) const;
  /// Marks the buffers empty for an overlapped capture: from now until
  /// `copy_in` ends, `wait_captured` blocks on the bytes not yet copied.
  void begin_capture() noexcept;
  /// Copies `tensors` (already `check`ed) in, publishing progress every
  /// few MiB; a failure (a device copy) makes every wait return false.
  status copy_in(const std::vector<tensor_ref>& tensors);
  /// Blocks until the first `n` stream bytes are captured (true) or the
  /// capture failed (false). After `capture` it returns true at once.
  bool wait_captured(uint64_t n) const;
  /// Blocks until the capture in progress, if any, has ended.
  void wait_capture_end() const { wait_captured(total_bytes_); }
  /// Threads asleep in `wait_captured` now, on bytes not yet copied (read
  /// under the lock they wait with, so a count above 0 means they are
  /// inside the wait). Lets a test start a copy only once a writer waits
  /// for it, instead of sleeping and hoping it does.
  int waiters() const;
  /// How long the last completed `copy_in` (or `capture`'s copy) took.
  int64_t capture_ns() const noexcept { return capture_ns_.load(std::memory_order_acquire); }
  /// True when the last capture failed part way (its bytes are not usable).
  bool capture_failed() const noexcept { return failed_.load(std::memory_order_acquire); }

  /// Reads one byte per page so the kernel keeps the pages resident and
  /// mapped (cheap; call it periodically between snapshots). Safe to call
  /// while a writer reads the buffers; takes turns with capture() (a short
  /// lock) so it never reads a page a capture is writing.
  void keep_warm() const;

  /// The captured tensors, pointing into these buffers.
  std::vector<snapshot_tensor> view() const;

  /// Each tensor's region, in layout order: where a restore stages the
  /// checkpoint's bytes (`checkpoint_store::restore_latest`), so they are
  /// read into warm pages and the buffers then hold the restored state.
  std::vector<void*> regions() noexcept;

  /// Sum of tensor bytes (without alignment padding).
  size_t total_bytes() const noexcept { return total_bytes_; }

  /// Set while the checkpoint writer owns this set (from the request until
  /// its answer); `capture` refuses meanwhile so a write never sees torn data.
  void set_busy(bool b) noexcept { busy_.store(b, std::memory_order_release); }
  bool busy() const noexcept { return busy_.load(std::memory_order_acquire); }

private:
  struct slot {
    std::string name;
    dtype type;
    std::vector<int64_t> shape;
    size_t bytes;
    size_t offset;  ///< into base_, multiple of `alignment`
    std::vector<int64_t> global_shape, offsets;  ///< a sharded tensor's slice
  };
  void publish(uint64_t captured, bool failed);
  /// copy_in's copy; `done`: the stream bytes copied so far.
  status copy_slots(const std::vector<tensor_ref>& tensors, uint64_t& done);

  std::vector<slot> slots_;
  unsigned char* base_ = nullptr;
  size_t capacity_ = 0;
  size_t total_bytes_ = 0;
  std::atomic<bool> busy_{false};
  std::atomic<uint64_t> captured_{0};  ///< stream bytes copied by the capture in progress
  std::atomic<bool> failed_{false};
  std::atomic<int64_t> capture_ns_{0};
  mutable std::mutex progress_m_;  ///< with progress_cv_: wait_captured sleeps on progress
  mutable std::condition_variable progress_cv_;
  mutable int waiters_ = 0;  ///< threads inside wait_captured's wait; guarded by progress_m_
  mutable std::mutex touch_m_;  ///< capture() writes, keep_warm() reads: one at a time
};

}  // namespace grace
