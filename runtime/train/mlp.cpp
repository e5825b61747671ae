#include "runtime/train/mlp.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <stdexcept>

#include "runtime/train/kernels.hpp"

extern "C" void openblas_set_num_threads(int);

namespace grace {

uint64_t fnv1a(uint64_t h, const void* data, size_t n) {
  auto p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

namespace {

/// One BLAS thread per worker: results stay bit-identical run to run and the
/// runtime keeps its cores.
void blas_single_thread() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

}  // namespace

status validate(const mlp_config& cfg, int world) {
  auto bad = [](std::string m) { return status(error{errc::invalid_input, std::move(m)}); };
  if (cfg.input_dim <= 0) return bad("mlp: input_dim must be positive");
  if (cfg.classes < 2) return bad("mlp: classes must be at least 2");
  for (int h : cfg.hidden)
    if (h <= 0) return bad("mlp: every hidden layer size must be positive");
  if (cfg.global_batch <= 0) return bad("mlp: global_batch must be positive");
  if (world < 0) return bad("mlp: world size must be positive");
  if (world > 0 && cfg.global_batch % world != 0)
    return bad("mlp: global_batch " + std::to_string(cfg.global_batch) + " is not divisible by world size " +
               std::to_string(world) + "; choose a global_batch that is a multiple of the worker count");
  return status::success();
}

namespace {

float teacher_weight(const mlp_config& cfg, int c, int j) {
  return kernels::normal(cfg.seed, kernels::stream_teacher, static_cast<uint64_t>(c), static_cast<uint64_t>(j));
}

/// Fills x and returns the label; `teacher` ([classes, input_dim]) is a cache
/// of teacher_weight, or null to generate the weights on the fly.
int sample_into(const mlp_config& cfg, const float* teacher, uint64_t index, float* x) {
  const int d = cfg.input_dim;
  for (int j = 0; j < d; ++j) x[j] = kernels::normal(cfg.seed, kernels::stream_data, index, static_cast<uint64_t>(j));
  int best = 0;
  float best_score = 0.0f;
  for (int c = 0; c < cfg.classes; ++c) {
    float s = 0.0f;
    for (int j = 0; j < d; ++j)
      s += (teacher ? teacher[static_cast<size_t>(c) * d + j] : teacher_weight(cfg, c, j)) * x[j];
    if (c == 0 || s > best_score) {
      best = c;
      best_score = s;
    }
  }
  return best;
}

}  // namespace

int make_sample(const mlp_config& cfg, uint64_t index, float* x) { return sample_into(cfg, nullptr, index, x); }

result<std::unique_ptr<mlp>> mlp::create(const mlp_config& cfg) {
  auto st = validate(cfg);
  if (!st) return st.err();
  return std::make_unique<mlp>(cfg);
}

mlp::mlp(mlp_config cfg) : cfg_(std::move(cfg)) {
  auto st = validate(cfg_);
  if (!st) throw std::invalid_argument(st.err().message);
  blas_single_thread();

  dims_.push_back(cfg_.input_dim);
  for (int h : cfg_.hidden) dims_.push_back(h);
  dims_.push_back(cfg_.classes);
  const int layers = static_cast<int>(dims_.size()) - 1;

  size_t off = 0;
  for (int l = 0; l < layers; ++l) {
    const size_t in = static_cast<size_t>(dims_[l]), out = static_cast<size_t>(dims_[l + 1]);
    std::vector<float> w(out * in);
    // He initialisation for the ReLU layers; the output layer starts small so
    // the initial loss is ~log(classes) and wide models (4096) do not spike.
    // A pure function of (seed, layer, row, col).
    const float scale =
        l + 1 < layers ? std::sqrt(2.0f / static_cast<float>(in)) : 0.1f / std::sqrt(static_cast<float>(in));
    for (size_t r = 0; r < out; ++r)
      for (size_t c = 0; c < in; ++c)
        w[r * in + c] = scale * kernels::normal(cfg_.seed, kernels::stream_init + static_cast<uint64_t>(l), r, c);
    w_.push_back(std::move(w));
    b_.emplace_back(out, 0.0f);
    vw_.emplace_back(out * in, 0.0f);
    vb_.emplace_back(out, 0.0f);
    grad_w_off_.push_back(off);
    off += out * in;
    grad_b_off_.push_back(off);
    off += out;
  }
  grad_.assign(off, 0.0f);

  teacher_.resize(static_cast<size_t>(cfg_.classes) * cfg_.input_dim);
  for (int c = 0; c < cfg_.classes; ++c)
    for (int j = 0; j < cfg_.input_dim; ++j)
      teacher_[static_cast<size_t>(c) * cfg_.input_dim + j] = teacher_weight(cfg_, c, j);
}

std::vector<tensor_ref> mlp::tensors() {
  std::vector<tensor_ref> out;
  auto add = [&](std::string name, std::vector<int64_t> shape, std::vector<float>& v) {
    tensor_ref t;
    t.name = std::move(name);
    t.type = dtype::f32;
    t.shape = std::move(shape);
    t.data = v.data();
    out.push_back(std::move(t));
  };
  const int layers = num_layers();
  for (int l = 0; l < layers; ++l) {
    const std::string p = "layers." + std::to_string(l);
    add(p + ".weight", {dims_[l + 1], dims_[l]}, w_[l]);
    add(p + ".bias", {dims_[l + 1]}, b_[l]);
  }
  if (optimizer_sharded()) {
    tensor_ref m;
    m.name = "optimizer.momentum";
    m.type = dtype::f32;
    m.shape = {static_cast<int64_t>(momentum_.size())};
    m.data = momentum_.data();
    m.global_shape = {static_cast<int64_t>(grad_.size())};
    m.offsets = {static_cast<int64_t>(shard_begin_)};
    out.push_back(std::move(m));
    return out;
  }
  for (int l = 0; l < layers; ++l) {
    const std::string p = "optimizer.momentum.layers." + std::to_string(l);
    add(p + ".weight", {dims_[l + 1], dims_[l]}, vw_[l]);
    add(p + ".bias", {dims_[l + 1]}, vb_[l]);
  }
  return out;
}

void mlp::make_batch(uint64_t step, int rank, int world, std::vector<float>& x, std::vector<int>& labels) const {
  auto st = validate(cfg_, world);
  if (!st) throw std::invalid_argument(st.err().message);
  if (rank < 0 || rank >= world)
    throw std::invalid_argument("mlp: rank " + std::to_string(rank) + " out of range for world " +
                                std::to_string(world));
  const int local = cfg_.global_batch / world;
  const size_t d = static_cast<size_t>(cfg_.input_dim);
  x.resize(static_cast<size_t>(local) * d);
  labels.resize(static_cast<size_t>(local));
  const uint64_t first =
      step * static_cast<uint64_t>(cfg_.global_batch) + static_cast<uint64_t>(rank) * static_cast<uint64_t>(local);
  for (int i = 0; i < local; ++i)
    labels[i] = sample_into(cfg_, teacher_.data(), first + static_cast<uint64_t>(i), x.data() + i * d);
}

void mlp::ensure_scratch(int local_batch) {
  if (scratch_batch_ == local_batch) return;
  scratch_batch_ = local_batch;
  const size_t B = static_cast<size_t>(local_batch);
  act_.resize(w_.size());
  size_t widest = 0;
  for (size_t l = 0; l < w_.size(); ++l) {
    act_[l].assign(B * static_cast<size_t>(dims_[l + 1]), 0.0f);
    widest = std::max(widest, static_cast<size_t>(dims_[l + 1]));
  }
  delta_.assign(B * widest, 0.0f);
  delta_prev_.assign(B * widest, 0.0f);
}

float mlp::compute_gradients(uint64_t step, int rank, int world) {
  make_batch(step, rank, world, x_, labels_);
  const int B = cfg_.global_batch / world;
  ensure_scratch(B);
  const int L = num_layers();

  // Forward: act_l = f(act_{l-1} W_l^T + b_l), f = ReLU except on the logits.
  for (int l = 0; l < L; ++l) {
    const int in = dims_[l], out = dims_[l + 1];
    const float* a = l == 0 ? x_.data() : act_[l - 1].data();
    float* z = act_[l].data();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, out, in, 1.0f, a, in, w_[l].data(), in, 0.0f, z, out);
    for (int i = 0; i < B; ++i) {
      float* row = z + static_cast<size_t>(i) * out;
      kernels::bias_add_row(row, b_[l].data(), out);
      if (l + 1 < L)
        for (int k = 0; k < out; ++k) row[k] = kernels::relu(row[k]);
    }
  }

  // Loss and d(loss)/d(logits), scaled by 1/global_batch so that the sum of
  // the workers' gradients is the global mean.
  const float scale = 1.0f / static_cast<float>(cfg_.global_batch);
  const int C = cfg_.classes;
  float loss_sum = 0.0f;
  for (int i = 0; i < B; ++i) {
    const float* logits = act_[L - 1].data() + static_cast<size_t>(i) * C;
    loss_sum += kernels::softmax_xent_row(logits, labels_[i], C, delta_.data() + static_cast<size_t>(i) * C, scale);
  }

  // Backward.
  for (int l = L - 1; l >= 0; --l) {
    const int in = dims_[l], out = dims_[l + 1];
    const float* a = l == 0 ? x_.data() : act_[l - 1].data();
    float* gw = grad_.data() + grad_w_off_[l];
    float* gb = grad_.data() + grad_b_off_[l];
    // dW_l = delta^T a   [out, in]
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, B, 1.0f, delta_.data(), out, a, in, 0.0f, gw, in);
    // db_l = column sums of delta, in row order.
    for (int k = 0; k < out; ++k) gb[k] = 0.0f;
    for (int i = 0; i < B; ++i) {
      const float* d = delta_.data() + static_cast<size_t>(i) * out;
      for (int k = 0; k < out; ++k) gb[k] += d[k];
    }
    if (l == 0) break;
    // delta_{l-1} = (delta W_l) * relu'(act_{l-1})   [B, in]
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B, in, out, 1.0f, delta_.data(), out, w_[l].data(), in, 0.0f,
                delta_prev_.data(), in);
    const size_t n = static_cast<size_t>(B) * in;
    for (size_t e = 0; e < n; ++e) delta_prev_[e] = kernels::relu_backward(delta_prev_[e], a[e]);
    delta_.swap(delta_prev_);
  }
  return loss_sum * scale;
}

