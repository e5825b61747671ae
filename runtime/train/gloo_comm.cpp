#include "runtime/train/gloo_comm.hpp"

#include "runtime/base/cancel_token.hpp"

#include <gloo/common/error.h>
#include <gloo/context.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/attr.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/unbound_buffer.h>

#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

namespace grace {

namespace {

/// How abort() unblocks a pending collective in this Gloo version
/// (Debian 0.0~git20220518):
///
/// - The collectives here are written on unbound buffers we create and
///   register (arm()), so abort() calls their abortWaitRecv()/abortWaitSend():
///   the blocked wait returns false at once. The flag is sticky, so an abort
///   between arm() and the wait is not lost. (gloo::allreduce & co. create
///   their buffers internally, out of reach: a rank blocked in them could
///   hang. Short timed waits are no way out either: a waitRecv/waitSend
///   that times out signals an exception to every pair of the context.)
/// - So the peers fail promptly too (they may be blocked on us), the pairs'
///   sockets are shut down. Why this way:
/// - transport::Pair::close() only closes the socket: local waiters are not
///   woken and would sit until the timeout.
/// - tcp::Pair::signalExceptionExternal / tcp::Context::signalException do
///   exactly the right thing but are protected, and the Debian package cannot
///   even include their headers (gloo/transport/tcp/pair.h includes
///   gloo/common/memory.h, which the package does not ship).
/// - What works through public API only: shutdown(2) the pair's connected
///   socket. The Gloo device thread then sees EOF on it, and its
///   "Connection closed by peer" path (Pair::signalException) hands an
///   IoException to every unbound buffer with a pending send/recv on that
///   pair - the blocked wait throws at once - and closes the pair, so peers
///   see EOF and fail too. Later operations on the pair rethrow.
///   The socket is found by its local address (transport::Pair::address(),
///   set from getsockname() once connected) among this process's fds;
///   shutdown() never frees the fd number, so the pair still owns and closes
///   it. Caveat: another socket in this process bound to the same local
///   ip:port (possible only for connect()-side sockets to a different
///   destination, i.e. another communicator in the same process) would be
///   shut down too; with one communicator per process this cannot happen.
bool same_local_address(const sockaddr_storage& a, const sockaddr_storage& b) {
  if (a.ss_family != b.ss_family) return false;
  if (a.ss_family == AF_INET) {
    auto x = reinterpret_cast<const sockaddr_in*>(&a);
    auto y = reinterpret_cast<const sockaddr_in*>(&b);
    return x->sin_port == y->sin_port && x->sin_addr.s_addr == y->sin_addr.s_addr;
  }
  if (a.ss_family == AF_INET6) {
    auto x = reinterpret_cast<const sockaddr_in6*>(&a);
    auto y = reinterpret_cast<const sockaddr_in6*>(&b);
    return x->sin6_port == y->sin6_port && std::memcmp(&x->sin6_addr, &y->sin6_addr, sizeof(x->sin6_addr)) == 0;
  }
  return false;
}

/// shutdown(SHUT_RDWR) every connected TCP socket of this process whose local
/// address is in `addrs`. Returns how many were shut down.
int shutdown_sockets_bound_to(const std::vector<sockaddr_storage>& addrs) {
  if (addrs.empty()) return 0;
  int count = 0;
  DIR* dir = ::opendir("/proc/self/fd");
  if (!dir) return 0;
  const int dir_fd = ::dirfd(dir);
  while (dirent* e = ::readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dir_fd) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    if (::getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &len) != 0) continue;  // not a socket
    sockaddr_storage peer{};
    socklen_t plen = sizeof(peer);
    if (::getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &plen) != 0)
      continue;  // not connected (e.g. a listener)
    for (const auto& a : addrs) {
      if (same_local_address(local, a)) {
        if (::shutdown(static_cast<int>(fd), SHUT_RDWR) == 0) ++count;
        break;
      }
    }
  }
  ::closedir(dir);
  return count;
}

/// A write to a socket the peer (or our own abort) has shut down raises
/// SIGPIPE, and Gloo writes with plain writev(): without this a dead peer
/// kills the process instead of producing an IoException. Only replaces the
/// default disposition; a handler the application installed is kept.
void ignore_sigpipe_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction old {};
    if (::sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) {
      struct sigaction ign {};
      ign.sa_handler = SIG_IGN;
      sigemptyset(&ign.sa_mask);
      ::sigaction(SIGPIPE, &ign, nullptr);
    }
  });
}

