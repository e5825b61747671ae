#include "runtime/train/cuda/device_snapshot.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "runtime/train/cuda/cuda_check.hpp"
#include "runtime/checkpoint/device_copy.hpp"

namespace grace {

namespace {

error cuda_failed(const std::string& what, cudaError_t rc) {
  return error{errc::failed, what + ": " + cuda_detail::describe(rc)};
}

#define GRACE_CUDA_STATUS(call, what)                                    \
  do {                                                                   \
    const cudaError_t grace_rc_ = (call);                                \
    if (grace_rc_ != cudaSuccess) return cuda_failed((what), grace_rc_); \
  } while (0)

/// Per-device side stream, two events and two pinned bounce buffers for the
/// hooks; created on first use, kept warm for the life of the process.
struct copy_lane {
  static constexpr size_t chunk = size_t(8) << 20;  // 8 MiB per bounce buffer
  cudaStream_t stream = nullptr;
  cudaEvent_t done[2] = {nullptr, nullptr};
  unsigned char* bounce[2] = {nullptr, nullptr};
};

std::mutex lanes_mu;  ///< serialises every hook copy (one snapshot at a time)
std::map<int, copy_lane> lanes;

status make_lane(int device, copy_lane*& out) {
  auto it = lanes.find(device);
  if (it != lanes.end()) {
    out = &it->second;
    return status::success();
  }
  copy_lane lane;
  const std::string where = "device copy lane for device " + std::to_string(device);
  GRACE_CUDA_STATUS(cudaSetDevice(device), where);
  GRACE_CUDA_STATUS(cudaStreamCreateWithFlags(&lane.stream, cudaStreamNonBlocking), where);
  for (int k = 0; k < 2; ++k) {
    GRACE_CUDA_STATUS(cudaEventCreateWithFlags(&lane.done[k], cudaEventDisableTiming), where);
    void* p = nullptr;
    GRACE_CUDA_STATUS(cudaMallocHost(&p, copy_lane::chunk), where);
    std::memset(p, 0, copy_lane::chunk);  // fault the pages in now, not during a snapshot
    lane.bounce[k] = static_cast<unsigned char*>(p);
  }
  out = &lanes.emplace(device, lane).first->second;
  return status::success();
}

bool is_pinned(const void* host) {
  cudaPointerAttributes attr{};
  const cudaError_t rc = cudaPointerGetAttributes(&attr, host);
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return attr.type == cudaMemoryTypeHost;
}

}  // namespace

status cuda_copy_to_host(void* host_dst, const void* device_src, size_t bytes, int device) {
  if (bytes == 0) return status::success();
  std::lock_guard<std::mutex> lock(lanes_mu);
  copy_lane* lane = nullptr;
  auto st = make_lane(device, lane);
  if (!st) return st;
  const std::string what =
      "device->host copy of " + std::to_string(bytes) + " bytes on device " + std::to_string(device);
  GRACE_CUDA_STATUS(cudaSetDevice(device), what);
  auto* dst = static_cast<unsigned char*>(host_dst);
  auto* src = static_cast<const unsigned char*>(device_src);
  if (is_pinned(host_dst)) {
    GRACE_CUDA_STATUS(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, lane->stream), what);
    GRACE_CUDA_STATUS(cudaStreamSynchronize(lane->stream), what);
    return status::success();
  }
  // Pageable destination: DMA chunk k into bounce[k % 2] while the CPU
  // copies chunk k - 1 out of the other buffer.
  const size_t chunks = (bytes + copy_lane::chunk - 1) / copy_lane::chunk;
  auto chunk_len = [&](size_t k) { return std::min(copy_lane::chunk, bytes - k * copy_lane::chunk); };
  for (size_t k = 0; k <= chunks; ++k) {
    if (k < chunks) {
      const int b = static_cast<int>(k % 2);
      GRACE_CUDA_STATUS(cudaMemcpyAsync(lane->bounce[b], src + k * copy_lane::chunk, chunk_len(k),
                                        cudaMemcpyDeviceToHost, lane->stream),
                        what);
      GRACE_CUDA_STATUS(cudaEventRecord(lane->done[b], lane->stream), what);
    }
    if (k > 0) {
      const size_t j = k - 1;
      const int b = static_cast<int>(j % 2);
      GRACE_CUDA_STATUS(cudaEventSynchronize(lane->done[b]), what);
      std::memcpy(dst + j * copy_lane::chunk, lane->bounce[b], chunk_len(j));
    }
  }
  return status::success();
}

