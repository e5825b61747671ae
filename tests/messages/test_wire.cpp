// The protocol's wire wrapper: round trips, and rejection (never a crash)
// of malformed, oversized, wrong-version and wrong-type input.
#include "messages/wire.hpp"

#include <catch2/catch.hpp>
#include <spdlog/spdlog.h>

#include <capnp/dynamic.h>
#include <capnp/schema.h>

#include <random>

using namespace grace;

namespace {

/// Reads every field (recursively), as a handler might.
void read_every_field(capnp::DynamicStruct::Reader s) {
  for (auto f : s.getSchema().getFields()) {
    if (!s.has(f)) continue;
    auto v = s.get(f);
    switch (v.getType()) {
      case capnp::DynamicValue::TEXT: (void)v.as<capnp::Text>().size(); break;
      case capnp::DynamicValue::DATA: (void)v.as<capnp::Data>().size(); break;
      case capnp::DynamicValue::STRUCT: read_every_field(v.as<capnp::DynamicStruct>()); break;
      case capnp::DynamicValue::LIST:
        for (auto e : v.as<capnp::DynamicList>())
          if (e.getType() == capnp::DynamicValue::STRUCT)
            read_every_field(e.as<capnp::DynamicStruct>());
          else if (e.getType() == capnp::DynamicValue::TEXT)
            (void)e.as<capnp::Text>().size();
        break;
      default: break;
    }
  }
}

/// A value per field that differs between fields (`seed` + the field's
/// index), so a field read back from the wrong place is caught.
void fill_every_field(capnp::DynamicStruct::Builder s, uint64_t seed) {
  for (auto f : s.getSchema().getFields()) {
    const uint64_t v = seed + f.getIndex() + 1;
    auto t = f.getType();
    switch (t.which()) {
      case capnp::schema::Type::BOOL: s.set(f, true); break;
      case capnp::schema::Type::INT8:
      case capnp::schema::Type::INT16:
      case capnp::schema::Type::INT32:
      case capnp::schema::Type::INT64: s.set(f, int64_t(v)); break;
      case capnp::schema::Type::UINT8:
      case capnp::schema::Type::UINT16:
      case capnp::schema::Type::UINT32:
      case capnp::schema::Type::UINT64: s.set(f, v); break;
      case capnp::schema::Type::FLOAT32:
      case capnp::schema::Type::FLOAT64: s.set(f, double(v) + 0.5); break;
      case capnp::schema::Type::TEXT: s.set(f, capnp::Text::Reader(("t" + std::to_string(v)).c_str())); break;
      case capnp::schema::Type::DATA: {
        std::vector<uint8_t> d{uint8_t(v), 0, uint8_t(v + 1)};
        s.set(f, capnp::Data::Reader(d.data(), d.size()));
        break;
      }
      case capnp::schema::Type::ENUM: {
        auto e = t.asEnum().getEnumerants();
        s.set(f, capnp::DynamicEnum(e[e.size() - 1]));
        break;
      }
      case capnp::schema::Type::STRUCT: fill_every_field(s.init(f).as<capnp::DynamicStruct>(), v * 100); break;
      case capnp::schema::Type::LIST: {
        auto l = s.init(f, 2).as<capnp::DynamicList>();
        if (t.asList().getElementType().isStruct())
          for (unsigned i = 0; i < 2; ++i) fill_every_field(l[i].as<capnp::DynamicStruct>(), v * 100 + i);
        break;
      }
      default: break;
    }
  }
}

/// The values fill_every_field wrote, read back after the wire.
void check_every_field(capnp::DynamicStruct::Reader s, uint64_t seed) {
  for (auto f : s.getSchema().getFields()) {
    const uint64_t v = seed + f.getIndex() + 1;
    INFO("field " << f.getProto().getName().cStr());
    auto t = f.getType();
    auto x = s.get(f);
    switch (t.which()) {
      case capnp::schema::Type::BOOL: CHECK(x.as<bool>()); break;
      case capnp::schema::Type::INT8: CHECK(x.as<int64_t>() == int64_t(int8_t(v))); break;
      case capnp::schema::Type::INT16:
      case capnp::schema::Type::INT32:
      case capnp::schema::Type::INT64: CHECK(x.as<int64_t>() == int64_t(v)); break;
      case capnp::schema::Type::UINT8: CHECK(x.as<uint64_t>() == uint8_t(v)); break;
      case capnp::schema::Type::UINT16:
      case capnp::schema::Type::UINT32:
      case capnp::schema::Type::UINT64: CHECK(x.as<uint64_t>() == v); break;
      case capnp::schema::Type::FLOAT32:
      case capnp::schema::Type::FLOAT64: CHECK(x.as<double>() == double(v) + 0.5); break;
      case capnp::schema::Type::TEXT: CHECK(std::string(x.as<capnp::Text>().cStr()) == "t" + std::to_string(v)); break;
      case capnp::schema::Type::DATA: {
        auto d = x.as<capnp::Data>();
        REQUIRE(d.size() == 3);
        CHECK(d[0] == uint8_t(v));
        CHECK(d[2] == uint8_t(v + 1));
        break;
      }
      case capnp::schema::Type::ENUM: {
        auto e = t.asEnum().getEnumerants();
        CHECK(x.as<capnp::DynamicEnum>().getRaw() == e[e.size() - 1].getOrdinal());
        break;
      }
      case capnp::schema::Type::STRUCT: check_every_field(x.as<capnp::DynamicStruct>(), v * 100); break;
      case capnp::schema::Type::LIST: {
        auto l = x.as<capnp::DynamicList>();
        REQUIRE(l.size() == 2);
        if (t.asList().getElementType().isStruct())
          for (unsigned i = 0; i < 2; ++i) check_every_field(l[i].as<capnp::DynamicStruct>(), v * 100 + i);
        break;
      }
      default: break;
    }
  }
}

}  // namespace

