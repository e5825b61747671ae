#include "messages/wire.hpp"

#include <capnp/dynamic.h>
#include <spdlog/spdlog.h>

namespace grace::detail {

namespace {
constexpr char magic[4] = {'G', 'R', 'C', 'E'};

void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = uint8_t(v >> (8 * i));
}
void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = uint8_t(v >> (8 * i));
}
uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
}  // namespace

std::vector<uint8_t> frame(capnp::MessageBuilder& b, uint64_t type_id) {
  auto words = capnp::messageToFlatArray(b);
  auto body = words.asBytes();
  std::vector<uint8_t> out(frame_header_bytes + body.size());
  std::memcpy(out.data(), magic, 4);
  put_u32(out.data() + 4, proto::PROTOCOL_VERSION);
  put_u64(out.data() + 8, type_id);
  std::memcpy(out.data() + frame_header_bytes, body.begin(), body.size());
  return out;
}

namespace {
void read_fields(capnp::DynamicStruct::Reader s) {
  for (auto f : s.getSchema().getFields()) {
    if (!s.has(f)) continue;
    auto v = s.get(f);
    switch (v.getType()) {
      case capnp::DynamicValue::TEXT: (void)v.as<capnp::Text>(); break;
      case capnp::DynamicValue::STRUCT: read_fields(v.as<capnp::DynamicStruct>()); break;
      case capnp::DynamicValue::LIST:
        for (auto e : v.as<capnp::DynamicList>()) {
          if (e.getType() == capnp::DynamicValue::STRUCT)
            read_fields(e.as<capnp::DynamicStruct>());
          else if (e.getType() == capnp::DynamicValue::TEXT)
            (void)e.as<capnp::Text>();
        }
        break;
      default: break;
    }
  }
}
}  // namespace

void read_every_field(capnp::AnyStruct::Reader root, capnp::StructSchema schema) {
  read_fields(root.as<capnp::DynamicStruct>(schema));
}

error decode_error(const char* type_name, const char* what) {
  error e{errc::invalid_input, std::string("rejected ") + type_name + " message: " + what};
  spdlog::error("{}", e.message);
  return e;
}

result<kj::Array<capnp::word>> unframe(const std::vector<uint8_t>& bytes, uint64_t type_id, const char* type_name) {
  if (bytes.size() < frame_header_bytes + sizeof(capnp::word))
    return decode_error(type_name, ("too short (" + std::to_string(bytes.size()) + " bytes)").c_str());
  if (bytes.size() > max_message_bytes)
    return decode_error(type_name, ("oversized (" + std::to_string(bytes.size()) + " bytes, limit " +
                                    std::to_string(max_message_bytes) + ")")
                                       .c_str());
  if (std::memcmp(bytes.data(), magic, 4) != 0) return decode_error(type_name, "bad magic (not a Grace message)");
  auto version = get_u32(bytes.data() + 4);
  if (version != proto::PROTOCOL_VERSION)
    return decode_error(type_name,
                        ("protocol version " + std::to_string(version) + ", this build speaks " +
                         std::to_string(proto::PROTOCOL_VERSION) + ": run the same Grace version on every node")
                            .c_str());
  if (get_u64(bytes.data() + 8) != type_id)
    return decode_error(type_name, "schema id mismatch (a different message type)");
  size_t body = bytes.size() - frame_header_bytes;
  if (body % sizeof(capnp::word) != 0) return decode_error(type_name, "body is not a whole number of words");
  auto words = kj::heapArray<capnp::word>(body / sizeof(capnp::word));
  std::memcpy(words.begin(), bytes.data() + frame_header_bytes, body);
  // The segment table must describe exactly the bytes we have.
  try {
    capnp::FlatArrayMessageReader probe(words.asPtr(), reader<proto::Ack>::options());
    (void)probe;
  } catch (const kj::Exception& e) {
    return decode_error(type_name, e.getDescription().cStr());
  }
  return words;
}

}  // namespace grace::detail
