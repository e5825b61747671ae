// grace-bench-scale: the coordination service with many members over real
// sockets. The coordinator runs in this process, published on loopback; the
// members are lightweight protocol clients (event-based actors speaking the
// workers' messages: Join, Heartbeat every 200 ms, Ack, Claim), many per
// process, in --procs forked processes that each reach the coordinator
// through CAF's middleman, as workers on several hosts would.
//
//   grace-bench-scale --members 1024 --procs 4 --reps 5 --idle-s 5
//   grace-bench-scale --members 1024 --per-host 8 --reps 5 --idle-s 5
//
// --per-host K: the members are laid out as hosts of K workers each, as a
// multi-node job is: one process per host (members/K of them), registered
// as that node's launcher, with a node relay (actors/node_relay.hpp)
// through which its members' heartbeats and acknowledgements go and the
// coordinator's orders come. Without it the members talk to the
// coordinator directly, --procs processes holding every procs-th rank.
//
// Per rep (a fresh incarnation, so every member joins again):
//   join_ms     first Join sent -> last Welcome received, all members
//   agree_ms    rank 0's Claim sent -> the last member holding the agreed step
//   agree_cpu_ms  the coordinator process's CPU time over that round: its
//               own share, the rest being the members' work and waits (on a
//               cluster each host does its share on its own CPUs)
// Once, with every member heartbeating and nothing else going on:
//   idle_cpu    the coordinator process's CPU time / wall time (1.0 = a core)
//   hb_per_s    heartbeats the coordinator accepted per second (check: N * 5)
//   rss_per_member_kib  the coordinator process's RSS growth / N
// One JSON line on stdout. Member processes report over pipes; times are
// CLOCK_MONOTONIC, which every process on the machine shares.
#include "actors/coordinator.hpp"
#include "actors/node_relay.hpp"
#include "actors/caf_types.hpp"
#include "runtime/base/events.hpp"
#include "actors/actor_runtime.hpp"

#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/io/middleman.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <thread>
#include <string>
#include <vector>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {

using namespace grace;

const char* const run_id = "scale";
const char* const token = "scale-bench-token";
constexpr auto heartbeat_every = std::chrono::milliseconds(200);

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "grace-bench-scale: %s\n", what.c_str());
  std::exit(2);
}

uint64_t arg_u(int argc, char** argv, const char* key, uint64_t def) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == key) return std::strtoull(argv[i + 1], nullptr, 10);
  return def;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int64_t rss_kib() {
  std::ifstream f("/proc/self/status");
  std::string k;
  int64_t v = 0;
  while (f >> k)
    if (k == "VmRSS:" && (f >> v)) return v;
  return 0;
}

double cpu_s() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// ------------------------------------------------------------ pipes

struct channel {
  FILE* to = nullptr;    ///< commands (parent -> member process) or reports (back)
  FILE* from = nullptr;
};

void put(FILE* f, const std::string& line) {
  std::fputs((line + "\n").c_str(), f);
  std::fflush(f);
}

