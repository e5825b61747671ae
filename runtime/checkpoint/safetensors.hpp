#pragma once
/// The safetensors file format: an 8-byte little-endian header length N, N
/// bytes of JSON describing every tensor (dtype, shape, byte range relative to
/// the data section) plus optional string metadata, then the raw bytes.
///
/// Writing is split in two so the checkpoint writer can stream tensor bytes
/// straight from snapshot buffers (no staging copy): `encode_header` lays out
/// the offsets and produces the header bytes; the caller then writes each
/// tensor's bytes, in order, right after it.
///
/// Reading is defensive because a checkpoint may be truncated, corrupted or
/// written by someone else: every malformed input becomes
/// `errc::invalid_input` naming the file and what is wrong, never a crash or
/// an allocation larger than the file itself.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "runtime/base/error.hpp"
#include "runtime/base/tensor.hpp"

namespace grace::safetensors {

/// Headers larger than this are rejected (same limit as the reference
/// implementation), so a corrupt length can never make us allocate much.
constexpr uint64_t max_header_bytes = 100ull * 1024 * 1024;

/// What the writer knows about a tensor before its bytes are written.
struct tensor_desc {
  std::string name;
  dtype type = dtype::f32;
  std::vector<int64_t> shape;
  uint64_t bytes = 0;
};

/// One tensor as described by a header. Offsets are relative to the start of
/// the data section (`header::data_start` in the file).
struct tensor_entry {
  std::string name;
  dtype type = dtype::f32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
  uint64_t bytes() const noexcept { return end - begin; }
};

/// A parsed, validated header.
struct header {
  std::vector<tensor_entry> tensors;  ///< in file order (ascending offsets)
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  ///< absolute file offset of the data section
  uint64_t file_size = 0;
};

/// An encoded header ready to be written, and where each tensor goes.
struct encoded_header {
  std::string bytes;                  ///< 8-byte length + space-padded JSON
  std::vector<tensor_entry> tensors;  ///< same order as the input descs
  uint64_t file_size = 0;             ///< header + all data
};

/// Lays tensors out back to back in the given order and encodes the header,
/// padded with spaces so the data section starts 8-byte aligned (as the
/// reference implementation does). Fails on duplicate names or a byte count
/// that does not match dtype and shape.
result<encoded_header> encode_header(const std::vector<tensor_desc>& tensors,
                                     const std::map<std::string, std::string>& metadata);

/// Validates a header. `label` names the file in error messages; `json_bytes`
/// is the N header bytes after the 8-byte length; `file_size` is the size of
/// the whole file, used to check every range lies inside it.
result<header> parse_header(const std::string& label, const char* json_bytes, size_t n, uint64_t file_size);

/// Opens a file and reads and validates its header (not the tensor bytes).
result<header> read_header(const std::filesystem::path& file);

/// Reads one tensor's bytes directly into `dst` (which holds entry.bytes()).
status read_tensor(const std::filesystem::path& file, const header& h, const tensor_entry& entry, void* dst);

/// Writes a whole safetensors file in one go (tools and tests; the checkpoint
/// writer streams instead). `data[i]` holds `tensors[i].bytes` bytes.
status write_file(const std::filesystem::path& file, const std::vector<tensor_desc>& tensors,
                  const std::vector<const void*>& data, const std::map<std::string, std::string>& metadata = {});

}  // namespace grace::safetensors
