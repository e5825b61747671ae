#include "runtime/net/job_token.hpp"

#include <sys/random.h>
#include <vector>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace grace {

result<std::string> random_hex(std::size_t bytes) {
  std::vector<unsigned char> b(bytes);
  size_t got = 0;
  while (got < b.size()) {
    ssize_t n = ::getrandom(b.data() + got, b.size() - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return error{errc::failed, std::string("getrandom: ") + std::strerror(errno)};
    got += static_cast<size_t>(n);
  }
  static const char hex[] = "0123456789abcdef";
  std::string t;
  for (unsigned char c : b) {
    t += hex[c >> 4];
    t += hex[c & 15];
  }
  return t;
}

status check_token(const std::string& token, const std::string& origin) {
  if (token.empty()) return invalid_input(origin + " is empty: the job's secret must be at least 16 characters");
  if (token.size() < min_token_bytes)
    return invalid_input(origin + " is " + std::to_string(token.size()) +
               " characters long: the job's secret must be at least 16 (e.g. `openssl rand -hex 16`)");
  if (token.size() > 4096) return invalid_input(origin + " is longer than 4096 characters");
  for (unsigned char c : token)
    if (c <= ' ' || c >= 127) return invalid_input(origin + " contains a blank or a non-printable character");
  return {};
}

result<std::string> read_private_file(const std::string& path, const std::string& flag) {
  struct stat sb {};
  if (::stat(path.c_str(), &sb) != 0) return invalid_input(flag + " " + path + ": " + std::strerror(errno));
  if (!S_ISREG(sb.st_mode)) return invalid_input(flag + " " + path + " is not a regular file");
  if (sb.st_mode & (S_IRWXG | S_IRWXO))
    return invalid_input(flag + " " + path + " can be read or written by group or others (chmod 600 " + path + ")");
  if (sb.st_size > 64 * 1024) return invalid_input(flag + " " + path + " is larger than 64 KiB: not a secret");
  std::ifstream f(path);
  if (!f) return invalid_input(flag + " " + path + ": cannot open it");
  std::stringstream ss;
  ss << f.rdbuf();
  std::string t = ss.str();
  while (!t.empty() && (t.back() == '\n' || t.back() == '\r')) t.pop_back();
  return t;
}

result<std::string> read_token_file(const std::string& path) {
  auto t = read_private_file(path, "--token-file");
  if (!t) return t.err();
  if (auto st = check_token(*t, "the secret in --token-file " + path); !st) return st.err();
  return t;
}

result<std::string> launcher_token(const std::string& token_file, const char* env_token, int nnodes) {
  if (!token_file.empty()) return read_token_file(token_file);
  if (env_token) {
    if (auto st = check_token(env_token, "GRACE_TOKEN"); !st) return st.err();
    return std::string(env_token);
  }
  if (nnodes > 1)
    return invalid_input(
        "several nodes need the same secret on each: --token-file FILE (mode 600, e.g. from "
        "`openssl rand -hex 16`) or GRACE_TOKEN");
  return random_token();
}

bool constant_time_equal(const std::string& a, const std::string& b) {
  // The length is not secret (at least 16, usually 32); the content is.
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const std::string& ref = a.size() == b.size() ? b : a;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ ref[i]);
  return diff == 0;
}

}  // namespace grace