std::string get(FILE* f) {
  char buf[256];
  if (!std::fgets(buf, sizeof buf, f)) die("a member process ended early (see its error above)");
  std::string s(buf);
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

// ------------------------------------------------------------ a member

/// What a member process's actors report to its main thread.
struct tally {
  std::mutex m;
  std::condition_variable cv;
  uint32_t joined = 0, agreed = 0;
  int64_t last_joined_ns = 0, last_agreed_ns = 0;
  bool refused = false;
  uint32_t members = 0;  ///< this process's members: the main thread is woken once all of them counted

  void add(uint32_t& n, int64_t& last) {
    std::lock_guard<std::mutex> g(m);
    ++n;
    last = std::max(last, mono_ns());
    // One wake-up per round, not one per member: the bench's own thread
    // must not compete with the members for the two CPUs.
    if (n >= members) cv.notify_all();
  }
  void wait(const uint32_t& n, uint32_t want) {
    std::unique_lock<std::mutex> l(m);
    if (!cv.wait_for(l, std::chrono::seconds(20), [&] { return n >= want || refused; }) || refused)
      die("members did not all answer within 20 s (" + std::to_string(n) + " of " + std::to_string(want) +
          (refused ? ", a join was refused)" : ")"));
  }
};

struct member_state {
  uint32_t rank = 0;
  uint32_t incarnation = 0;
  uint32_t world = 0;
  tally* t = nullptr;
  node_relay_actor relay;  ///< --per-host: heartbeats and acks go through it
};

/// Where heartbeats and acknowledgements go: the relay, else the service.
template <class M>
void up(caf::stateful_actor<member_state>* self, const coordinator_actor& coord, M m) {
  if (self->state.relay)
    self->send(self->state.relay, std::move(m));
  else
    self->send(coord, std::move(m));
}

void heartbeat(caf::stateful_actor<member_state>* self, const coordinator_actor& coord) {
  auto& st = self->state;
  up(self, coord, make<proto::Heartbeat>([&](auto b) {
               b.setRank(st.rank);
               b.setIncarnation(st.incarnation);
               b.setCompletedStep(100);
               b.setLastStepNs(1000000);
             }));
}

void join(caf::stateful_actor<member_state>* self, coordinator_actor coord);

caf::behavior member(caf::stateful_actor<member_state>* self, coordinator_actor coord, member_state init) {
  self->state = init;
  auto& st = self->state;
  if (st.relay)
    self->request(st.relay, std::chrono::seconds(60), relay_atom::value, st.rank, st.incarnation)
        .then([self, coord](bool) { join(self, coord); });
  else
    join(self, coord);
  return {
      [self, coord](tick_atom) {
        heartbeat(self, coord);
        self->delayed_send(self, heartbeat_every, tick_atom::value);
      },
      [self, coord](msg<proto::CheckpointAt>& m) {
        auto c = decode(m);
        if (!c) return;
        if (c->get().getAgreed()) {
          self->state.t->add(self->state.t->agreed, self->state.t->last_agreed_ns);
          return;
        }
        auto id = c->get().getAgreementId();
        auto step = c->get().getStep();
        up(self, coord, make<proto::Ack>([&](auto b) {
             b.setAgreementId(id);
             b.setRank(self->state.rank);
             b.setEarliestStep(step);
           }));
      },
      [](msg<proto::ClaimReply>&) {},
      [](msg<proto::PeerLost>&) {},  // the other member processes quitting at the end
      [](msg<proto::Committed>&) {},
  };
}

void join(caf::stateful_actor<member_state>* self, coordinator_actor coord) {
  auto& st = self->state;
  self->request(coord, std::chrono::seconds(60), make<proto::Join>([&](auto b) {
                  b.setRank(st.rank);
                  b.setWorldSize(st.world);
                  b.setRunId(run_id);
                  b.setToken(token);
                  b.setProtocolVersion(proto::PROTOCOL_VERSION);
                  b.setIncarnation(st.incarnation);
                  b.setCompletedStep(100);
                  b.setPid(static_cast<uint32_t>(::getpid()));
                }))
      .then(
          [self, coord](msg<proto::Welcome>& m) {
            auto w = decode(m);
            if (!w || !w->get().getAccepted()) {
              std::lock_guard<std::mutex> g(self->state.t->m);
              self->state.t->refused = true;
              self->state.t->cv.notify_all();
              return;
            }
            self->state.t->add(self->state.t->joined, self->state.t->last_joined_ns);
            // Spread the first heartbeats over one period, as real workers' are.
            self->delayed_send(self, heartbeat_every * (self->state.rank % 16) / 16, tick_atom::value);
          },
          [self](caf::error&) {
            std::lock_guard<std::mutex> g(self->state.t->m);
            self->state.t->refused = true;
            self->state.t->cv.notify_all();
          });
}

/// The ranks a member process holds: every procs-th (no relays), or one
/// host's contiguous block of `per_host` (ranks node * K .. node * K + K - 1).
std::vector<uint32_t> ranks_of(uint32_t index, uint32_t procs, uint32_t world, uint32_t per_host) {
  std::vector<uint32_t> out;
  if (per_host)
    for (uint32_t r = index * per_host; r < std::min(world, (index + 1) * per_host); ++r) out.push_back(r);
  else
    for (uint32_t r = index; r < world; r += procs) out.push_back(r);
  return out;
}

/// --per-host: this process is node `index`'s launcher (registered with the
/// job's secret) and hosts the node's relay.
node_relay_actor start_relay(caf::actor_system& sys, const coordinator_actor& coord, uint32_t index,
                             uint32_t per_host, uint32_t world) {
  const auto nodes = static_cast<int32_t>((world + per_host - 1) / per_host);
  if (auto st = register_launcher(sys, coord, static_cast<int32_t>(index), static_cast<int32_t>(per_host), token, nodes,
                                  nodes);
      !st)
    die(st.err().message);
  node_relay_config rc;
  rc.node = static_cast<int32_t>(index);
  rc.nproc = static_cast<int32_t>(per_host);
  rc.heartbeat = heartbeat_every;
  auto relay = spawn_node_relay(sys, rc);
  caf::scoped_actor self{sys};
  self->send(relay, coord_atom::value, caf::actor_cast<caf::actor>(coord));
  return relay;
}

/// A member process: hosts ranks_of(index, ...).
[[noreturn]] void member_process(channel ch, uint32_t index, uint32_t procs, uint32_t world, uint32_t per_host) {
  spdlog::set_level(spdlog::level::warn);
  uint16_t port = static_cast<uint16_t>(std::stoul(get(ch.from)));
  actor_runtime rt;
  auto& sys = rt.sys();
  auto coord = connect_coordinator(sys, "127.0.0.1", port, std::chrono::seconds(30));
  if (!coord) die(coord.err().message);
  node_relay_actor relay;
  if (per_host) relay = start_relay(sys, *coord, index, per_host, world);
  std::vector<caf::actor> mine;
  tally t;
  const auto ranks = ranks_of(index, procs, world, per_host);
  const auto count = static_cast<uint32_t>(ranks.size());
  t.members = count;
  for (;;) {
    auto cmd = get(ch.from);
    if (cmd.rfind("join ", 0) == 0) {
      for (auto& a : mine) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
      mine.clear();
      {
        std::lock_guard<std::mutex> g(t.m);
        t.joined = t.agreed = 0;
        t.last_joined_ns = t.last_agreed_ns = 0;
      }
      uint32_t inc = static_cast<uint32_t>(std::stoul(cmd.substr(5)));
      if (relay) {
        caf::scoped_actor self{sys};
        self->send(relay, incarnation_atom::value, inc, index * per_host);
      }
      for (auto r : ranks) mine.push_back(sys.spawn(member, *coord, member_state{r, inc, world, &t, relay}));
      t.wait(t.joined, count);
      put(ch.to, std::to_string(t.last_joined_ns));
    } else if (cmd == "claim") {  // only the process hosting rank 0, which claims
      caf::scoped_actor self{sys};
      int64_t t0 = mono_ns();
      self->send(*coord, make<proto::Claim>([&](auto b) {
                   auto n = b.initNotice();
                   n.setRank(0);
                   n.setSource(proto::NoticeSource::TEST);
                   n.setDetail("scale bench");
                   b.setStartedStep(100);
                 }));
      put(ch.to, std::to_string(t0));
    } else if (cmd == "agreed") {
      t.wait(t.agreed, count);
      put(ch.to, std::to_string(t.last_agreed_ns));
    } else {
      for (auto& a : mine) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
      if (relay) caf::anon_send_exit(relay, caf::exit_reason::user_shutdown);
      std::_Exit(0);
    }
  }
}

}  // namespace

