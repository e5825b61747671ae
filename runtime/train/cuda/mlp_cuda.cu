#include "runtime/train/cuda/mlp_cuda.hpp"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "runtime/train/cuda/cuda_check.hpp"
#include "runtime/train/kernels.hpp"

#define GRACE_CUDA_THROW(call)                                                                        \
  do {                                                                                                \
    const cudaError_t grace_rc_ = (call);                                                             \
    if (grace_rc_ != cudaSuccess)                                                                     \
      throw ::grace::cuda_error(::grace::cuda_detail::failure(#call, __FILE__, __LINE__, grace_rc_)); \
  } while (0)

#define GRACE_CUBLAS_THROW(call)                                                                      \
  do {                                                                                                \
    const cublasStatus_t grace_rc_ = (call);                                                          \
    if (grace_rc_ != CUBLAS_STATUS_SUCCESS)                                                           \
      throw ::grace::cuda_error(::grace::cuda_detail::failure(#call, __FILE__, __LINE__, grace_rc_)); \
  } while (0)

namespace grace {

namespace {

constexpr int threads_per_block = 256;

unsigned blocks_for(size_t n) { return static_cast<unsigned>((n + threads_per_block - 1) / threads_per_block); }

// ---- kernels: one thread per element or row, each calling kernels.hpp -----

/// teacher[c, j] = teacher_weight(cfg, c, j) of mlp.cpp.
__global__ void teacher_kernel(uint64_t seed, int classes, int d, float* teacher) {
  const size_t e = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (e >= static_cast<size_t>(classes) * d) return;
  const uint64_t c = e / d, j = e % d;
  teacher[e] = kernels::normal(seed, kernels::stream_teacher, c, j);
}

/// x[i, j] of global sample first + i, as sample_into in mlp.cpp.
__global__ void features_kernel(uint64_t seed, uint64_t first, int local, int d, float* x) {
  const size_t e = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (e >= static_cast<size_t>(local) * d) return;
  const uint64_t i = e / d, j = e % d;
  x[e] = kernels::normal(seed, kernels::stream_data, first + i, j);
}

/// Label of each sample: argmax of the teacher scores, first maximum wins,
/// summed in the same order as sample_into.
__global__ void labels_kernel(const float* teacher, const float* x, int local, int d, int classes, int* labels) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= local) return;
  const float* xi = x + static_cast<size_t>(i) * d;
  int best = 0;
  float best_score = 0.0f;
  for (int c = 0; c < classes; ++c) {
    float s = 0.0f;
    for (int j = 0; j < d; ++j) s += teacher[static_cast<size_t>(c) * d + j] * xi[j];
    if (c == 0 || s > best_score) {
      best = c;
      best_score = s;
    }
  }
  labels[i] = best;
}

/// z[i, k] += b[k], then ReLU on hidden layers.
__global__ void bias_act_kernel(float* z, const float* b, int rows, int out, bool relu) {
  const size_t e = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (e >= static_cast<size_t>(rows) * out) return;
  const int k = static_cast<int>(e % out);
  kernels::bias_add_row(z + e, b + k, 1);
  if (relu) z[e] = kernels::relu(z[e]);
}

/// One row per thread: loss[i] and the scaled gradient w.r.t. the logits.
__global__ void xent_kernel(const float* logits, const int* labels, int rows, int classes, float* delta, float* loss,
                            float scale) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= rows) return;
  const size_t off = static_cast<size_t>(i) * classes;
  loss[i] = kernels::softmax_xent_row(logits + off, labels[i], classes, delta + off, scale);
}

/// gb[k] = sum over rows of delta[i, k], in row order (as mlp.cpp).
__global__ void bias_grad_kernel(const float* delta, int rows, int out, float* gb) {
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= out) return;
  float s = 0.0f;
  for (int i = 0; i < rows; ++i) s += delta[static_cast<size_t>(i) * out + k];
  gb[k] = s;
}

__global__ void relu_backward_kernel(float* d, const float* y, size_t n) {
  const size_t e = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (e < n) d[e] = kernels::relu_backward(d[e], y[e]);
}

__global__ void sgd_kernel(float* w, float* v, const float* g, size_t n, float lr, float mu, float wd) {
  const size_t e = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (e < n) kernels::sgd_momentum(w[e], v[e], g[e], lr, mu, wd);
}

template <class T>
T* device_alloc(size_t n) {
  void* p = nullptr;
  if (n == 0) return nullptr;
  GRACE_CUDA_THROW(cudaMalloc(&p, n * sizeof(T)));
  return static_cast<T*>(p);
}

}  // namespace

