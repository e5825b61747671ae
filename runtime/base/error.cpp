#include "runtime/base/error.hpp"

namespace grace {

const char* to_string(errc e) noexcept {
  switch (e) {
    case errc::ok: return "ok";
    case errc::failed: return "failed";
    case errc::overloaded: return "overloaded";
    case errc::disconnected: return "disconnected";
    case errc::preempted: return "preempted";
    case errc::invalid_input: return "invalid_input";
  }
  return "unknown";
}

}  // namespace grace
