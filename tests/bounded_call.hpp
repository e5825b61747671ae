#pragma once
// A call on its own thread that a test waits for with a bound.
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

namespace grace::testing {

/// Runs `fn()` on its own thread. `get(bound)` joins the thread once `fn`
/// returned, so everything the call touched is visibly finished (a join is
/// a synchronisation ThreadSanitizer understands; a detached thread's last
/// release of a shared state is not, under GCC 12's shared_ptr). A call
/// still running after the bound is detached, owning what it uses: the test
/// fails instead of hanging in a destructor.
template <class T>
class bounded_call {
 public:
  template <class F>
  explicit bounded_call(F fn) : box_(std::make_shared<box>()) {
    thread_ = std::thread([b = box_, fn = std::move(fn)]() mutable {
      T v = fn();
      std::lock_guard<std::mutex> l(b->m);
      b->value.emplace(std::move(v));
      b->cv.notify_all();
    });
  }
  bounded_call(bounded_call&&) noexcept = default;
  bounded_call& operator=(bounded_call&&) = delete;
  bounded_call(const bounded_call&) = delete;
  bounded_call& operator=(const bounded_call&) = delete;
  ~bounded_call() {
    if (thread_.joinable()) thread_.detach();
  }

  /// `fn`'s result if it returned within `bound`; nullopt otherwise.
  std::optional<T> get(std::chrono::milliseconds bound = std::chrono::seconds(30)) {
    {
      std::unique_lock<std::mutex> l(box_->m);
      if (!box_->cv.wait_for(l, bound, [&] { return box_->value.has_value(); })) return std::nullopt;
    }
    thread_.join();
    return std::move(box_->value);
  }

 private:
  struct box {
    std::mutex m;
    std::condition_variable cv;
    std::optional<T> value;
  };
  std::shared_ptr<box> box_;
  std::thread thread_;
};

}  // namespace grace::testing
