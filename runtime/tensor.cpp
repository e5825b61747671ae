#include "runtime/tensor.hpp"

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

}  // namespace grace