template <class F>
void mlp::for_each_parameter(F&& f) {
  for (int l = 0; l < num_layers(); ++l) {
    f(w_[l], grad_w_off_[l]);
    f(b_[l], grad_b_off_[l]);
  }
}

void mlp::shard_optimizer(uint32_t rank, uint32_t world) {
  auto [begin, count] = even_split(static_cast<int64_t>(grad_.size()), rank, world);
  shard_world_ = world;
  shard_begin_ = static_cast<size_t>(begin);
  momentum_.assign(static_cast<size_t>(count), 0.0f);
  vw_.clear();
  vb_.clear();
}

void mlp::apply_gradients() {
  const float lr = cfg_.lr, mu = cfg_.momentum, wd = cfg_.weight_decay;
  if (optimizer_sharded()) {
    // This rank's share, element by element as below (the same kernel and
    // order, so every element's update is bit-identical to an unsharded run's).
    const size_t lo = shard_begin_, hi = shard_begin_ + momentum_.size();
    for_each_parameter([&](std::vector<float>& p, size_t off) {
      const size_t b = std::max(lo, off), e = std::min(hi, off + p.size());
      for (size_t i = b; i < e; ++i) kernels::sgd_momentum(p[i - off], momentum_[i - lo], grad_[i], lr, mu, wd);
    });
    std::fill(grad_.begin(), grad_.end(), 0.0f);
    for_each_parameter([&](std::vector<float>& p, size_t off) {
      const size_t b = std::max(lo, off), e = std::min(hi, off + p.size());
      for (size_t i = b; i < e; ++i) grad_[i] = p[i - off];
    });
    return;
  }
  for (int l = 0; l < num_layers(); ++l) {
    const float* gw = grad_.data() + grad_w_off_[l];
    const float* gb = grad_.data() + grad_b_off_[l];
    float* w = w_[l].data();
    float* v = vw_[l].data();
    for (size_t e = 0, n = w_[l].size(); e < n; ++e) kernels::sgd_momentum(w[e], v[e], gw[e], lr, mu, wd);
    float* b = b_[l].data();
    float* vb = vb_[l].data();
    for (size_t e = 0, n = b_[l].size(); e < n; ++e) kernels::sgd_momentum(b[e], vb[e], gb[e], lr, mu, wd);
  }
}

