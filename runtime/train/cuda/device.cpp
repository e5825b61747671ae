#include "runtime/train/cuda/device.hpp"
#include "runtime/worker/device_probe.hpp"

#include <cuda_runtime_api.h>

#include <cstdlib>

namespace grace {

cuda_probe probe_cuda() {
  cuda_probe p;
  // No NVIDIA kernel driver: say so without initialising the CUDA runtime,
  // which costs ~100 ms per process (a restart pays it on its critical path).
  p.driver = nvidia_driver_present(&p.why);
  if (!p.driver) return p;
  if (auto o = cuda_probe_from_env()) {
    if (o->what == cuda_probe_override::mode::driver_error) {
      p.why = "cudaGetDeviceCount failed (GRACE_CUDA_PROBE=driver-error)";
      return p;
    }
    p.devices = o->devices;
    if (p.devices == 0) p.why = "cudaGetDeviceCount: 0 devices (GRACE_CUDA_PROBE=" + o->text + ")";
    return p;
  }
  // Without a driver cudaGetDeviceCount returns cudaErrorInsufficientDriver
  // (35) and leaves the count untouched: start from 0.
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();  // do not leave the error for the next CUDA call
    p.why = std::string("cudaGetDeviceCount: ") + cudaGetErrorName(rc) + " (" + cudaGetErrorString(rc) + ")";
    return p;
  }
  if (count <= 0) {
    p.why = "cudaGetDeviceCount: 0 devices";
    if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES"))
      p.why += std::string(" (CUDA_VISIBLE_DEVICES='") + v + "')";
    return p;
  }
  p.devices = count;
  return p;
}

int cuda_device_count(std::string* why) {
  auto p = probe_cuda();
  if (why && p.devices == 0) *why = p.why;
  return p.devices;
}

result<int> pick_device(int local_rank) {
  if (local_rank < 0)
    return error{errc::invalid_input, "pick_device: local rank " + std::to_string(local_rank) + " is negative"};
  std::string why;
  const int n = cuda_device_count(&why);
  if (n == 0) return error{errc::invalid_input, "no CUDA device (" + why + ")"};
  return local_rank % n;
}

const char* to_string(backend_kind k) noexcept { return k == backend_kind::cuda ? "cuda" : "cpu"; }

result<backend_choice> choose_backend(const std::string& requested, int local_rank) {
  if (requested != "auto" && requested != "cpu" && requested != "cuda")
    return error{errc::invalid_input, "--device '" + requested + "': expected auto, cpu or cuda"};
  if (requested == "cpu") return backend_choice{backend_kind::cpu, "device: cpu (--device cpu)", -1};

  std::string why;
  const int n = cuda_device_count(&why);
  if (n == 0) {
    if (requested == "cuda")
      return error{errc::invalid_input,
                   "--device cuda: no CUDA device (" + why +
                       "); run on a GPU node, check CUDA_VISIBLE_DEVICES, or use --device auto|cpu"};
    return backend_choice{backend_kind::cpu, "device: cpu (--device auto: no CUDA device: " + why + ")", -1};
  }
  if (local_rank < 0)
    return error{errc::invalid_input,
                 "--device " + requested + ": local rank " + std::to_string(local_rank) + " is negative"};
  const int dev = local_rank % n;
  std::string name;
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, dev) == cudaSuccess)
    name = std::string(" ") + prop.name;
  else
    (void)cudaGetLastError();
  return backend_choice{backend_kind::cuda,
                        "device: cuda:" + std::to_string(dev) + name + " (--device " + requested + ", local rank " +
                            std::to_string(local_rank) + " of " + std::to_string(n) + " visible device" +
                            (n == 1 ? "" : "s") + ")",
                        dev};
}

}  // namespace grace
