// The protocol's wire wrapper: round trips, and rejection (never a crash)
// of malformed, oversized, wrong-version and wrong-type input.
#include "messages/wire.hpp"

#include <catch2/catch.hpp>
#include <spdlog/spdlog.h>

#include <random>

using namespace grace;

TEST_CASE("wire: every message type round-trips", "[wire]") {
  auto j = make<proto::Join>([](auto b) {
    b.setRank(3); b.setWorldSize(4); b.setRunId("run-a"); b.setIncarnation(7); b.setToken("t0k");
    b.setProtocolVersion(proto::PROTOCOL_VERSION); b.setHost("h"); b.setPid(42); b.setCompletedStep(99);
  });
  auto r = decode(j);
  REQUIRE(r);
  CHECK(r->get().getRank() == 3);
  CHECK(str(r->get().getRunId()) == "run-a");
  CHECK(r->get().getCompletedStep() == 99);

  auto c = make<proto::CheckpointAt>([](auto b) {
    b.setAgreementId(5); b.setStep(120); b.setKind(proto::CheckpointKind::JIT); b.setAgreed(true);
    b.setSaver(2); b.setExitAfter(true); b.setDeadlineNs(123456789);
  });
  auto rc = decode(c);
  REQUIRE(rc);
  CHECK(rc->get().getKind() == proto::CheckpointKind::JIT);
  CHECK(rc->get().getSaver() == 2);

  std::vector<uint8_t> value(300);
  for (size_t i = 0; i < value.size(); ++i) value[i] = uint8_t(i * 7);
  auto kv = make<proto::KvSet>([&](auto b) { b.setKey("k/1"); b.setValue(as_data(value)); });
  auto rk = decode(kv);
  REQUIRE(rk);
  CHECK(bytes(rk->get().getValue()) == value);

  auto saved = make<proto::CheckpointSaved>([](auto b) {
    auto files = b.initFiles(2);
    files[0].setName("a"); files[0].setSize(10); files[0].setChecksum("00ff");
    files[1].setName("b");
  });
  auto rs = decode(saved);
  REQUIRE(rs);
  CHECK(rs->get().getFiles().size() == 2);
  CHECK(str(rs->get().getFiles()[0].getChecksum()) == "00ff");

  // Copies are independent byte vectors (CAF copies messages).
  auto copy = kv;
  REQUIRE(decode(copy));
}

TEST_CASE("wire: malformed input is rejected with a clear error", "[wire]") {
  auto good = make<proto::Ack>([](auto b) { b.setAgreementId(1); b.setRank(2); b.setEarliestStep(3); });

  SECTION("empty and truncated") {
    msg<proto::Ack> m;
    auto r = decode(m);
    REQUIRE_FALSE(r);
    CHECK(r.err().code == errc::invalid_input);
    CHECK(r.err().message.find("too short") != std::string::npos);
    for (size_t n = 0; n < good.bytes.size(); ++n) {
      msg<proto::Ack> t{std::vector<uint8_t>(good.bytes.begin(), good.bytes.begin() + n)};
      REQUIRE_FALSE(decode(t));
    }
  }
  SECTION("bad magic") {
    auto m = good;
    m.bytes[0] = 'X';
    auto r = decode(m);
    REQUIRE_FALSE(r);
    CHECK(r.err().message.find("magic") != std::string::npos);
  }
  SECTION("wrong protocol version") {
    auto m = good;
    m.bytes[4] = 99;
    auto r = decode(m);
    REQUIRE_FALSE(r);
    CHECK(r.err().message.find("protocol version 99") != std::string::npos);
  }
  SECTION("another message type") {
    auto other = make<proto::Heartbeat>([](auto b) { b.setRank(1); });
    msg<proto::Ack> m{other.bytes};
    auto r = decode(m);
    REQUIRE_FALSE(r);
    CHECK(r.err().message.find("schema id") != std::string::npos);
  }
  SECTION("oversized") {
    msg<proto::Ack> m{good.bytes};
    m.bytes.resize(max_message_bytes + 8, 0);
    auto r = decode(m);
    REQUIRE_FALSE(r);
    CHECK(r.err().message.find("oversized") != std::string::npos);
  }
  SECTION("a pointer out of bounds") {
    auto kv = make<proto::KvSet>([](auto b) { b.setKey("abc"); });
    // Corrupt the root struct's pointer section: point the key far away.
    auto m = kv;
    size_t root = frame_header_bytes + 8;  // after the segment table
    m.bytes[root + 8 + 4] = 0xff;
    m.bytes[root + 8 + 5] = 0xff;
    m.bytes[root + 8 + 6] = 0xff;
    REQUIRE_NOTHROW(decode(m));
  }
  SECTION("random garbage after a valid header never crashes") {
    std::mt19937 rng(7);
    spdlog::set_level(spdlog::level::off);  // 2000 rejections: keep the output readable
    for (int i = 0; i < 2000; ++i) {
      auto m = good;
      size_t n = frame_header_bytes + 8 * (1 + rng() % 16);
      m.bytes.resize(n);
      for (size_t k = frame_header_bytes; k < n; ++k) m.bytes[k] = uint8_t(rng());
      REQUIRE_NOTHROW(decode(m));
    }
    spdlog::set_level(spdlog::level::info);
  }
}
