#pragma once
/// A self-pipe: one thread wakes another that waits in poll(2) on `fd()`
/// beside its other descriptors (a listening socket, a signalfd). Used to
/// stop server threads and to announce queued events.

namespace grace {

class wake_pipe {
public:
  /// Both ends close-on-exec and non-blocking. When the pipe cannot be made,
  /// `ok()` is false, `error_number()` says why, `fd()` is -1 and `wake()`
  /// does nothing.
  wake_pipe() noexcept;
  ~wake_pipe();
  wake_pipe(const wake_pipe&) = delete;
  wake_pipe& operator=(const wake_pipe&) = delete;

  bool ok() const noexcept { return fds_[0] >= 0; }
  int error_number() const noexcept { return errno_; }
  /// The read end: readable once `wake()` was called and not yet drained.
  int fd() const noexcept { return fds_[0]; }
  /// Makes `fd()` readable. Never blocks (a full pipe is already readable).
  void wake() const noexcept;
  /// Reads every pending wake-up, so the next poll sleeps until the next one.
  void drain() const noexcept;

private:
  int fds_[2] = {-1, -1};
  int errno_ = 0;
};

}  // namespace grace
