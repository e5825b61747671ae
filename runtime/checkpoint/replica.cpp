#include "runtime/checkpoint/replica.hpp"

#include "runtime/base/events.hpp"
#include "runtime/net/job_token.hpp"
#include "runtime/checkpoint/manifest.hpp"
#include "runtime/net/tcp.hpp"

#include <gloo/rendezvous/store.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace grace {

using json = nlohmann::json;

uint32_t replica_holder(uint32_t rank, uint32_t world, uint32_t local_world) noexcept {
  if (world < 2) return rank;
  uint32_t stride = local_world > 0 && local_world < world && world % local_world == 0 ? local_world : 1;
  return (rank + world - stride) % world;
}

uint32_t replica_source(uint32_t rank, uint32_t world, uint32_t local_world) noexcept {
  if (world < 2) return rank;
  uint32_t stride = local_world > 0 && local_world < world && world % local_world == 0 ? local_world : 1;
  return (rank + stride) % world;
}

namespace {

constexpr uint32_t version = 3;
constexpr uint32_t max_layout = 16u << 20;
constexpr uint32_t max_state = 64u << 20;  ///< counters and blobs (each blob at most 1 MiB)

/// Never throws on a name that is not UTF-8 (the sender thread has no one
/// to report to): such bytes are replaced.
std::string state_to_text(const checkpoint_meta& m) {
  return rank_state_to_json({m.counters, m.metadata}).dump(-1, ' ', false, json::error_handler_t::replace);
}

result<rank_state> state_from_text(const std::string& text) {
  auto j = json::parse(text, nullptr, false);
  rank_state s;
  if (j.is_discarded()) return error{errc::invalid_input, "counters and blobs: not JSON"};
  if (auto why = rank_state_from_json(j, s); !why.empty()) return error{errc::invalid_input, "counters and blobs: " + why};
  return s;
}

std::string layout_to_text(const std::vector<tensor_ref>& layout) {
  json j = json::array();
  for (auto& t : layout)
    j.push_back({{"name", t.name},
                 {"dtype", dtype_name(t.type)},
                 {"shape", t.shape},
                 {"global_shape", t.global_shape},
                 {"offsets", t.offsets}});
  return j.dump();
}

/// The layout a transfer announces; an error says what does not add up.
result<std::vector<tensor_ref>> layout_from_text(const std::string& text) {
  try {
    std::vector<tensor_ref> out;
    for (auto& e : json::parse(text)) {
      tensor_ref t;
      t.name = e.at("name").get<std::string>();
      if (!parse_dtype(e.at("dtype").get<std::string>(), t.type))
        return error{errc::invalid_input, "unknown dtype for '" + t.name + "'"};
      t.shape = e.at("shape").get<std::vector<int64_t>>();
      t.global_shape = e.at("global_shape").get<std::vector<int64_t>>();
      t.offsets = e.at("offsets").get<std::vector<int64_t>>();
      for (auto d : t.shape)
        if (d < 0 || d > (int64_t(1) << 40)) return error{errc::invalid_input, "bad shape for '" + t.name + "'"};
      if (auto why = slice_problem(t); !why.empty()) return error{errc::invalid_input, why};
      out.push_back(std::move(t));
    }
    return out;
  } catch (const std::exception& e) {
    return error{errc::invalid_input, std::string("layout: ") + e.what()};
  }
}

/// Small writes (a header, the one-byte acknowledgement) go out at once:
/// with Nagle's algorithm and delayed acknowledgements each transfer would
/// wait tens of milliseconds for its acknowledgement.
void no_delay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

}  // namespace

replica_keeper::replica_keeper(config cfg) : cfg_(std::move(cfg)) {
  if (!cfg_.log) cfg_.log = spdlog::default_logger();
}

