// Tests of the CUDA backend. Tests tagged [gpu] need a CUDA device (two for
// the NCCL ones) and skip, saying why, where there is none; the [cuda] tests
// without [gpu] run everywhere the backend is built and check the no-device
// paths (backend choice, error values instead of crashes).

#include <catch2/catch.hpp>

#include <gloo/rendezvous/hash_store.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "runtime/train/cuda/device.hpp"
#include "runtime/train/cuda/device_snapshot.hpp"
#include "runtime/train/cuda/mlp_cuda.hpp"
#include "runtime/train/cuda/nccl_comm.hpp"
#include "runtime/checkpoint/device_copy.hpp"
#include "tests/skip.hpp"
#include "runtime/train/mlp.hpp"

#include <cuda_runtime.h>

using namespace grace;

namespace {

/// True when `need` devices are present. Without a driver (or with fewer
/// devices than the test needs) the test is skipped, saying why; a driver
/// that is present while CUDA cannot start is a failure, not a skip.
bool have_devices(int need = 1) {
  const auto p = probe_cuda();
  if (p.devices >= need) return true;
  if (p.driver && p.devices == 0) FAIL("an NVIDIA driver is present but CUDA cannot start: " << p.why);
  if (p.devices == 0) GRACE_SKIP_BOOL("no CUDA device (" << p.why << ")");
  GRACE_SKIP_BOOL("needs " << need << " CUDA devices, found " << p.devices);
}

mlp_config small_config() {
  mlp_config cfg;
  cfg.input_dim = 32;
  cfg.hidden = {64, 48};
  cfg.classes = 10;
  cfg.global_batch = 64;
  cfg.lr = 0.05f;
  cfg.momentum = 0.9f;
  cfg.weight_decay = 1e-4f;
  cfg.seed = 7;
  return cfg;
}

std::vector<float> host_state(mlp& m) {
  std::vector<float> out;
  for (const tensor_ref& t : m.tensors()) {
    const float* p = static_cast<const float*>(t.data);
    out.insert(out.end(), p, p + t.numel());
  }
  return out;
}

/// max |a - b| / max |b|, per tensor of `layout`, worst over tensors.
double worst_relative_diff(const std::vector<float>& a, const std::vector<float>& b,
                           const std::vector<tensor_ref>& layout) {
  double worst = 0;
  size_t off = 0;
  for (const tensor_ref& t : layout) {
    double diff = 0, scale = 0;
    for (size_t i = off; i < off + t.numel(); ++i) {
      diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
      scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
    }
    if (scale > 0) worst = std::max(worst, diff / scale);
    off += t.numel();
  }
  return worst;
}

}  // namespace

// ---- without a device -----------------------------------------------------

TEST_CASE("choose_backend: auto falls back to cpu, cuda is a clear error", "[cuda]") {
  std::string why;
  const int n = cuda_device_count(&why);
  auto cpu = choose_backend("cpu", 0);
  REQUIRE(cpu.ok());
  CHECK(cpu->kind == backend_kind::cpu);
  CHECK(cpu->device == -1);

  auto bad = choose_backend("tpu", 0);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.err().code == errc::invalid_input);

  auto aut = choose_backend("auto", 0);
  auto cuda = choose_backend("cuda", 0);
  if (n == 0) {
    CHECK_FALSE(why.empty());
    REQUIRE(aut.ok());
    CHECK(aut->kind == backend_kind::cpu);
    CHECK(aut->device == -1);
    CHECK(aut->explanation.find("no CUDA device") != std::string::npos);
    CHECK(aut->explanation.find(why) != std::string::npos);
    CHECK(aut->explanation.find('\n') == std::string::npos);
    INFO(aut->explanation);

    REQUIRE_FALSE(cuda.ok());
    CHECK(cuda.err().code == errc::invalid_input);
    CHECK(cuda.err().message.rfind("--device cuda: no CUDA device (", 0) == 0);

    auto dev = pick_device(0);
    REQUIRE_FALSE(dev.ok());
    CHECK(dev.err().code == errc::invalid_input);
  } else {
    REQUIRE(aut.ok());
    CHECK(aut->kind == backend_kind::cuda);
    REQUIRE(cuda.ok());
    CHECK(cuda->kind == backend_kind::cuda);
    auto other = choose_backend("cuda", n + 1);
    REQUIRE(other.ok());
    CHECK(other->device == (n + 1) % n);
  }
}

