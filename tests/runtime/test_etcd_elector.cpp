// leader_campaign against a real one-member etcd on loopback (Debian
// etcd-server), started by the fixture with its own data directory and
// ports: the job key's marks as launchers see them. Skipped without etcd.
#include "runtime/coordination/leader_campaign.hpp"
#include "../skip.hpp"
#include "../temp_dir.hpp"

#include <catch2/catch.hpp>

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <random>
#include <thread>

using namespace grace;
using namespace std::chrono_literals;

namespace {

/// One etcd member on 127.0.0.1, killed and waited for on destruction.
struct etcd_server {
  pid_t pid = -1;
  std::string endpoint;
  testing::temp_dir dir{"grace-etcd-test"};

  bool start() {
    std::mt19937 rng(static_cast<unsigned>(::getpid()) ^ static_cast<unsigned>(std::random_device{}()));
    const int client = 20000 + static_cast<int>(rng() % 20000), peer = client + 1;
    endpoint = "127.0.0.1:" + std::to_string(client);
    const std::string peer_url = "http://127.0.0.1:" + std::to_string(peer);
    const std::string client_url = "http://" + endpoint;
    const std::string data = (dir.path / "data").string(), log = (dir.path / "etcd.log").string();
    pid = ::fork();
    if (pid == 0) {
      FILE* out = std::freopen(log.c_str(), "w", stdout);
      (void)out;
      ::dup2(::fileno(stdout), 2);
      ::execlp("etcd", "etcd", "--name", "t", "--data-dir", data.c_str(), "--listen-client-urls", client_url.c_str(),
               "--advertise-client-urls", client_url.c_str(), "--listen-peer-urls", peer_url.c_str(),
               "--initial-advertise-peer-urls", peer_url.c_str(), "--initial-cluster", ("t=" + peer_url).c_str(),
               static_cast<char*>(nullptr));
      ::_exit(127);
    }
    auto c = etcd_client::create(endpoint, 500ms);
    for (int i = 0; i < 100 && c; ++i) {  // ready in about a second; at most 10 s
      if (c->get("/probe")) return true;
      int st = 0;
      if (::waitpid(pid, &st, WNOHANG) == pid) {
        pid = -1;
        return false;
      }
      std::this_thread::sleep_for(100ms);
    }
    return false;
  }
  ~etcd_server() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
};

bool have_etcd() { return std::system("command -v etcd >/dev/null 2>&1") == 0; }

elector_config config(const std::string& endpoints, uint32_t node) {
  elector_config c;
  c.endpoints = endpoints;
  c.key = "/grace/t/coordinator";
  c.job_key = "/grace/t/job";
  c.endpoint = "127.0.0.1:" + std::to_string(29500 + node);
  c.node = node;
  c.ttl_seconds = 2;
  c.poll = 20ms;
  return c;
}

/// The next event of `e`, at most `limit` away.
std::optional<leadership_event> next_event(leader_campaign& e, std::chrono::milliseconds limit) {
  static thread_local std::vector<leadership_event> queued;
  const auto until = std::chrono::steady_clock::now() + limit;
  while (queued.empty()) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    if (left.count() <= 0) return std::nullopt;
    pollfd p{e.fd(), POLLIN, 0};
    ::poll(&p, 1, static_cast<int>(left.count()));
    for (auto& ev : e.take()) queued.push_back(ev);
  }
  auto ev = queued.front();
  queued.erase(queued.begin());
  return ev;
}

/// Whether the job mark comes to read `want` within 5 s (a leader puts its
/// running mark in its first loop, after its elected event).
bool mark_becomes(const std::string& endpoint, const std::string& want) {
  auto c = etcd_client::create(endpoint);
  REQUIRE(c);
  const auto until = std::chrono::steady_clock::now() + 5s;
  for (;;) {
    auto m = c->get("/grace/t/job");
    if (m && *m && (*m)->value == want) return true;
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(10ms);
  }
}

std::unique_ptr<leader_campaign> started(const elector_config& c) {
  auto e = leader_campaign::create(c, {});
  REQUIRE(e);
  (*e)->start();
  return std::move(*e);
}

