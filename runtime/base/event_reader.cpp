#include "runtime/base/event_reader.hpp"

#include <fstream>

namespace grace {

bool parse_event(const std::string& line, event& e) {
  try {
    auto j = nlohmann::json::parse(line);
    if (!j.is_object()) return false;
    e.name = j.value("event", "");
    e.t_ns = j.value("t_ns", int64_t(0));
    e.pid = j.value("pid", int64_t(0));
    int64_t rank = j.value("rank", int64_t(-1));
    e.rank = rank >= 4294967295LL ? -1 : rank;
    e.incarnation = j.value("incarnation", int64_t(0));
    e.j = std::move(j);
    return !e.name.empty();
  } catch (...) {
    return false;
  }
}

std::vector<event> read_events(const std::filesystem::path& path, uint64_t& offset) {
  std::vector<event> out;
  std::ifstream f(path, std::ios::binary);
  if (!f) return out;
  f.seekg(static_cast<std::streamoff>(offset));
  std::string line;
  while (std::getline(f, line)) {
    if (f.eof()) break;  // incomplete last line: read it next time
    offset += line.size() + 1;
    event e;
    if (!line.empty() && parse_event(line, e)) out.push_back(std::move(e));
  }
  return out;
}

}  // namespace grace