struct mlp_cuda::impl {
  mlp_config cfg;
  int device = 0;
  std::vector<int> dims;             ///< input_dim, hidden..., classes
  std::vector<size_t> w_off, b_off;  ///< into params / momentum / grad
  size_t total = 0;                  ///< floats in each of params, momentum, grad

  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  float* params = nullptr;    ///< W_0, b_0, W_1, b_1, ... (the grad layout)
  float* momentum = nullptr;  ///< same layout
  float* grad = nullptr;      ///< same layout
  float* teacher = nullptr;   ///< [classes, input_dim]

  // Scratch for the local batch, allocated on first use and reused.
  int batch = 0;
  float* x = nullptr;
  int* labels = nullptr;
  std::vector<float*> act;  ///< output of each layer, [B, out]
  float* delta = nullptr;
  float* delta_prev = nullptr;
  float* loss = nullptr;       ///< per row, device
  float* loss_host = nullptr;  ///< per row, pinned

  int layers() const { return static_cast<int>(dims.size()) - 1; }

  void use_device() const { GRACE_CUDA_THROW(cudaSetDevice(device)); }

  void free_scratch() noexcept {
    cudaFree(x);
    cudaFree(labels);
    for (float* a : act) cudaFree(a);
    act.clear();
    cudaFree(delta);
    cudaFree(delta_prev);
    cudaFree(loss);
    cudaFreeHost(loss_host);
    x = delta = delta_prev = loss = loss_host = nullptr;
    labels = nullptr;
    batch = 0;
  }

  void ensure_scratch(int b) {
    if (batch == b) return;
    free_scratch();
    const size_t B = static_cast<size_t>(b);
    x = device_alloc<float>(B * dims[0]);
    labels = device_alloc<int>(B);
    size_t widest = 0;
    for (int l = 0; l < layers(); ++l) {
      act.push_back(device_alloc<float>(B * dims[l + 1]));
      widest = std::max(widest, static_cast<size_t>(dims[l + 1]));
    }
    delta = device_alloc<float>(B * widest);
    delta_prev = device_alloc<float>(B * widest);
    loss = device_alloc<float>(B);
    void* h = nullptr;
    GRACE_CUDA_THROW(cudaMallocHost(&h, B * sizeof(float)));
    loss_host = static_cast<float*>(h);
    batch = b;
  }

  void check_launch(const char* what) {
    const cudaError_t rc = cudaGetLastError();
    if (rc != cudaSuccess) throw cuda_error(std::string("launch of ") + what + ": " + cuda_detail::describe(rc));
  }

  ~impl() {
    if (cudaSetDevice(device) != cudaSuccess) return;
    if (stream) cudaStreamSynchronize(stream);
    free_scratch();
    cudaFree(params);
    cudaFree(momentum);
    cudaFree(grad);
    cudaFree(teacher);
    if (blas) cublasDestroy(blas);
    if (stream) cudaStreamDestroy(stream);
  }
};

result<std::unique_ptr<mlp_cuda>> mlp_cuda::create(const mlp_config& cfg, int device) {
  auto st = validate(cfg);
  if (!st) return st.err();
  try {
    return std::make_unique<mlp_cuda>(cfg, device);
  } catch (const cuda_error& e) {
    return error{errc::failed, std::string("mlp_cuda on device ") + std::to_string(device) + ": " + e.what()};
  } catch (const std::bad_alloc&) {
    return error{errc::failed, "mlp_cuda: out of host memory"};
  }
}