/// Gloo reports a timeout only in an IoException's text ("Timed out ..."):
/// the one place Grace reads a message's words, at the backend wrapper, to
/// turn a third-party exception into a typed error (overloaded, not
/// disconnected); nothing beyond this wrapper ever matches error text.
bool mentions_timeout(const std::string& what) {
  return what.find("imed out") != std::string::npos || what.find("imeout") != std::string::npos;
}

/// Classifies the exception in flight. `aborted` wins: the failure is ours.
error classify(const char* op, bool aborted, bool timed_out) {
  std::string what;
  try {
    throw;
  } catch (const gloo::IoException& e) {
    what = e.what();
  } catch (const gloo::EnforceNotMet& e) {
    what = e.what();
  } catch (const gloo::Exception& e) {
    what = e.what();
  } catch (const std::exception& e) {
    return error{errc::failed, std::string(op) + ": " + e.what()};
  } catch (...) {
    return error{errc::failed, std::string(op) + ": unknown exception"};
  }
  if (aborted) return error{errc::disconnected, std::string(op) + ": aborted (" + what + ")"};
  if (timed_out || mentions_timeout(what)) return error{errc::overloaded, std::string(op) + ": timed out: " + what};
  return error{errc::disconnected, std::string(op) + ": " + what};
}

/// A store the rendezvous helper thread uses: once the caller abandoned the
/// attempt it refuses every call, so the helper never touches the real store
/// (whose owner may be gone by then).
class abandonable_store : public gloo::rendezvous::Store {
public:
  explicit abandonable_store(std::shared_ptr<gloo::rendezvous::Store> s) : inner_(std::move(s)) {}
  void abandon() { abandoned_.store(true, std::memory_order_release); }
  void set(const std::string& key, const std::vector<char>& data) override {
    check();
    inner_->set(key, data);
  }
  std::vector<char> get(const std::string& key) override {
    check();
    return inner_->get(key);
  }
  void wait(const std::vector<std::string>& keys) override {
    check();
    inner_->wait(keys);
  }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    check();
    inner_->wait(keys, timeout);
  }

private:
  void check() const {
    if (abandoned_.load(std::memory_order_acquire)) throw gloo::IoException("rendezvous abandoned");
  }
  std::shared_ptr<gloo::rendezvous::Store> inner_;
  std::atomic<bool> abandoned_{false};
};

/// The caller stopped waiting for the mesh (its cancel token was raised).
struct cancelled_error {};

/// One mesh setup on a helper thread, waited for with a cancel token.
struct mesh_attempt {
  std::mutex m;
  bool done = false;
  std::shared_ptr<gloo::rendezvous::Context> context;
  std::exception_ptr error;
};

}  // namespace

result<std::unique_ptr<gloo_comm>> gloo_comm::connect(std::shared_ptr<gloo::rendezvous::Store> store,
                                                      std::string prefix, int rank, int size,
                                                      std::chrono::milliseconds timeout, std::string iface_host,
                                                      std::shared_ptr<cancel_token> cancel) {
  if (!store) return error{errc::invalid_input, "gloo_comm: no rendezvous store given"};
  if (size < 1 || rank < 0 || rank >= size)
    return error{errc::invalid_input,
                 "gloo_comm: rank " + std::to_string(rank) + " is out of range for world size " + std::to_string(size)};
  if (timeout.count() <= 0)
    return error{errc::invalid_input, "gloo_comm: timeout must be positive (Gloo treats 0 as 'wait forever')"};

  ignore_sigpipe_once();
  std::unique_ptr<gloo_comm> c(new gloo_comm());
  c->rank_ = rank;
  c->size_ = size;
  c->timeout_ = timeout;
  c->store_ = std::move(store);
  const auto start = std::chrono::steady_clock::now();
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = iface_host;
    c->device_ = gloo::transport::tcp::CreateDevice(attr);
    c->prefix_store_ = std::make_unique<gloo::rendezvous::PrefixStore>(prefix, *c->store_);
    if (cancel) {
      c->context_ = c->connect_abandonable(prefix, timeout, cancel);
    } else {
      auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
      ctx->setTimeout(timeout);
      ctx->connectFullMesh(*c->prefix_store_, c->device_);
      c->context_ = std::move(ctx);
    }
  } catch (const cancelled_error&) {
    return error{errc::disconnected, "connect (prefix '" + prefix + "', " + iface_host +
                                         "): aborted during the rendezvous (a peer was lost)"};
  } catch (...) {
    const bool timed_out = std::chrono::steady_clock::now() - start >= timeout;
    return classify(("connect (prefix '" + prefix + "', " + iface_host + ")").c_str(), false, timed_out);
  }
  return c;
}

