#include "runtime/base/base64.hpp"

#include <catch2/catch.hpp>

#include <string>

using namespace grace;

TEST_CASE("base64: RFC 4648 test vectors", "[base64]") {
  const char* pairs[][2] = {{"", ""},
                            {"f", "Zg=="},
                            {"fo", "Zm8="},
                            {"foo", "Zm9v"},
                            {"foob", "Zm9vYg=="},
                            {"fooba", "Zm9vYmE="},
                            {"foobar", "Zm9vYmFy"}};
  for (auto& p : pairs) {
    CHECK(base64_encode(p[0]) == p[1]);
    CHECK(base64_decode(p[1]) == std::string(p[0]));
  }
}

TEST_CASE("base64: every byte value and length round-trips", "[base64]") {
  std::string bytes;
  for (int i = 0; i < 256; ++i) bytes += static_cast<char>(i);
  for (size_t n = 0; n <= bytes.size(); n += 17) {
    auto s = bytes.substr(0, n);
    auto back = base64_decode(base64_encode(s));
    REQUIRE(back);
    CHECK(*back == s);
  }
}

TEST_CASE("base64: malformed text is refused", "[base64]") {
  for (const char* bad : {"Zg", "Zg=", "Z===", "Zm9v!A==", "Zh==", "Zm9=Zm9v", "===="}) CHECK_FALSE(base64_decode(bad));
}