mlp_cuda::mlp_cuda(mlp_config cfg, int device) : impl_(std::make_unique<impl>()) {
  // The host model validates the config and computes the initial state with
  // the same code as the CPU backend: both backends start bit-identical.
  mlp host(cfg);
  impl& m = *impl_;
  m.cfg = std::move(cfg);
  m.device = device;
  m.dims.push_back(m.cfg.input_dim);
  for (int h : m.cfg.hidden) m.dims.push_back(h);
  m.dims.push_back(m.cfg.classes);
  for (int l = 0; l < m.layers(); ++l) {
    const size_t in = static_cast<size_t>(m.dims[l]), out = static_cast<size_t>(m.dims[l + 1]);
    m.w_off.push_back(m.total);
    m.total += out * in;
    m.b_off.push_back(m.total);
    m.total += out;
  }

  m.use_device();
  GRACE_CUDA_THROW(cudaStreamCreateWithFlags(&m.stream, cudaStreamNonBlocking));
  GRACE_CUBLAS_THROW(cublasCreate(&m.blas));
  GRACE_CUBLAS_THROW(cublasSetStream(m.blas, m.stream));
  // Plain FP32 products: no TF32 tensor-core rounding, so the numerics stay
  // within ~1e-5 of the CPU backend.
  GRACE_CUBLAS_THROW(cublasSetMathMode(m.blas, CUBLAS_PEDANTIC_MATH));
  m.params = device_alloc<float>(m.total);
  m.momentum = device_alloc<float>(m.total);
  m.grad = device_alloc<float>(m.total);
  GRACE_CUDA_THROW(cudaMemsetAsync(m.grad, 0, m.total * sizeof(float), m.stream));

  // host.tensors() is W_0, b_0, W_1, b_1, ..., then the momentum in the same
  // order: exactly the device layout, concatenated.
  std::vector<float> staging(2 * m.total);
  size_t off = 0;
  for (const tensor_ref& t : host.tensors()) {
    std::memcpy(staging.data() + off, t.data, t.bytes());
    off += t.numel();
  }
  GRACE_CUDA_THROW(
      cudaMemcpyAsync(m.params, staging.data(), m.total * sizeof(float), cudaMemcpyHostToDevice, m.stream));
  GRACE_CUDA_THROW(
      cudaMemcpyAsync(m.momentum, staging.data() + m.total, m.total * sizeof(float), cudaMemcpyHostToDevice, m.stream));

  const size_t tn = static_cast<size_t>(m.cfg.classes) * m.cfg.input_dim;
  m.teacher = device_alloc<float>(tn);
  teacher_kernel<<<blocks_for(tn), threads_per_block, 0, m.stream>>>(m.cfg.seed, m.cfg.classes, m.cfg.input_dim,
                                                                     m.teacher);
  m.check_launch("teacher_kernel");
  GRACE_CUDA_THROW(cudaStreamSynchronize(m.stream));
}

mlp_cuda::~mlp_cuda() = default;

const mlp_config& mlp_cuda::config() const noexcept { return impl_->cfg; }
int mlp_cuda::num_layers() const noexcept { return impl_->layers(); }
int mlp_cuda::device() const noexcept { return impl_->device; }
float* mlp_cuda::grad_data() noexcept { return impl_->grad; }
size_t mlp_cuda::grad_size() const noexcept { return impl_->total; }
uint64_t mlp_cuda::parameter_count() const noexcept { return impl_->total; }
size_t mlp_cuda::state_bytes() const noexcept { return 2 * impl_->total * sizeof(float); }

std::vector<tensor_ref> mlp_cuda::tensors() {
  impl& m = *impl_;
  std::vector<tensor_ref> out;
  auto add = [&](std::string name, std::vector<int64_t> shape, float* p) {
    tensor_ref t;
    t.name = std::move(name);
    t.type = dtype::f32;
    t.shape = std::move(shape);
    t.data = p;
    t.memory = memory_kind::device;
    t.device = m.device;
    out.push_back(std::move(t));
  };
  for (int l = 0; l < m.layers(); ++l) {
    const std::string p = "layers." + std::to_string(l);
    add(p + ".weight", {m.dims[l + 1], m.dims[l]}, m.params + m.w_off[l]);
    add(p + ".bias", {m.dims[l + 1]}, m.params + m.b_off[l]);
  }
  for (int l = 0; l < m.layers(); ++l) {
    const std::string p = "optimizer.momentum.layers." + std::to_string(l);
    add(p + ".weight", {m.dims[l + 1], m.dims[l]}, m.momentum + m.w_off[l]);
    add(p + ".bias", {m.dims[l + 1]}, m.momentum + m.b_off[l]);
  }
  return out;
}

