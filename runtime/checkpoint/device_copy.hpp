#pragma once
/// The seam between the snapshot code (plain C++, always built) and the CUDA
/// backend (built only with nvcc): copies between host memory and device
/// memory go through two process-wide hooks.
///
/// Without the CUDA backend the hooks return errc::failed ("no CUDA
/// backend"), so a device tensor in a CPU-only build is a clear error, not a
/// crash. The CUDA backend installs real copies with
/// `register_device_copy` (see runtime/train/cuda/device_snapshot.hpp:
/// `register_cuda_device_copy()`), once, before any snapshot is taken.

#include <cstddef>

#include "runtime/base/error.hpp"

namespace grace {

/// Copies `bytes` between host memory and memory on CUDA device `device`.
/// For the to-host direction `dst` is host memory and `src` device memory;
/// for the to-device direction the other way round. Returns when the copy is
/// complete (the destination may be read or reused at once).
using device_copy_fn = status (*)(void* dst, const void* src, size_t bytes, int device);

/// Installs the copy functions. Null restores the "no CUDA backend" default
/// for that direction. Thread-safe, but meant to be called once at start-up.
void register_device_copy(device_copy_fn to_host, device_copy_fn to_device);

/// Device -> host through the registered hook.
status device_copy_to_host(void* host_dst, const void* device_src, size_t bytes, int device);
/// Host -> device through the registered hook.
status device_copy_to_device(void* device_dst, const void* host_src, size_t bytes, int device);

/// True once a CUDA backend has registered its copies.
bool device_copy_available() noexcept;

}  // namespace grace
