#pragma once
/// Why a checkpoint was taken: one vocabulary for the agreement, the worker,
/// the checkpoint store's manifest, events and tools. The wire conversion
/// lives in messages/convert.hpp.

#include <cstdint>
#include <string>

namespace grace {

enum class checkpoint_kind : uint8_t {
  periodic,  ///< a backup every N steps or seconds
  initial,   ///< the save agreed after a notice (with a grace period, the first of two)
  final,     ///< a grace period's last save, before the deadline
  jit,       ///< just in time, by the most advanced survivor after a member was lost
  end,       ///< the end of training (session::finish)
  manual,    ///< written by a tool or a test
};

/// "periodic", "initial", "final", "jit", "end", "manual": the manifest's
/// `kind` and the events' `kind`.
const char* to_string(checkpoint_kind k) noexcept;
/// Also reads "preempt" (manifests written before the kinds were one
/// vocabulary: a save after a notice, now `initial`).
bool parse_checkpoint_kind(const std::string& s, checkpoint_kind& out) noexcept;

}  // namespace grace