namespace {

std::vector<channel> fork_member_processes(uint32_t procs, uint32_t world, uint32_t per_host,
                                          std::vector<pid_t>& pids) {
  std::vector<channel> out;
  for (uint32_t i = 0; i < procs; ++i) {
    int down[2], up[2];
    if (::pipe(down) != 0 || ::pipe(up) != 0) die("pipe failed");
    pid_t pid = ::fork();
    if (pid < 0) die("fork failed");
    if (pid == 0) {
      ::close(down[1]);
      ::close(up[0]);
      member_process({fdopen(up[1], "w"), fdopen(down[0], "r")}, i, procs, world, per_host);
    }
    ::close(down[0]);
    ::close(up[1]);
    out.push_back({fdopen(down[1], "w"), fdopen(up[0], "r")});
    pids.push_back(pid);
  }
  return out;
}

/// Sends `cmd` to every process (or the first only) and returns the
/// largest timestamp they answer with.
int64_t round_trip(std::vector<channel>& chs, const std::string& cmd, bool first_only = false) {
  int64_t last = 0;
  for (size_t i = 0; i < (first_only ? 1 : chs.size()); ++i) put(chs[i].to, cmd);
  for (size_t i = 0; i < (first_only ? 1 : chs.size()); ++i) last = std::max<int64_t>(last, std::stoll(get(chs[i].from)));
  return last;
}

struct idle_sample {
  double cpu = 0, hb_per_s = 0;
};

idle_sample measure_idle(const std::atomic<uint64_t>& heartbeats, double seconds) {
  uint64_t h0 = heartbeats.load();
  double c0 = cpu_s();
  int64_t w0 = mono_ns();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  double wall = (mono_ns() - w0) / 1e9;
  return {(cpu_s() - c0) / wall, (heartbeats.load() - h0) / wall};
}

}  // namespace

