#pragma once
/// A deterministic MLP classifier on a synthetic, stateless task: the CPU
/// compute backend that Grace trains, checkpoints and restores.
///
/// The data need no saved state: sample `i` is generated from (seed, i), so
/// a restarted worker resumes at any step by index alone. Step `s` uses the
/// global samples `s*global_batch .. (s+1)*global_batch - 1`; worker `rank`
/// of `world` takes the contiguous slice of `global_batch/world` of them.
///
/// Determinism contract: the same config and the same sequence of
/// (allreduced) gradients give bit-identical parameters and momentum. Matrix
/// products go through single-threaded OpenBLAS; the rest through
/// runtime/train/kernels.hpp in a fixed order.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/base/error.hpp"
#include "runtime/base/tensor.hpp"

namespace grace {

struct mlp_config {
  int input_dim = 32;
  std::vector<int> hidden = {64};
  int classes = 10;
  int global_batch = 64;
  float lr = 0.05f;
  float momentum = 0.9f;
  float weight_decay = 0;
  uint64_t seed = 1;
};

/// Checks the config (positive sizes, classes >= 2) and, when `world` > 0,
/// that `global_batch` splits evenly over `world` workers.
status validate(const mlp_config& cfg, int world = 0);

/// Features and label of global sample `index`: x has `cfg.input_dim`
/// entries. The label is the argmax of a fixed random linear teacher applied
/// to x, so the task is learnable.
int make_sample(const mlp_config& cfg, uint64_t index, float* x);

/// FNV-1a 64 over bytes, continuing from `h` (start with fnv_offset): the
/// weights checksum shared by the CPU and CUDA models, so both agree.
uint64_t fnv1a(uint64_t h, const void* data, size_t n);
constexpr uint64_t fnv_offset = 0xcbf29ce484222325ull;

/// Many fields for a reason: the reference model's parameters, gradients,
/// optimizer state (whole or this rank's shard) and the step's scratch
/// (inputs, activations, deltas), kept to avoid allocating in a step.
class mlp {
public:
  /// Throws std::invalid_argument on a config `validate` rejects; use
  /// `create` for an error value instead.
  explicit mlp(mlp_config cfg);
  static result<std::unique_ptr<mlp>> create(const mlp_config& cfg);

  mlp(const mlp&) = delete;
  mlp& operator=(const mlp&) = delete;

  const mlp_config& config() const noexcept { return cfg_; }
  int num_layers() const noexcept { return static_cast<int>(w_.size()); }

  /// Parameters, then optimizer state, with stable names:
  /// `layers.<l>.weight` [out, in], `layers.<l>.bias` [out], then
  /// `optimizer.momentum.layers.<l>.weight` / `.bias`. The pointers stay
  /// valid for the life of this object (buffers are never reallocated).
  std::vector<tensor_ref> tensors();

  /// Forward/backward on this worker's slice of step `step`'s batch. Leaves
  /// in the gradient buffer the sum over local samples of d(loss)/d(param)
  /// divided by the GLOBAL batch, so an allreduce(sum) of the buffer gives
  /// the global mean gradient. Returns the local summed loss / global_batch
  /// (allreduced, the global mean loss). Parameters are not touched.
  /// Throws std::invalid_argument if `global_batch % world != 0` or
  /// `rank` is out of range (check with `validate(cfg, world)` first).
  float compute_gradients(uint64_t step, int rank, int world);

  /// One contiguous buffer, laid out as the parameters in `tensors()` order
  /// (W_0, b_0, W_1, b_1, ...): allreduce it in place between
  /// compute_gradients and apply_gradients.
  float* grad_data() noexcept { return grad_.data(); }
  size_t grad_size() const noexcept { return grad_.size(); }

  /// SGD-momentum update of every parameter from the gradient buffer; with
  /// a sharded optimizer, of this rank's share only (see shard_optimizer).
  void apply_gradients();

  /// ZeRO-1 (grace-train --shard-optimizer): this rank keeps and updates
  /// only its share of the optimizer state, the flat range
  /// `even_split(parameter_count(), rank, world)` of the grad_data() layout.
  /// tensors() then lists the parameters (replicated) and one momentum
  /// slice, `optimizer.momentum` [parameter_count()] at that range. Call
  /// before tensors(); world 1 keeps the whole state as one slice.
  void shard_optimizer(uint32_t rank, uint32_t world);
  bool optimizer_sharded() const noexcept { return shard_world_ > 0; }
  /// Sharded: after apply_gradients, grad_data() holds this rank's updated
  /// parameters in its range and zeros elsewhere. Allreduce(sum) it - each
  /// element has one non-zero term, so the sum is exact - then
  /// take_parameters() installs every rank's share (the all-gather).
  void take_parameters();
  /// Sharded: grad_data() gets this rank's momentum in its range and zeros
  /// elsewhere; after an allreduce(sum), weights_checksum() covers the
  /// whole optimizer state.
  void stage_momentum();

  /// This worker's inputs and labels for `step` (what compute_gradients
  /// trains on): x is [global_batch/world, input_dim] row-major.
  void make_batch(uint64_t step, int rank, int world, std::vector<float>& x, std::vector<int>& labels) const;

  /// Number of parameters (floats), momentum excluded.
  uint64_t parameter_count() const noexcept;
  /// Bytes of checkpointed state: parameters plus momentum.
  size_t state_bytes() const noexcept;
  /// FNV-1a 64 over the bytes of every tensor in `tensors()` order
  /// (parameters and momentum), for quick equality checks. Sharded: over
  /// the parameters and the momentum gathered in grad_data() (stage_momentum).
  uint64_t weights_checksum() const;

private:
  void ensure_scratch(int local_batch);
  /// Calls f(parameter vector, its flat offset) for every parameter tensor
  /// in grad_data() order.
  template <class F>
  void for_each_parameter(F&& f);

  mlp_config cfg_;
  std::vector<int> dims_;                  ///< input_dim, hidden..., classes
  std::vector<std::vector<float>> w_, b_;  ///< per layer
  std::vector<std::vector<float>> vw_, vb_;
  std::vector<float> grad_;
  std::vector<size_t> grad_w_off_, grad_b_off_;
  std::vector<float> teacher_;  ///< [classes, input_dim], derived from seed
  uint32_t shard_world_ = 0;     ///< 0: optimizer state not sharded
  size_t shard_begin_ = 0;       ///< this rank's flat range of the optimizer state
  std::vector<float> momentum_;  ///< sharded: this rank's momentum, [shard count]
  // Scratch, sized for the local batch on first use and then reused.
  int scratch_batch_ = 0;
  std::vector<float> x_;
  std::vector<int> labels_;
  std::vector<std::vector<float>> act_;  ///< output of each layer, [B, out]
  std::vector<float> delta_, delta_prev_;
};

}  // namespace grace