result<std::unique_ptr<replica_keeper>> replica_keeper::start(config cfg, const std::vector<tensor_ref>& layout) {
  std::unique_ptr<replica_keeper> k(new replica_keeper(std::move(cfg)));
  k->layout_text_ = layout_to_text(layout);
  try {
    for (size_t i = 0; i < kept_slots; ++i)
      k->kept_.push_back(kept_slot{kept_copy{0, std::make_shared<snapshot_buffers>(layout), {}}, false});
  } catch (const std::bad_alloc&) {
    return error{errc::failed, "replicas: cannot allocate " + std::to_string(kept_slots) + " kept copies"};
  }
  k->replicas_.resize(replica_slots + (k->cfg_.mirror ? 1 : 0));
  bulk_config bc;
  bc.kind = bulk_kind::replica;
  bc.address = k->cfg_.host;
  bc.token = k->cfg_.token;
  bc.io_timeout = k->cfg_.io_timeout;
  bc.backlog = 4;
  bc.on_refused = [log = k->cfg_.log](const std::string& why) { log->warn("replicas: a transfer was refused: {}", why); };
  auto server = bulk_server::start(std::move(bc), [p = k.get()](int fd, int stop_fd) {
    no_delay(fd);
    p->receive_from(fd, stop_fd);
  });
  if (!server) return error{errc::failed, "replicas: " + server.err().message};
  k->server_ = std::move(*server);
  auto ep = k->server_->endpoint();
  try {
    k->cfg_.kv->set(k->cfg_.prefix + "/replica/" + std::to_string(k->cfg_.rank), std::vector<char>(ep.begin(), ep.end()));
  } catch (const std::exception& e) {
    return error{errc::failed, std::string("replicas: cannot publish this rank's address: ") + e.what()};
  }
  k->sender_ = std::thread([p = k.get()] { p->send_loop(); });
  if (k->cfg_.mirror) k->mirrorer_ = std::thread([p = k.get()] { p->mirror_loop(); });
  return k;
}

replica_keeper::~replica_keeper() {
  {
    std::lock_guard<std::mutex> g(m_);
    stop_ = true;
  }
  cv_.notify_all();
  server_.reset();  // the receiver: woken, its transfer cut, joined
  if (sender_.joinable()) sender_.join();
  if (mirrorer_.joinable()) mirrorer_.join();
}

// ------------------------------------------------------------ own copies

status replica_keeper::keep(uint64_t step, const std::vector<tensor_ref>& tensors, checkpoint_meta meta) {
  std::unique_lock<std::mutex> lk(m_);
  if (frozen_) return {};
  if (!cv_.wait_for(lk, cfg_.io_timeout, [&] { return !in_flight_ || stop_; })) {
    if (!warned_slow_)
      cfg_.log->warn("replicas: the copy of a step is still on its way to rank {} after {} ms: step {} is not kept",
                     holder(), cfg_.io_timeout.count(), step);
    warned_slow_ = true;
    return {};
  }
  auto oldest = std::min_element(kept_.begin(), kept_.end(), [](auto& a, auto& b) {
    return std::make_pair(a.valid, a.copy.step) < std::make_pair(b.valid, b.copy.step);
  });
  oldest->valid = false;
  lk.unlock();
  // Only this thread writes kept copies, and the sender is idle: no lock
  // needed for the copy itself.
  auto st = oldest->copy.buffers->capture(tensors);
  lk.lock();
  if (!st) return st;
  if (frozen_) return {};  // reported without it: it stays invalid
  oldest->copy.step = step;
  oldest->copy.meta = std::move(meta);
  oldest->valid = true;
  to_push_ = static_cast<size_t>(oldest - kept_.begin());
  in_flight_ = true;
  lk.unlock();
  cv_.notify_all();
  return {};
}

replica_report replica_keeper::freeze() {
  std::lock_guard<std::mutex> g(m_);
  frozen_ = true;
  replica_report r;
  for (auto& s : kept_)
    if (s.valid) r.kept.push_back(s.copy.step);
  std::sort(r.kept.begin(), r.kept.end());
  if (cfg_.world >= 2) {
    r.of = source();
    for (auto& s : replicas_)
      if (s.whole) r.replica.push_back(s.step);
    std::sort(r.replica.begin(), r.replica.end());
  }
  return r;
}

