#pragma once
/// Small POSIX file helpers shared by the checkpoint format, its transfer
/// and the safetensors reader.

#include <unistd.h>

#include <cstring>
#include <cerrno>
#include <fcntl.h>
#include <filesystem>
#include <string>

#include "runtime/base/error.hpp"

namespace grace {

/// Owns a file descriptor and closes it on scope exit. Movable, so a
/// function can hand an open descriptor on; `release()` gives it up (to hand
/// it to an owner of another kind, or to close it yourself and see the error).
struct fd_guard {
  int fd = -1;
  fd_guard() = default;
  explicit fd_guard(int f) noexcept : fd(f) {}
  fd_guard(const fd_guard&) = delete;
  fd_guard& operator=(const fd_guard&) = delete;
  fd_guard(fd_guard&& o) noexcept : fd(o.release()) {}
  fd_guard& operator=(fd_guard&& o) noexcept {
    if (this != &o) reset(o.release());
    return *this;
  }
  ~fd_guard() { reset(); }
  /// Closes the descriptor held (if any) and holds `f` instead.
  void reset(int f = -1) noexcept {
    if (fd >= 0) ::close(fd);
    fd = f;
  }
  int release() noexcept {
    const int f = fd;
    fd = -1;
    return f;
  }
};

/// `strerror(e)` as a string.
inline std::string errno_str(int e) { return std::strerror(e); }

/// Opens a checkpoint file without following a symbolic link: a link in a
/// checkpoint directory could point anywhere (checkpoints are input).
inline int open_no_follow(const std::filesystem::path& p, int flags) {
  return ::open(p.c_str(), flags | O_NOFOLLOW | O_CLOEXEC);
}

/// What a failed open of a checkpoint file means, for its error message.
inline std::string open_failure(int e) {
  if (e == ELOOP) return "not a regular file (a symbolic link, refused: it could point outside the checkpoint directory)";
  if (e == ENOENT) return "missing";
  return "cannot open: " + errno_str(e);
}

/// A bad-input error about one file: "<path>: <what>".
inline error invalid_file(const std::filesystem::path& p, const std::string& what) {
  return error{errc::invalid_input, p.string() + ": " + what};
}

}  // namespace grace
