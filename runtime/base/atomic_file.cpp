#include "runtime/base/atomic_file.hpp"

#include <fstream>

namespace grace {

status write_file_atomically(const std::filesystem::path& file, const std::string& content) {
  auto tmp = file;
  tmp += ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << content;
    f.flush();
    if (!f) {
      std::error_code ignored;
      std::filesystem::remove(tmp, ignored);
      return error{errc::failed, "cannot write " + tmp.string()};
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, file, ec);
  if (ec) return error{errc::failed, "cannot rename " + tmp.string() + " to " + file.string() + ": " + ec.message()};
  return {};
}

status write_json_atomically(const std::filesystem::path& file, const nlohmann::json& value) {
  return write_file_atomically(file, value.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

}  // namespace grace
