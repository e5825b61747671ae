#pragma once
/// Standard base64 (RFC 4648, with padding): how small byte strings (a
/// session's blobs) travel in the JSON manifest.

#include <optional>
#include <string>

namespace grace {

std::string base64_encode(const std::string& bytes);
/// nullopt when `text` is not canonical padded base64.
std::optional<std::string> base64_decode(const std::string& text);

}  // namespace grace
