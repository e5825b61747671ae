#include "runtime/checkpoint/device_copy.hpp"

#include <atomic>
#include <string>

namespace grace {

namespace {

status no_backend(void*, const void*, size_t, int device) {
  return error{errc::failed, "device tensor on CUDA device " + std::to_string(device) +
                                 ": this build has no CUDA backend (rebuild with nvcc "
                                 "and -DGRACE_CUDA=ON, or register the tensor in host memory)"};
}

std::atomic<device_copy_fn> to_host_hook{&no_backend};
std::atomic<device_copy_fn> to_device_hook{&no_backend};
std::atomic<bool> registered{false};

}  // namespace

void register_device_copy(device_copy_fn to_host, device_copy_fn to_device) {
  to_host_hook.store(to_host ? to_host : &no_backend, std::memory_order_release);
  to_device_hook.store(to_device ? to_device : &no_backend, std::memory_order_release);
  registered.store(to_host != nullptr && to_device != nullptr, std::memory_order_release);
}

status device_copy_to_host(void* host_dst, const void* device_src, size_t bytes, int device) {
  return to_host_hook.load(std::memory_order_acquire)(host_dst, device_src, bytes, device);
}

status device_copy_to_device(void* device_dst, const void* host_src, size_t bytes, int device) {
  return to_device_hook.load(std::memory_order_acquire)(device_dst, host_src, bytes, device);
}

bool device_copy_available() noexcept { return registered.load(std::memory_order_acquire); }

}  // namespace grace