/// Node 0 elected, node 1 following it; the leader's epoch.
struct two_launchers {
  std::unique_ptr<leader_campaign> leader, follower;
  uint64_t epoch = 0;
};
two_launchers leader_and_follower(const std::string& endpoint) {
  two_launchers t;
  t.leader = started(config(endpoint, 0));
  auto ev = next_event(*t.leader, 5s);
  REQUIRE(ev);
  REQUIRE(ev->what == leadership_event::type::elected);
  t.epoch = ev->where.epoch;
  t.follower = started(config(endpoint, 1));
  auto f = next_event(*t.follower, 5s);
  REQUIRE(f);
  REQUIRE(f->what == leadership_event::type::following);
  REQUIRE(mark_becomes(endpoint, job_key_value(job_mark::state::running, t.epoch)));
  return t;
}

#define REQUIRE_ETCD(server)                                                \
  if (!have_etcd()) {                                                       \
    GRACE_SKIP("no etcd (Debian etcd-server) to run the elector against");  \
  }                                                                         \
  etcd_server server;                                                       \
  REQUIRE(server.start())

}  // namespace

TEST_CASE("etcd elector: a launcher left behind stops when the job finished without it", "[etcd]") {
  REQUIRE_ETCD(etcd);
  auto client = etcd_client::create(etcd.endpoint);
  REQUIRE(client);
  auto [leader, follower, epoch] = leader_and_follower(etcd.endpoint);
  auto mark = client->get("/grace/t/job");
  REQUIRE(mark);
  REQUIRE(*mark);
  CHECK((*mark)->value == job_key_value(job_mark::state::running, epoch));

  leader->stop(true, true);  // the job finished with success
  mark = client->get("/grace/t/job");
  REQUIRE(mark);
  REQUIRE(*mark);
  CHECK((*mark)->value == job_key_value(job_mark::state::finished, epoch));
  CHECK((*mark)->lease != 0);  // the mark ends by itself
  auto done = next_event(*follower, 5s);
  REQUIRE(done);
  CHECK(done->what == leadership_event::type::finished);
  std::this_thread::sleep_for(200ms);  // ten polls: it never campaigns
  auto key = client->get("/grace/t/coordinator");
  REQUIRE(key);
  CHECK_FALSE(*key);
  CHECK_FALSE(next_event(*follower, 100ms));
}

TEST_CASE("etcd elector: a new job of the same run id starts over a finished mark", "[etcd]") {
  REQUIRE_ETCD(etcd);
  auto client = etcd_client::create(etcd.endpoint);
  REQUIRE(client);
  REQUIRE(client->put("/grace/t/job", job_key_value(job_mark::state::finished, 3)));
  auto leader = started(config(etcd.endpoint, 0));  // its first look: a requeued run
  auto ev = next_event(*leader, 5s);
  REQUIRE(ev);
  REQUIRE(ev->what == leadership_event::type::elected);
  REQUIRE(mark_becomes(etcd.endpoint, job_key_value(job_mark::state::running, ev->where.epoch)));
  auto mark = client->get("/grace/t/job");
  REQUIRE(mark);
  REQUIRE(*mark);
  CHECK((*mark)->value == job_key_value(job_mark::state::running, ev->where.epoch));
  leader->stop(true, false);  // a job that failed removes its running mark
  mark = client->get("/grace/t/job");
  REQUIRE(mark);
  CHECK_FALSE(*mark);
}

TEST_CASE("etcd elector: an earlier job's finished mark does not stop a running job's follower", "[etcd]") {
  REQUIRE_ETCD(etcd);
  auto client = etcd_client::create(etcd.endpoint);
  REQUIRE(client);
  auto [leader, follower, epoch] = leader_and_follower(etcd.endpoint);
  // The mark of a job before this leader's (an epoch below it), then the
  // leader lost: the follower must take over, not stop.
  REQUIRE(client->put("/grace/t/job", job_key_value(job_mark::state::finished, epoch - 1)));
  leader->stop(true, false);
  auto next = next_event(*follower, 5s);
  REQUIRE(next);
  CHECK(next->what == leadership_event::type::elected);
  CHECK(next->where.epoch > epoch);
  follower->stop(true, false);
}
