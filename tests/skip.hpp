#pragma once
// Catch2 v2 has no SKIP. A test that cannot exercise its target calls
// GRACE_SKIP(why): under CTest (which sets GRACE_SKIP_EXIT, and the test's
// SKIP_RETURN_CODE to the same value) the process exits with that code and
// CTest reports the test Skipped, never Passed; run by hand the test case
// warns and ends, and the rest of the binary goes on.
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

namespace grace::testing {

inline void skip_now(const std::string& why) {
  std::fprintf(stderr, "skipped: %s\n", why.c_str());
  if (const char* code = std::getenv("GRACE_SKIP_EXIT")) {
    std::fflush(nullptr);
    std::_Exit(std::atoi(code));
  }
}

}  // namespace grace::testing

/// Reports the skip (and under CTest exits); the caller then returns.
#define GRACE_SKIP_REPORT(why_stream)                 \
  do {                                                \
    std::ostringstream grace_skip_os_;                \
    grace_skip_os_ << why_stream;                     \
    ::grace::testing::skip_now(grace_skip_os_.str()); \
    WARN("skipped: " << grace_skip_os_.str());        \
  } while (0)

/// Skips the rest of a test case.
#define GRACE_SKIP(why_stream)     \
  do {                             \
    GRACE_SKIP_REPORT(why_stream); \
    return;                        \
  } while (0)

/// Skips from a helper that tells its test case whether to go on.
#define GRACE_SKIP_BOOL(why_stream) \
  do {                              \
    GRACE_SKIP_REPORT(why_stream);  \
    return false;                   \
  } while (0)
