#pragma once
/// A value behind its own mutex, in the spirit of KJ's MutexGuarded: the
/// value is reached only by a copy out, a replacement, or a function run
/// under the lock, so no caller can forget the lock.

#include <mutex>
#include <utility>

namespace grace {

template <class T>
class guarded {
public:
  guarded() = default;
  explicit guarded(T v) : v_(std::move(v)) {}
  guarded(const guarded&) = delete;
  guarded& operator=(const guarded&) = delete;

  /// A copy of the value (for handles and shared pointers: cheap).
  T get() const {
    std::lock_guard<std::mutex> g(m_);
    return v_;
  }
  void set(T v) {
    std::lock_guard<std::mutex> g(m_);
    v_ = std::move(v);
  }
  /// `f(value)` under the lock; returns what `f` returns.
  template <class F>
  auto with(F&& f) {
    std::lock_guard<std::mutex> g(m_);
    return std::forward<F>(f)(v_);
  }
  template <class F>
  auto with(F&& f) const {
    std::lock_guard<std::mutex> g(m_);
    return std::forward<F>(f)(static_cast<const T&>(v_));
  }

private:
  mutable std::mutex m_;
  T v_{};
};

}  // namespace grace
