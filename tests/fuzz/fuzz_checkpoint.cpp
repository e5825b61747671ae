// libFuzzer: restoring a crafted checkpoint directory. The input is the
// step directory's three files, split by a line "@@@@": grace-manifest.json,
// the shard model-00001-of-00001.safetensors, model.safetensors.index.json.
// Checksums are not checked (xxh3 is no MAC: an attacker can make them
// match), so the fuzzer reaches every parser and the reads behind them.
// Nothing outside the fuzzer's own temporary directory may be touched.
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/base/mutants.hpp"

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

namespace fs = std::filesystem;

namespace {

const fs::path& root() {
  static const fs::path r = [] {
    auto p = fs::temp_directory_path() / ("grace-fuzz-ckpt-" + std::to_string(::getpid()));
    fs::create_directories(p);
    return p;
  }();
  return r;
}

std::vector<std::string> split(const std::string& s, const std::string& sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t at; (at = s.find(sep, start)) != std::string::npos && parts.size() < 2; start = at + sep.size())
    parts.push_back(s.substr(start, at - start));
  parts.push_back(s.substr(start));
  return parts;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);
  auto parts = split(in, "\n@@@@\n");
  const auto dir = root() / "ck";
  std::error_code ec;
  fs::remove_all(dir, ec);
  const auto step = dir / "step-0000000001";
  fs::create_directories(step);
  const char* names[] = {"grace-manifest.json", "model-00001-of-00001.safetensors", "model.safetensors.index.json"};
  for (size_t i = 0; i < parts.size(); ++i) std::ofstream(step / names[i], std::ios::binary) << parts[i];

  grace::checkpoint_store store(dir);
#if GRACE_MUTANTS
  // Past the checksums, so that fuzzed bytes reach the parsers behind them.
  grace::mutants::active().restore_without_checksums = true;
#endif
  (void)store.list();
  (void)store.read_manifest(step);
  auto stored = store.read_tensors(step);
  if (!stored) return 0;
  // Restore into tensors shaped as the checkpoint says (bounded: 16 MiB).
  std::vector<std::vector<unsigned char>> buffers;
  std::vector<grace::tensor_ref> into;
  uint64_t total = 0;
  for (auto& t : *stored) {
    grace::tensor_ref r;
    r.name = t.name;
    r.type = t.type;
    r.shape = t.shape;
    uint64_t numel = 1;
    for (auto d : t.shape) {
      if (d < 0 || (d > 0 && numel > (16u << 20) / static_cast<uint64_t>(d))) return 0;
      numel *= static_cast<uint64_t>(d);
    }
    // The buffer the shape asks for: a checkpoint whose byte count disagrees
    // must be refused, not read past it.
    total += numel * grace::dtype_size(t.type);
    if (total > (16u << 20)) return 0;
    buffers.emplace_back(numel * grace::dtype_size(t.type));
    r.data = buffers.back().data();
    into.push_back(r);
  }
  (void)store.restore_latest(into);
  return 0;
}
