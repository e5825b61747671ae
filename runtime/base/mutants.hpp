#pragma once
/// The test seam for the failure harness's deliberate bugs: each switch,
/// when on, breaks one guarantee on purpose, to prove that an invariant of
/// grace-chaos can fail (tests/chaos/mutants.sh, docs/RELIABILITY.md).
///
/// Compiled in only when the build defines GRACE_MUTANTS=1 (CMake
/// -DGRACE_MUTANTS=ON, the default of a build with tests). Otherwise
/// `active()` is a constant with every switch off, the code behind each
/// switch folds away, and grace-train has no --broken-* flags. Nothing in
/// the public API (actors/session.hpp, checkpoint_store) names a switch.

namespace grace::mutants {

struct switches {
  // The runtime's own
  bool restore_without_checksums = false;  ///< a damaged checkpoint is restored (no_corrupt_restore)
  bool keep_stale_temporaries = false;     ///< leftover .tmp-* directories are never removed (no_temp_left)
  bool no_just_in_time_save = false;       ///< a lost peer stops everyone without a save (work_lost)
  // grace-train's
  bool skip_optimizer_restore = false;  ///< optimizer state zeroed after a restore (bit_identical)
  bool repeat_step = false;             ///< the first step after a restore runs twice (exactly_once)
  bool exit_zero = false;               ///< ranks > 0 exit 0 instead of the restart code (exit_codes)
};

#if GRACE_MUTANTS
constexpr bool compiled_in = true;
/// The process's switches: set once at start (grace-train's --broken-*
/// flags, a fuzz harness) before any session or store reads them.
switches& active();
#else
constexpr bool compiled_in = false;
constexpr switches active() { return {}; }
#endif

}  // namespace grace::mutants