std::optional<kept_copy> replica_keeper::kept(uint64_t step) const {
  std::lock_guard<std::mutex> g(m_);
  for (auto& s : kept_)
    if (s.valid && s.copy.step == step) return s.copy;
  return std::nullopt;
}

std::shared_ptr<snapshot_buffers> replica_keeper::replica(uint64_t step) const {
  std::lock_guard<std::mutex> g(m_);
  for (auto& s : replicas_)
    if (s.whole && s.step == step) return s.buffers;
  return nullptr;
}

std::optional<rank_state> replica_keeper::replica_state(uint64_t step) const {
  std::lock_guard<std::mutex> g(m_);
  for (auto& s : replicas_)
    if (s.whole && s.step == step) return s.state;
  return std::nullopt;
}

uint64_t replica_keeper::pushed() const {
  std::lock_guard<std::mutex> g(m_);
  return pushed_;
}

uint64_t replica_keeper::pushed_step() const {
  std::lock_guard<std::mutex> g(m_);
  return pushed_step_;
}

// ---------------------------------------------------------------- sender

void replica_keeper::send_loop() {
  std::unique_lock<std::mutex> lk(m_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || to_push_; });
    if (stop_) return;
    auto& slot = kept_[*to_push_];
    to_push_.reset();
    lk.unlock();
    bool ok = push(slot);  // keep() waits for in_flight_: the slot stays as it is
    lk.lock();
    if (ok) ++pushed_, pushed_step_ = slot.copy.step;
    in_flight_ = false;
    lk.unlock();
    cv_.notify_all();
    lk.lock();
  }
}

bool replica_keeper::connect_holder() {
  if (holder_.fd >= 0) return true;
  std::string ep;
  try {
    // Bounded by the I/O timeout, not the store's own (a minute): the
    // keeper's destructor waits for this thread.
    const auto key = cfg_.prefix + "/replica/" + std::to_string(holder());
    cfg_.kv->wait({key}, cfg_.io_timeout);
    auto v = cfg_.kv->get(key);
    ep.assign(v.begin(), v.end());
  } catch (const std::exception& e) {
    cfg_.log->warn("replicas: no address for rank {}: {}", holder(), e.what());
    return false;
  }
  auto conn = bulk_connect(ep, bulk_kind::replica, cfg_.token, cfg_.io_timeout);
  if (!conn) {
    cfg_.log->warn("replicas: rank {}: {}", holder(), conn.err().message);
    return false;
  }
  holder_ = std::move(*conn);
  no_delay(holder_.fd);
  return true;
}

bool replica_keeper::push(const kept_slot& s) {
  if (!connect_holder()) return false;
  std::string head;
  tcp::append_raw(head, version);
  tcp::append_raw(head, cfg_.rank);
  tcp::append_raw(head, s.copy.step);
  tcp::append_raw(head, static_cast<uint32_t>(layout_text_.size()));
  head += layout_text_;
  const auto state = state_to_text(s.copy.meta);
  tcp::append_raw(head, static_cast<uint32_t>(state.size()));
  head += state;
  tcp::append_raw(head, static_cast<uint64_t>(s.copy.buffers->total_bytes()));
  bool ok = tcp::send_all(holder_.fd, head);
  for (auto& t : s.copy.buffers->view())
    ok = ok && tcp::send_all(holder_.fd, static_cast<const char*>(t.data), t.bytes);
  char ack = 0;
  ok = ok && tcp::recv_all(holder_.fd, &ack, 1) && ack == 'A';
  if (!ok) {
    cfg_.log->warn("replicas: the copy of step {} did not reach rank {}", s.copy.step, holder());
    holder_.reset();
  }
  return ok;
}

// -------------------------------------------------------------- receiver

