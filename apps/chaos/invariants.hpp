#pragma once
/// The invariants grace-chaos proves after a run, each with a verdict.
///
///   job_finished        the job exited 0 (or with the fatal code 3 when a step error was injected)
///   exactly_once        out.json and every remaining checkpoint count each step exactly once
///   bit_identical       final weights equal an uninterrupted reference run's, bit for bit
///   no_corrupt_restore  every restored checkpoint verified; no damaged one was ever restored
///   no_temp_left        no `.tmp-*` directory left in the checkpoint directory
///   exit_codes          every worker and launcher exit code is explained by an injected fault
///   work_lost           steps re-run after each fault within its bound
///                       (notice 0, kill/freeze 1, damaged checkpoint: the periodic interval, or
///                       after a full disk back to the newest periodic save its window spared)
///   survivors_kept      (--launcher-arg=--recovery --launcher-arg=in-place) every lone SIGKILL (or
///                       freeze for good) of a worker other than rank 0, alone (no other fault
///                       from 2 s before it until its recovery), was recovered in place: replaced, resumed, and
///                       no other process of the group exited in between
///   no_split_brain      (--hosts) a host cut off or frozen past dead-after never commits a
///                       checkpoint in the incarnation it was declared dead in

#include "apps/chaos/runner.hpp"

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

namespace grace::chaos {

enum class verdict_status { pass, fail, skip };
const char* to_string(verdict_status s) noexcept;

struct verdict {
  std::string name;
  verdict_status status = verdict_status::skip;
  std::string detail;
};

/// An elastic job's sizes (--elastic): the reference run that a faulted
/// run must equal changes size where the run did. One phase: `workers`
/// trained from the checkpoint of step `from` (0: the start) to `to`.
struct size_phase {
  int workers = 0;
  int64_t from = 0;
  int64_t to = 0;
  bool operator==(const size_phase& o) const { return workers == o.workers && from == o.from && to == o.to; }
};
/// From the events: each group that trained (its size from the service's
/// group_formed, its start from what it restored); a restore at step s
/// supersedes whatever trained past s before it; equal sizes in a row are
/// one phase (a restart at the same size changes nothing). The last phase
/// ends at `steps`. Empty when no group formed.
std::vector<size_phase> size_phases(const std::vector<event>& events, uint64_t steps);

/// Work lost by one fault, from the events.
struct fault_loss {
  size_t index = 0;
  bool applicable = false;
  int64_t reached = -1;   ///< last step completed before the restart
  int64_t restored = -1;  ///< step the next incarnation restored
  int64_t lost = 0;
  int64_t bound = 0;
  bool ok = true;
  std::string detail;
};

struct check_input {
  const run_config* cfg = nullptr;
  const run_result* res = nullptr;
  std::optional<std::string> reference_checksum;
  std::string reference_note;
  /// False only with --no-reference: then a missing reference is a SKIP;
  /// a reference that was wanted and failed makes bit_identical FAIL.
  bool reference_wanted = true;
};

struct check_output {
  std::vector<verdict> verdicts;
  std::vector<fault_loss> losses;
  bool passed() const;
};

check_output check_invariants(const check_input& in);

}  // namespace grace::chaos
