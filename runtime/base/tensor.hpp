#pragma once
/// Named tensors registered with Grace: what a checkpoint saves and restores.

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace grace {

/// Element types, named as in safetensors.
enum class dtype : uint8_t { f32, f64, f16, bf16, i8, i16, i32, i64, u8, u16, u32, u64, boolean };

/// The safetensors spelling ("F32", "I64", ...).
const char* dtype_name(dtype t) noexcept;
/// Size of one element in bytes.
size_t dtype_size(dtype t) noexcept;
/// Parses a safetensors dtype name; false when unknown.
bool parse_dtype(const std::string& name, dtype& out) noexcept;
/// A shape for messages: `[2,3]` (`sep` between the dimensions).
std::string shape_str(const std::vector<int64_t>& shape, const char* sep = ",");

/// Where a tensor's bytes live.
enum class memory_kind : uint8_t { host, device };

/// A registered tensor: Grace reads it for a snapshot and writes it on restore.
/// The memory is owned by the caller and must stay valid while registered.
struct tensor_ref {
  std::string name;
  dtype type = dtype::f32;
  std::vector<int64_t> shape;
  void* data = nullptr;
  memory_kind memory = memory_kind::host;
  int device = -1;  ///< CUDA device ordinal for device tensors
  /// Sharded state: this rank's bytes are the slice [offsets, offsets +
  /// shape) of a global tensor of `global_shape` (same number of
  /// dimensions). Empty: a whole tensor every rank holds alike (replicated).
  std::vector<int64_t> global_shape{};
  std::vector<int64_t> offsets{};
  bool sharded() const noexcept { return !global_shape.empty(); }
  size_t numel() const noexcept {
    size_t n = 1;
    for (auto d : shape) n *= static_cast<size_t>(d);
    return n;
  }
  size_t bytes() const noexcept { return numel() * dtype_size(type); }
};

/// Checks a sharded tensor's slice: as many offsets as dimensions, the
/// slice inside the global shape, at least one dimension. A replicated
/// tensor passes (with no offsets).
std::string slice_problem(const tensor_ref& t);

/// The rows of `rows` that rank `rank` of `world` holds when a first
/// dimension is split as evenly as possible (the first `rows % world`
/// ranks get one more): {begin, count}.
std::pair<int64_t, int64_t> even_split(int64_t rows, uint32_t rank, uint32_t world) noexcept;

/// Copies the overlap of two slices of one global tensor (row-major, all
/// dimensions the same count): `src` holds the box [src_off, src_off +
/// src_shape), `dst` the box [dst_off, dst_off + dst_shape). Returns the
/// elements copied (0 when the boxes do not meet).
uint64_t copy_overlap(const void* src, const std::vector<int64_t>& src_off, const std::vector<int64_t>& src_shape,
                      void* dst, const std::vector<int64_t>& dst_off, const std::vector<int64_t>& dst_shape,
                      size_t elem_size);

}  // namespace grace
