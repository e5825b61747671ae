// Tests for runtime/gloo_comm.{hpp,cpp}: real Gloo TCP over loopback, one
// thread per rank, Gloo's in-process HashStore for rendezvous.
//
// No check here is about speed. What ended a blocked call is read from its
// error: with a timeout far away, errc::disconnected says the abort or the
// lost peer did, errc::overloaded only the call's own timeout. Threads are
// ordered by events (a collective armed, keys published), never by sleeps.
#include <catch2/catch.hpp>

#include <gloo/common/error.h>
#include <gloo/rendezvous/hash_store.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "../bounded_call.hpp"
#include "runtime/base/cancel_token.hpp"
#include "runtime/train/gloo_comm.hpp"
#include "runtime/train/kernels.hpp"
#include "runtime/train/mlp.hpp"
#include "../skip.hpp"

using namespace grace;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

std::string fresh_prefix() {
  static std::atomic<int> n{0};
  return "test-" + std::to_string(n++);
}

/// Connects `world` ranks in parallel threads; fails the test on error.
std::vector<std::unique_ptr<gloo_comm>> connect_all(int world, std::chrono::milliseconds timeout = 10000ms) {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  const std::string prefix = fresh_prefix();
  std::vector<std::future<result<std::unique_ptr<gloo_comm>>>> fs;
  for (int r = 0; r < world; ++r)
    fs.push_back(std::async(std::launch::async,
                            [=] { return gloo_comm::connect(store, prefix, r, world, timeout, "127.0.0.1"); }));
  std::vector<std::unique_ptr<gloo_comm>> comms;
  for (auto& f : fs) {
    auto c = f.get();
    INFO((c.ok() ? std::string("ok") : c.err().what()));
    REQUIRE(c.ok());
    comms.push_back(std::move(c.value()));
  }
  return comms;
}

/// Runs fn(rank) on one thread per rank and joins them. Catch2 v2's
/// assertions are not thread-safe: `fn` records, the caller asserts.
void on_all_ranks(int world, const std::function<void(int)>& fn) {
  std::vector<std::thread> ts;
  for (int r = 0; r < world; ++r) ts.emplace_back(fn, r);
  for (auto& t : ts) t.join();
}

/// Waits for `event`. The bound only turns a hang into a failure: whatever
/// is awaited here happens within milliseconds unless the code is broken.
bool eventually(const std::function<bool()>& event) {
  const auto give_up = clock_type::now() + 30s;
  while (!event()) {
    if (clock_type::now() > give_up) return false;
    std::this_thread::yield();
  }
  return true;
}

}  // namespace

TEST_CASE("gloo_comm: connect rejects bad arguments", "[gloo]") {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  auto c = gloo_comm::connect(store, fresh_prefix(), 2, 2, 1000ms, "127.0.0.1");
  REQUIRE_FALSE(c.ok());
  CHECK(c.err().code == errc::invalid_input);
  c = gloo_comm::connect(nullptr, fresh_prefix(), 0, 1, 1000ms, "127.0.0.1");
  REQUIRE_FALSE(c.ok());
  CHECK(c.err().code == errc::invalid_input);
  c = gloo_comm::connect(store, fresh_prefix(), 0, 1, 0ms, "127.0.0.1");
  REQUIRE_FALSE(c.ok());
  CHECK(c.err().code == errc::invalid_input);
}

TEST_CASE("gloo_comm: world of one is a no-op", "[gloo]") {
  auto comms = connect_all(1);
  std::vector<float> v = {1, 2, 3};
  CHECK(comms[0]->allreduce_sum(v.data(), v.size()).ok());
  CHECK(comms[0]->broadcast(v.data(), v.size(), 0).ok());
  CHECK(comms[0]->barrier().ok());
  CHECK(v == std::vector<float>{1, 2, 3});
}

