#pragma once
/// A flag another thread raises to abandon a blocking setup step (a
/// collective's rendezvous), with a wait that wakes on it.
///
/// Why it exists: Gloo's connectFullMesh waits for each peer's connection
/// with the full collective timeout and offers no public way to wake it, so
/// a peer that dies during the rendezvous would hold the survivors for that
/// long. gloo_comm::connect runs the mesh setup on a helper thread and waits
/// here instead; the session's abort handler (armed with `cancel()` before
/// connecting) makes the wait return at once.

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>

namespace grace {

class cancel_token {
public:
  /// Raises the flag and wakes every waiter. Safe from any thread, repeatable.
  void cancel() {
    {
      std::lock_guard<std::mutex> g(m_);
      cancelled_ = true;
    }
    cv_.notify_all();
  }
  bool cancelled() const {
    std::lock_guard<std::mutex> g(m_);
    return cancelled_;
  }
  /// Wakes waiters to re-check their condition (a helper finished).
  void notify() {
    { std::lock_guard<std::mutex> g(m_); }
    cv_.notify_all();
  }
  /// Waits until `done()` (evaluated under this token's lock) or the flag,
  /// whichever comes first, or `deadline`. Returns true when done.
  bool wait_until(const std::function<bool()>& done, std::chrono::steady_clock::time_point deadline) {
    std::unique_lock<std::mutex> lk(m_);
    cv_.wait_until(lk, deadline, [&] { return cancelled_ || done(); });
    return done();
  }

private:
  mutable std::mutex m_;
  std::condition_variable cv_;
  bool cancelled_ = false;
};

}  // namespace grace