TEST_CASE("without a device the backend returns errors, not crashes", "[cuda]") {
  std::string why;
  if (cuda_device_count(&why) > 0) {
    SUCCEED("a device is present; the no-device paths are not reachable here");
    return;
  }
  auto m = mlp_cuda::create(small_config(), 0);
  REQUIRE_FALSE(m.ok());
  CHECK(m.err().code == errc::failed);

  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  auto c = nccl_comm::connect(store, "t/", 0, 1, 0, std::chrono::milliseconds(1000));
  REQUIRE_FALSE(c.ok());
  CHECK(c.err().code == errc::invalid_input);
  CHECK(c.err().message.find("no CUDA device") != std::string::npos);

  auto snap = device_snapshot::create({});
  REQUIRE(snap.ok());  // an empty layout needs no device
  CHECK(snap.value()->total_bytes() == 0);
}

TEST_CASE("device copy hooks: default error, then the CUDA copies", "[cuda]") {
  float host[4] = {};
  register_device_copy(nullptr, nullptr);
  CHECK_FALSE(device_copy_available());
  auto st = device_copy_to_host(host, host, sizeof(host), 0);
  REQUIRE_FALSE(st.ok());
  CHECK(st.err().code == errc::failed);
  CHECK(st.err().message.find("no CUDA backend") != std::string::npos);

  register_cuda_device_copy();
  CHECK(device_copy_available());
  CHECK(device_copy_to_host(host, host, 0, 0).ok());  // zero bytes: no CUDA call
  register_device_copy(nullptr, nullptr);
}

// ---- with a device ----------------------------------------------------------

TEST_CASE("mlp_cuda matches the CPU mlp over 20 steps", "[cuda][gpu]") {
  if (!have_devices()) return;
  const mlp_config cfg = small_config();
  mlp cpu(cfg);
  auto made = mlp_cuda::create(cfg, 0);
  REQUIRE(made.ok());
  mlp_cuda& gpu = *made.value();

  // Same layout, same initial state, bit for bit.
  const auto ct = cpu.tensors(), gt = gpu.tensors();
  REQUIRE(ct.size() == gt.size());
  for (size_t i = 0; i < ct.size(); ++i) {
    CHECK(ct[i].name == gt[i].name);
    CHECK(ct[i].shape == gt[i].shape);
    CHECK(gt[i].memory == memory_kind::device);
    CHECK(gt[i].device == 0);
  }
  REQUIRE(gpu.grad_size() == cpu.grad_size());
  CHECK(gpu.weights_checksum() == cpu.weights_checksum());

  for (uint64_t step = 0; step < 20; ++step) {
    const float lc = cpu.compute_gradients(step, 0, 1);
    const float lg = gpu.compute_gradients(step, 0, 1);
    CHECK(std::fabs(lc - lg) <= 1e-4f * std::fabs(lc));
    cpu.apply_gradients();
    gpu.apply_gradients();
  }
  const double rel = worst_relative_diff(gpu.download_state(), host_state(cpu), ct);
  INFO("worst per-tensor relative difference after 20 steps: " << rel);
  CHECK(rel <= 1e-4);

  // Run to run, the GPU backend is deterministic.
  auto again = mlp_cuda::create(cfg, 0);
  REQUIRE(again.ok());
  for (uint64_t step = 0; step < 20; ++step) {
    again.value()->compute_gradients(step, 0, 1);
    again.value()->apply_gradients();
  }
  CHECK(again.value()->weights_checksum() == gpu.weights_checksum());
}