/// Transfers on one connection until it closes, fails, or this keeper
/// stops; a read waits at most the I/O timeout, then checks for a stop.
void replica_keeper::receive_from(int fd, int stop_fd) {
  for (;;) {
    pollfd p[2] = {{fd, POLLIN, 0}, {stop_fd, POLLIN, 0}};
    int n = ::poll(p, 2, -1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 || p[1].revents) return;
    if (!receive_one(fd)) return;
  }
}

/// The slot a transfer goes into: the oldest that is neither the newest
/// whole one nor being mirrored, emptied; nullopt once frozen.
std::optional<size_t> replica_keeper::begin_receive() {
  std::lock_guard<std::mutex> g(m_);
  if (frozen_ || stop_) return std::nullopt;
  auto age = [&](size_t i) { return std::make_pair(replicas_[i].whole, replicas_[i].step); };
  size_t newest = 0;
  for (size_t i = 1; i < replicas_.size(); ++i)
    if (age(i) > age(newest)) newest = i;
  std::optional<size_t> target;
  for (size_t i = 0; i < replicas_.size(); ++i)
    if (i != newest && !replicas_[i].pinned && (!target || age(i) < age(*target))) target = i;
  if (!target) return std::nullopt;  // not reached: a pinned slot comes with a third one
  replicas_[*target].whole = false;
  cv_.notify_all();  // a mirror waiting for a step this slot held gives up on it
  return target;
}

bool replica_keeper::receive_one(int fd) {
  uint32_t ver = 0, rank = 0, layout_len = 0;
  uint64_t step = 0, bytes = 0;
  if (!tcp::recv_raw(fd, ver) || ver != version) return false;
  if (!tcp::recv_raw(fd, rank) || !tcp::recv_raw(fd, step) || !tcp::recv_raw(fd, layout_len) || layout_len > max_layout)
    return false;
  if (rank != source()) {
    cfg_.log->warn("replicas: a transfer from rank {} was refused (this rank keeps rank {}'s)", rank, source());
    return false;
  }
  std::string layout_text(layout_len, '\0');
  uint32_t state_len = 0;
  if (!tcp::recv_all(fd, layout_text.data(), layout_len) || !tcp::recv_raw(fd, state_len)) return false;
  if (state_len > max_state) {
    cfg_.log->warn("replicas: rank {}'s transfer refused: {} bytes of counters and blobs, above {}", rank, state_len,
                   max_state);
    return false;
  }
  std::string state_text(state_len, '\0');
  if (!tcp::recv_all(fd, state_text.data(), state_len) || !tcp::recv_raw(fd, bytes)) return false;
  auto state = state_from_text(state_text);
  if (!state) {
    cfg_.log->warn("replicas: rank {}'s transfer refused: {}", rank, state.err().message);
    return false;
  }
  auto slot = begin_receive();
  if (!slot) return false;
  auto& r = replicas_[*slot];  // only this thread touches a slot that is not whole
  if (r.layout != layout_text || !r.buffers) {
    auto layout = layout_from_text(layout_text);
    if (!layout) {
      cfg_.log->warn("replicas: rank {}'s transfer refused: {}", rank, layout.err().message);
      return false;
    }
    try {
      r.buffers = std::make_shared<snapshot_buffers>(*layout);
    } catch (const std::bad_alloc&) {
      cfg_.log->warn("replicas: no memory for rank {}'s part ({} bytes)", rank, bytes);
      return false;
    }
    r.layout = layout_text;
  }
  if (bytes != r.buffers->total_bytes()) {
    cfg_.log->warn("replicas: rank {}'s transfer announces {} bytes, its layout {}", rank, bytes,
                   r.buffers->total_bytes());
    return false;
  }
  auto regions = r.buffers->regions();
  auto view = r.buffers->view();
  for (size_t i = 0; i < view.size(); ++i)
    if (!tcp::recv_all(fd, regions[i], view[i].bytes)) return false;
  {
    std::lock_guard<std::mutex> g(m_);
    if (frozen_) return false;  // reported without it
    r.step = step;
    r.state = std::move(*state);
    r.whole = true;
  }
  cv_.notify_all();  // a mirror request may wait for this step
  char ack = 'A';
  return tcp::send_all(fd, &ack, 1);
}