TEST_CASE("gloo_comm: allreduce sums exactly for several sizes", "[gloo]") {
  for (int world : {2, 3}) {
    auto comms = connect_all(world);
    for (size_t n : {size_t(0), size_t(1), size_t(7), size_t(1000), size_t(700001)}) {
      std::vector<std::vector<float>> data(world);
      std::vector<status> st(world);
      on_all_ranks(world, [&](int r) {
        data[r].resize(n);
        // Small integers and halves: every partial sum is exact.
        for (size_t i = 0; i < n; ++i) data[r][i] = float(r + 1) + 0.5f * float(i % 97);
        st[r] = comms[r]->allreduce_sum(data[r].data(), n);
      });
      for (int r = 0; r < world; ++r) {
        INFO("world " << world << " n " << n << " rank " << r);
        REQUIRE(st[r].ok());
        bool all_ok = true;
        for (size_t i = 0; i < n; ++i) {
          const float expect = float(world * (world + 1) / 2) + float(world) * 0.5f * float(i % 97);
          if (data[r][i] != expect) {
            all_ok = false;
            break;
          }
        }
        CHECK(all_ok);
      }
    }
  }
}

TEST_CASE("gloo_comm: allreduce is bit-identical across ranks and runs", "[gloo]") {
  const int world = 3;
  const size_t n = 300007;
  auto run = [&] {
    auto comms = connect_all(world);
    std::vector<std::vector<float>> data(world);
    std::vector<int> ok(world, 0);
    on_all_ranks(world, [&](int r) {
      data[r].resize(n);
      // Values whose sums round, so summation order shows in the bits.
      for (size_t i = 0; i < n; ++i) data[r][i] = kernels::normal(42, 1, uint64_t(r), i) * 1e3f;
      for (int rep = 0; rep < 3; ++rep) ok[r] += comms[r]->allreduce_sum(data[r].data(), n).ok();
    });
    for (int r = 0; r < world; ++r) REQUIRE(ok[r] == 3);
    for (int r = 1; r < world; ++r) CHECK(std::memcmp(data[0].data(), data[r].data(), n * sizeof(float)) == 0);
    return data[0];
  };
  const auto a = run();
  const auto b = run();
  CHECK(std::memcmp(a.data(), b.data(), n * sizeof(float)) == 0);
}

TEST_CASE("gloo_comm: broadcast and barrier", "[gloo]") {
  const int world = 3;
  auto comms = connect_all(world);
  std::vector<std::vector<float>> data(world);
  std::vector<status> st(world), bt(world);
  on_all_ranks(world, [&](int r) {
    data[r].assign(5000, float(r));
    st[r] = comms[r]->broadcast(data[r].data(), data[r].size(), 2);
    bt[r] = comms[r]->barrier();
  });
  for (int r = 0; r < world; ++r) {
    CHECK(st[r].ok());
    CHECK(bt[r].ok());
    CHECK(data[r] == std::vector<float>(5000, 2.0f));
  }
  float x = 0;
  auto bad = comms[0]->broadcast(&x, 1, 3);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.err().code == errc::invalid_input);
}

TEST_CASE("gloo_comm: abort from another thread unblocks a pending allreduce", "[gloo]") {
  // A long timeout: an error before it is the abort's (disconnected), one
  // at it the timeout's (overloaded).
  auto comms = connect_all(2, 30000ms);
  std::vector<float> v(100000, 1.0f);
  status st;
  std::thread trainer([&] { st = comms[0]->allreduce_sum(v.data(), v.size()); });  // rank 1 never joins
  // Abort once the collective is under way (its buffers armed), so the
  // abort takes the blocked path rather than the pre-check.
  const bool under_way = eventually([&] { return comms[0]->in_collective(); });
  comms[0]->abort();
  trainer.join();
  REQUIRE(under_way);
  REQUIRE_FALSE(st.ok());
  INFO(st.err().what());
  CHECK(st.err().code == errc::disconnected);
  CHECK(comms[0]->aborted());
  // Unusable afterwards, and says so at once.
  auto again = comms[0]->allreduce_sum(v.data(), v.size());
  REQUIRE_FALSE(again.ok());
  CHECK(again.err().code == errc::disconnected);
  comms[0]->abort();  // idempotent

  // The peer sees the connection go and fails too, not at its timeout.
  auto peer = comms[1]->allreduce_sum(v.data(), v.size());
  REQUIRE_FALSE(peer.ok());
  INFO(peer.err().what());
  CHECK(peer.err().code == errc::disconnected);
}

