#include "runtime/checkpoint/checkpoint_fetch.hpp"

#include "runtime/net/bulk_channel.hpp"
#include "runtime/net/tcp.hpp"

#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/net/job_token.hpp"
#include "runtime/checkpoint/manifest.hpp"
#include "runtime/base/posix_file.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>

namespace grace {

namespace fs = std::filesystem;

namespace {

constexpr size_t max_line = 512;

error failed(std::string m) { return error{errc::failed, std::move(m)}; }

using tcp::send_all;

bool send_str(int fd, const std::string& s) { return send_all(fd, s.data(), s.size()); }

/// One '\n'-terminated line (without it), at most max_line bytes.
result<std::string> read_line(int fd) {
  std::string s;
  char c;
  while (s.size() <= max_line) {
    ssize_t r = ::recv(fd, &c, 1, 0);
    if (r <= 0) return failed(r == 0 ? "connection closed" : std::string("read: ") + std::strerror(errno));
    if (c == '\n') return s;
    s.push_back(c);
  }
  return failed("line longer than " + std::to_string(max_line) + " bytes");
}

/// Reads "OK <n>" (or "ERR ..."); returns n.
result<uint64_t> read_ok(int fd, const std::string& what) {
  auto l = read_line(fd);
  if (!l) return failed(what + ": " + l.err().message);
  if (l->rfind("OK ", 0) != 0)
    return failed(what + ": " + (l->rfind("ERR ", 0) == 0 ? l->substr(4) : "bad reply '" + *l + "'"));
  char* end = nullptr;
  auto n = std::strtoull(l->c_str() + 3, &end, 10);
  if (*end != '\0') return failed(what + ": bad reply '" + *l + "'");
  return static_cast<uint64_t>(n);
}

bool plain_name(const std::string& n) {
  return !n.empty() && n != "." && n != ".." && n.find('/') == std::string::npos && n.size() < 256;
}

std::vector<std::string> words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> w;
  for (std::string s; in >> s;) w.push_back(s);
  return w;
}

std::optional<uint64_t> to_step(const std::string& s) {
  if (s.empty() || s.size() > 19 || s.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return std::stoull(s);
}

/// Opens a connection and sends one request line.
result<int> request(const std::string& ep, const std::string& token, const std::string& what,
                    std::chrono::milliseconds timeout) {
  auto conn = bulk_connect(ep, bulk_kind::checkpoint, token, timeout);
  if (!conn) return conn.err();
  if (!send_str(conn->fd, what + "\n")) return error{errc::disconnected, "send to " + ep + " failed"};
  return conn->release();
}

}  // namespace

// ------------------------------------------------------------------ server

result<std::unique_ptr<checkpoint_server>> checkpoint_server::start(fs::path dir, std::string address,
                                                                    std::string token,
                                                                    std::chrono::milliseconds io_timeout,
                                                                    fs::path memory_dir,
                                                                    std::optional<checkpoint_key> key) {
  std::unique_ptr<checkpoint_server> s(new checkpoint_server());
  s->key_ = std::move(key);
  s->dir_ = std::move(dir);
  s->memory_dir_ = std::move(memory_dir);
  bulk_config c;
  c.kind = bulk_kind::checkpoint;
  c.on_refused = [](const std::string& why) { spdlog::warn("checkpoint server: a connection was refused: {}", why); };
  c.address = std::move(address);
  c.token = std::move(token);
  c.io_timeout = io_timeout;
  auto server = bulk_server::start(std::move(c), [p = s.get()](int fd, int) { p->answer(fd); });
  if (!server) return failed("checkpoint server: " + server.err().message);
  s->server_ = std::move(*server);
  return s;
}

void checkpoint_server::answer(int fd) {
  auto line = read_line(fd);
  if (!line) return;
  auto w = words(*line);
  auto err = [&](const std::string& m) { send_str(fd, "ERR " + m + "\n"); };
  if (w.empty()) return err("not a checkpoint request");
  checkpoint_store store(dir_);
  store.set_signing_key(key_);
  if (w[0] == "LIST" && w.size() == 1) {
    std::string body;
    size_t n = 0;
    for (auto& c : store.list())
      if (c.valid && !c.temporary && !c.set_aside) body += std::to_string(c.step) + "\n", ++n;
    send_str(fd, "OK " + std::to_string(n) + "\n" + body);
    return;
  }
  if ((w[0] == "PREPARED" || w[0] == "MIRRORED") && w.size() == 1) {
    std::vector<checkpoint_store::prepared_part> parts;
    if (w[0] == "PREPARED")
      parts = store.prepared_parts();
    else if (!memory_dir_.empty())
      parts = checkpoint_store(memory_dir_, 0).prepared_parts();
    std::string body;
    for (auto& p : parts)
      body += std::to_string(p.step) + " " + p.file + (w[0] == "MIRRORED" ? " " + p.xxh3 : std::string()) + "\n";
    send_str(fd, "OK " + std::to_string(parts.size()) + "\n" + body);
    return;
  }
  auto step = w.size() >= 2 ? to_step(w[1]) : std::nullopt;
  if (!step) return err("bad request '" + *line + "'");
  auto sdir = store.step_path(*step);
  if (w[0] == "FILES" && w.size() == 2) {
    std::string body;
    size_t n = 0;
    std::error_code ec;
    for (auto it = fs::directory_iterator(sdir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
      if (!it->is_regular_file()) continue;
      body += std::to_string(it->file_size()) + " " + it->path().filename().string() + "\n";
      ++n;
    }
    if (ec || n == 0) return err("no checkpoint step " + std::to_string(*step));
    send_str(fd, "OK " + std::to_string(n) + "\n" + body);
    return;
  }
  if (w[0] == "PARTS" && w.size() == 3) {
    auto descs = store.part_descriptions(*step, w[2]);
    if (!descs) return err(descs.err().message);
    std::string body = "OK " + std::to_string(descs->size()) + "\n";
    for (auto& d : *descs) body += std::to_string(d.size()) + "\n" + d;
    send_str(fd, body);
    return;
  }
  if (w[0] == "GET" && w.size() == 3 && plain_name(w[2])) {
    int f = open_no_follow(sdir / w[2], O_RDONLY);
    if (f < 0) return err("cannot open " + w[2] + " of step " + std::to_string(*step) + ": " + std::strerror(errno));
    fd_guard g{f};
    struct stat st {};
    ::fstat(f, &st);
    if (!S_ISREG(st.st_mode)) return err(w[2] + " is not a file");
    if (!send_str(fd, "OK " + std::to_string(st.st_size) + "\n")) return;
    off_t off = 0;
    while (off < st.st_size)
      if (::sendfile(fd, f, &off, static_cast<size_t>(st.st_size - off)) <= 0) return;
    return;
  }
  err("bad request '" + *line + "'");
}

// ------------------------------------------------------------------ client

std::optional<fetch_plan> plan_fetch(uint64_t local_newest, const std::vector<peer_checkpoints>& peers) {
  std::optional<fetch_plan> best;
  for (auto& p : peers)
    for (auto s : p.steps)
      if (s > local_newest && (!best || s > best->step)) best = fetch_plan{s, p.endpoint};
  return best;
}

result<std::vector<uint64_t>> list_remote(const std::string& ep, const std::string& token,
                                          std::chrono::milliseconds timeout) {
  auto fd = request(ep, token, "LIST", timeout);
  if (!fd) return fd.err();
  fd_guard g{*fd};
  auto n = read_ok(*fd, "LIST from " + ep);
  if (!n) return n.err();
  std::vector<uint64_t> steps;
  for (uint64_t i = 0; i < *n; ++i) {
    auto l = read_line(*fd);
    auto s = l ? to_step(*l) : std::nullopt;
    if (!s) return failed("LIST from " + ep + ": bad step line");
    steps.push_back(*s);
  }
  return steps;
}

namespace {
/// A list of "<step> <part>[ <xxh3>]" lines: PREPARED, or MIRRORED (with
/// the checksum).
result<std::vector<remote_part>> list_parts_of(const std::string& verb, const std::string& ep,
                                               const std::string& token, std::chrono::milliseconds timeout) {
  auto fd = request(ep, token, verb, timeout);
  if (!fd) return fd.err();
  fd_guard g{*fd};
  auto n = read_ok(*fd, verb + " from " + ep);
  if (!n) return n.err();
  const size_t fields = verb == "MIRRORED" ? 3 : 2;
  std::vector<remote_part> out;
  for (uint64_t i = 0; i < *n; ++i) {
    auto l = read_line(*fd);
    if (!l) return l.err();
    auto w = words(*l);
    auto s = w.size() == fields ? to_step(w[0]) : std::nullopt;
    if (!s || !plain_name(w[1]) || (fields == 3 && (w[2].empty() || w[2].size() > 32)))
      return failed(verb + " from " + ep + ": bad line '" + *l + "'");
    out.push_back({*s, w[1], fields == 3 ? w[2] : std::string()});
  }
  return out;
}
}  // namespace

result<std::vector<std::pair<uint64_t, std::string>>> list_prepared_remote(const std::string& ep,
                                                                         const std::string& token,
                                                                         std::chrono::milliseconds timeout) {
  auto parts = list_parts_of("PREPARED", ep, token, timeout);
  if (!parts) return parts.err();
  std::vector<std::pair<uint64_t, std::string>> out;
  for (auto& p : *parts) out.emplace_back(p.step, p.file);
  return out;
}

result<std::vector<remote_part>> list_mirrored_remote(const std::string& ep, const std::string& token,
                                                      std::chrono::milliseconds timeout) {
  return list_parts_of("MIRRORED", ep, token, timeout);
}

result<std::string> get_text_remote(const std::string& ep, const std::string& token, uint64_t step,
                                    const std::string& name, std::chrono::milliseconds timeout, uint64_t limit) {
  auto fd = request(ep, token, "GET " + std::to_string(step) + " " + name, timeout);
  if (!fd) return fd.err();
  fd_guard g{*fd};
  auto size = read_ok(*fd, "GET " + name + " from " + ep);
  if (!size) return size.err();
  if (*size > limit) return failed(name + " from " + ep + ": " + std::to_string(*size) + " bytes, too large");
  std::string text(static_cast<size_t>(*size), '\0');
  if (!tcp::recv_all(*fd, text.data(), text.size()))
    return error{errc::disconnected, name + " from " + ep + ": transfer cut"};
  return text;
}

result<std::vector<std::string>> list_parts_remote(const std::string& ep, const std::string& token, uint64_t step,
                                                   const std::string& tag, std::chrono::milliseconds timeout) {
  auto fd = request(ep, token, "PARTS " + std::to_string(step) + " " + tag, timeout);
  if (!fd) return fd.err();
  fd_guard g{*fd};
  auto n = read_ok(*fd, "PARTS from " + ep);
  if (!n) return n.err();
  std::vector<std::string> out;
  for (uint64_t i = 0; i < *n; ++i) {
    auto l = read_line(*fd);
    auto size = l ? to_step(*l) : std::nullopt;
    if (!size || *size > (uint64_t(16) << 20)) return failed("PARTS from " + ep + ": bad size line");
    std::string d(static_cast<size_t>(*size), '\0');
    if (!tcp::recv_all(*fd, d.data(), d.size()))
      return error{errc::disconnected, "PARTS from " + ep + ": cut after " + std::to_string(i) + " descriptions"};
    out.push_back(std::move(d));
  }
  return out;
}

namespace {

/// GET one file into `to` (fsynced). Returns its size.
result<uint64_t> get_file(const std::string& ep, const std::string& token, uint64_t step, const std::string& name,
                          uint64_t expected, const fs::path& to, std::chrono::milliseconds timeout) {
  auto fd = request(ep, token, "GET " + std::to_string(step) + " " + name, timeout);
  if (!fd) return fd.err();
  fd_guard g{*fd};
  auto size = read_ok(*fd, "GET " + name + " from " + ep);
  if (!size) return size.err();
  if (*size != expected)
    return failed(name + " from " + ep + ": size " + std::to_string(*size) + " != listed " + std::to_string(expected));
  int out = ::open(to.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out < 0) return failed("cannot create " + to.string() + ": " + std::strerror(errno));
  fd_guard o{out};
  std::vector<char> buf(1 << 20);
  uint64_t left = *size;
  while (left > 0) {
    ssize_t r = ::recv(*fd, buf.data(), std::min<uint64_t>(left, buf.size()), 0);
    if (r <= 0)
      return error{errc::disconnected, name + " from " + ep + ": transfer cut after " + std::to_string(*size - left) +
                                           " of " + std::to_string(*size) + " bytes"};
    if (::write(out, buf.data(), static_cast<size_t>(r)) != r)
      return failed("write " + to.string() + ": " + std::strerror(errno));
    left -= static_cast<uint64_t>(r);
  }
  if (::fsync(out) != 0) return failed("fsync " + to.string() + ": " + std::strerror(errno));
  return *size;
}

void sync_dir_best_effort(const fs::path& d) {
  fd_guard f(::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (f.fd >= 0) ::fsync(f.fd);
}

/// FILES: the peer's step's files with their sizes.
result<std::vector<std::pair<uint64_t, std::string>>> files_of(const std::string& ep, const std::string& token,
                                                              uint64_t step, std::chrono::milliseconds timeout) {
  auto fd = request(ep, token, "FILES " + std::to_string(step), timeout);
  if (!fd) return fd.err();
  std::vector<std::pair<uint64_t, std::string>> files;
  fd_guard g{*fd};
  auto n = read_ok(*fd, "FILES from " + ep);
  if (!n) return n.err();
  for (uint64_t i = 0; i < *n; ++i) {
    auto l = read_line(*fd);
    if (!l) return l.err();
    auto w = words(*l);
    auto sz = w.size() == 2 ? to_step(w[0]) : std::nullopt;
    if (!sz || !plain_name(w[1])) return failed("FILES from " + ep + ": bad line '" + *l + "'");
    files.emplace_back(*sz, w[1]);
  }
  return files;
}

/// Lists the step's files and copies each into `tmp`. Returns total bytes.
result<uint64_t> copy_step(const std::string& ep, const std::string& token, uint64_t step, const fs::path& tmp,
                           std::chrono::milliseconds timeout, bool with_parts) {
  auto files = files_of(ep, token, step, timeout);
  if (!files) return files.err();
  uint64_t total = 0;
  for (auto& [size, name] : *files) {
    if (!with_parts && name.rfind("rank-", 0) == 0 && is_shard(name)) continue;
    auto r = get_file(ep, token, step, name, size, tmp / name, timeout);
    if (!r) return r.err();
    total += *r;
  }
  sync_dir_best_effort(tmp);
  return total;
}

}  // namespace

result<uint64_t> fetch_remote(const std::string& ep, const std::string& token, uint64_t step, const fs::path& dir,
                              std::chrono::milliseconds timeout, bool with_parts, const checkpoint_key* key) {
  checkpoint_store store(dir);
  if (key) store.set_signing_key(*key);
  auto target = store.step_path(step);
  std::error_code ec;
  if (fs::exists(target, ec) && store.verify(target)) return uint64_t{0};
  fs::create_directories(dir, ec);
  auto tmp = dir / (".tmp-step-" + std::to_string(step) + "-" + std::to_string(::getpid()) + "-fetch");
  fs::remove_all(tmp, ec);
  if (!fs::create_directory(tmp, ec)) return failed("cannot create " + tmp.string() + ": " + ec.message());
  auto bytes = copy_step(ep, token, step, tmp, timeout, with_parts);
  status ok = bytes ? store.verify(tmp) : status{bytes.err()};
  if (!ok) {
    fs::remove_all(tmp, ec);
    return error{ok.err().code, "fetching step " + std::to_string(step) + " from " + ep + ": " + ok.err().message};
  }
  if (fs::exists(target, ec)) {  // there but damaged: set aside, never deleted
    auto aside = target;
    aside += ".corrupt-fetch-" + std::to_string(::getpid());
    fs::rename(target, aside, ec);
  }
  fs::rename(tmp, target, ec);
  if (ec) {
    fs::remove_all(tmp, ec);
    return failed("cannot commit fetched " + target.string() + ": " + ec.message());
  }
  sync_dir_best_effort(dir);
  return *bytes;
}

result<uint64_t> fetch_part(const std::string& ep, const std::string& token, uint64_t step, const std::string& name,
                            const fs::path& dir, std::chrono::milliseconds timeout) {
  checkpoint_store store(dir);
  auto absent = store.absent_parts(step);
  if (!absent) return absent.err();
  auto it = std::find_if(absent->begin(), absent->end(), [&](const checkpoint_file& f) { return f.name == name; });
  if (it == absent->end()) return error{errc::invalid_input, name + " is not a part step " + std::to_string(step) + " lacks in " + dir.string()};
  // A temporary the store's cleaner recognizes (a crashed fetch leaves no litter).
  auto tmp = dir / (".tmp-step-" + std::to_string(step) + "-" + std::to_string(::getpid()) + "-part");
  std::error_code ec;
  fs::remove_all(tmp, ec);
  if (!fs::create_directory(tmp, ec)) return failed("cannot create " + tmp.string() + ": " + ec.message());
  auto got = get_file(ep, token, step, name, it->size, tmp / name, timeout);
  status ok = got ? store.adopt_part(step, tmp / name) : status{got.err()};
  fs::remove_all(tmp, ec);
  if (!ok)
    return error{ok.err().code, "fetching " + name + " of step " + std::to_string(step) + " from " + ep + ": " +
                                    ok.err().message};
  return *got;
}

result<std::set<std::string>> list_files_remote(const std::string& ep, const std::string& token, uint64_t step,
                                                std::chrono::milliseconds timeout) {
  auto files = files_of(ep, token, step, timeout);
  if (!files) return files.err();
  std::set<std::string> out;
  for (auto& f : *files) out.insert(f.second);
  return out;
}

}  // namespace grace