float mlp_cuda::compute_gradients(uint64_t step, int rank, int world) {
  impl& m = *impl_;
  auto st = validate(m.cfg, world);
  if (!st) throw std::invalid_argument(st.err().message);
  if (rank < 0 || rank >= world)
    throw std::invalid_argument("mlp_cuda: rank " + std::to_string(rank) + " out of range for world " +
                                std::to_string(world));
  m.use_device();
  const int B = m.cfg.global_batch / world;
  m.ensure_scratch(B);
  const int L = m.layers();
  const int D = m.cfg.input_dim, C = m.cfg.classes;
  cudaStream_t s = m.stream;

  // This worker's slice of the step's global batch, generated on the device.
  const uint64_t first =
      step * static_cast<uint64_t>(m.cfg.global_batch) + static_cast<uint64_t>(rank) * static_cast<uint64_t>(B);
  features_kernel<<<blocks_for(static_cast<size_t>(B) * D), threads_per_block, 0, s>>>(m.cfg.seed, first, B, D, m.x);
  labels_kernel<<<blocks_for(B), threads_per_block, 0, s>>>(m.teacher, m.x, B, D, C, m.labels);
  m.check_launch("data kernels");

  // cuBLAS is column-major: a row-major [r, c] matrix is its column-major
  // transpose [c, r] with the same leading dimension c. So row-major
  // Z = A W^T ([B,out] = [B,in] [out,in]^T) is column-major Z^T = W^T' A^T'
  // where W^T' (the col-major view of W) is [in, out]: gemm(T, N, out, B, in).
  const float one = 1.0f, zero = 0.0f;
  for (int l = 0; l < L; ++l) {
    const int in = m.dims[l], out = m.dims[l + 1];
    const float* a = l == 0 ? m.x : m.act[l - 1];
    float* z = m.act[l];
    GRACE_CUBLAS_THROW(cublasSgemm(m.blas, CUBLAS_OP_T, CUBLAS_OP_N, out, B, in, &one, m.params + m.w_off[l], in, a, in,
                                   &zero, z, out));
    bias_act_kernel<<<blocks_for(static_cast<size_t>(B) * out), threads_per_block, 0, s>>>(z, m.params + m.b_off[l], B,
                                                                                           out, l + 1 < L);
    m.check_launch("bias_act_kernel");
  }

  const float scale = 1.0f / static_cast<float>(m.cfg.global_batch);
  xent_kernel<<<blocks_for(B), threads_per_block, 0, s>>>(m.act[L - 1], m.labels, B, C, m.delta, m.loss, scale);
  m.check_launch("xent_kernel");
  GRACE_CUDA_THROW(cudaMemcpyAsync(m.loss_host, m.loss, B * sizeof(float), cudaMemcpyDeviceToHost, s));

  for (int l = L - 1; l >= 0; --l) {
    const int in = m.dims[l], out = m.dims[l + 1];
    const float* a = l == 0 ? m.x : m.act[l - 1];
    // Row-major dW = delta^T a [out, in]; column-major dW^T [in, out] =
    // a^T' delta^T'^T with a^T' = [in, B] and delta^T' = [out, B]:
    // gemm(N, T, in, out, B).
    GRACE_CUBLAS_THROW(cublasSgemm(m.blas, CUBLAS_OP_N, CUBLAS_OP_T, in, out, B, &one, a, in, m.delta, out, &zero,
                                   m.grad + m.w_off[l], in));
    bias_grad_kernel<<<blocks_for(out), threads_per_block, 0, s>>>(m.delta, B, out, m.grad + m.b_off[l]);
    m.check_launch("bias_grad_kernel");
    if (l == 0) break;
    // Row-major delta_prev = delta W [B, in]; column-major [in, B] =
    // W^T' delta^T' with W^T' = [in, out]: gemm(N, N, in, B, out).
    GRACE_CUBLAS_THROW(cublasSgemm(m.blas, CUBLAS_OP_N, CUBLAS_OP_N, in, B, out, &one, m.params + m.w_off[l], in,
                                   m.delta, out, &zero, m.delta_prev, in));
    const size_t n = static_cast<size_t>(B) * in;
    relu_backward_kernel<<<blocks_for(n), threads_per_block, 0, s>>>(m.delta_prev, a, n);
    m.check_launch("relu_backward_kernel");
    std::swap(m.delta, m.delta_prev);
  }
  GRACE_CUDA_THROW(cudaStreamSynchronize(s));

  float loss_sum = 0.0f;  // row order, as the CPU backend
  for (int i = 0; i < B; ++i) loss_sum += m.loss_host[i];
  return loss_sum * scale;
}

void mlp_cuda::apply_gradients() {
  impl& m = *impl_;
  m.use_device();
  sgd_kernel<<<blocks_for(m.total), threads_per_block, 0, m.stream>>>(m.params, m.momentum, m.grad, m.total, m.cfg.lr,
                                                                      m.cfg.momentum, m.cfg.weight_decay);
  m.check_launch("sgd_kernel");
  GRACE_CUDA_THROW(cudaStreamSynchronize(m.stream));
}

std::vector<float> mlp_cuda::download_state() const {
  const impl& m = *impl_;
  m.use_device();
  std::vector<float> host(2 * m.total);
  GRACE_CUDA_THROW(cudaMemcpyAsync(host.data(), m.params, m.total * sizeof(float), cudaMemcpyDeviceToHost, m.stream));
  GRACE_CUDA_THROW(
      cudaMemcpyAsync(host.data() + m.total, m.momentum, m.total * sizeof(float), cudaMemcpyDeviceToHost, m.stream));
  GRACE_CUDA_THROW(cudaStreamSynchronize(m.stream));
  return host;
}

uint64_t mlp_cuda::weights_checksum() const {
  // Parameters then momentum, each in W_0, b_0, W_1, ... order: the same
  // byte sequence as grace::mlp::weights_checksum.
  const std::vector<float> host = download_state();
  return fnv1a(fnv_offset, host.data(), host.size() * sizeof(float));
}

}  // namespace grace