std::shared_ptr<gloo::Context> gloo_comm::connect_abandonable(const std::string& prefix,
                                                              std::chrono::milliseconds timeout,
                                                              std::shared_ptr<cancel_token> token) {
  auto guarded = std::make_shared<abandonable_store>(store_);
  auto attempt = std::make_shared<mesh_attempt>();
  // The helper owns everything it touches (store wrapper, device, context,
  // token) and only signals through `attempt` and the token.
  std::thread([attempt, guarded, dev = device_, prefix, rank = rank_, size = size_, timeout, token]() mutable {
    std::shared_ptr<gloo::rendezvous::Context> ctx;
    std::exception_ptr err;
    try {
      gloo::rendezvous::PrefixStore ps(prefix, *guarded);
      ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
      ctx->setTimeout(timeout);
      ctx->connectFullMesh(ps, dev);
    } catch (...) {
      err = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> g(attempt->m);
      attempt->context = std::move(ctx);
      attempt->error = err;
      attempt->done = true;
    }
    // Not under attempt->m: the waiter takes it inside the token's lock.
    token->notify();
  }).detach();
  auto done = [&] {
    std::lock_guard<std::mutex> g(attempt->m);
    return attempt->done;
  };
  // Gloo's own timeout ends the helper; a second past it is only a backstop.
  token->wait_until(done, std::chrono::steady_clock::now() + timeout + std::chrono::seconds(1));
  std::lock_guard<std::mutex> g(attempt->m);
  if (!attempt->done) {
    guarded->abandon();
    throw cancelled_error();
  }
  if (attempt->error) std::rethrow_exception(attempt->error);
  return attempt->context;
}

namespace {

/// Buffers of failed collectives, kept for the life of the process. Each
/// holds Gloo's transport context, and with it the device thread, which may
/// still signal them (a pair seeing EOF after an abort calls their
/// signalException): destroying them while that thread runs is a use after
/// free (ThreadSanitizer showed the destructor racing signalException).
/// A failed communicator is followed by a restart, so this stays small.
void keep_forever(std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>>& bufs) {
  static std::mutex m;
  static auto* kept = new std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>>();
  std::lock_guard<std::mutex> g(m);
  for (auto& b : bufs) kept->push_back(std::move(b));
  bufs.clear();
}

}  // namespace

gloo_comm::~gloo_comm() {
  // Pairs close their sockets on destruction; peers see EOF and fail.
  context_.reset();
  device_.reset();
  keep_forever(graveyard_);
}

void gloo_comm::abort() {
  if (aborted_.exchange(true, std::memory_order_acq_rel)) return;
  {
    // Wake the running collective's waits (see the note at the top).
    std::lock_guard<std::mutex> g(active_m_);
    for (auto* b : active_) {
      b->abortWaitRecv();
      b->abortWaitSend();
    }
  }
  if (!context_) return;
  std::vector<sockaddr_storage> addrs;
  for (int i = 0; i < size_; ++i) {
    if (i == rank_) continue;
    try {
      auto& p = context_->getPair(i);
      if (!p) continue;
      auto* a = dynamic_cast<const gloo::transport::tcp::Address*>(&p->address());
      if (a) addrs.push_back(a->getSockaddr());
    } catch (...) {
      // Best effort: a pair that already failed has nothing left to wake.
    }
  }
  shutdown_sockets_bound_to(addrs);
}

status gloo_comm::precheck(const char* op) const {
  if (aborted()) return error{errc::disconnected, std::string(op) + ": communicator was aborted"};
  if (failed_.load(std::memory_order_acquire))
    return error{errc::disconnected, std::string(op) + ": communicator failed earlier; connect a new one"};
  return status::success();
}

