#pragma once
/// Is there an NVIDIA driver on this node? Asked before any CUDA call (the
/// CUDA runtime costs ~100 ms to initialise, and the CPU binary has none).
///
/// GRACE_CUDA_PROBE lets tests check the device logic without a GPU:
///   none          no driver (the CPU path, even on a GPU node)
///   driver-error  a driver whose device query fails
///   devices:N     a driver with N devices (CUDA calls themselves still
///                 go to the real runtime, so without a GPU they fail)
/// Unset: the real probe.

#include <optional>
#include <string>

namespace grace {

struct cuda_probe_override {
  enum class mode { none, driver_error, devices } what = mode::none;
  int devices = 0;
  std::string text;   ///< the variable's value, for messages
  bool valid = true;  ///< false: the value matches none of the forms above
};

/// GRACE_CUDA_PROBE parsed; nullopt when unset or empty.
std::optional<cuda_probe_override> cuda_probe_from_env();

/// True when an NVIDIA kernel driver is present (or GRACE_CUDA_PROBE says
/// so); otherwise false and `why` names what is missing.
bool nvidia_driver_present(std::string* why = nullptr);

}  // namespace grace
