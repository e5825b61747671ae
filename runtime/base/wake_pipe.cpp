#include "runtime/base/wake_pipe.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

namespace grace {

wake_pipe::wake_pipe() noexcept {
  if (::pipe2(fds_, O_CLOEXEC | O_NONBLOCK) != 0) {
    errno_ = errno;
    fds_[0] = fds_[1] = -1;
  }
}

wake_pipe::~wake_pipe() {
  for (int fd : fds_)
    if (fd >= 0) ::close(fd);
}

void wake_pipe::wake() const noexcept {
  if (fds_[1] < 0) return;
  const char c = 1;
  ssize_t n = ::write(fds_[1], &c, 1);
  (void)n;  // EAGAIN: the pipe is full, so already readable
}

void wake_pipe::drain() const noexcept {
  if (fds_[0] < 0) return;
  char buf[64];
  while (::read(fds_[0], buf, sizeof buf) > 0) {
  }
}

}  // namespace grace
