// Tests for runtime/gloo_comm.{hpp,cpp}: real Gloo TCP over loopback, one
// thread per rank, Gloo's in-process HashStore for rendezvous.
#include <catch2/catch.hpp>

#include <gloo/rendezvous/hash_store.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "runtime/cancel_token.hpp"
#include "runtime/gloo_comm.hpp"
#include "runtime/kernels.hpp"
#include "runtime/mlp.hpp"

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
  // A long timeout, so only the abort can end the wait promptly.
  auto comms = connect_all(2, 30000ms);
  std::vector<float> v(100000, 1.0f);
  std::atomic<bool> started{false};
  clock_type::time_point aborted_at;
  status st;
  std::thread trainer([&] {
    started = true;
    st = comms[0]->allreduce_sum(v.data(), v.size());  // rank 1 never joins
  });
  while (!started) std::this_thread::yield();
  // Real sockets: give the trainer time to block inside Gloo, so the abort
  // exercises the blocked path rather than the pre-check.
  std::this_thread::sleep_for(300ms);
  aborted_at = clock_type::now();
  comms[0]->abort();
  trainer.join();
  const auto took = clock_type::now() - aborted_at;
  INFO("returned " << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms after abort");
  CHECK(took < 2s);
  REQUIRE_FALSE(st.ok());
  CHECK(st.err().code == errc::disconnected);
  CHECK(comms[0]->aborted());
  // Unusable afterwards, and says so at once.
  auto again = comms[0]->allreduce_sum(v.data(), v.size());
  REQUIRE_FALSE(again.ok());
  CHECK(again.err().code == errc::disconnected);
  comms[0]->abort();  // idempotent

  // The peer sees the connection go and fails too (instead of hanging).
  const auto t0 = clock_type::now();
  auto peer = comms[1]->allreduce_sum(v.data(), v.size());
  CHECK(clock_type::now() - t0 < 2s);
  REQUIRE_FALSE(peer.ok());
  CHECK(peer.err().code == errc::disconnected);
}

TEST_CASE("gloo_comm: a peer that goes away makes allreduce fail, not hang", "[gloo]") {
  auto comms = connect_all(2, 5000ms);
  std::vector<float> v(1000, 1.0f);
  status st;
  std::atomic<bool> started{false};
  std::thread trainer([&] {
    started = true;
    st = comms[0]->allreduce_sum(v.data(), v.size());
  });
  while (!started) std::this_thread::yield();
  std::this_thread::sleep_for(100ms);
  const auto t0 = clock_type::now();
  comms[1].reset();  // the peer's comm is destroyed: its sockets close
  trainer.join();
  const auto took = clock_type::now() - t0;
  INFO("failed " << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                 << " ms after the peer went away: " << (st.ok() ? "ok" : st.err().what()));
  REQUIRE_FALSE(st.ok());
  CHECK(st.err().code == errc::disconnected);
  CHECK(took < 2s);
  CHECK_FALSE(comms[0]->allreduce_sum(v.data(), v.size()).ok());
}

TEST_CASE("gloo_comm: a peer that never joins times out as overloaded", "[gloo]") {
  auto comms = connect_all(2, 500ms);
  std::vector<float> v(10, 1.0f);
  const auto t0 = clock_type::now();
  auto st = comms[0]->allreduce_sum(v.data(), v.size());
  const auto took = clock_type::now() - t0;
  INFO((st.ok() ? std::string("ok") : st.err().what()));
  REQUIRE_FALSE(st.ok());
  CHECK(st.err().code == errc::overloaded);
  CHECK(took >= 400ms);
  CHECK(took < 5s);
}

