#pragma once
/// The CUDA compute backend: the same model, data, layout and update as
/// grace::mlp (runtime/train/mlp.hpp), with parameters, optimizer state and
/// gradients in device memory.
///
/// - Matrix products through cuBLAS; everything element-wise through the
///   `GRACE_HD` functions of runtime/train/kernels.hpp, the very formulas the CPU
///   tests check. Data are generated on the device from (seed, sample index)
///   with the kernels.hpp RNG, so a restarted worker resumes at any step.
/// - Initial state is copied from a host grace::mlp built from the same
///   config: both backends start bit-identical, and a checkpoint written by
///   either loads into the other (same tensor names, shapes, dtypes).
/// - Not bit-identical to the CPU backend step by step (cuBLAS summation
///   order, device expf/logf); close to ~1e-5 relative over tens of steps.
///   Bit-identical run to run on the same GPU model and library versions.
///
/// One CUDA stream and one cuBLAS handle per instance, on the device given
/// at construction (`pick_device(local_rank)`). Every public call returns
/// with the stream idle, so the gradient buffer may be handed to a
/// collective on another stream and `tensors()` read by a snapshot copy on a
/// side stream without further synchronisation.
///
/// Plain C++ header (pimpl): no CUDA header is included.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/base/error.hpp"
#include "runtime/train/mlp.hpp"
#include "runtime/base/tensor.hpp"

namespace grace {

/// A CUDA or cuBLAS call failed (out of memory, a sticky device error, a
/// lost device). Thrown by mlp_cuda's step functions; the trainer turns it
/// into errc::failed at its boundary (`create` already returns a value).
class cuda_error : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

class mlp_cuda {
public:
  /// Validates `cfg` (errc::invalid_input), selects `device` and allocates;
  /// CUDA failures -> errc::failed with the CUDA error name.
  static result<std::unique_ptr<mlp_cuda>> create(const mlp_config& cfg, int device);

  /// Throws std::invalid_argument on a bad config, cuda_error on a CUDA
  /// failure; prefer `create`.
  mlp_cuda(mlp_config cfg, int device);
  ~mlp_cuda();
  mlp_cuda(const mlp_cuda&) = delete;
  mlp_cuda& operator=(const mlp_cuda&) = delete;

  const mlp_config& config() const noexcept;
  int num_layers() const noexcept;
  int device() const noexcept;

  /// As grace::mlp::tensors(), with `memory = memory_kind::device` and
  /// `device` set; the pointers are device pointers, valid for the life of
  /// this object.
  std::vector<tensor_ref> tensors();

  /// As grace::mlp::compute_gradients, on the device. Returns the local
  /// summed loss / global_batch. Throws std::invalid_argument for a bad
  /// (rank, world), cuda_error on a CUDA failure.
  float compute_gradients(uint64_t step, int rank, int world);

  /// Device pointer to the contiguous gradient buffer (W_0, b_0, W_1, ...):
  /// allreduce it in place (NCCL) between compute_gradients and
  /// apply_gradients.
  float* grad_data() noexcept;
  size_t grad_size() const noexcept;

  /// SGD-momentum update (kernels::sgd_momentum) of every parameter.
  /// Throws cuda_error.
  void apply_gradients();

  uint64_t parameter_count() const noexcept;
  size_t state_bytes() const noexcept;
  /// FNV-1a 64 over every tensor in `tensors()` order, as
  /// grace::mlp::weights_checksum (copies the state to the host).
  uint64_t weights_checksum() const;

  /// Copies the state (parameters, then momentum, `tensors()` order) to the
  /// host, for tests and debugging. Throws cuda_error.
  std::vector<float> download_state() const;

private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace grace
