#pragma once
/// The job's shared secret: every member's Join and every checkpoint
/// transfer carry it, and the coordination service and the checkpoint
/// server refuse a wrong one. One node: a random 128-bit secret the launcher
/// makes and hands its workers in the environment. Several nodes: the same
/// secret on every node, from a file only its owner can read
/// (--token-file) or GRACE_TOKEN. It is never logged.

#include "runtime/base/error.hpp"

#include <cstddef>
#include <string>

namespace grace {

/// Shorter secrets are refused (16 bytes: 128 bits when random).
inline constexpr std::size_t min_token_bytes = 16;

/// `bytes` random bytes (getrandom), as 2 * bytes hex digits: secrets,
/// nonces and run ids.
result<std::string> random_hex(std::size_t bytes);
/// 128 random bits, as 32 hex digits: a job's secret.
inline result<std::string> random_token() { return random_hex(16); }

/// A secret's length and characters (printable ASCII, no blanks: it travels
/// in a text line); `origin` names where it came from in the error.
status check_token(const std::string& token, const std::string& origin);

/// The content of a secret's file (trailing newline removed): refused when
/// group or others may read or write it, when it is not a regular file or
/// is over 64 KiB. `flag` names the file's option in errors.
result<std::string> read_private_file(const std::string& path, const std::string& flag);

/// Reads a token file: refused when group or others may read or write it,
/// when it is not a regular file, or when its content (trailing newline
/// removed) fails check_token.
result<std::string> read_token_file(const std::string& path);

/// The launcher's secret: --token-file, else GRACE_TOKEN (`env_token`, may
/// be null), else, on one node, a random one; several nodes without either
/// is an error saying how to provide one.
result<std::string> launcher_token(const std::string& token_file, const char* env_token, int nnodes);

/// Equality in time independent of where the strings differ.
bool constant_time_equal(const std::string& a, const std::string& b);

}  // namespace grace
