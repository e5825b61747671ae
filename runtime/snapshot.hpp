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
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/error.hpp"
#include "runtime/tensor.hpp"

namespace grace {

/// A read-only view of one tensor's bytes in host memory: what a checkpoint
/// save consumes. The bytes must stay unchanged until the save returns.
struct snapshot_tensor {
  std::string name;
  dtype type = dtype::f32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t bytes = 0;
};

/// Host buffers for one snapshot of a fixed set of registered tensors.
///
/// Each tensor gets its own 4096-aligned region (so O_DIRECT writes are
/// possible later). Not thread-safe: one thread captures; the writer thread
/// only reads, and `capture` refuses while a write of this set is in flight
/// (use two sets alternately to overlap capture and write).
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
  /// Device tensors are copied through runtime/device_copy.hpp (the CUDA
  /// backend's pinned side-stream copy once `register_cuda_device_copy()` ran);
  /// without a registered copy -> errc::failed, before any byte is copied.
  /// While a writer still owns this set -> errc::overloaded.
  status capture(const std::vector<tensor_ref>& tensors);

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
  };
  std::vector<slot> slots_;
  unsigned char* base_ = nullptr;
  size_t capacity_ = 0;
  size_t total_bytes_ = 0;
  std::atomic<bool> busy_{false};
  mutable std::mutex touch_m_;  ///< capture() writes, keep_warm() reads: one at a time
};

}  // namespace grace