status cuda_copy_to_device(void* device_dst, const void* host_src, size_t bytes, int device) {
  if (bytes == 0) return status::success();
  std::lock_guard<std::mutex> lock(lanes_mu);
  copy_lane* lane = nullptr;
  auto st = make_lane(device, lane);
  if (!st) return st;
  const std::string what =
      "host->device copy of " + std::to_string(bytes) + " bytes on device " + std::to_string(device);
  GRACE_CUDA_STATUS(cudaSetDevice(device), what);
  auto* dst = static_cast<unsigned char*>(device_dst);
  auto* src = static_cast<const unsigned char*>(host_src);
  if (is_pinned(host_src)) {
    GRACE_CUDA_STATUS(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, lane->stream), what);
    GRACE_CUDA_STATUS(cudaStreamSynchronize(lane->stream), what);
    return status::success();
  }
  const size_t chunks = (bytes + copy_lane::chunk - 1) / copy_lane::chunk;
  for (size_t k = 0; k < chunks; ++k) {
    const int b = static_cast<int>(k % 2);
    const size_t len = std::min(copy_lane::chunk, bytes - k * copy_lane::chunk);
    // bounce[b] was last used by chunk k - 2: wait for its DMA to finish.
    if (k >= 2) GRACE_CUDA_STATUS(cudaEventSynchronize(lane->done[b]), what);
    std::memcpy(lane->bounce[b], src + k * copy_lane::chunk, len);
    GRACE_CUDA_STATUS(
        cudaMemcpyAsync(dst + k * copy_lane::chunk, lane->bounce[b], len, cudaMemcpyHostToDevice, lane->stream), what);
    GRACE_CUDA_STATUS(cudaEventRecord(lane->done[b], lane->stream), what);
  }
  GRACE_CUDA_STATUS(cudaStreamSynchronize(lane->stream), what);
  return status::success();
}

void register_cuda_device_copy() { register_device_copy(&cuda_copy_to_host, &cuda_copy_to_device); }

void release_cuda_copy_resources() {
  std::lock_guard<std::mutex> lock(lanes_mu);
  for (auto& [device, lane] : lanes) {
    if (cudaSetDevice(device) != cudaSuccess) continue;
    cudaStreamSynchronize(lane.stream);
    for (int k = 0; k < 2; ++k) {
      cudaEventDestroy(lane.done[k]);
      cudaFreeHost(lane.bounce[k]);
    }
    cudaStreamDestroy(lane.stream);
  }
  lanes.clear();
}

// ---------------------------------------------------------------------------
// device_snapshot
// ---------------------------------------------------------------------------

struct device_snapshot::impl {
  struct slot {
    std::string name;
    dtype type;
    std::vector<int64_t> shape;
    memory_kind memory;
    int device;
    size_t bytes;
    size_t offset;  ///< into base, multiple of `alignment`
  };
  std::vector<slot> slots;
  unsigned char* base = nullptr;
  size_t capacity = 0;
  size_t total = 0;
  std::map<int, cudaStream_t> streams;  ///< side stream per device
  std::map<int, cudaEvent_t> events;

  ~impl() {
    for (auto& [device, s] : streams) {
      if (cudaSetDevice(device) != cudaSuccess) continue;
      cudaStreamSynchronize(s);
      cudaStreamDestroy(s);
      cudaEventDestroy(events[device]);
    }
    if (base) cudaFreeHost(base);
  }

  status check(const std::vector<tensor_ref>& tensors, const char* op) const {
    if (tensors.size() != slots.size())
      return error{errc::invalid_input, std::string(op) + ": " + std::to_string(tensors.size()) +
                                            " tensors, the snapshot layout has " + std::to_string(slots.size())};
    for (size_t i = 0; i < slots.size(); ++i) {
      const tensor_ref& t = tensors[i];
      const slot& s = slots[i];
      if (t.name != s.name || t.type != s.type || t.shape != s.shape || t.memory != s.memory ||
          (t.memory == memory_kind::device && t.device != s.device))
        return error{errc::invalid_input, std::string(op) + ": tensor " + std::to_string(i) + " ('" + t.name +
                                              "') does not match the layout ('" + s.name + "')"};
      if (!t.data && s.bytes)
        return error{errc::invalid_input, std::string(op) + ": tensor '" + t.name + "' has no data"};
    }
    return status::success();
  }

