// libFuzzer: a safetensors file's header (runtime/checkpoint/safetensors.hpp), the
// input being the whole file: 8-byte little-endian length, JSON, data.
#include "runtime/checkpoint/safetensors.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 8) return 0;
  uint64_t n = 0;
  std::memcpy(&n, data, 8);
  if (n > size - 8) return 0;  // read_header refuses a length past the file first
  auto h = grace::safetensors::parse_header("fuzz.safetensors", reinterpret_cast<const char*>(data + 8),
                                            static_cast<size_t>(n), size);
  (void)h;
  return 0;
}
