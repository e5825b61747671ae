#include "runtime/checkpoint/snapshot.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <optional>
#include <thread>

#include <spdlog/spdlog.h>

#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/checkpoint/device_copy.hpp"

namespace grace {

namespace {
constexpr size_t page = 4096;
size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }
}  // namespace

snapshot_buffers::snapshot_buffers(const std::vector<tensor_ref>& layout) {
  size_t off = 0;
  for (auto& t : layout) {
    size_t b = t.bytes();
    slots_.push_back({t.name, t.type, t.shape, b, off, t.global_shape, t.offsets});
    off += round_up(b ? b : 1, alignment);
    total_bytes_ += b;
  }
  capacity_ = off ? off : alignment;
  captured_.store(total_bytes_);  // nothing to wait for until a capture begins
  void* p = nullptr;
  if (::posix_memalign(&p, alignment, capacity_) != 0) throw std::bad_alloc();
  base_ = static_cast<unsigned char*>(p);
  // Fault every page in now (one write per page, then a memset to settle
  // the contents) so captures never pay for page faults.
  for (size_t i = 0; i < capacity_; i += page) base_[i] = 1;
  std::memset(base_, 0, capacity_);
}

snapshot_buffers::~snapshot_buffers() { std::free(base_); }

status snapshot_buffers::capture(const std::vector<tensor_ref>& tensors) {
  if (busy())
    return error{errc::overloaded,
                 "snapshot buffers are still being written; wait for the writer or use the other set"};
  if (auto st = check(tensors); !st) return st;
  begin_capture();
  return copy_in(tensors);
}

status snapshot_buffers::check(const std::vector<tensor_ref>& tensors) const {
  if (tensors.size() != slots_.size())
    return error{errc::invalid_input, "capture of " + std::to_string(tensors.size()) +
                                          " tensors into buffers allocated for " + std::to_string(slots_.size())};
  for (size_t i = 0; i < tensors.size(); ++i) {
    auto& t = tensors[i];
    auto& s = slots_[i];
    if (t.name != s.name || t.type != s.type || t.shape != s.shape)
      return error{errc::invalid_input, "capture: tensor " + std::to_string(i) + " is '" + t.name + "' " +
                                            dtype_name(t.type) + " " + shape_str(t.shape) +
                                            " but the buffers were allocated for '" + s.name + "' " +
                                            dtype_name(s.type) + " " + shape_str(s.shape)};
    if (t.memory == memory_kind::device && !device_copy_available())
      return error{errc::failed, "capture: tensor '" + t.name +
                                     "': device tensors need the CUDA backend (this process has not "
                                     "registered its device copy; see runtime/checkpoint/device_copy.hpp)"};
    if (s.bytes > 0 && !t.data) return error{errc::invalid_input, "capture: tensor '" + t.name + "' has no data"};
  }
  return {};
}

void snapshot_buffers::begin_capture() noexcept {
  std::lock_guard<std::mutex> g(progress_m_);
  failed_.store(false, std::memory_order_relaxed);
  captured_.store(0, std::memory_order_release);
}

void snapshot_buffers::publish(uint64_t captured, bool failed) {
  {
    std::lock_guard<std::mutex> g(progress_m_);
    if (failed) failed_.store(true, std::memory_order_release);
    captured_.store(captured, std::memory_order_release);
  }
  progress_cv_.notify_all();
}

status snapshot_buffers::copy_in(const std::vector<tensor_ref>& tensors) {
  const auto t0 = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> g(touch_m_);
  uint64_t done = 0;
  status st;
  try {
    st = copy_slots(tensors, done);
  } catch (...) {
    publish(done, true);  // a writer waiting on this capture must not wait forever
    throw;
  }
  if (!st) {
    // Marked failed, so a writer waiting on it gives up and nothing half
    // filled is ever written.
    publish(done, true);
    return st;
  }
  // The last bytes are published only after capture_ns_ is set, so a
  // writer that saw every byte also sees the capture's duration.
  capture_ns_.store(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count(),
                    std::memory_order_release);
  publish(total_bytes_, false);
  return {};
}

status snapshot_buffers::copy_slots(const std::vector<tensor_ref>& tensors, uint64_t& done) {
  // Published every `step` bytes: small enough that the writer starts soon,
  // large enough that the lock and wake-up cost nothing next to the copy.
  constexpr size_t step = 8u << 20;
  auto progress = [&](size_t n) {
    done += n;
    if (done < total_bytes_) publish(done, false);
  };
  for (size_t i = 0; i < tensors.size(); ++i) {
    auto& t = tensors[i];
    auto& s = slots_[i];
    if (!s.bytes) continue;
    if (t.memory == memory_kind::device) {
      // The hook returns when the bytes are in our buffer.
      if (auto st = device_copy_to_host(base_ + s.offset, t.data, s.bytes, t.device); !st)
        return error{st.err().code, "capture: tensor '" + t.name + "': " + st.err().message};
      progress(s.bytes);
      continue;
    }
    auto* src = static_cast<const unsigned char*>(t.data);
    for (size_t off = 0; off < s.bytes; off += step) {
      size_t n = std::min(step, s.bytes - off);
      std::memcpy(base_ + s.offset + off, src + off, n);
      progress(n);
    }
  }
  return {};
}

bool snapshot_buffers::wait_captured(uint64_t n) const {
  n = std::min<uint64_t>(n, total_bytes_);
  auto ready = [&] { return failed_.load(std::memory_order_acquire) || captured_.load(std::memory_order_acquire) >= n; };
  if (!ready()) {
    std::unique_lock<std::mutex> g(progress_m_);
    ++waiters_;
    progress_cv_.wait(g, ready);
    --waiters_;
  }
  return !failed_.load(std::memory_order_acquire);
}

int snapshot_buffers::waiters() const {
  std::lock_guard<std::mutex> g(progress_m_);
  return waiters_;
}

void snapshot_buffers::keep_warm() const {
  // Reads only: safe alongside a writer thread reading the same pages.
  std::lock_guard<std::mutex> g(touch_m_);
  unsigned sink = 0;
  const volatile unsigned char* p = base_;
  for (size_t i = 0; i < capacity_; i += page) sink += p[i];
  (void)sink;
}

std::vector<void*> snapshot_buffers::regions() noexcept {
  std::vector<void*> out;
  out.reserve(slots_.size());
  for (auto& s : slots_) out.push_back(base_ + s.offset);
  return out;
}

std::vector<snapshot_tensor> snapshot_buffers::view() const {
  std::vector<snapshot_tensor> out;
  out.reserve(slots_.size());
  for (auto& s : slots_) out.push_back({s.name, s.type, s.shape, base_ + s.offset, s.bytes, s.global_shape, s.offsets});
  return out;
}

}  // namespace grace
