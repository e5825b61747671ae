// A trainer outside Grace's tree, built against the installed library
// (find_package(Grace) -> Grace::grace). Every worker applies the same
// deterministic update to a replicated weight vector (no collective, so the
// example needs nothing but Grace); Grace handles notices, agreement,
// checkpoints and restarts.
//
//   embed-train STEPS [STEP_DELAY_MS]
// Prints "finished STEPS steps; checksum HEX" from the chief at the end.
#include "actors/session.hpp"

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

uint64_t fnv1a(const void* data, size_t n) {
  uint64_t h = 1469598103934665603ull;
  auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

void step(std::vector<float>& w, uint64_t k, int delay_ms) {
  for (size_t i = 0; i < w.size(); ++i) w[i] = w[i] * 0.999f + 0.001f * float((k * 31 + i) % 97);
  std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strtoull(argv[1], nullptr, 10) == 0) {
    std::fprintf(stderr, "usage: %s STEPS [STEP_DELAY_MS]\n", argv[0]);
    return 2;
  }
  const uint64_t steps = std::strtoull(argv[1], nullptr, 10);
  const int delay_ms = argc > 2 ? std::atoi(argv[2]) : 5;
  grace::options opts;
  if (const char* d = std::getenv("GRACE_CHECKPOINT_DIR")) opts.checkpoint_dir = d;
  opts.save_every_steps = 50;
  grace::session g(opts);  // first: blocks SIGTERM/SIGINT for the threads Grace starts
  std::vector<float> w(4096);
  for (size_t i = 0; i < w.size(); ++i) w[i] = float(i) / float(w.size());
  g.register_tensor({"w", grace::dtype::f32, {int64_t(w.size())}, w.data()});
  auto start = g.attach();
  if (!start) {
    std::fprintf(stderr, "embed-train: %s\n", start.err().message.c_str());
    return 2;
  }
  for (uint64_t s = *start + 1; s <= steps; ++s)
    if (g.run([&](uint64_t k) { step(w, k, delay_ms); }) == grace::step_result::stop) return g.exit_code();
  if (auto st = g.finish(); !st) {
    std::fprintf(stderr, "embed-train: %s\n", st.err().message.c_str());
    return 3;
  }
  if (g.is_chief())
    std::printf("finished %" PRIu64 " steps; checksum %016" PRIx64 "\n", steps, fnv1a(w.data(), w.size() * 4));
  return 0;
}