TEST_CASE("gloo_comm: a peer that goes away makes allreduce fail, not hang", "[gloo]") {
  // A long timeout: disconnected says the closed peer ended the call.
  auto comms = connect_all(2, 30000ms);
  std::vector<float> v(1000, 1.0f);
  status st;
  std::thread trainer([&] { st = comms[0]->allreduce_sum(v.data(), v.size()); });
  const bool under_way = eventually([&] { return comms[0]->in_collective(); });
  comms[1].reset();  // the peer's comm is destroyed: its sockets close
  trainer.join();
  REQUIRE(under_way);
  INFO((st.ok() ? std::string("ok") : st.err().what()));
  REQUIRE_FALSE(st.ok());
  CHECK(st.err().code == errc::disconnected);
  CHECK_FALSE(comms[0]->allreduce_sum(v.data(), v.size()).ok());
}

TEST_CASE("gloo_comm: a peer that never joins times out as overloaded", "[gloo]") {
  // overloaded is the timeout's mark: gloo_comm gives it only once the
  // call's own timeout elapsed (or Gloo reported one).
  auto comms = connect_all(2, 500ms);
  std::vector<float> v(10, 1.0f);
  auto st = comms[0]->allreduce_sum(v.data(), v.size());
  INFO((st.ok() ? std::string("ok") : st.err().what()));
  REQUIRE_FALSE(st.ok());
  CHECK(st.err().code == errc::overloaded);
  CHECK_FALSE(comms[0]->aborted());
}

TEST_CASE("gloo_comm: rendezvous times out when a rank is missing", "[gloo]") {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  auto c = gloo_comm::connect(store, fresh_prefix(), 0, 2, 300ms, "127.0.0.1");
  REQUIRE_FALSE(c.ok());
  INFO(c.err().what());
  CHECK(c.err().code == errc::overloaded);  // rank 1's key never came: the rendezvous's timeout
}

TEST_CASE("mlp + gloo_comm: 2-worker training is bit-identical across workers and runs", "[gloo][mlp]") {
  mlp_config cfg;
  cfg.input_dim = 16;
  cfg.hidden = {32, 32};
  cfg.classes = 5;
  cfg.global_batch = 32;
  cfg.seed = 3;
  const int world = 2;
  const uint64_t steps = 40;

  struct outcome {
    uint64_t checksum[2];
    float first_loss, last_loss;
  };
  auto run = [&] {
    auto comms = connect_all(world);
    outcome out{};
    std::vector<float> losses(steps);
    std::vector<uint64_t> ok(world, 0);
    on_all_ranks(world, [&](int r) {
      mlp m(cfg);
      for (uint64_t s = 0; s < steps; ++s) {
        float loss = m.compute_gradients(s, r, world);
        if (!comms[r]->allreduce_sum(m.grad_data(), m.grad_size()).ok()) return;
        if (!comms[r]->allreduce_sum(&loss, 1).ok()) return;
        m.apply_gradients();
        if (r == 0) losses[s] = loss;
        ++ok[r];
      }
      out.checksum[r] = m.weights_checksum();
    });
    for (int r = 0; r < world; ++r) REQUIRE(ok[r] == steps);
    out.first_loss = losses.front();
    out.last_loss = losses.back();
    return out;
  };
  const outcome a = run();
  CHECK(a.checksum[0] == a.checksum[1]);
  CHECK(a.last_loss < a.first_loss);
  const outcome b = run();
  CHECK(b.checksum[0] == a.checksum[0]);
  CHECK(b.checksum[1] == a.checksum[1]);

  // The allreduced loss is the global mean: it matches one worker on the
  // whole batch at step 0 (same initial weights).
  mlp single(cfg);
  CHECK(single.compute_gradients(0, 0, 1) == Approx(a.first_loss).epsilon(1e-5));
}