  /// Copies every tensor; device copies are queued on the side streams first,
  /// host copies done meanwhile, then every stream is waited for.
  status copy(const std::vector<tensor_ref>& tensors, bool to_host) const {
    const char* op = to_host ? "device snapshot capture" : "device snapshot restore";
    auto st = check(tensors, op);
    if (!st) return st;
    for (size_t i = 0; i < slots.size(); ++i) {
      const slot& s = slots[i];
      if (s.memory != memory_kind::device || s.bytes == 0) continue;
      const std::string what = std::string(op) + ": '" + s.name + "'";
      GRACE_CUDA_STATUS(cudaSetDevice(s.device), what);
      unsigned char* host = base + s.offset;
      if (to_host)
        GRACE_CUDA_STATUS(cudaMemcpyAsync(host, tensors[i].data, s.bytes, cudaMemcpyDeviceToHost, streams.at(s.device)),
                          what);
      else
        GRACE_CUDA_STATUS(cudaMemcpyAsync(tensors[i].data, host, s.bytes, cudaMemcpyHostToDevice, streams.at(s.device)),
                          what);
    }
    for (size_t i = 0; i < slots.size(); ++i) {
      const slot& s = slots[i];
      if (s.memory != memory_kind::host || s.bytes == 0) continue;
      if (to_host)
        std::memcpy(base + s.offset, tensors[i].data, s.bytes);
      else
        std::memcpy(tensors[i].data, base + s.offset, s.bytes);
    }
    for (const auto& [device, stream] : streams) {
      const std::string what = std::string(op) + ": device " + std::to_string(device);
      GRACE_CUDA_STATUS(cudaSetDevice(device), what);
      cudaEvent_t ev = events.at(device);
      GRACE_CUDA_STATUS(cudaEventRecord(ev, stream), what);
      GRACE_CUDA_STATUS(cudaEventSynchronize(ev), what);
    }
    return status::success();
  }
};

device_snapshot::device_snapshot() : impl_(std::make_unique<impl>()) {}
device_snapshot::~device_snapshot() = default;

result<std::unique_ptr<device_snapshot>> device_snapshot::create(const std::vector<tensor_ref>& layout) {
  std::unique_ptr<device_snapshot> snap(new device_snapshot());
  impl& m = *snap->impl_;
  size_t off = 0;
  for (const tensor_ref& t : layout) {
    impl::slot s{t.name, t.type, t.shape, t.memory, t.device, t.bytes(), off};
    off += (s.bytes + alignment - 1) / alignment * alignment;
    m.total += s.bytes;
    if (t.memory == memory_kind::device && !m.streams.count(t.device)) {
      const std::string what = "device snapshot: side stream on device " + std::to_string(t.device);
      GRACE_CUDA_STATUS(cudaSetDevice(t.device), what);
      cudaStream_t stream = nullptr;
      GRACE_CUDA_STATUS(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), what);
      m.streams[t.device] = stream;
      cudaEvent_t ev = nullptr;
      GRACE_CUDA_STATUS(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), what);
      m.events[t.device] = ev;
    }
    m.slots.push_back(std::move(s));
  }
  m.capacity = off;
  if (off) {
    void* p = nullptr;
    GRACE_CUDA_STATUS(cudaMallocHost(&p, off),
                      "device snapshot: " + std::to_string(off) + " bytes of pinned host memory");
    m.base = static_cast<unsigned char*>(p);
    // Touch every page now: a snapshot must not pay for page faults.
    std::memset(m.base, 0, off);
  }
  return result<std::unique_ptr<device_snapshot>>(std::move(snap));
}

status device_snapshot::capture(const std::vector<tensor_ref>& tensors) { return impl_->copy(tensors, true); }

status device_snapshot::restore(const std::vector<tensor_ref>& tensors) const { return impl_->copy(tensors, false); }

std::vector<snapshot_tensor> device_snapshot::view() const {
  std::vector<snapshot_tensor> out;
  for (const auto& s : impl_->slots)
    out.push_back(snapshot_tensor{s.name, s.type, s.shape, impl_->base + s.offset, s.bytes});
  return out;
}

size_t device_snapshot::total_bytes() const noexcept { return impl_->total; }

}  // namespace grace
