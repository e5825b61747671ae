#pragma once
/// CUDA device discovery and the `--device auto|cpu|cuda` decision.
///
/// Plain C++: no CUDA header is included, so grace-train can call this from
/// translation units compiled by the host compiler. Only built when the CUDA
/// backend is (GRACE_HAVE_CUDA); a build without it has CPU only.

#include <string>

#include "runtime/base/error.hpp"

namespace grace {

/// What the node offers: a driver or not, and how many devices CUDA sees.
struct cuda_probe {
  bool driver = false;  ///< an NVIDIA driver is present (or GRACE_CUDA_PROBE says so)
  int devices = 0;      ///< usable devices; 0 with a driver means CUDA could not start
  std::string why;      ///< when devices == 0: no driver, or the failing call and its error
};

/// Never throws, never aborts: safe without a GPU. Honours GRACE_CUDA_PROBE
/// (runtime/worker/device_probe.hpp).
cuda_probe probe_cuda();

/// Number of usable CUDA devices; 0 on any error (no driver, no device,
/// CUDA_VISIBLE_DEVICES empty, ...), and then `why`, when given, says which
/// ("cudaGetDeviceCount: cudaErrorInsufficientDriver (...)"). Never throws,
/// never aborts: safe to call on a machine without a GPU.
int cuda_device_count(std::string* why = nullptr);

/// The device for a worker: `local_rank % cuda_device_count()`, so one
/// process per GPU on each node. errc::invalid_input when no device exists
/// or local_rank is negative.
result<int> pick_device(int local_rank);

enum class backend_kind { cpu, cuda };

const char* to_string(backend_kind k) noexcept;

/// The outcome of `--device`: which backend, a one-line explanation meant for
/// the worker's first log line, and the CUDA device ordinal (-1 for CPU).
struct backend_choice {
  backend_kind kind = backend_kind::cpu;
  std::string explanation;
  int device = -1;
};

/// `requested` is "auto", "cpu" or "cuda".
/// - auto: CUDA on device `local_rank % count` if a device exists, else CPU
///   with the reason (e.g. "no CUDA device (cudaGetDeviceCount: ...)").
/// - cpu: CPU.
/// - cuda: CUDA, or errc::invalid_input "--device cuda: no CUDA device (...)"
///   when there is none.
/// Anything else -> errc::invalid_input.
result<backend_choice> choose_backend(const std::string& requested, int local_rank);

}  // namespace grace
