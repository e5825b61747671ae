#pragma once
/// Small files written whole or not at all: the content goes to
/// `<file>.tmp`, which is then renamed over `file`, so a reader (another
/// process, the next run) sees the old content or the new, never half.
/// For the launcher's exit reason and coordinator location, the goodput
/// account and grace-chaos's reference cache. (Checkpoints have their own,
/// durable commit: runtime/checkpoint/checkpoint.hpp.)

#include "runtime/base/error.hpp"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>

namespace grace {

/// Writes `content` to `file` through a temporary and a rename.
status write_file_atomically(const std::filesystem::path& file, const std::string& content);
/// The same for `value` as indented JSON and a newline; text that is not
/// UTF-8 (a run id, a reason) is written with replacement characters.
status write_json_atomically(const std::filesystem::path& file, const nlohmann::json& value);

}  // namespace grace