error gloo_comm::map_exception(const char* op, std::chrono::steady_clock::time_point start) const {
  const bool timed_out = std::chrono::steady_clock::now() - start >= timeout_;
  return classify(op, aborted(), timed_out);
}

bool gloo_comm::arm(std::initializer_list<gloo::transport::UnboundBuffer*> bufs) {
  std::lock_guard<std::mutex> g(active_m_);
  if (aborted()) return false;
  active_.assign(bufs.begin(), bufs.end());
  return true;
}

bool gloo_comm::in_collective() const {
  std::lock_guard<std::mutex> g(active_m_);
  return !active_.empty();
}

void gloo_comm::release(std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>>& bufs, bool failed) {
  {
    std::lock_guard<std::mutex> g(active_m_);
    active_.clear();
  }
  if (failed)
    for (auto& b : bufs) graveyard_.push_back(std::move(b));
  bufs.clear();
}

error gloo_comm::fail(const char* op, std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>>& bufs,
                      std::chrono::steady_clock::time_point start) {
  failed_.store(true, std::memory_order_release);
  release(bufs, true);
  close_pairs();
  return map_exception(op, start);
}

void gloo_comm::close_pairs() {
  // An aborted wait returns while the device thread may still be reading a
  // late message into the collective's memory (the caller's tensor or
  // scratch_). Pair::close() takes the pair's lock, so it waits for a read
  // in progress, and unregisters the socket: once it returns, nothing of
  // this context writes into our memory again.
  if (!context_) return;
  for (int i = 0; i < size_; ++i) {
    if (i == rank_) continue;
    try {
      if (auto& p = context_->getPair(i)) p->close();
    } catch (...) {
      // A pair that failed earlier is closed already.
    }
  }
}

namespace {
std::chrono::milliseconds left_until(std::chrono::steady_clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  // Never 0 or negative: Gloo reads kUnsetTimeout (-1) as "the context's".
  return std::max(left, std::chrono::milliseconds(1));
}
}  // namespace

void gloo_comm::wait_recv(gloo::transport::UnboundBuffer& b, std::chrono::steady_clock::time_point deadline) {
  if (!b.waitRecv(nullptr, left_until(deadline)))
    throw gloo::IoException("communicator aborted while waiting to receive");
}

void gloo_comm::wait_send(gloo::transport::UnboundBuffer& b, std::chrono::steady_clock::time_point deadline) {
  if (!b.waitSend(nullptr, left_until(deadline))) throw gloo::IoException("communicator aborted while waiting to send");
}

namespace {
/// Slot of step `step` of the collective with tag `tag`: both ends compute
/// the same one, and no two collectives of one comm share a slot.
uint64_t slot_of(uint32_t tag, uint32_t step) { return (uint64_t(tag) << 24) | step; }
}  // namespace

