// Fuzzes every message handler of the coordination service, in process, on
// CAF's deterministic test scheduler (simulated time). Each input is a
// program: three members join, then every op sends one message (any kind the
// service accepts, with fields from the input, or raw bytes as its body)
// from a member, a process outside the job or nobody, lets a member die and
// come back, or advances time (heartbeat checks, dead-after verdicts, rescue
// and cutoff timers). The phases follow: claims, acknowledgements, saves,
// commits, losses, just-in-time rounds, leaves, new incarnations.
//
// Fails (abort) when a handler crashes, trips ASan/UBSan, or kills the
// service: after the program the service must still answer.
#include "actors/coordinator.hpp"
#include "actors/caf_types.hpp"
#include "runtime/coordination/agreement.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/after.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/system_messages.hpp>

#include <spdlog/spdlog.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

namespace grace {
void register_message_types(caf::actor_system_config& cfg);
}

namespace {

using namespace grace;
constexpr uint32_t world = 3;
const std::string token = "fuzz-secret-0123456789";

/// The input as a stream of values; past its end every value is 0.
struct input {
  const uint8_t* p;
  size_t n;
  uint8_t byte() { return n ? (--n, *p++) : 0; }
  uint64_t u64(int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v = v << 8 | byte();
    return v;
  }
  /// Mostly a member's rank, sometimes out of range or the launcher's.
  uint32_t rank() {
    auto b = byte();
    return b < 200 ? b % world : b < 240 ? b : launcher_rank;
  }
  std::string text(size_t max) {
    size_t len = byte() % (max + 1);
    std::string s;
    for (size_t i = 0; i < len; ++i) s += static_cast<char>(byte());
    return s;
  }
  std::vector<uint8_t> raw() {
    size_t len = u64(2) % 512;
    std::vector<uint8_t> v;
    for (size_t i = 0; i < len; ++i) v.push_back(byte());
    return v;
  }
};

struct harness {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  caf::scheduler::test_coordinator* sched = nullptr;
  harness() {
    // GRACE_FUZZ_LOG=1: the service's log, to follow a replayed input.
    spdlog::set_level(std::getenv("GRACE_FUZZ_LOG") ? spdlog::level::info : spdlog::level::off);
    register_message_types(cfg);
    cfg.set("scheduler.policy", caf::atom("testing"));
    sys = std::make_unique<caf::actor_system>(cfg);
    sched = &dynamic_cast<caf::scheduler::test_coordinator&>(sys->scheduler());
  }
};

/// One actor system for the whole run, never destroyed: at exit its
/// destructor would run after CAF's and spdlog's own statics are gone.
harness& env() {
  static harness* h = new harness;
  return *h;
}

/// Inputs whose length is 3 mod 7 run against a service taking a group
/// over (etcd failover): its members rejoin instead of joining; 5 mod 7
/// against an elastic job's (2 to 3 nodes of one worker: the group forms
/// from the launchers' plan requests first).
bool rejoining = false;
bool elastic = false;

msg<proto::GroupPlanRequest> plan_request(int32_t node, uint32_t from, const std::string& host) {
  return make<proto::GroupPlanRequest>([&](auto b) {
    b.setNode(node);
    b.setFromIncarnation(from);
    b.setHost(host);
  });
}

msg<proto::Join> join(uint32_t rank, input& in, bool faithful) {
  return make<proto::Join>([&](auto b) {
    b.setRank(rank);
    b.setWorldSize(faithful ? world : in.byte());
    b.setRunId(faithful ? "run" : in.text(8));
    b.setToken(faithful ? token : in.text(24));
    b.setProtocolVersion(faithful ? proto::PROTOCOL_VERSION : in.byte());
    b.setIncarnation(faithful ? 0 : in.byte() % 4);
    b.setCompletedStep(faithful ? 0 : in.u64(1));
    b.setRejoin(rejoining || (!faithful && (in.byte() & 1)));
    // Recovery in place: members that can, and replacements of lost ranks.
    b.setInPlace(faithful || (in.byte() & 1));
    b.setStateEndpoint("127.0.0.1:9");
    b.setReplacement(!faithful && (in.byte() & 1));
  });
}

/// The sender of one op: a member's process, a process outside the job,
/// or nobody (an anonymous message).
struct senders {
  std::vector<std::unique_ptr<caf::scoped_actor>> members;
  std::unique_ptr<caf::scoped_actor> outsider;
  template <class... Ts>
  void send(uint8_t who, const coordinator_actor& coord, Ts&&... xs) {
    who %= world + 2;
    if (who < world)
      (*members[who])->send(coord, std::forward<Ts>(xs)...);
    else if (who == world)
      (*outsider)->send(coord, std::forward<Ts>(xs)...);
    else
      caf::anon_send(coord, std::forward<Ts>(xs)...);
  }
};

/// Messages a member's process sends (protocol structs).
void send_member_message(uint8_t kind, uint8_t who, senders& s, const coordinator_actor& c, input& in) {
  switch (kind % 11) {
    case 0: s.send(who, c, join(in.rank(), in, in.byte() & 1)); break;
    case 1:
      s.send(who, c, make<proto::Claim>([&](auto b) {
               auto n = b.initNotice();
               n.setRank(in.rank());
               n.setSource(static_cast<proto::NoticeSource>(in.byte() % 4));
               n.setDetail(in.text(16));
               n.setDeadlineNs(static_cast<int64_t>(in.u64(1)) * 1'000'000);
               b.setStartedStep(in.u64(1));
             }));
      break;
    case 2: s.send(who, c, make<proto::Ack>([&](auto b) {
                     b.setAgreementId(in.byte() % 4);
                     b.setRank(in.rank());
                     b.setEarliestStep(in.u64(1));
                   }));
      break;
    case 3: s.send(who, c, make<proto::Heartbeat>([&](auto b) {
                     b.setRank(in.rank());
                     b.setIncarnation(in.byte() % 3);
                     b.setCompletedStep(in.u64(1));
                     b.setLastStepNs(static_cast<int64_t>(in.u64(2)));
                   }));
      break;
    case 4: s.send(who, c, make<proto::CheckpointSaved>([&](auto b) {
                     b.setAgreementId(in.byte() % 4);
                     b.setRank(in.rank());
                     b.setStep(in.u64(1));
                     b.setOk(in.byte() & 1);
                     b.setError(in.text(8));
                   }));
      break;
    case 5: s.send(who, c, make<proto::ProposeFinal>([&](auto b) {
                     b.setRank(in.rank());
                     b.setStartedStep(in.u64(1));
                   }));
      break;
    case 6: s.send(who, c, make<proto::ErrorReport>([&](auto b) {
                     b.setRank(in.rank());
                     b.setStep(in.u64(1));
                     b.setMessage(in.text(16));
                   }));
      break;
    case 7: s.send(who, c, make<proto::Leave>([&](auto b) {
                     b.setRank(in.rank());
                     b.setExitCode(static_cast<int32_t>(in.byte()) - 2);
                   }));
      break;
    case 8: s.send(who, c, make<proto::KvSet>([&](auto b) {
                     b.setKey(in.text(4));
                     auto v = in.text(16);
                     b.setValue(kj::arrayPtr(reinterpret_cast<const kj::byte*>(v.data()), v.size()));
                   }));
      break;
    case 9: s.send(who, c, make<proto::Recovered>([&](auto b) {
                     b.setAgreementId(in.byte() % 4);
                     b.setRank(in.rank());
                   }));
      break;
    default:
      if (in.byte() & 1)
        s.send(who, c, make<proto::KvGet>([&](auto b) {
                 b.setKey(in.text(4));
                 b.setTimeoutMs(in.u64(2));
               }));
      else
        s.send(who, c, make<proto::Barrier>([&](auto b) {
                 b.setName(in.text(4));
                 b.setRank(in.rank());
                 b.setCount(in.byte() % 5);
               }));
  }
}

/// A protocol message whose body is the input's bytes (decoding in the handler).
void send_raw(uint8_t kind, uint8_t who, senders& s, const coordinator_actor& c, input& in) {
  auto bytes = in.raw();
  switch (kind % 8) {
    case 0: s.send(who, c, msg<proto::Join>{bytes}); break;
    case 1: s.send(who, c, msg<proto::Claim>{bytes}); break;
    case 2: s.send(who, c, msg<proto::Ack>{bytes}); break;
    case 3: s.send(who, c, msg<proto::Heartbeat>{bytes}); break;
    case 4: s.send(who, c, msg<proto::CheckpointSaved>{bytes}); break;
    case 5: s.send(who, c, msg<proto::ErrorReport>{bytes}); break;
    case 6: s.send(who, c, msg<proto::KvSet>{bytes}); break;
    default: s.send(who, c, msg<proto::Barrier>{bytes});
  }
}

/// The launchers' messages, the questions and the service's own timers.
void send_control(uint8_t kind, uint8_t who, senders& s, const coordinator_actor& c, input& in) {
  switch (kind % 11) {
    case 9: s.send(who, c, plan_request(int32_t{in.byte() % 5} - 1, in.byte() % 4u, in.text(16))); break;
    case 10: s.send(who, c, make<proto::ResizeQuery>([&](auto b) { b.setIncarnation(in.byte() % 4u); })); break;
    case 0:
      s.send(who, c, make<proto::WorkerExited>([&](auto b) {
               b.setRank(in.rank());
               b.setIncarnation(in.byte() % 3u);
               b.setCode(in.byte());
             }));
      break;
    case 1:
      s.send(who, c, make<proto::LauncherRegister>([&](auto b) {
               b.setNode(int32_t{in.byte()} - 1);
               b.setWorkersPerNode(in.byte() % 4);
               b.setToken(in.text(24));
               b.setMinNodes(in.byte() % 5);
               b.setMaxNodes(in.byte() % 5);
             }));
      break;
    case 2:
      s.send(who, c, make<proto::IncarnationQuery>([&](auto b) {
               b.setSet(true);
               b.setIncarnation(in.byte() % 4u);
             }));
      break;
    case 3:
      s.send(who, c, make<proto::CheckpointPeers>([&](auto b) {
               b.setNode(in.byte() % 4);
               b.setEndpoint(in.text(12));
             }));
      break;
    case 4: s.send(who, c, make<proto::IncarnationQuery>([](auto) {})); break;
    case 5: s.send(who, c, make<proto::StatusQuery>([](auto) {})); break;
    case 6: s.send(who, c, tick_atom::value); break;
    case 7: s.send(who, c, rescue_atom::value, uint64_t{in.byte() % 4u}); break;
    default: s.send(who, c, cutoff_atom::value, uint64_t{in.byte() % 4u});
  }
}

/// Node relays' messages (per-host aggregation) and the takeover's timer.
void send_relay(uint8_t kind, uint8_t who, senders& s, const coordinator_actor& c, input& in) {
  const int32_t node = static_cast<int32_t>(in.byte() % 3) - 1;
  switch (kind % 5) {
    case 0:
      s.send(who, c, make<proto::RelayRegister>([&](auto b) {
               b.setNode(node);
               b.setWorkersPerNode(in.byte() % 3);
             }));
      break;
    case 1:
      s.send(who, c, make<proto::HeartbeatBatch>([&](auto b) {
               b.setNode(node);
               auto l = b.initBeats(in.byte() % 4);
               for (auto h : l) {
                 h.setRank(in.rank());
                 h.setIncarnation(in.byte() % 2);
                 h.setCompletedStep(in.u64(1));
               }
             }));
      break;
    case 2:
      s.send(who, c, make<proto::AckBatch>([&](auto b) {
               b.setNode(node);
               auto l = b.initAcks(in.byte() % 4);
               for (auto a : l) {
                 a.setAgreementId(in.byte() % 4);
                 a.setRank(in.rank());
                 a.setEarliestStep(in.u64(1));
               }
             }));
      break;
    case 3:
      if (in.byte() & 1)
        s.send(who, c, msg<proto::HeartbeatBatch>{in.raw()});
      else
        s.send(who, c, msg<proto::AckBatch>{in.raw()});
      break;
    default: s.send(who, c, takeover_atom::value, uint64_t{in.byte() % 4u});
  }
}

/// The service must still answer after the program.
void check_alive(harness& h, const coordinator_actor& coord) {
  caf::scoped_actor probe{*h.sys};
  probe->monitor(coord);
  probe->send(coord, make<proto::IncarnationQuery>([](auto) {}));
  h.sched->run();
  bool answered = false;
  std::string why = "no answer";
  for (int i = 0; i < 2 && !answered; ++i)
    probe->receive([&](msg<proto::IncarnationReply>&) { answered = true; },
                   [&](caf::down_msg& d) { why = "it terminated: " + caf::to_string(d.reason); },
                   caf::after(std::chrono::seconds(0)) >> [] {});
  if (!answered) {
    std::fprintf(stderr, "fuzz_coordinator: the coordination service stopped answering (%s)\n", why.c_str());
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto& h = env();
  input in{data, size};
  coordinator_config cc;
  cc.world_size = world;
  cc.run_id = "run";
  cc.token = token;
  cc.dead_after = std::chrono::milliseconds(1000);
  cc.hung_after = std::chrono::milliseconds(3000);
  cc.log = spdlog::default_logger();
  cc.recovery_in_place = true;  // losses recover in place: replacements, recover orders, Recovered
  rejoining = size % 7 == 3;
  elastic = size % 7 == 5;
  cc.takeover = rejoining;
  if (elastic) {
    cc.min_nodes = 2;
    cc.max_nodes = world;
    cc.nproc = 1;
    cc.elastic_wait = std::chrono::milliseconds(200);
  }
  cc.first_agreement_id = rejoining ? 2'000'000 : 0;
  auto coord = spawn_coordinator(*h.sys, cc);
  senders s;
  for (uint32_t r = 0; r < world; ++r) s.members.push_back(std::make_unique<caf::scoped_actor>(*h.sys));
  s.outsider = std::make_unique<caf::scoped_actor>(*h.sys);
  if (elastic)
    for (uint32_t r = 0; r < world; ++r) (*s.members[r])->send(coord, plan_request(int32_t(r), 0, "10.0.0.1"));
  h.sched->run();
  for (uint32_t r = 0; r < world; ++r) (*s.members[r])->send(coord, join(r, in, true));
  h.sched->run();
  for (int op = 0; op < 256 && in.n > 0; ++op) {
    uint8_t code = in.byte(), who = in.byte();
    switch (code % 6) {
      case 0:
      case 1: send_member_message(code / 6, who, s, coord, in); break;
      case 2: send_raw(code / 6, who, s, coord, in); break;
      case 3: send_control(code / 6, who, s, coord, in); break;
      case 4: h.sched->advance_time(caf::timespan{std::chrono::milliseconds(50 * (1 + code / 6))}); break;
      default:
        if ((code / 6) % 2) {
          send_relay(code / 12, who, s, coord, in);
          break;
        }
        // a member's process dies; a new one takes its place
        s.members[who % world] = std::make_unique<caf::scoped_actor>(*h.sys);
    }
    h.sched->run();
  }
  check_alive(h, coord);
  s.members.clear();
  s.outsider.reset();
  caf::anon_send_exit(coord, caf::exit_reason::user_shutdown);
  h.sched->run();
  return 0;
}
