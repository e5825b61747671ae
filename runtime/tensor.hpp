#pragma once
/// Named tensors registered with Grace: what a checkpoint saves and restores.

#include <cstddef>
#include <cstdint>
#include <string>
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
  size_t numel() const noexcept {
    size_t n = 1;
    for (auto d : shape) n *= static_cast<size_t>(d);
    return n;
  }
  size_t bytes() const noexcept { return numel() * dtype_size(type); }
};

}  // namespace grace
