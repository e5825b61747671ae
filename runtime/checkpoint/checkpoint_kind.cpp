#include "runtime/checkpoint/checkpoint_kind.hpp"

namespace grace {

const char* to_string(checkpoint_kind k) noexcept {
  switch (k) {
    case checkpoint_kind::periodic: return "periodic";
    case checkpoint_kind::initial: return "initial";
    case checkpoint_kind::final: return "final";
    case checkpoint_kind::jit: return "jit";
    case checkpoint_kind::end: return "end";
    case checkpoint_kind::manual: return "manual";
  }
  return "unknown";
}

bool parse_checkpoint_kind(const std::string& s, checkpoint_kind& out) noexcept {
  for (auto k : {checkpoint_kind::periodic, checkpoint_kind::initial, checkpoint_kind::final, checkpoint_kind::jit,
                 checkpoint_kind::end, checkpoint_kind::manual})
    if (s == to_string(k)) {
      out = k;
      return true;
    }
  if (s == "preempt") {
    out = checkpoint_kind::initial;
    return true;
  }
  return false;
}

}  // namespace grace
