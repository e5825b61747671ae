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

  bool coordinator_gone = false;              ///< the coordination service is unreachable

  /// Sets the flag and wakes a trainer waiting at a step boundary.
  /// Call with `m` held.
  void raise_locked() {
    pending.store(true, std::memory_order_seq_cst);
    cv.notify_all();
  }

  /// Installs (or, with an empty function, clears) the handler that unblocks
  /// a collective stuck on a dead peer (closes the Gloo context /
  /// ncclCommAbort). Set by the trainer; called from actor threads.
  void set_abort_handler(std::function<void()> f) {
    std::lock_guard<std::mutex> g(m);
    abort_collectives_ = std::move(f);
  }

  /// Aborts collectives, if a handler is armed. Runs the handler outside the
  /// lock (it may block briefly) but counted, so disarm() can wait for it.
  void abort() {
    {
      std::function<void()> f;
      {
        std::lock_guard<std::mutex> g(m);
        if (!abort_collectives_) return;
        f = abort_collectives_;
        ++aborts_running_;
      }
      try {
        f();
      } catch (...) {
        // A handler must not throw; an abort is best effort anyway.
      }
      // `f` (and whatever it captured) is released before the count drops,
      // so after disarm() no abort call holds the communicator.
    }
    {
      std::lock_guard<std::mutex> g(m);
      --aborts_running_;
    }
    abort_cv_.notify_all();
  }

  /// Clears the handler and waits until an abort already running has
  /// returned. Afterwards the handler is never called again, so what it
  /// points at (the communicator) may be destroyed. Why this is needed: the
  /// peer watcher calls abort() on a ClusterError / PeerLost from an actor
  /// thread, which races with the trainer thread tearing the communicator
  /// down once run() returned stop. Never call from inside the handler.
  void disarm() {
    std::unique_lock<std::mutex> lk(m);
    abort_collectives_ = nullptr;
    abort_cv_.wait(lk, [this] { return aborts_running_ == 0; });
  }

  /// True while a handler is installed (tests, diagnostics).
  bool armed() {
    std::lock_guard<std::mutex> g(m);
    return static_cast<bool>(abort_collectives_);
  }

private:
  std::function<void()> abort_collectives_;  ///< guarded by `m`
  int aborts_running_ = 0;                   ///< guarded by `m`
  std::condition_variable abort_cv_;
};

} // namespace grace
