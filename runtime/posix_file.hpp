#pragma once
/// Small POSIX file helpers shared by the checkpoint format, its transfer
/// and the safetensors reader.

#include <unistd.h>

#include <cstring>
#include <cerrno>
#include <fcntl.h>
#include <filesystem>
#include <string>

#include "runtime/error.hpp"

namespace grace {

/// Owns a file descriptor and closes it on scope exit; set `fd = -1` to
/// keep it open (hand it on, or close it yourself to see the error).
struct fd_guard {
  int fd = -1;
  fd_guard() = default;
  explicit fd_guard(int f) noexcept : fd(f) {}
  fd_guard(const fd_guard&) = delete;
  fd_guard& operator=(const fd_guard&) = delete;
  ~fd_guard() {
    if (fd >= 0) ::close(fd);
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
