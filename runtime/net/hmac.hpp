#pragma once
/// HMAC-SHA256 and SHA-256 (OpenSSL's one-shot functions): the job secret's
/// derived keys and the checkpoint signatures use them.

#include <string>

namespace grace {

/// The 32-byte HMAC-SHA256 of `data` under `key`.
std::string hmac_sha256(const std::string& key, const std::string& data);
/// The 32-byte SHA-256 of `data`.
std::string sha256(const std::string& data);
/// Lowercase hex of raw bytes.
std::string to_hex(const std::string& raw);

}  // namespace grace
