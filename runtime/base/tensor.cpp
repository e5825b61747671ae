#include "runtime/base/tensor.hpp"

#include <algorithm>
#include <cstring>

namespace grace {

namespace {
struct dtype_info {
  dtype t;
  const char* name;
  size_t size;
};
constexpr dtype_info table[] = {
    {dtype::f32, "F32", 4},      {dtype::f64, "F64", 8}, {dtype::f16, "F16", 2}, {dtype::bf16, "BF16", 2},
    {dtype::i8, "I8", 1},        {dtype::i16, "I16", 2}, {dtype::i32, "I32", 4}, {dtype::i64, "I64", 8},
    {dtype::u8, "U8", 1},        {dtype::u16, "U16", 2}, {dtype::u32, "U32", 4}, {dtype::u64, "U64", 8},
    {dtype::boolean, "BOOL", 1},
};
}  // namespace

const char* dtype_name(dtype t) noexcept {
  for (auto& i : table)
    if (i.t == t) return i.name;
  return "?";
}

size_t dtype_size(dtype t) noexcept {
  for (auto& i : table)
    if (i.t == t) return i.size;
  return 0;
}

bool parse_dtype(const std::string& name, dtype& out) noexcept {
  for (auto& i : table)
    if (name == i.name) {
      out = i.t;
      return true;
    }
  return false;
}

std::string shape_str(const std::vector<int64_t>& shape, const char* sep) {
  std::string r = "[";
  for (size_t i = 0; i < shape.size(); ++i) r += (i ? sep : "") + std::to_string(shape[i]);
  return r + "]";
}

std::string slice_problem(const tensor_ref& t) {
  if (!t.sharded()) return t.offsets.empty() ? "" : "offsets given without a global shape";
  const std::string who = "sharded tensor '" + t.name + "': ";
  if (t.shape.empty()) return who + "a slice needs at least one dimension";
  if (t.global_shape.size() != t.shape.size() || t.offsets.size() != t.shape.size())
    return who + "slice " + shape_str(t.shape) + " at " + shape_str(t.offsets) + " and global shape " +
           shape_str(t.global_shape) + " differ in their number of dimensions";
  for (size_t d = 0; d < t.shape.size(); ++d)
    if (t.offsets[d] < 0 || t.shape[d] < 0 || t.offsets[d] + t.shape[d] > t.global_shape[d])
      return who + "slice " + shape_str(t.shape) + " at " + shape_str(t.offsets) + " lies outside the global shape " +
             shape_str(t.global_shape) + " (dimension " + std::to_string(d) + ")";
  return "";
}

std::pair<int64_t, int64_t> even_split(int64_t rows, uint32_t rank, uint32_t world) noexcept {
  if (world == 0) return {0, rows};
  const int64_t base = rows / world, extra = rows % world;
  const int64_t r = rank;
  return {r * base + std::min(r, extra), base + (r < extra ? 1 : 0)};
}

namespace {
/// Row-major strides (in elements) of a box.
std::vector<uint64_t> strides_of(const std::vector<int64_t>& shape) {
  std::vector<uint64_t> st(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) st[d - 1] = st[d] * static_cast<uint64_t>(shape[d]);
  return st;
}
}  // namespace

uint64_t copy_overlap(const void* src, const std::vector<int64_t>& src_off, const std::vector<int64_t>& src_shape,
                      void* dst, const std::vector<int64_t>& dst_off, const std::vector<int64_t>& dst_shape,
                      size_t elem) {
  const size_t n = src_shape.size();
  if (n == 0 || dst_shape.size() != n || src_off.size() != n || dst_off.size() != n) return 0;
  std::vector<int64_t> lo(n), ext(n);
  uint64_t total = 1;
  for (size_t d = 0; d < n; ++d) {
    lo[d] = std::max(src_off[d], dst_off[d]);
    const int64_t hi = std::min(src_off[d] + src_shape[d], dst_off[d] + dst_shape[d]);
    if (hi <= lo[d]) return 0;
    ext[d] = hi - lo[d];
    total *= static_cast<uint64_t>(ext[d]);
  }
  const auto ss = strides_of(src_shape), ds = strides_of(dst_shape);
  const size_t run = static_cast<size_t>(ext[n - 1]) * elem;
  std::vector<int64_t> idx(n, 0);  // position within the overlap, last dimension fixed at 0
  for (;;) {
    uint64_t so = 0, dof = 0;
    for (size_t d = 0; d < n; ++d) {
      so += static_cast<uint64_t>(lo[d] + idx[d] - src_off[d]) * ss[d];
      dof += static_cast<uint64_t>(lo[d] + idx[d] - dst_off[d]) * ds[d];
    }
    std::memcpy(static_cast<char*>(dst) + dof * elem, static_cast<const char*>(src) + so * elem, run);
    size_t d = n - 1;
    for (;;) {
      if (d == 0) return total;
      --d;
      if (++idx[d] < ext[d]) break;
      idx[d] = 0;
    }
  }
}

}  // namespace grace
