// The TLS option rules (runtime/net/tls.hpp). The file checks against real
// certificates (chain, key match, key mode, encrypted key, purpose) are in
// tests/integration/tls.sh, which makes them with the openssl command.
#include "runtime/net/tls.hpp"

#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>

using namespace grace;

TEST_CASE("TLS files: flags win over GRACE_TLS_*, each on its own", "[tls]") {
  auto env = [](const char* v) -> const char* {
    if (std::strcmp(v, "GRACE_TLS_CERT") == 0) return "/env/cert.pem";
    if (std::strcmp(v, "GRACE_TLS_KEY") == 0) return "/env/key.pem";
    return nullptr;
  };
  auto f = tls_files_from(tls_files{"/flag/cert.pem", "", ""}, env);
  CHECK(f.cert == "/flag/cert.pem");
  CHECK(f.key == "/env/key.pem");
  CHECK(f.ca.empty());
  CHECK(f.any());
  CHECK_FALSE(tls_files_from({}, [](const char*) -> const char* { return nullptr; }).any());
}

TEST_CASE("TLS files: none is plain TCP, some but not all three is an error naming the missing ones", "[tls]") {
  CHECK(check_tls_files({}));
  auto st = check_tls_files(tls_files{"c.pem", "", ""});
  REQUIRE_FALSE(st);
  CHECK(st.err().code == errc::invalid_input);
  CHECK(st.err().message.find("missing: --tls-key, --tls-ca") != std::string::npos);
  auto env = check_tls_files(tls_files{"", "k.pem", ""}, "GRACE_TLS_");
  REQUIRE_FALSE(env);
  CHECK(env.err().message.find("missing: GRACE_TLS_CERT, GRACE_TLS_CA") != std::string::npos);
}

TEST_CASE("TLS files: a file that is not there is named", "[tls]") {
  auto st = check_tls_files(tls_files{"/nonexistent/c.pem", "/nonexistent/k.pem", "/nonexistent/ca.pem"});
  REQUIRE_FALSE(st);
  CHECK(st.err().message.find("--tls-cert /nonexistent/c.pem: No such file") != std::string::npos);
}

TEST_CASE("TLS environment for workers: absolute paths, nothing when off", "[tls]") {
  CHECK(tls_environment({}).empty());
  auto e = tls_environment(tls_files{"a/c.pem", "/k.pem", "./ca.pem"});
  CHECK(e.at("GRACE_TLS_CERT") == (std::filesystem::current_path() / "a/c.pem").string());
  CHECK(e.at("GRACE_TLS_KEY") == "/k.pem");
  CHECK(e.at("GRACE_TLS_CA") == (std::filesystem::current_path() / "ca.pem").string());
}

TEST_CASE("plain-text warning: only off loopback and without TLS", "[tls]") {
  CHECK_FALSE(plaintext_warning("127.0.0.1", false));
  CHECK_FALSE(plaintext_warning("127.3.2.1", false));
  CHECK_FALSE(plaintext_warning("192.0.2.1", true));
  auto w = plaintext_warning("192.0.2.1", false);
  REQUIRE(w);
  CHECK(w->find("192.0.2.1 without TLS") != std::string::npos);
  CHECK(w->find("--tls-cert") != std::string::npos);
  CHECK(plaintext_warning("0.0.0.0", false));
}
