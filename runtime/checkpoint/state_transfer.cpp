#include "runtime/checkpoint/state_transfer.hpp"

#include "runtime/checkpoint/direct_io.hpp"
#include "runtime/net/tcp.hpp"

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstring>

namespace grace {

namespace {

constexpr char request_magic[4] = {'G', 'E', 'T', 'S'};
constexpr uint32_t max_header_bytes = 64u << 20;  ///< names, shapes, counters, blobs (1 MiB each at most)

std::string hex64(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

uint64_t xxh3_of(const void* p, size_t n) {
  xxh3_hash h;
  h.update(p, n);
  return h.digest();
}

nlohmann::json header_of(const donor_state& s) {
  nlohmann::json tensors = nlohmann::json::array();
  for (auto& t : s.tensors)
    tensors.push_back({{"name", t.name},
                       {"dtype", dtype_name(t.type)},
                       {"shape", t.shape},
                       {"bytes", t.bytes()},
                       {"xxh3", hex64(xxh3_of(t.data, t.bytes()))}});
  return {{"step", s.step}, {"counters", s.meta.counters}, {"metadata", s.meta.metadata}, {"tensors", tensors}};
}

bool send_reply(int fd, uint8_t code, const std::string& body) {
  std::string head;
  tcp::append_raw(head, code);
  tcp::append_raw(head, static_cast<uint32_t>(body.size()));
  return tcp::send_all(fd, head) && tcp::send_all(fd, body);
}

/// Why the donor's layout cannot go into `into` ("" when it can).
std::string layout_problem(const nlohmann::json& tensors, const std::vector<tensor_ref>& into) {
  if (!tensors.is_array() || tensors.size() != into.size())
    return "the donor has " + std::to_string(tensors.is_array() ? tensors.size() : 0) + " tensors, this worker " +
           std::to_string(into.size());
  for (size_t i = 0; i < into.size(); ++i) {
    auto& t = tensors[i];
    auto& mine = into[i];
    if (mine.memory != memory_kind::host) return "tensor '" + mine.name + "' is not in host memory";
    if (t.value("name", "") != mine.name) return "tensor " + std::to_string(i) + " is '" + t.value("name", "") + "' at the donor, '" + mine.name + "' here";
    if (t.value("dtype", "") != dtype_name(mine.type) || t.value("shape", std::vector<int64_t>{}) != mine.shape ||
        t.value("bytes", uint64_t(0)) != mine.bytes())
      return "tensor '" + mine.name + "' differs in dtype or shape from the donor's";
  }
  return {};
}

}  // namespace

result<std::unique_ptr<state_server>> state_server::start(const std::string& address, const std::string& token,
                                                          std::chrono::milliseconds io_timeout) {
  std::unique_ptr<state_server> s(new state_server());
  s->io_timeout_ = io_timeout;
  bulk_config c;
  c.kind = bulk_kind::state;
  c.address = address;
  c.token = token;
  c.io_timeout = io_timeout;
  c.on_refused = [](const std::string& why) { spdlog::warn("state server: a connection was refused: {}", why); };
  auto* raw = s.get();
  auto server = bulk_server::start(c, [raw](int fd, int stop_fd) { raw->handle(fd, stop_fd); });
  if (!server) return error{server.err().code, "state server: " + server.err().message};
  s->server_ = std::move(server.value());
  return s;
}

state_server::~state_server() {
  disarm();         // a transfer in flight still reads the tensors: it ends first
  server_.reset();  // joins the serving thread
}

void state_server::arm(donor_state s) {
  {
    std::lock_guard<std::mutex> g(m_);
    armed_ = std::move(s);
  }
  cv_.notify_all();
}

void state_server::disarm() {
  std::unique_lock<std::mutex> g(m_);
  // No new transfer starts; the ones in flight hold a pointer into armed_,
  // which goes only after the last of them ended.
  disarming_ = true;
  cv_.notify_all();
  cv_.wait(g, [&] { return in_flight_ == 0; });
  armed_.reset();
  disarming_ = false;
}

uint64_t state_server::served() const {
  std::lock_guard<std::mutex> g(m_);
  return served_;
}

const donor_state* state_server::begin_serving(uint64_t round, uint64_t step, std::string& why) {
  std::unique_lock<std::mutex> g(m_);
  auto matches = [&] { return !disarming_ && armed_ && armed_->round == round && armed_->step == step; };
  if (!cv_.wait_for(g, io_timeout_, matches)) {
    why = armed_ && !disarming_ ? "this worker serves round " + std::to_string(armed_->round) + " step " + std::to_string(armed_->step) +
                       ", not round " + std::to_string(round) + " step " + std::to_string(step)
                 : "this worker serves no state (round " + std::to_string(round) + " step " + std::to_string(step) +
                       " was asked for)";
    return nullptr;
  }
  ++in_flight_;
  return &*armed_;
}

void state_server::end_serving() {
  {
    std::lock_guard<std::mutex> g(m_);
    --in_flight_;
    ++served_;
  }
  cv_.notify_all();
}

void state_server::handle(int fd, int stop_fd) {
  (void)stop_fd;  // every wait here is bounded by the I/O timeout
  char magic[4];
  uint64_t round = 0, step = 0;
  if (!tcp::recv_all(fd, magic, 4) || std::memcmp(magic, request_magic, 4) != 0 || !tcp::recv_raw(fd, round) ||
      !tcp::recv_raw(fd, step)) {
    send_reply(fd, 1, "not a state request");
    return;
  }
  std::string why;
  const donor_state* s = begin_serving(round, step, why);
  if (!s) {
    send_reply(fd, 1, why);
    return;
  }
  // A receiver that goes away mid-transfer only ends this connection.
  bool ok = send_reply(fd, 0, header_of(*s).dump());
  for (size_t i = 0; ok && i < s->tensors.size(); ++i)
    ok = tcp::send_all(fd, static_cast<const char*>(s->tensors[i].data), s->tensors[i].bytes());
  end_serving();
}

result<fetched_state> fetch_state(const std::string& endpoint, const std::string& token, uint64_t round, uint64_t step,
                                  const std::vector<tensor_ref>& into, std::chrono::milliseconds timeout) {
  auto conn = bulk_connect(endpoint, bulk_kind::state, token, timeout);
  if (!conn) return conn.err();
  const int fd = conn.value().fd;
  std::string req(request_magic, 4);
  tcp::append_raw(req, round);
  tcp::append_raw(req, step);
  uint8_t code = 0;
  uint32_t len = 0;
  auto lost = [&](const char* what) {
    return error{errc::disconnected, std::string("state transfer from ") + endpoint + ": " + what};
  };
  if (!tcp::send_all(fd, req) || !tcp::recv_raw(fd, code) || !tcp::recv_raw(fd, len)) return lost("no answer");
  if (len > max_header_bytes) return lost("header too large");
  std::string body(len, '\0');
  if (!tcp::recv_all(fd, body.data(), len)) return lost("header cut short");
  if (code != 0) return error{errc::failed, "state transfer from " + endpoint + " refused: " + body};
  nlohmann::json h = nlohmann::json::parse(body, nullptr, false);
  if (h.is_discarded() || !h.is_object()) return lost("malformed header");
  if (h.value("step", uint64_t(0)) != step) return lost("header for another step");
  if (auto why = layout_problem(h["tensors"], into); !why.empty())
    return error{errc::invalid_input, "state transfer from " + endpoint + ": " + why};
  fetched_state out;
  for (size_t i = 0; i < into.size(); ++i) {
    auto& t = into[i];
    if (!tcp::recv_all(fd, t.data, t.bytes())) return lost(("tensor '" + t.name + "' cut short").c_str());
    if (hex64(xxh3_of(t.data, t.bytes())) != h["tensors"][i].value("xxh3", ""))
      return error{errc::failed, "state transfer from " + endpoint + ": tensor '" + t.name + "' fails its checksum"};
    out.bytes += t.bytes();
  }
  try {
    out.meta.counters = h.at("counters").get<std::map<std::string, int64_t>>();
    out.meta.metadata = h.at("metadata").get<std::map<std::string, std::string>>();
  } catch (const std::exception&) {
    return lost("malformed counters or metadata");
  }
  return out;
}

}  // namespace grace
