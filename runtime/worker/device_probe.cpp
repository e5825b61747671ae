#include "runtime/worker/device_probe.hpp"

#include <sys/stat.h>

#include <cstdlib>

namespace grace {

std::optional<cuda_probe_override> cuda_probe_from_env() {
  const char* v = std::getenv("GRACE_CUDA_PROBE");
  if (!v || !*v) return std::nullopt;
  cuda_probe_override o;
  o.text = v;
  const std::string s = v;
  if (s == "none") {
    o.what = cuda_probe_override::mode::none;
  } else if (s == "driver-error") {
    o.what = cuda_probe_override::mode::driver_error;
  } else if (s.rfind("devices:", 0) == 0 && s.size() > 8 && s.find_first_not_of("0123456789", 8) == std::string::npos &&
             s.size() <= 11) {
    o.what = cuda_probe_override::mode::devices;
    o.devices = std::atoi(s.c_str() + 8);
  } else {
    o.valid = false;
  }
  return o;
}

bool nvidia_driver_present(std::string* why) {
  if (auto o = cuda_probe_from_env()) {
    if (!o->valid) {
      if (why) *why = "GRACE_CUDA_PROBE='" + o->text + "' is not none, driver-error or devices:N";
      return false;
    }
    if (o->what == cuda_probe_override::mode::none) {
      if (why) *why = "no NVIDIA driver (GRACE_CUDA_PROBE=none)";
      return false;
    }
    return true;
  }
  struct stat sb;
  if (::stat("/proc/driver/nvidia/version", &sb) == 0 || ::stat("/dev/nvidiactl", &sb) == 0) return true;
  if (why) *why = "no NVIDIA driver (/proc/driver/nvidia/version and /dev/nvidiactl are absent)";
  return false;
}

}  // namespace grace