TEST_CASE("gloo_comm: rendezvous times out when a rank is missing", "[gloo]") {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  const auto t0 = clock_type::now();
  auto c = gloo_comm::connect(store, fresh_prefix(), 0, 2, 300ms, "127.0.0.1");
  REQUIRE_FALSE(c.ok());
  CHECK((c.err().code == errc::overloaded || c.err().code == errc::disconnected));
  CHECK(clock_type::now() - t0 < 60s);
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
  // Three ranks; rank 2 never calls. Ranks 0 and 1 block (long timeout);
  // abort() on each from another thread must end their calls promptly.
  enum class op { allreduce, broadcast, barrier };
  for (op o : {op::allreduce, op::broadcast, op::barrier}) {
    auto comms = connect_all(3, 60000ms);
    std::vector<std::vector<float>> v(2, std::vector<float>(10007, 1.0f));
    std::vector<status> st(2);
    std::atomic<int> started{0};
    std::vector<std::thread> ts;
    for (int r = 0; r < 2; ++r)
      ts.emplace_back([&, r] {
        started++;
        switch (o) {
          case op::allreduce: st[r] = comms[r]->allreduce_sum(v[r].data(), v[r].size()); break;
          case op::broadcast: st[r] = comms[r]->broadcast(v[r].data(), v[r].size(), 2); break;
          case op::barrier: st[r] = comms[r]->barrier(); break;
        }
      });
    while (started < 2) std::this_thread::yield();
    std::this_thread::sleep_for(200ms);  // real sockets: let both block inside the wait
    const auto t0 = clock_type::now();
    std::thread aborter([&] {
      comms[0]->abort();
      comms[1]->abort();
    });
    for (auto& t : ts) t.join();
    aborter.join();
    const auto took = clock_type::now() - t0;
    INFO("op " << int(o) << ": returned " << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
               << " ms after abort");
    CHECK(took < 2s);
    for (int r = 0; r < 2; ++r) {
      REQUIRE_FALSE(st[r].ok());
      CHECK(st[r].err().code == errc::disconnected);
    }
  }
}

namespace {

/// Rank 2's view of the rendezvous in the test below: it publishes its
/// addresses, then stalls before connecting any pair - a peer that died
/// right after publishing - until the test releases it.
class stalling_store : public gloo::rendezvous::Store {
public:
  stalling_store(std::shared_ptr<gloo::rendezvous::Store> inner, std::shared_future<void> release)
      : inner_(std::move(inner)), release_(std::move(release)) {}
  void set(const std::string& k, const std::vector<char>& v) override { inner_->set(k, v); }
  std::vector<char> get(const std::string& k) override { return inner_->get(k); }
  void wait(const std::vector<std::string>& keys) override {
    release_.wait();
    inner_->wait(keys);
  }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& t) override {
    release_.wait();
    inner_->wait(keys, t);
  }

private:
  std::shared_ptr<gloo::rendezvous::Store> inner_;
  std::shared_future<void> release_;
};

}  // namespace

TEST_CASE("gloo_comm: a cancelled rendezvous returns at once while a peer never connects its pairs", "[gloo]") {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  const std::string prefix = fresh_prefix();
  std::promise<void> release;
  auto stalled = std::make_shared<stalling_store>(store, release.get_future().share());
  auto r2 =
      std::async(std::launch::async, [=] { return gloo_comm::connect(stalled, prefix, 2, 3, 3000ms, "127.0.0.1"); });
  // Ranks 0 and 1 with Gloo's timeout far away: only the cancel can end them.
  std::vector<std::shared_ptr<cancel_token>> tokens{std::make_shared<cancel_token>(), std::make_shared<cancel_token>()};
  std::vector<std::future<result<std::unique_ptr<gloo_comm>>>> fs;
  for (int r = 0; r < 2; ++r)
    fs.push_back(std::async(std::launch::async,
                            [=] { return gloo_comm::connect(store, prefix, r, 3, 60000ms, "127.0.0.1", tokens[r]); }));
  store->wait({prefix + "/2"});  // rank 2 published its pairs' addresses
  for (auto& t : tokens) t->cancel();
  for (auto& f : fs) {
    auto c = f.get();
    REQUIRE_FALSE(c.ok());
    CHECK(c.err().code == errc::disconnected);
    CHECK(c.err().message.find("aborted during the rendezvous") != std::string::npos);
  }
  release.set_value();
  // Rank 2 connects to what the abandoned helpers of 0 and 1 left behind,
  // or fails at its own 3 s timeout: either way it returns.
  CHECK(r2.wait_for(std::chrono::seconds(20)) == std::future_status::ready);
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