TEST_CASE("device snapshot round trip through pinned memory", "[cuda][gpu]") {
  if (!have_devices()) return;
  const mlp_config cfg = small_config();
  auto made = mlp_cuda::create(cfg, 0);
  REQUIRE(made.ok());
  mlp_cuda& gpu = *made.value();
  gpu.compute_gradients(0, 0, 1);
  gpu.apply_gradients();
  const uint64_t at_step_1 = gpu.weights_checksum();
  const std::vector<float> state = gpu.download_state();

  auto snap = device_snapshot::create(gpu.tensors());
  REQUIRE(snap.ok());
  REQUIRE(snap.value()->capture(gpu.tensors()).ok());
  CHECK(snap.value()->total_bytes() == gpu.state_bytes());

  // The view holds the bytes the checkpoint writer would persist: the same
  // as the state, tensor by tensor.
  size_t off = 0;
  for (const snapshot_tensor& t : snap.value()->view()) {
    CHECK(std::memcmp(t.data, state.data() + off, t.bytes) == 0);
    off += t.bytes / sizeof(float);
  }

  for (uint64_t step = 1; step < 4; ++step) {
    gpu.compute_gradients(step, 0, 1);
    gpu.apply_gradients();
  }
  REQUIRE(gpu.weights_checksum() != at_step_1);
  REQUIRE(snap.value()->restore(gpu.tensors()).ok());
  CHECK(gpu.weights_checksum() == at_step_1);

  // A layout mismatch is invalid input, not a wild copy.
  auto fewer = gpu.tensors();
  fewer.pop_back();
  auto st = snap.value()->capture(fewer);
  REQUIRE_FALSE(st.ok());
  CHECK(st.err().code == errc::invalid_input);

  // A checkpoint written on GPU loads on CPU: the captured bytes restore a
  // host mlp to the same checksum.
  mlp cpu(cfg);
  auto host_tensors = cpu.tensors();
  const auto view = snap.value()->view();
  REQUIRE(view.size() == host_tensors.size());
  for (size_t i = 0; i < view.size(); ++i) {
    REQUIRE(view[i].bytes == host_tensors[i].bytes());
    std::memcpy(host_tensors[i].data, view[i].data, view[i].bytes);
  }
  CHECK(cpu.weights_checksum() == at_step_1);
}

TEST_CASE("device copy hooks round trip, pinned and pageable, over chunk boundaries", "[cuda][gpu]") {
  if (!have_devices()) return;
  const size_t n = (size_t(20) << 20) / sizeof(float) + 123;  // > two 8 MiB bounce chunks
  std::vector<float> src(n), back(n, -1.0f);
  for (size_t i = 0; i < n; ++i) src[i] = static_cast<float>(i % 9973) * 0.5f;
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  void* dev = nullptr;
  REQUIRE(cudaMalloc(&dev, n * sizeof(float)) == cudaSuccess);

  register_cuda_device_copy();
  REQUIRE(device_copy_to_device(dev, src.data(), n * sizeof(float), 0).ok());
  REQUIRE(device_copy_to_host(back.data(), dev, n * sizeof(float), 0).ok());
  CHECK(back == src);

  void* pinned = nullptr;
  REQUIRE(cudaMallocHost(&pinned, n * sizeof(float)) == cudaSuccess);
  REQUIRE(device_copy_to_host(pinned, dev, n * sizeof(float), 0).ok());
  CHECK(std::memcmp(pinned, src.data(), n * sizeof(float)) == 0);

  cudaFreeHost(pinned);
  cudaFree(dev);
  register_device_copy(nullptr, nullptr);
  release_cuda_copy_resources();
}

