#include "runtime/gloo_comm.hpp"

#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/attr.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/pair.h>

#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <vector>

namespace grace {

namespace {

/// How abort() unblocks a pending collective in this Gloo version
/// (Debian 0.0~git20220518):
///
/// - A ring allreduce blocks in tcp::UnboundBuffer::waitRecv/waitSend on
///   buffers the algorithm creates internally, so abortWaitRecv() is out of
///   reach.
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
    return x->sin6_port == y->sin6_port &&
           std::memcmp(&x->sin6_addr, &y->sin6_addr, sizeof(x->sin6_addr)) == 0;
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
    if (::getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &len) != 0)
      continue; // not a socket
    sockaddr_storage peer{};
    socklen_t plen = sizeof(peer);
    if (::getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &plen) != 0)
      continue; // not connected (e.g. a listener)
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

void sum_floats(void* out, const void* a, const void* b, size_t n) {
  auto o = static_cast<float*>(out);
  auto x = static_cast<const float*>(a);
  auto y = static_cast<const float*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
}

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
  if (timed_out || mentions_timeout(what))
    return error{errc::overloaded, std::string(op) + ": timed out: " + what};
  return error{errc::disconnected, std::string(op) + ": " + what};
}

} // namespace

result<std::unique_ptr<gloo_comm>> gloo_comm::connect(
    std::shared_ptr<gloo::rendezvous::Store> store, std::string prefix, int rank, int size,
    std::chrono::milliseconds timeout, std::string iface_host) {
  if (!store) return error{errc::invalid_input, "gloo_comm: no rendezvous store given"};
  if (size < 1 || rank < 0 || rank >= size)
    return error{errc::invalid_input, "gloo_comm: rank " + std::to_string(rank) +
                                          " is out of range for world size " + std::to_string(size)};
  if (timeout.count() <= 0)
    return error{errc::invalid_input,
                 "gloo_comm: timeout must be positive (Gloo treats 0 as 'wait forever')"};

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
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
    ctx->setTimeout(timeout);
    ctx->connectFullMesh(*c->prefix_store_, c->device_);
    c->context_ = std::move(ctx);
  } catch (...) {
    const bool timed_out = std::chrono::steady_clock::now() - start >= timeout;
    return classify(("connect (prefix '" + prefix + "', " + iface_host + ")").c_str(), false,
                    timed_out);
  }
  return c;
}

gloo_comm::~gloo_comm() {
  // Pairs close their sockets on destruction; peers see EOF and fail.
  context_.reset();
  device_.reset();
}

void gloo_comm::abort() {
  if (aborted_.exchange(true, std::memory_order_acq_rel)) return;
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
    return error{errc::disconnected,
                 std::string(op) + ": communicator failed earlier; connect a new one"};
  return status::success();
}

error gloo_comm::map_exception(const char* op, std::chrono::steady_clock::time_point start) const {
  const bool timed_out = std::chrono::steady_clock::now() - start >= timeout_;
  return classify(op, aborted(), timed_out);
}

status gloo_comm::allreduce_sum(float* data, size_t n) {
  if (auto st = precheck("allreduce"); !st) return st;
  if (n == 0 || size_ == 1) return status::success();
  const auto start = std::chrono::steady_clock::now();
  try {
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(data, n);
    opts.setReduceFunction(&sum_floats);
    opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    opts.setTag(next_tag_++);
    opts.setTimeout(timeout_);
    gloo::allreduce(opts);
  } catch (...) {
    failed_.store(true, std::memory_order_release);
    return map_exception("allreduce", start);
  }
  return status::success();
}

status gloo_comm::broadcast(float* data, size_t n, int root) {
  if (auto st = precheck("broadcast"); !st) return st;
  if (root < 0 || root >= size_)
    return error{errc::invalid_input, "broadcast: root " + std::to_string(root) +
                                          " is out of range for world size " +
                                          std::to_string(size_)};
  if (n == 0 || size_ == 1) return status::success();
  const auto start = std::chrono::steady_clock::now();
  try {
    gloo::BroadcastOptions opts(context_);
    opts.setOutput(data, n);
    opts.setRoot(root);
    opts.setTag(next_tag_++);
    opts.setTimeout(timeout_);
    gloo::broadcast(opts);
  } catch (...) {
    failed_.store(true, std::memory_order_release);
    return map_exception("broadcast", start);
  }
  return status::success();
}

status gloo_comm::barrier() {
  if (auto st = precheck("barrier"); !st) return st;
  if (size_ == 1) return status::success();
  const auto start = std::chrono::steady_clock::now();
  try {
    gloo::BarrierOptions opts(context_);
    opts.setTag(next_tag_++);
    opts.setTimeout(timeout_);
    gloo::barrier(opts);
  } catch (...) {
    failed_.store(true, std::memory_order_release);
    return map_exception("barrier", start);
  }
  return status::success();
}

} // namespace grace
