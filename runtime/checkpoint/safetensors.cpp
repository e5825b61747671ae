#include "runtime/checkpoint/safetensors.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include <nlohmann/json.hpp>

#include "runtime/base/posix_file.hpp"

namespace grace::safetensors {

namespace {

using json = nlohmann::json;

error bad(const std::string& label, const std::string& what) { return error{errc::invalid_input, label + ": " + what}; }

std::string sys_error(const std::string& label, const std::string& what, int err) {
  return label + ": " + what + ": " + std::strerror(err);
}

/// numel * element size, false on overflow or a negative dimension.
bool checked_size(const std::vector<int64_t>& shape, dtype t, uint64_t& out) {
  uint64_t n = dtype_size(t);
  for (auto d : shape) {
    if (d < 0) return false;
    auto ud = static_cast<uint64_t>(d);
    if (ud != 0 && n > UINT64_MAX / ud) return false;
    n *= ud;
  }
  out = n;
  return true;
}

/// pread until `n` bytes are read; false with errno set (0 on a short file).
bool pread_all(int fd, void* dst, size_t n, uint64_t off) {
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    ssize_t r = ::pread(fd, p, std::min<size_t>(n, 64u << 20), static_cast<off_t>(off));
    if (r < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (r == 0) {
      errno = 0;
      return false;
    }
    p += r;
    n -= static_cast<size_t>(r);
    off += static_cast<uint64_t>(r);
  }
  return true;
}

bool write_all(int fd, const void* src, size_t n) {
  auto* p = static_cast<const char*>(src);
  while (n > 0) {
    ssize_t r = ::write(fd, p, std::min<size_t>(n, 64u << 20));
    if (r < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

}  // namespace

result<encoded_header> encode_header(const std::vector<tensor_desc>& tensors,
                                     const std::map<std::string, std::string>& metadata) {
  encoded_header out;
  json j = json::object();
  std::set<std::string> seen;
  uint64_t off = 0;
  for (auto& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__")
      return error{errc::invalid_input, "tensor name '" + t.name + "' is not allowed"};
    if (!seen.insert(t.name).second) return error{errc::invalid_input, "duplicate tensor name '" + t.name + "'"};
    uint64_t expect = 0;
    if (!checked_size(t.shape, t.type, expect) || expect != t.bytes)
      return error{errc::invalid_input, "tensor '" + t.name + "': " + std::to_string(t.bytes) + " bytes do not match " +
                                            dtype_name(t.type) + " " + shape_str(t.shape)};
    tensor_entry e{t.name, t.type, t.shape, off, off + t.bytes};
    j[t.name] = {{"dtype", dtype_name(t.type)}, {"shape", t.shape}, {"data_offsets", {e.begin, e.end}}};
    out.tensors.push_back(std::move(e));
    off += t.bytes;
  }
  if (!metadata.empty()) j["__metadata__"] = metadata;
  std::string text = j.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  uint64_t n = text.size();
  out.bytes.resize(8);
  for (int i = 0; i < 8; ++i) out.bytes[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out.bytes += text;
  out.file_size = out.bytes.size() + off;
  return out;
}

result<header> parse_header(const std::string& label, const char* json_bytes, size_t n, uint64_t file_size) {
  if (file_size < 8 || n > file_size - 8)
    return bad(label, "header length " + std::to_string(n) + " exceeds file size " + std::to_string(file_size));
  json j = json::parse(json_bytes, json_bytes + n, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return bad(label, "header is not valid JSON");
  if (!j.is_object()) return bad(label, "header is not a JSON object");

  header h;
  h.data_start = 8 + n;
  h.file_size = file_size;
  const uint64_t data_size = file_size - h.data_start;

  for (auto& [key, v] : j.items()) {
    if (key == "__metadata__") {
      if (!v.is_object()) return bad(label, "__metadata__ is not an object");
      for (auto& [mk, mv] : v.items()) {
        if (!mv.is_string()) return bad(label, "__metadata__ value for '" + mk + "' is not a string");
        h.metadata[mk] = mv.get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor '" + key + "'";
    if (!v.is_object()) return bad(label, where + " is not an object");
    auto dt = v.find("dtype");
    auto sh = v.find("shape");
    auto of = v.find("data_offsets");
    if (dt == v.end() || !dt->is_string()) return bad(label, where + " has no dtype string");
    if (sh == v.end() || !sh->is_array()) return bad(label, where + " has no shape array");
    if (of == v.end() || !of->is_array() || of->size() != 2)
      return bad(label, where + " has no [begin, end] data_offsets");
    tensor_entry e;
    e.name = key;
    if (!parse_dtype(dt->get<std::string>(), e.type))
      return bad(label, where + " has unknown dtype '" + dt->get<std::string>() + "'");
    for (auto& d : *sh) {
      if (!d.is_number_unsigned()) return bad(label, where + " has a shape entry that is not a non-negative integer");
      auto ud = d.get<uint64_t>();
      if (ud > static_cast<uint64_t>(INT64_MAX)) return bad(label, where + " has an oversized dimension");
      e.shape.push_back(static_cast<int64_t>(ud));
    }
    if (!(*of)[0].is_number_unsigned() || !(*of)[1].is_number_unsigned())
      return bad(label, where + " has non-integer data_offsets");
    e.begin = (*of)[0].get<uint64_t>();
    e.end = (*of)[1].get<uint64_t>();
    if (e.begin > e.end) return bad(label, where + " has data_offsets begin > end");
    if (e.end > data_size)
      return bad(label, where + " data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                            "] exceed the data section (" + std::to_string(data_size) + " bytes; file truncated?)");
    uint64_t expect = 0;
    if (!checked_size(e.shape, e.type, expect) || expect != e.bytes())
      return bad(label, where + ": " + std::to_string(e.bytes()) + " bytes do not match " + dtype_name(e.type) + " " +
                            shape_str(e.shape));
    h.tensors.push_back(std::move(e));
  }
  std::sort(h.tensors.begin(), h.tensors.end(), [](const tensor_entry& a, const tensor_entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (size_t i = 1; i < h.tensors.size(); ++i) {
    auto& p = h.tensors[i - 1];
    auto& c = h.tensors[i];
    // Zero-sized tensors occupy no bytes and may share an offset.
    if (c.begin < p.end && c.bytes() > 0 && p.bytes() > 0)
      return bad(label, "tensors '" + p.name + "' and '" + c.name + "' overlap");
  }
  return h;
}

result<header> read_header(const std::filesystem::path& file) {
  const std::string label = file.string();
  fd_guard f;
  f.fd = open_no_follow(file, O_RDONLY);
  if (f.fd < 0) return invalid_file(file, open_failure(errno));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) return error{errc::invalid_input, sys_error(label, "cannot stat", errno)};
  if (!S_ISREG(st.st_mode)) return bad(label, "not a regular file");
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size < 8)
    return bad(label, "truncated: " + std::to_string(size) + " bytes, shorter than the 8-byte header length");
  unsigned char len[8];
  if (!pread_all(f.fd, len, 8, 0))
    return bad(label, errno ? std::string("read failed: ") + std::strerror(errno) : "truncated while reading");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  if (n > size - 8)
    return bad(label, "header length " + std::to_string(n) + " exceeds file size " + std::to_string(size));
  if (n > max_header_bytes)
    return bad(label, "header length " + std::to_string(n) + " exceeds the " + std::to_string(max_header_bytes) +
                          "-byte limit");
  std::string text(static_cast<size_t>(n), '\0');
  if (!pread_all(f.fd, text.data(), text.size(), 8))
    return bad(label, errno ? std::string("read failed: ") + std::strerror(errno) : "truncated while reading header");
  return parse_header(label, text.data(), text.size(), size);
}

status read_tensor(const std::filesystem::path& file, const header& h, const tensor_entry& entry, void* dst) {
  const std::string label = file.string();
  if (entry.bytes() == 0) return {};
  fd_guard f;
  f.fd = open_no_follow(file, O_RDONLY);
  if (f.fd < 0) return invalid_file(file, open_failure(errno));
  if (!pread_all(f.fd, dst, entry.bytes(), h.data_start + entry.begin)) {
    if (errno) return error{errc::invalid_input, sys_error(label, "read of '" + entry.name + "' failed", errno)};
    return bad(label, "truncated while reading '" + entry.name + "'");
  }
  return {};
}

status write_file(const std::filesystem::path& file, const std::vector<tensor_desc>& tensors,
                  const std::vector<const void*>& data, const std::map<std::string, std::string>& metadata) {
  if (data.size() != tensors.size())
    return error{errc::invalid_input, file.string() + ": " + std::to_string(tensors.size()) + " tensors but " +
                                          std::to_string(data.size()) + " buffers"};
  auto enc = encode_header(tensors, metadata);
  if (!enc) return error{enc.err().code, file.string() + ": " + enc.err().message};
  fd_guard f;
  f.fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (f.fd < 0) return error{errc::failed, sys_error(file.string(), "cannot create", errno)};
  if (!write_all(f.fd, enc->bytes.data(), enc->bytes.size()))
    return error{errc::failed, sys_error(file.string(), "write failed", errno)};
  for (size_t i = 0; i < tensors.size(); ++i)
    if (tensors[i].bytes && !write_all(f.fd, data[i], tensors[i].bytes))
      return error{errc::failed, sys_error(file.string(), "write failed", errno)};
  if (::fsync(f.fd) != 0) return error{errc::failed, sys_error(file.string(), "fsync failed", errno)};
  return {};
}

}  // namespace grace::safetensors