TEST_CASE("NCCL allreduce across local devices", "[cuda][gpu][nccl]") {
  if (!have_devices(2)) return;
  std::string why;
  const int world = std::min(cuda_device_count(&why), 4);
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  const size_t n = 1000003;
  std::vector<int> ok(world, 0);
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto c = nccl_comm::connect(store, "ar/", r, world, r, std::chrono::seconds(60));
      if (!c) {
        errors[r] = c.err().what();
        return;
      }
      std::vector<float> h(n);
      for (size_t i = 0; i < n; ++i) h[i] = static_cast<float>(r + 1) * static_cast<float>(i % 7);
      float* d = nullptr;
      cudaSetDevice(r);
      if (cudaMalloc(&d, n * sizeof(float)) != cudaSuccess) {
        errors[r] = "cudaMalloc";
        return;
      }
      cudaMemcpy(d, h.data(), n * sizeof(float), cudaMemcpyHostToDevice);
      auto st = c.value()->allreduce_sum(d, n);
      if (!st) {
        errors[r] = st.err().what();
        cudaFree(d);
        return;
      }
      if (!c.value()->allreduce_sum(d, 0).ok()) errors[r] = "allreduce of 0 floats failed";
      cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost);
      cudaFree(d);
      const float ranks_sum = static_cast<float>(world * (world + 1) / 2);
      bool all = true;
      for (size_t i = 0; i < n && all; ++i) all = h[i] == ranks_sum * static_cast<float>(i % 7);
      ok[r] = all ? 1 : 0;
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r << ": " << errors[r]);
    CHECK(ok[r] == 1);
  }
}

TEST_CASE("NCCL: two workers with mlp_cuda train like one CPU worker", "[cuda][gpu][nccl]") {
  if (!have_devices(2)) return;
  const mlp_config cfg = small_config();
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  std::vector<std::vector<float>> states(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto c = nccl_comm::connect(store, "train/", r, 2, r, std::chrono::seconds(60));
      if (!c) {
        errors[r] = c.err().what();
        return;
      }
      auto m = mlp_cuda::create(cfg, r);
      if (!m) {
        errors[r] = m.err().what();
        return;
      }
      for (uint64_t step = 0; step < 10; ++step) {
        m.value()->compute_gradients(step, r, 2);
        auto st = c.value()->allreduce_sum(m.value()->grad_data(), m.value()->grad_size());
        if (!st) {
          errors[r] = st.err().what();
          return;
        }
        m.value()->apply_gradients();
      }
      states[r] = m.value()->download_state();
    });
  }
  for (auto& t : threads) t.join();
  INFO(errors[0] << " / " << errors[1]);
  REQUIRE(errors[0].empty());
  REQUIRE(errors[1].empty());
  CHECK(states[0] == states[1]);  // every rank applies the same reduced gradient

  mlp cpu(cfg);
  for (uint64_t step = 0; step < 10; ++step) {
    cpu.compute_gradients(step, 0, 1);
    cpu.apply_gradients();
  }
  CHECK(worst_relative_diff(states[0], host_state(cpu), cpu.tensors()) <= 1e-4);
}

TEST_CASE("NCCL: abort unblocks an allreduce waiting for a dead peer", "[cuda][gpu][nccl]") {
  if (!have_devices(2)) return;
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  std::shared_ptr<nccl_comm> comms[2];
  std::string errors[2];
  {
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r)
      threads.emplace_back([&, r] {
        auto c = nccl_comm::connect(store, "abort/", r, 2, r, std::chrono::seconds(60));
        if (c)
          comms[r] = std::move(c.value());
        else
          errors[r] = c.err().what();
      });
    for (auto& t : threads) t.join();
  }
  INFO(errors[0] << " / " << errors[1]);
  REQUIRE(comms[0]);
  REQUIRE(comms[1]);

  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  float* d = nullptr;
  REQUIRE(cudaMalloc(&d, 1024 * sizeof(float)) == cudaSuccess);
  // Rank 1 never joins (a dead peer). The timeout is long, so only the abort
  // can end the call with errc::disconnected (a timeout is overloaded).
  status result;
  std::atomic<bool> returned{false};
  std::thread blocked([&] {
    result = comms[0]->allreduce_sum(d, 1024);
    returned = true;
  });
  while (!comms[0]->in_flight() && !returned) std::this_thread::yield();
  comms[0]->abort();
  blocked.join();
  REQUIRE_FALSE(result.ok());
  CHECK(result.err().code == errc::disconnected);
  CHECK(comms[0]->aborted());
  CHECK_FALSE(comms[0]->allreduce_sum(d, 1024).ok());  // and every later call fails at once
  comms[1]->abort();
  cudaFree(d);
}