int main(int argc, char** argv) {
  spdlog::set_level(spdlog::level::warn);
  const auto world = static_cast<uint32_t>(arg_u(argc, argv, "--members", 64));
  const auto per_host = static_cast<uint32_t>(arg_u(argc, argv, "--per-host", 0));
  const auto procs = per_host ? (world + per_host - 1) / per_host
                              : static_cast<uint32_t>(std::min<uint64_t>(arg_u(argc, argv, "--procs", 4), world));
  const auto reps = static_cast<uint32_t>(arg_u(argc, argv, "--reps", 5));
  const double idle_s = static_cast<double>(arg_u(argc, argv, "--idle-s", 5));
  if (world < 2 || procs < 1 || reps < 1) die("usage: grace-bench-scale --members N>=2 [--procs P] [--reps R] [--idle-s S]");
  std::vector<pid_t> pids;
  auto chs = fork_member_processes(procs, world, per_host, pids);  // before any thread exists

  actor_runtime rt;
  auto& sys = rt.sys();
  const int64_t rss0 = rss_kib();
  std::atomic<uint64_t> heartbeats{0};
  coordinator_config cc;
  cc.world_size = world;
  cc.run_id = run_id;
  cc.token = token;
  cc.dead_after = std::chrono::seconds(60);
  cc.own_node = -1;  // every node's launcher is a member process
  // The member processes' exit at the end is reported as lost members.
  cc.log = spdlog::stderr_color_mt("coordinator");
  cc.log->set_level(spdlog::level::err);
  cc.on_progress = [&](uint32_t, uint64_t, int64_t) { heartbeats.fetch_add(1, std::memory_order_relaxed); };
  auto coord = spawn_coordinator(sys, cc);
  auto port = sys.middleman().publish(coord, 0, "127.0.0.1");
  if (!port) die("publish: " + sys.render(port.error()));
  for (auto& c : chs) put(c.to, std::to_string(*port));

  std::vector<double> join_ms, agree_ms, agree_cpu_ms;
  idle_sample idle;
  int64_t rss1 = 0;
  for (uint32_t rep = 0; rep < reps; ++rep) {
    if (rep > 0) {
      if (!ask_incarnation(sys, coord, rep, std::chrono::seconds(10))) die("new incarnation: no answer");
    }
    int64_t t0 = mono_ns();
    join_ms.push_back((round_trip(chs, "join " + std::to_string(rep)) - t0) / 1e6);
    if (rep == 0) {
      idle = measure_idle(heartbeats, idle_s);
      rss1 = rss_kib();
    }
    const double cpu0 = cpu_s();
    int64_t claimed = round_trip(chs, "claim", true);
    agree_ms.push_back((round_trip(chs, "agreed") - claimed) / 1e6);
    agree_cpu_ms.push_back((cpu_s() - cpu0) * 1e3);
  }
  for (auto& c : chs) put(c.to, "quit");
  for (auto p : pids) ::waitpid(p, nullptr, 0);
  std::printf(
      "{\"row\":\"scale\",\"members\":%u,\"procs\":%u,\"per_host\":%u,\"reps\":%u,\"join_ms\":%.2f,\"agree_ms\":%.3f,"
      "\"agree_ms_max\":%.3f,\"agree_cpu_ms\":%.3f,\"idle_cpu\":%.4f,\"hb_per_s\":%.0f,\"rss_per_member_kib\":%.2f}\n",
      world, procs, per_host, reps, median(join_ms), median(agree_ms), *std::max_element(agree_ms.begin(), agree_ms.end()),
      median(agree_cpu_ms),
      idle.cpu, idle.hb_per_s, double(rss1 - rss0) / world);
  std::fflush(stdout);
  // The actor system waits for every actor when it is destroyed.
  caf::anon_send_exit(coord, caf::exit_reason::user_shutdown);
  return 0;
}