void mlp::take_parameters() {
  for_each_parameter([&](std::vector<float>& p, size_t off) { std::copy_n(grad_.begin() + off, p.size(), p.begin()); });
}

void mlp::stage_momentum() {
  std::fill(grad_.begin(), grad_.end(), 0.0f);
  std::copy(momentum_.begin(), momentum_.end(), grad_.begin() + shard_begin_);
}

uint64_t mlp::parameter_count() const noexcept { return grad_.size(); }

size_t mlp::state_bytes() const noexcept {
  return (grad_.size() + (optimizer_sharded() ? momentum_.size() : grad_.size())) * sizeof(float);
}

uint64_t mlp::weights_checksum() const {
  uint64_t h = fnv_offset;
  for (int l = 0; l < num_layers(); ++l) {
    h = fnv1a(h, w_[l].data(), w_[l].size() * sizeof(float));
    h = fnv1a(h, b_[l].data(), b_[l].size() * sizeof(float));
  }
  if (optimizer_sharded()) return fnv1a(h, grad_.data(), grad_.size() * sizeof(float));
  for (int l = 0; l < num_layers(); ++l) {
    h = fnv1a(h, vw_[l].data(), vw_[l].size() * sizeof(float));
    h = fnv1a(h, vb_[l].data(), vb_[l].size() * sizeof(float));
  }
  return h;
}

}  // namespace grace