TEST_CASE("gloo_comm: allreduce equals the reference ring sum bit for bit", "[gloo]") {
  // The documented order: chunk c (of w near-equal chunks, the first n % w
  // one longer) is summed ((x_c + x_c+1) + x_c+2) + ... around the ring,
  // then copied to every rank. Values whose sums round, so the order shows
  // in the bits; sizes below the world size and not divisible by it.
  for (int world : {2, 3, 4}) {
    auto comms = connect_all(world);
    for (size_t n : {size_t(1), size_t(2), size_t(3), size_t(5), size_t(7), size_t(1001), size_t(65537)}) {
      std::vector<std::vector<float>> in(world), data(world);
      for (int r = 0; r < world; ++r) {
        in[r].resize(n);
        for (size_t i = 0; i < n; ++i) in[r][i] = kernels::normal(7, 1, uint64_t(r), i) * 1e3f;
      }
      std::vector<float> ref(n);
      const size_t base = n / size_t(world), rem = n % size_t(world);
      for (int c = 0; c < world; ++c) {
        const size_t off = size_t(c) * base + std::min(size_t(c), rem);
        const size_t len = base + (size_t(c) < rem ? 1 : 0);
        for (size_t i = off; i < off + len; ++i) {
          float acc = in[c][i];
          for (int k = 1; k < world; ++k) acc = acc + in[(c + k) % world][i];
          ref[i] = acc;
        }
      }
      std::vector<status> st(world);
      on_all_ranks(world, [&](int r) {
        data[r] = in[r];
        st[r] = comms[r]->allreduce_sum(data[r].data(), n);
      });
      for (int r = 0; r < world; ++r) {
        INFO("world " << world << " n " << n << " rank " << r);
        REQUIRE(st[r].ok());
        CHECK(std::memcmp(data[r].data(), ref.data(), n * sizeof(float)) == 0);
      }
    }
  }
}

TEST_CASE("gloo_comm: abort unblocks every collective waiting on a peer that never arrives", "[gloo]") {
  // Three ranks; rank 2 never calls. Ranks 0 and 1 block (the timeout a
  // minute away); abort() on each from another thread must end their calls
  // (disconnected), not the timeout (overloaded).
  enum class op { allreduce, broadcast, barrier };
  for (op o : {op::allreduce, op::broadcast, op::barrier}) {
    auto comms = connect_all(3, 60000ms);
    std::vector<std::vector<float>> v(2, std::vector<float>(10007, 1.0f));
    std::vector<status> st(2);
    std::vector<std::thread> ts;
    for (int r = 0; r < 2; ++r)
      ts.emplace_back([&, r] {
        switch (o) {
          case op::allreduce: st[r] = comms[r]->allreduce_sum(v[r].data(), v[r].size()); break;
          case op::broadcast: st[r] = comms[r]->broadcast(v[r].data(), v[r].size(), 2); break;
          case op::barrier: st[r] = comms[r]->barrier(); break;
        }
      });
    const bool under_way = eventually([&] { return comms[0]->in_collective() && comms[1]->in_collective(); });
    std::thread aborter([&] {
      comms[0]->abort();
      comms[1]->abort();
    });
    for (auto& t : ts) t.join();
    aborter.join();
    INFO("op " << int(o));
    REQUIRE(under_way);
    for (int r = 0; r < 2; ++r) {
      REQUIRE_FALSE(st[r].ok());
      INFO(st[r].err().what());
      CHECK(st[r].err().code == errc::disconnected);
    }
  }
}

namespace {

/// Rank 2's view of the rendezvous in the test below: the store works
/// until rank 2 published its pairs' addresses (under `pairs_key`); then it
/// dies before connecting any (every later store call fails, and its
/// listening sockets close with it).
class dying_store : public gloo::rendezvous::Store {
public:
  dying_store(std::shared_ptr<gloo::rendezvous::Store> inner, std::string pairs_key)
      : inner_(std::move(inner)), pairs_key_(std::move(pairs_key)) {}
  void set(const std::string& k, const std::vector<char>& v) override {
    check();
    inner_->set(k, v);
    if (k == pairs_key_) dead_ = true;
  }
  std::vector<char> get(const std::string& k) override {
    check();
    return inner_->get(k);
  }
  void wait(const std::vector<std::string>& keys) override {
    check();
    inner_->wait(keys);
  }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& t) override {
    check();
    inner_->wait(keys, t);
  }

private:
  void check() const {
    if (dead_) throw gloo::IoException("rank 2 died after publishing its pairs' addresses");
  }
  std::shared_ptr<gloo::rendezvous::Store> inner_;
  std::string pairs_key_;
  bool dead_ = false;  ///< only rank 2's connect thread uses this store
};

