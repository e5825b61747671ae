// libFuzzer: a checkpoint's grace-manifest.json (runtime/checkpoint/manifest.hpp).
#include "runtime/checkpoint/manifest.hpp"

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto j = nlohmann::json::parse(data, data + size, nullptr, false);
  if (j.is_discarded()) return 0;
  auto m = grace::manifest_from_json("fuzz/grace-manifest.json", j);
  (void)m;
  return 0;
}
