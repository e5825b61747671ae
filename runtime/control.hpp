#pragma once
/// The control block between a worker's actors and its trainer thread.
///
/// The trainer's per-step cost is one seq_cst store (`started`) and one load
/// (`pending`). Everything else happens under the mutex, only when `pending`
/// is set. The store/load pair on each side (trainer: store started, load
/// pending; watcher: store pending, load started) is Dekker's pattern: with
/// seq_cst either the trainer sees the flag before starting step k, or the
/// watcher sees started >= k. So the watcher can promise "this worker stops
/// no later than max(N, started)" without waiting for the trainer.

#include "runtime/agreement.hpp"

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>

namespace grace {

struct checkpoint_order {
  uint64_t id = 0;
  uint64_t step = 0;
  ckpt_kind kind = ckpt_kind::initial;
  bool agreed = false;
  uint32_t saver = 0;
  bool exit_after = false;
  int64_t deadline_ns = 0;
};

struct cluster_failure {
  uint32_t origin = 0;
  uint64_t step = 0;
  std::string kind;
  std::string message;
};

class control_block {
public:
  // --- fast path (trainer thread) ---
  std::atomic<bool> pending{false};
  std::atomic<uint64_t> started{0};
  std::atomic<uint64_t> completed{0};
  std::atomic<int64_t> last_step_ns{0};

  // --- rare path: guarded by `m` ---
  std::mutex m;
  std::condition_variable cv;
  std::optional<checkpoint_order> order;      ///< newest checkpoint order
  std::optional<uint64_t> committed_id;       ///< newest committed agreement
  std::optional<uint64_t> committed_step;
  bool committed_exit = false;
  std::optional<cluster_failure> failure;     ///< a cluster error (fatal)
  std::optional<std::string> lost;            ///< peer or coordinator lost
  std::optional<int> shutdown_code;
  int64_t deadline_ns = 0;                    ///< grace-period deadline (chief keeps time)

  /// Called from outside the trainer thread to unblock a collective stuck on
  /// a dead peer (closes the Gloo context / ncclCommAbort). Set by the trainer.
  std::function<void()> abort_collectives;

  /// Sets the flag and wakes a trainer waiting at a step boundary.
  /// Call with `m` held.
  void raise_locked() {
    pending.store(true, std::memory_order_seq_cst);
    cv.notify_all();
  }

  /// Aborts collectives (outside the lock: the callback may block briefly).
  void abort() {
    std::function<void()> f;
    {
      std::lock_guard<std::mutex> g(m);
      f = abort_collectives;
    }
    if (f) f();
  }
};

} // namespace grace
