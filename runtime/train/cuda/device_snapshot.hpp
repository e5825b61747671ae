#pragma once
/// Snapshots of device tensors through pinned host memory.
///
/// Two ways in:
/// - `register_cuda_device_copy()` installs `cuda_copy_to_host` /
///   `cuda_copy_to_device` as the hooks of runtime/checkpoint/device_copy.hpp, so the
///   generic snapshot code (snapshot_buffers::capture, restore) handles
///   `memory_kind::device` tensors. Destinations already in pinned memory
///   are copied into directly; pageable ones (e.g. snapshot_buffers) go
///   through two per-device pinned bounce buffers, allocated once, with the
///   DMA of one chunk overlapping the memcpy of the previous one.
/// - `device_snapshot`: pinned buffers for a fixed tensor layout, allocated
///   once (cudaMallocHost) and touched, filled by cudaMemcpyAsync on a
///   dedicated side stream per device and an event wait.
///
/// Every copy runs on a side stream (non-blocking, so it never serialises
/// with the training stream) and returns when complete. The caller makes
/// sure prior device work on the tensors has finished (mlp_cuda's public
/// calls return with its stream idle), so training is stalled for the copy
/// only. Safe to call from any thread; copies are serialised per process.
///
/// Plain C++ header: no CUDA header is included.

#include <cstddef>
#include <memory>
#include <vector>

#include "runtime/base/error.hpp"
#include "runtime/checkpoint/snapshot.hpp"
#include "runtime/base/tensor.hpp"

namespace grace {

/// Device -> host copy of `bytes` from `device_src` on CUDA device `device`.
/// errc::failed with the CUDA error on failure.
status cuda_copy_to_host(void* host_dst, const void* device_src, size_t bytes, int device);
/// Host -> device copy.
status cuda_copy_to_device(void* device_dst, const void* host_src, size_t bytes, int device);

/// Installs the two functions above as the process's device-copy hooks
/// (runtime/checkpoint/device_copy.hpp). Idempotent.
void register_cuda_device_copy();

/// Frees the per-device side streams and pinned bounce buffers of the hooks
/// (they are otherwise kept for the life of the process, warm).
void release_cuda_copy_resources();

/// Pinned host copies of a fixed set of tensors (host or device).
class device_snapshot {
public:
  static constexpr size_t alignment = 4096;

  /// Allocates pinned, touched buffers for `layout` (names, dtypes, shapes,
  /// memory kinds, devices; data pointers are not read) and one side stream
  /// per device. errc::failed if pinned memory or a stream cannot be had.
  static result<std::unique_ptr<device_snapshot>> create(const std::vector<tensor_ref>& layout);
  ~device_snapshot();
  device_snapshot(const device_snapshot&) = delete;
  device_snapshot& operator=(const device_snapshot&) = delete;

  /// Copies the tensors' current bytes in (device tensors by DMA on the side
  /// stream, host tensors by memcpy). `tensors` must match the layout ->
  /// otherwise errc::invalid_input.
  status capture(const std::vector<tensor_ref>& tensors);

  /// Copies the captured bytes back into `tensors` (same layout check).
  status restore(const std::vector<tensor_ref>& tensors) const;

  /// The captured tensors, pointing into the pinned buffers: what the
  /// checkpoint writer persists, as for CPU tensors.
  std::vector<snapshot_tensor> view() const;

  /// Sum of tensor bytes (without alignment padding).
  size_t total_bytes() const noexcept;

private:
  device_snapshot();
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace grace
