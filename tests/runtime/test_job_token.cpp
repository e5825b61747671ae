#include "runtime/net/job_token.hpp"

#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <set>

using namespace grace;

namespace {
std::string temp_file(const std::string& content, mode_t mode) {
  char tmpl[] = "/tmp/grace-token-XXXXXX";
  int fd = ::mkstemp(tmpl);
  REQUIRE(fd >= 0);
  REQUIRE(::write(fd, content.data(), content.size()) == ssize_t(content.size()));
  ::close(fd);
  REQUIRE(::chmod(tmpl, mode) == 0);
  return tmpl;
}
}  // namespace

TEST_CASE("job token: random secrets are 128 bits in hex and differ", "[token]") {
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    auto t = random_token();
    REQUIRE(t);
    CHECK(t->size() == 32);
    CHECK(t->find_first_not_of("0123456789abcdef") == std::string::npos);
    seen.insert(*t);
  }
  CHECK(seen.size() == 100);
}

TEST_CASE("job token: empty, short and non-printable secrets are refused", "[token]") {
  CHECK_FALSE(check_token("", "GRACE_TOKEN"));
  CHECK(check_token("", "GRACE_TOKEN").err().message.find("empty") != std::string::npos);
  auto short_one = check_token("tok-abc", "GRACE_TOKEN");
  REQUIRE_FALSE(short_one);
  CHECK(short_one.err().message.find("at least 16") != std::string::npos);
  CHECK_FALSE(check_token("0123456789abcdef 0123", "x"));
  CHECK_FALSE(check_token(std::string("0123456789abcdef\x01"), "x"));
  CHECK(check_token("0123456789abcdef", "x"));
}

TEST_CASE("job token: the launcher's choice among file, environment and random", "[token]") {
  auto f = temp_file("0123456789abcdef0123\n", 0600);
  auto from_file = launcher_token(f, "ffffffffffffffffffff", 2);
  REQUIRE(from_file);
  CHECK(*from_file == "0123456789abcdef0123");  // the file wins, its newline dropped
  auto from_env = launcher_token("", "ffffffffffffffffffff", 2);
  REQUIRE(from_env);
  CHECK(*from_env == "ffffffffffffffffffff");
  CHECK_FALSE(launcher_token("", "", 1));  // set but empty: refused, not "no token"
  auto none = launcher_token("", nullptr, 2);
  REQUIRE_FALSE(none);
  CHECK(none.err().message.find("--token-file") != std::string::npos);
  auto one_node = launcher_token("", nullptr, 1);
  REQUIRE(one_node);
  CHECK(one_node->size() == 32);
  std::remove(f.c_str());
}

TEST_CASE("job token: a token file others can read, or that is missing, is refused", "[token]") {
  auto open_file = temp_file("0123456789abcdef0123\n", 0644);
  auto r = read_token_file(open_file);
  REQUIRE_FALSE(r);
  CHECK(r.err().message.find("chmod 600") != std::string::npos);
  std::remove(open_file.c_str());
  auto short_file = temp_file("abc\n", 0600);
  CHECK_FALSE(read_token_file(short_file));
  std::remove(short_file.c_str());
  CHECK_FALSE(read_token_file("/nonexistent/grace-token"));
  CHECK_FALSE(read_token_file("/tmp"));  // not a regular file
}

TEST_CASE("job token: comparison", "[token]") {
  CHECK(constant_time_equal("0123456789abcdef", "0123456789abcdef"));
  CHECK_FALSE(constant_time_equal("0123456789abcdef", "0123456789abcdeF"));
  CHECK_FALSE(constant_time_equal("0123456789abcdef", "0123456789abcde"));
  CHECK_FALSE(constant_time_equal("", "x"));
  CHECK(constant_time_equal("", ""));
}