bool can_bind(const char* ipv4) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = 0;
  const bool ok = ::inet_pton(AF_INET, ipv4, &a.sin_addr) == 1 &&
                  ::bind(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

}  // namespace

TEST_CASE("gloo_comm: a cancelled rendezvous returns at once while a peer never connects its pairs", "[gloo]") {
  // Gloo pairs one listening and one connecting side by address, the lower
  // one listening. Rank 2 on 127.0.0.2 makes ranks 0 and 1 (127.0.0.1) the
  // listening side of their pairs with it: they wait for a connection that
  // never comes, whatever the ports.
  if (!can_bind("127.0.0.2")) GRACE_SKIP("127.0.0.2 is not a local address here (Linux routes 127/8 to lo)");
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  const std::string prefix = fresh_prefix();
  using call = grace::testing::bounded_call<result<std::unique_ptr<gloo_comm>>>;
  call r2([=] {
    return gloo_comm::connect(std::make_shared<dying_store>(store, prefix + "/2"), prefix, 2, 3, 60000ms, "127.0.0.2");
  });
  // Ranks 0 and 1 with Gloo's timeout an hour away: only the cancel can end
  // them (their helpers, abandoned, stay blocked: detached, like the calls,
  // so a failure here ends the test instead of hanging it).
  std::vector<std::shared_ptr<cancel_token>> tokens{std::make_shared<cancel_token>(), std::make_shared<cancel_token>()};
  std::vector<call> fs;
  for (int r = 0; r < 2; ++r)
    fs.emplace_back([=] { return gloo_comm::connect(store, prefix, r, 3, 3600000ms, "127.0.0.1", tokens[r]); });
  // Every rank published its pairs' addresses: 0 and 1 are connecting
  // pairs, rank 2 is gone without connecting any.
  store->wait({prefix + "/0", prefix + "/1", prefix + "/2"});
  auto gone = r2.get();
  REQUIRE(gone.has_value());
  CHECK_FALSE(gone->ok());
  for (auto& t : tokens) t->cancel();
  for (auto& f : fs) {
    INFO("a connect did not return after its cancel (it would wait an hour)");
    auto c = f.get();
    REQUIRE(c.has_value());
    REQUIRE_FALSE(c->ok());
    CHECK(c->err().code == errc::disconnected);
    CHECK(c->err().message.find("aborted during the rendezvous") != std::string::npos);
  }
}

TEST_CASE("gloo_comm: a rendezvous with a cancel token that is never raised connects normally", "[gloo]") {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  const std::string prefix = fresh_prefix();
  std::vector<std::future<result<std::unique_ptr<gloo_comm>>>> fs;
  for (int r = 0; r < 2; ++r)
    fs.push_back(std::async(std::launch::async, [=] {
      return gloo_comm::connect(store, prefix, r, 2, 10000ms, "127.0.0.1", std::make_shared<cancel_token>());
    }));
  std::vector<std::unique_ptr<gloo_comm>> comms;
  for (auto& f : fs) {
    auto c = f.get();
    REQUIRE(c.ok());
    comms.push_back(std::move(c.value()));
  }
  std::vector<float> a{1, 2}, b{10, 20};
  std::vector<status> st(2);
  on_all_ranks(2, [&](int r) { st[r] = comms[r]->allreduce_sum(r == 0 ? a.data() : b.data(), 2); });
  CHECK(st[0].ok());
  CHECK(st[1].ok());
  CHECK(a == std::vector<float>{11, 22});
  CHECK(b == a);
}
