// libFuzzer: what an unauthenticated peer controls before anything trusts
// it. The first byte picks the target:
//  - even: the bulk channel's gate (bulk_handshake), fed the rest in pieces
//    whose sizes the first byte's upper bits choose; a fixed key and server
//    nonce, so a seed can hold a passing handshake;
//  - odd: a manifest's signature check (JSON, then HMAC) under a fixed key.
#include "runtime/checkpoint/signing.hpp"
#include "runtime/net/bulk_channel.hpp"

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

namespace {

const std::string& key() {
  static const std::string k = grace::bulk_channel_key("fuzz-job-secret-0123");
  return k;
}

void handshake(const uint8_t* data, size_t size, size_t piece) {
  grace::bulk_handshake hs(grace::bulk_kind::replica, key(), std::string(16, 's'));
  std::string out;
  for (size_t at = 0; at < size && hs.current() == grace::bulk_handshake::state::reading; at += piece)
    hs.feed(reinterpret_cast<const char*>(data + at), std::min(piece, size - at), out);
  if (out.size() > 34 + 128) __builtin_trap();  // the gate never says more than its OK or one error
}

void signature(const uint8_t* data, size_t size) {
  static const grace::checkpoint_key k = grace::make_checkpoint_key(std::string(32, 'f'), "fuzz");
  auto j = nlohmann::json::parse(data, data + size, nullptr, false);
  if (j.is_discarded()) return;
  (void)grace::manifest_signature_problem(j, k);
  (void)grace::manifest_key_id(j);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  if (data[0] % 2 == 0)
    handshake(data + 1, size - 1, 1 + (data[0] >> 1) % 64);
  else
    signature(data + 1, size - 1);
  return 0;
}