// ---------------------------------------------------------------- mirror

void replica_keeper::mirror(uint64_t step, checkpoint_meta meta, std::string tag) {
  if (!cfg_.mirror || cfg_.world < 2) return;
  {
    std::lock_guard<std::mutex> g(m_);
    mirror_req_ = mirror_request{step, std::move(meta), std::move(tag)};
  }
  cv_.notify_all();
}

uint64_t replica_keeper::mirrored_step() const {
  std::lock_guard<std::mutex> g(m_);
  return mirrored_;
}

/// The whole slot holding the requested step (under m_).
std::optional<size_t> replica_keeper::mirror_slot(const mirror_request& r) const {
  for (size_t i = 0; i < replicas_.size(); ++i)
    if (replicas_[i].whole && replicas_[i].step == r.step) return i;
  return std::nullopt;
}

/// Carries out mirror requests: waits until the requested step's replica
/// is whole, pins its slot, writes it, unpins. A request whose step was
/// passed by every replica held (the source skipped that copy) is dropped.
void replica_keeper::mirror_loop() {
  std::unique_lock<std::mutex> lk(m_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || (mirror_req_ && !frozen_); });
    if (stop_) return;
    auto slot = mirror_slot(*mirror_req_);
    if (!slot) {
      bool passed = std::all_of(replicas_.begin(), replicas_.end(),
                                [&](const replica_slot& s) { return s.whole && s.step > mirror_req_->step; });
      if (passed) {
        cfg_.log->warn("replicas: no whole replica of rank {}'s step {}: not mirrored", source(), mirror_req_->step);
        mirror_req_.reset();
        continue;
      }
      cv_.wait_for(lk, std::chrono::milliseconds(50));
      continue;
    }
    auto req = std::move(*mirror_req_);
    mirror_req_.reset();
    replicas_[*slot].pinned = true;
    lk.unlock();
    write_mirror(req, replicas_[*slot]);  // a pinned, whole slot: nobody writes it
    lk.lock();
    replicas_[*slot].pinned = false;
  }
}

/// The source's part of `r.step`, as the source wrote it, into the mirror
/// store (its own counters and blobs in the part description, as a part
/// written from a replica in a just-in-time save).
void replica_keeper::write_mirror(const mirror_request& r, const replica_slot& slot) {
  const auto t0 = std::chrono::steady_clock::now();
  auto meta = r.meta;
  meta.counters = slot.state.counters;
  meta.metadata = slot.state.metadata;
  auto st = cfg_.mirror->save_part(slot.buffers->view(), meta, r.tag, source(), true, {}, true);
  if (!st) {
    // A partial file would hold memory (tmpfs) for nothing: a full /dev/shm
    // is also NCCL's problem.
    std::error_code ec;
    std::filesystem::remove(cfg_.mirror->parts_path(r.step, r.tag) /
                                rank_file_name(source(), static_cast<uint32_t>(meta.world_size), ".safetensors"),
                            ec);
    cfg_.log->warn("replicas: rank {}'s part of step {} not mirrored to {}: {}", source(), r.step,
                   cfg_.mirror->dir().string(), st.err().message);
    return;
  }
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  uint64_t drop = 0;
  {
    std::lock_guard<std::mutex> g(m_);
    if (r.step != mirrored_) mirrored_prev_ = std::exchange(mirrored_, r.step);
    drop = mirrored_prev_;
  }
  // Only this source's older mirrors: the other local ranks' share the directory.
  if (drop > 0) cfg_.mirror->remove_rank_parts_up_to(drop - 1, source(), static_cast<uint32_t>(meta.world_size));
  emit_event("replica_mirrored", {{"step", r.step}, {"source_rank", source()}, {"bytes", st->total_bytes}, {"ns", ns}});
}

}  // namespace grace
