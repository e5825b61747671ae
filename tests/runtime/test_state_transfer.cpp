// A donor's state straight from its memory (runtime/checkpoint/state_transfer.hpp).
#include "runtime/checkpoint/state_transfer.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <future>
#include <numeric>
#include <thread>
#include <vector>

using namespace grace;
using namespace std::chrono_literals;

namespace {

const std::string job_token = "0123456789abcdef0123456789abcdef";

/// Two tensors of the shape grace-train registers, in `w` and `b`.
std::vector<tensor_ref> layout(std::vector<float>& w, std::vector<int64_t>& b) {
  return {{"w", dtype::f32, {int64_t(w.size())}, w.data()}, {"b", dtype::i64, {int64_t(b.size())}, b.data()}};
}

donor_state round_of(uint64_t round, uint64_t step, std::vector<tensor_ref> t) {
  donor_state s;
  s.round = round;
  s.step = step;
  s.tensors = std::move(t);
  s.meta.counters = {{"steps_done", int64_t(step)}};
  s.meta.metadata = {{"grace.blob.rng", "AAEC"}};
  return s;
}

}  // namespace

TEST_CASE("state transfer: the receiver gets the donor's bytes, counters and blobs", "[state_transfer]") {
  std::vector<float> w(300000);
  std::iota(w.begin(), w.end(), 0.5f);
  std::vector<int64_t> b = {7, -3, 1LL << 40};
  auto server = state_server::start("127.0.0.1", job_token, 2000ms);
  REQUIRE(server);
  (*server)->arm(round_of(4, 31, layout(w, b)));

  std::vector<float> w2(w.size(), -1.0f);
  std::vector<int64_t> b2(b.size(), 0);
  auto got = fetch_state((*server)->endpoint(), job_token, 4, 31, layout(w2, b2), 2000ms);
  REQUIRE(got);
  CHECK(std::memcmp(w.data(), w2.data(), w.size() * sizeof(float)) == 0);
  CHECK(b2 == b);
  CHECK(got->bytes == w.size() * 4 + b.size() * 8);
  CHECK(got->meta.counters.at("steps_done") == 31);
  CHECK(got->meta.metadata.at("grace.blob.rng") == "AAEC");
  (*server)->disarm();
  CHECK((*server)->served() == 1);
}

TEST_CASE("state transfer: a request that comes before the arm is served once armed", "[state_transfer]") {
  std::vector<float> w(1000, 2.0f);
  std::vector<int64_t> b = {1};
  auto server = state_server::start("127.0.0.1", job_token, 5000ms);
  REQUIRE(server);
  std::vector<float> w2(w.size());
  std::vector<int64_t> b2(1);
  auto fetch = std::async(std::launch::async, [&] {
    return fetch_state((*server)->endpoint(), job_token, 2, 9, layout(w2, b2), 5000ms);
  });
  // The fetch is under way (connected, waiting for the arm) or not yet
  // started: either way it must end with the armed state.
  (*server)->arm(round_of(2, 9, layout(w, b)));
  auto got = fetch.get();
  REQUIRE(got);
  CHECK(w2 == w);
}

TEST_CASE("state transfer: refusals name the reason and write nothing", "[state_transfer]") {
  std::vector<float> w(64, 1.0f);
  std::vector<int64_t> b = {5};
  auto server = state_server::start("127.0.0.1", job_token, 300ms);
  REQUIRE(server);
  (*server)->arm(round_of(3, 12, layout(w, b)));
  std::vector<float> w2(64, 0.0f);
  std::vector<int64_t> b2(1, 0);

  SECTION("another step") {
    auto got = fetch_state((*server)->endpoint(), job_token, 3, 11, layout(w2, b2), 2000ms);
    REQUIRE_FALSE(got);
    CHECK(got.err().message.find("serves round 3 step 12") != std::string::npos);
  }
  SECTION("nothing armed") {
    (*server)->disarm();
    auto got = fetch_state((*server)->endpoint(), job_token, 3, 12, layout(w2, b2), 2000ms);
    REQUIRE_FALSE(got);
    CHECK(got.err().message.find("serves no state") != std::string::npos);
  }
  SECTION("a wrong token") {
    auto got = fetch_state((*server)->endpoint(), "ffffffffffffffffffffffffffffffff", 3, 12, layout(w2, b2), 2000ms);
    REQUIRE_FALSE(got);
    CHECK(got.err().message.find("token") != std::string::npos);
  }
  SECTION("another layout") {
    std::vector<float> small(32);
    auto got = fetch_state((*server)->endpoint(), job_token, 3, 12,
                           {{"w", dtype::f32, {32}, small.data()}, {"b", dtype::i64, {1}, b2.data()}}, 2000ms);
    REQUIRE_FALSE(got);
    CHECK(got.err().code == errc::invalid_input);
    CHECK(got.err().message.find("'w' differs") != std::string::npos);
  }
  CHECK(std::all_of(w2.begin(), w2.end(), [](float x) { return x == 0.0f; }));
}

TEST_CASE("state transfer: disarm waits for a transfer that reads the tensors", "[state_transfer]") {
  std::vector<float> w(8 << 20, 3.0f);  // 32 MiB: the transfer takes a while
  std::vector<int64_t> b = {1};
  auto server = state_server::start("127.0.0.1", job_token, 5000ms);
  REQUIRE(server);
  (*server)->arm(round_of(1, 1, layout(w, b)));
  std::vector<float> w2(w.size());
  std::vector<int64_t> b2(1);
  auto fetch = std::async(std::launch::async, [&] {
    return fetch_state((*server)->endpoint(), job_token, 1, 1, layout(w2, b2), 5000ms);
  });
  // Once disarm() returned, whatever was served is complete: the donor may
  // change its tensors. A transfer not yet started is refused instead.
  (*server)->disarm();
  const uint64_t served = (*server)->served();
  std::fill(w.begin(), w.end(), 9.0f);
  auto got = fetch.get();
  if (served == 1) {
    REQUIRE(got);
    CHECK(std::all_of(w2.begin(), w2.end(), [](float x) { return x == 3.0f; }));
  } else {
    CHECK_FALSE(got);
  }
}