TEST_CASE("wire: every message type round-trips", "[wire]") {
  auto j = make<proto::Join>([](auto b) {
    b.setRank(3);
    b.setWorldSize(4);
    b.setRunId("run-a");
    b.setIncarnation(7);
    b.setToken("t0k");
    b.setProtocolVersion(proto::PROTOCOL_VERSION);
    b.setHost("h");
    b.setPid(42);
    b.setCompletedStep(99);
  });
  auto r = decode(j);
  REQUIRE(r);
  CHECK(r->get().getRank() == 3);
  CHECK(str(r->get().getRunId()) == "run-a");
  CHECK(r->get().getCompletedStep() == 99);

  auto c = make<proto::CheckpointAt>([](auto b) {
    b.setAgreementId(5);
    b.setStep(120);
    b.setKind(proto::CheckpointKind::JIT);
    b.setAgreed(true);
    b.setSaver(2);
    b.setExitAfter(true);
    b.setDeadlineNs(123456789);
  });
  auto rc = decode(c);
  REQUIRE(rc);
  CHECK(rc->get().getKind() == proto::CheckpointKind::JIT);
  CHECK(rc->get().getSaver() == 2);

  std::vector<uint8_t> value(300);
  for (size_t i = 0; i < value.size(); ++i) value[i] = uint8_t(i * 7);
  auto kv = make<proto::KvSet>([&](auto b) {
    b.setKey("k/1");
    b.setValue(as_data(value));
  });
  auto rk = decode(kv);
  REQUIRE(rk);
  CHECK(bytes(rk->get().getValue()) == value);

  auto saved = make<proto::CheckpointSaved>([](auto b) {
    b.setAgreementId(9);
    b.setStep(40);
    b.setOk(true);
    b.setBytes(1u << 30);
  });
  auto rs = decode(saved);
  REQUIRE(rs);
  CHECK(rs->get().getStep() == 40);
  CHECK(rs->get().getBytes() == (1u << 30));

  // Copies are independent byte vectors (CAF copies messages).
  auto copy = kv;
  REQUIRE(decode(copy));
}

TEST_CASE("wire: malformed input is rejected with a clear error", "[wire]") {
  auto good = make<proto::Ack>([](auto b) {
    b.setAgreementId(1);
    b.setRank(2);
    b.setEarliestStep(3);
  });

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
    auto r = decode(m);
    REQUIRE_FALSE(r);
    CHECK(r.err().code == errc::invalid_input);
    CHECK(r.err().message.find("KvSet") != std::string::npos);
  }
  SECTION("text without its terminating NUL") {
    auto kv = make<proto::KvSet>([](auto b) { b.setKey("abcdefg"); });  // 7 chars + NUL: one word
    auto m = kv;
    // The key's bytes are the last word of the message: overwrite its NUL.
    m.bytes[m.bytes.size() - 1] = 'x';
    auto r = decode(m);
    REQUIRE_FALSE(r);
    CHECK(r.err().code == errc::invalid_input);
  }
  SECTION("random garbage after a valid header is rejected or decodes to readable fields") {
    std::mt19937 rng(7);
    spdlog::set_level(spdlog::level::off);  // 2000 rejections: keep the output readable
    int rejected = 0;
    for (int i = 0; i < 2000; ++i) {
      auto m = good;
      size_t n = frame_header_bytes + 8 * (1 + rng() % 16);
      m.bytes.resize(n);
      for (size_t k = frame_header_bytes; k < n; ++k) m.bytes[k] = uint8_t(rng());
      auto r = decode(m);
      if (!r) {
        ++rejected;
        CHECK(r.err().code == errc::invalid_input);
        continue;
      }
      // Whatever decode accepts, every field read afterwards succeeds.
      CHECK_NOTHROW(read_every_field(capnp::DynamicStruct::Reader(r->get())));
    }
    spdlog::set_level(spdlog::level::info);
    CHECK(rejected > 1000);  // random segment tables and pointers are mostly invalid
  }
}

TEST_CASE("wire: every field of every message type survives a round trip", "[wire]") {
  int types = 0;
#define GRACE_ROUND_TRIP(T)                                              \
  {                                                                      \
    capnp::MallocMessageBuilder b;                                       \
    auto root = b.initRoot<proto::T>();                                  \
    fill_every_field(capnp::DynamicStruct::Builder(root), 1);            \
    auto m = msg<proto::T>{detail::frame(b, capnp::typeId<proto::T>())}; \
    auto r = decode(m);                                                  \
    INFO(#T);                                                            \
    REQUIRE(r);                                                          \
    check_every_field(capnp::DynamicStruct::Reader(r->get()), 1);        \
    ++types;                                                             \
  }
  GRACE_MESSAGE_TYPES(GRACE_ROUND_TRIP)
#undef GRACE_ROUND_TRIP
  CHECK(types == 45);
}

TEST_CASE("wire: an edited message keeps every field it does not change", "[wire]") {
  auto m = make<proto::Join>([](auto b) {
    b.setRank(3);
    b.setRunId("job");
    b.setSharded(true);
    b.setCompletedStep(40);
  });
  auto r = decode(m);
  REQUIRE(r);
  auto e = edited<proto::Join>(r->get(), [](auto b) { b.setRelayed(true); });
  auto d = decode(e);
  REQUIRE(d);
  CHECK(d->get().getRelayed());
  CHECK(d->get().getSharded());
  CHECK(d->get().getRank() == 3);
  CHECK(d->get().getCompletedStep() == 40);
  CHECK(std::string(d->get().getRunId().cStr()) == "job");
}