status gloo_comm::allreduce_sum(float* data, size_t n) {
  if (auto st = precheck("allreduce"); !st) return st;
  if (n == 0 || size_ == 1) return status::success();
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + timeout_;
  const int w = size_, r = rank_;
  const int right = (r + 1) % w, left = (r + w - 1) % w;
  const size_t base = n / size_t(w), rem = n % size_t(w);
  auto mod = [w](int x) { return ((x % w) + w) % w; };
  // Chunk c: [off(c), off(c) + len(c)); the first `rem` chunks get one more.
  auto off = [=](int c) { return size_t(c) * base + std::min(size_t(c), rem); };
  auto len = [=](int c) { return base + (size_t(c) < rem ? 1 : 0); };
  const size_t max_len = base + (rem ? 1 : 0);
  if (scratch_.size() < max_len) scratch_.resize(max_len);
  const uint32_t tag = next_tag_++;
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> bufs;
  try {
    bufs.push_back(context_->createUnboundBuffer(data, n * sizeof(float)));
    bufs.push_back(context_->createUnboundBuffer(scratch_.data(), max_len * sizeof(float)));
    auto& dbuf = *bufs[0];
    auto& sbuf = *bufs[1];
    if (!arm({&dbuf, &sbuf})) throw gloo::IoException("communicator aborted");
    // Reduce-scatter: at step s rank r passes chunk r-s to the right and
    // adds chunk r-s-1 from the left (incoming + own). Chunk c starts at
    // rank c and is complete at rank c-1 after w-1 steps: one fixed order.
    for (int s = 0; s < w - 1; ++s) {
      const int sc = mod(r - s), rc = mod(r - s - 1);
      if (len(sc)) dbuf.send(right, slot_of(tag, uint32_t(s)), off(sc) * sizeof(float), len(sc) * sizeof(float));
      if (len(rc)) {
        sbuf.recv(left, slot_of(tag, uint32_t(s)), 0, len(rc) * sizeof(float));
        wait_recv(sbuf, deadline);
        float* own = data + off(rc);
        const float* in = scratch_.data();
        for (size_t i = 0, m = len(rc); i < m; ++i) own[i] = in[i] + own[i];
      }
      if (len(sc)) wait_send(dbuf, deadline);
    }
    // Allgather: rank r owns chunk r+1; pass complete chunks around the
    // ring (copies only, so every rank ends with the same bits).
    for (int s = 0; s < w - 1; ++s) {
      const int sc = mod(r + 1 - s), rc = mod(r - s);
      const uint32_t step = uint32_t(w - 1 + s);
      if (len(sc)) dbuf.send(right, slot_of(tag, step), off(sc) * sizeof(float), len(sc) * sizeof(float));
      if (len(rc)) {
        dbuf.recv(left, slot_of(tag, step), off(rc) * sizeof(float), len(rc) * sizeof(float));
        wait_recv(dbuf, deadline);
      }
      if (len(sc)) wait_send(dbuf, deadline);
    }
  } catch (...) {
    return fail("allreduce", bufs, start);
  }
  release(bufs, false);
  return status::success();
}

status gloo_comm::broadcast(float* data, size_t n, int root) {
  if (auto st = precheck("broadcast"); !st) return st;
  if (root < 0 || root >= size_)
    return error{errc::invalid_input, "broadcast: root " + std::to_string(root) + " is out of range for world size " +
                                          std::to_string(size_)};
  if (n == 0 || size_ == 1) return status::success();
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + timeout_;
  const uint32_t tag = next_tag_++;
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> bufs;
  try {
    bufs.push_back(context_->createUnboundBuffer(data, n * sizeof(float)));
    auto& b = *bufs[0];
    if (!arm({&b})) throw gloo::IoException("communicator aborted");
    if (rank_ == root) {
      for (int p = 0; p < size_; ++p)
        if (p != root) b.send(p, slot_of(tag, 0));
      for (int p = 0; p < size_ - 1; ++p) wait_send(b, deadline);
    } else {
      b.recv(root, slot_of(tag, 0));
      wait_recv(b, deadline);
    }
  } catch (...) {
    return fail("broadcast", bufs, start);
  }
  release(bufs, false);
  return status::success();
}

status gloo_comm::barrier() {
  if (auto st = precheck("barrier"); !st) return st;
  if (size_ == 1) return status::success();
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + timeout_;
  const uint32_t tag = next_tag_++;
  // Everyone reports to rank 0, which releases everyone once all arrived.
  if (tokens_.size() < size_t(size_)) tokens_.assign(size_t(size_), 0);
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> bufs;
  try {
    bufs.push_back(context_->createUnboundBuffer(tokens_.data(), tokens_.size()));
    auto& b = *bufs[0];
    if (!arm({&b})) throw gloo::IoException("communicator aborted");
    if (rank_ == 0) {
      for (int p = 1; p < size_; ++p) b.recv(p, slot_of(tag, 0), size_t(p), 1);
      for (int p = 1; p < size_; ++p) wait_recv(b, deadline);
      for (int p = 1; p < size_; ++p) b.send(p, slot_of(tag, 1), 0, 1);
      for (int p = 1; p < size_; ++p) wait_send(b, deadline);
    } else {
      b.send(0, slot_of(tag, 0), size_t(rank_), 1);
      b.recv(0, slot_of(tag, 1), 0, 1);
      wait_send(b, deadline);
      wait_recv(b, deadline);
    }
  } catch (...) {
    return fail("barrier", bufs, start);
  }
  release(bufs, false);
  return status::success();
}

}  // namespace grace
