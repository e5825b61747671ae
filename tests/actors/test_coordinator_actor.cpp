// The coordinator actor under CAF's deterministic test_coordinator: no
// sleeps, no threads racing; every message is delivered when run() says so.
// Workers are played by scoped actors.
#include "actors/coordinator.hpp"
#include "actors/node_relay.hpp"
#include "runtime/coordination/agreement.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/after.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include <catch2/catch.hpp>
#include <spdlog/spdlog.h>

#include <functional>
#include <optional>
#include <tuple>

using namespace grace;

namespace {

struct fixture {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  caf::scheduler::test_coordinator* sched = nullptr;
  coordinator_actor coord;
  std::vector<std::unique_ptr<caf::scoped_actor>> workers;
  /// What the coordinator told its host (grace-launch): rank, incarnation, why.
  std::vector<std::tuple<uint32_t, uint32_t, std::string>> host_verdicts;

  explicit fixture(uint32_t world, std::string token = "tok",
                   std::chrono::milliseconds dead_after = std::chrono::milliseconds(5000),
                   const std::function<void(coordinator_config&)>& tweak = {}) {
    spdlog::set_level(spdlog::level::err);  // expected losses at teardown are not news
    register_message_types(cfg);
    cfg.set("scheduler.policy", caf::atom("testing"));
    sys = std::make_unique<caf::actor_system>(cfg);
    sched = &dynamic_cast<caf::scheduler::test_coordinator&>(sys->scheduler());
    coordinator_config cc;
    cc.world_size = world;
    cc.run_id = "run";
    cc.token = std::move(token);
    cc.dead_after = dead_after;
    cc.on_member_lost = [this](uint32_t rank, uint32_t incarnation, uint32_t, const std::string& why) {
      host_verdicts.emplace_back(rank, incarnation, why);
    };
    if (tweak) tweak(cc);
    coord = spawn_coordinator(*sys, cc);
    run();
    for (uint32_t r = 0; r < world; ++r) workers.push_back(std::make_unique<caf::scoped_actor>(*sys));
  }
  ~fixture() {
    workers.clear();
    caf::anon_send_exit(coord, caf::exit_reason::user_shutdown);
    run();
  }
  void run() { sched->run(); }
  caf::scoped_actor& w(size_t r) { return *workers[r]; }

  static msg<proto::Join> join_msg(uint32_t rank, uint32_t world = 3, std::string token = "tok",
                                   uint32_t version = proto::PROTOCOL_VERSION, uint32_t incarnation = 0,
                                   uint64_t completed = 0) {
    return make<proto::Join>([&](auto b) {
      b.setRank(rank);
      b.setWorldSize(world);
      b.setRunId("run");
      b.setToken(token);
      b.setProtocolVersion(version);
      b.setIncarnation(incarnation);
      b.setCompletedStep(completed);
    });
  }

  /// The next message of type S in r's mailbox, if there is one now.
  template <class S>
  std::optional<msg<S>> next(size_t r) {
    std::optional<msg<S>> out;
    w(r)->receive([&](msg<S>& m) { out = std::move(m); }, caf::after(std::chrono::milliseconds(0)) >> [] {});
    return out;
  }

  template <class S>
  reader<S> expect(size_t r) {
    auto m = next<S>(r);
    REQUIRE(m);
    auto d = decode(*m);
    REQUIRE(d);
    return std::move(d.value());
  }

  void join_all(uint32_t world) {
    for (uint32_t r = 0; r < world; ++r) w(r)->send(coord, join_msg(r, world));
    run();
    for (uint32_t r = 0; r < world; ++r) REQUIRE(expect<proto::Welcome>(r)->getAccepted());
  }
};

msg<proto::Claim> claim(uint32_t rank, uint64_t started) {
  return make<proto::Claim>([&](auto b) {
    auto n = b.initNotice();
    n.setRank(rank);
    n.setSource(proto::NoticeSource::TEST);
    n.setDetail("test");
    b.setStartedStep(started);
  });
}

msg<proto::Ack> ack(uint64_t id, uint32_t rank, uint64_t earliest) {
  return make<proto::Ack>([&](auto b) {
    b.setAgreementId(id);
    b.setRank(rank);
    b.setEarliestStep(earliest);
  });
}

/// The launchers' messages (coordinator.hpp, coordinator_launcher).
msg<proto::LauncherRegister> registration(int32_t node, int32_t nproc, const std::string& token, int32_t lo,
                                          int32_t hi) {
  return make<proto::LauncherRegister>([&](auto b) {
    b.setNode(node);
    b.setWorkersPerNode(nproc);
    b.setToken(token);
    b.setMinNodes(lo);
    b.setMaxNodes(hi);
  });
}

msg<proto::WorkerExited> exited(uint32_t rank, uint32_t incarnation, int32_t code) {
  return make<proto::WorkerExited>([&](auto b) {
    b.setRank(rank);
    b.setIncarnation(incarnation);
    b.setCode(code);
  });
}

msg<proto::IncarnationQuery> incarnation_query(std::optional<uint32_t> set = std::nullopt) {
  return make<proto::IncarnationQuery>([&](auto b) {
    b.setSet(set.has_value());
    b.setIncarnation(set.value_or(0));
  });
}

/// The next reply of type R in `self`'s mailbox, decoded, if there is one.
template <class R, class Take>
bool take_reply(caf::scoped_actor& self, Take take) {
  bool got = false;
  self->receive(
      [&](msg<R>& m) {
        if (auto r = decode(m)) {
          take(r->get());
          got = true;
        }
      },
      caf::after(std::chrono::milliseconds(0)) >> [] {});
  return got;
}

}  // namespace

TEST_CASE("coordinator: a join with another restored step is refused as a failed rendezvous", "[coordinator]") {
  // Node-local directories not level: rank 0 restored step 40, rank 1 an
  // empty disk. The refusal says the steps differ, so the worker stops as
  // a failed rendezvous (its launcher counts the streak and names the
  // leveling) instead of a restart that could commit the wrong step.
  fixture f(3);
  auto with_step = [](uint32_t rank, uint64_t completed) {
    return fixture::join_msg(rank, 3, "tok", proto::PROTOCOL_VERSION, 0, completed);
  };
  f.w(0)->send(f.coord, with_step(0, 40));
  f.run();
  REQUIRE(f.expect<proto::Welcome>(0)->getAccepted());
  f.w(1)->send(f.coord, with_step(1, 0));
  f.run();
  auto refused = f.expect<proto::Welcome>(1);
  CHECK_FALSE(refused->getAccepted());
  CHECK(refused->getStepsDiffer());
  CHECK(str(refused->getReason()).find("restored step 0 but the group restored step 40") != std::string::npos);
  // A refusal for another reason does not say so.
  f.w(2)->send(f.coord, with_step(0, 40));
  f.run();
  auto dup = f.expect<proto::Welcome>(2);
  CHECK_FALSE(dup->getAccepted());
  CHECK_FALSE(dup->getStepsDiffer());
}

TEST_CASE("coordinator: joins are refused with a reason", "[coordinator]") {
  fixture f(3);
  f.w(0)->send(f.coord, fixture::join_msg(0, 3, "wrong"));
  f.w(1)->send(f.coord, fixture::join_msg(1, 3, "tok", 77));
  f.w(2)->send(f.coord, fixture::join_msg(2, 3, "tok", proto::PROTOCOL_VERSION, 5));
  f.run();
  auto a = f.expect<proto::Welcome>(0);
  CHECK_FALSE(a->getAccepted());
  CHECK(str(a->getReason()) == "wrong job token");
  auto b = f.expect<proto::Welcome>(1);
  CHECK_FALSE(b->getAccepted());
  CHECK(str(b->getReason()).find("protocol version 77") != std::string::npos);
  auto c = f.expect<proto::Welcome>(2);
  CHECK_FALSE(c->getAccepted());
  CHECK(str(c->getReason()).find("incarnation 5") != std::string::npos);
  // A stale incarnation is refused for now, naming the current one, so the
  // launcher restarts into it; a wrong token or version is final.
  CHECK(c->getRestartable());
  CHECK(c->getIncarnation() == 0);
  CHECK_FALSE(a->getRestartable());
  CHECK_FALSE(b->getRestartable());

  f.w(0)->send(f.coord, fixture::join_msg(0));
  f.run();
  REQUIRE(f.expect<proto::Welcome>(0)->getAccepted());
  f.w(1)->send(f.coord, fixture::join_msg(0));
  f.run();
  auto dup = f.expect<proto::Welcome>(1);
  CHECK_FALSE(dup->getAccepted());
  CHECK(str(dup->getReason()).find("duplicate rank 0") != std::string::npos);
  CHECK(dup->getRestartable());

  // A malformed message is rejected, the coordinator keeps serving.
  f.w(2)->send(f.coord, msg<proto::Join>{std::vector<uint8_t>(40, 0xab)});
  f.run();
  auto bad = f.expect<proto::Welcome>(2);
  CHECK_FALSE(bad->getAccepted());
  CHECK(str(bad->getReason()).find("rejected") != std::string::npos);
}

TEST_CASE("coordinator: the next group may advance the incarnation once the old one is gone", "[coordinator]") {
  fixture f(1);
  f.w(0)->send(f.coord, fixture::join_msg(0, 1));
  f.run();
  REQUIRE(f.expect<proto::Welcome>(0)->getAccepted());
  f.w(0)->send(f.coord, make<proto::Leave>([](auto b) { b.setRank(0); }));
  f.run();
  caf::scoped_actor next{*f.sys};
  next->send(f.coord, fixture::join_msg(0, 1, "tok", proto::PROTOCOL_VERSION, 1));
  f.run();
  bool accepted = false;
  next->receive([&](msg<proto::Welcome>& m) { accepted = decode(m)->get().getAccepted(); },
                caf::after(std::chrono::milliseconds(0)) >> [] {});
  CHECK(accepted);
  // Launchers on other nodes ask for it before they start a group.
  next->send(f.coord, incarnation_query());
  f.run();
  uint32_t current = 99;
  take_reply<proto::IncarnationReply>(next, [&](auto r) { current = r.getIncarnation(); });
  CHECK(current == 1);
}

TEST_CASE("coordinator: key-value store is set-once with blocking get", "[coordinator][kv]") {
  fixture f(2);
  auto set = [](std::string k, std::string v) {
    return make<proto::KvSet>([&](auto b) {
      b.setKey(k);
      b.setValue(capnp::Data::Reader(reinterpret_cast<const uint8_t*>(v.data()), v.size()));
    });
  };
  auto get = [](std::string k, uint32_t timeout) {
    return make<proto::KvGet>([&](auto b) {
      b.setKey(k);
      b.setTimeoutMs(timeout);
    });
  };
  f.join_all(2);
  f.w(1)->send(f.coord, get("late", 1000));
  f.run();
  CHECK_FALSE(f.next<proto::KvReply>(1));  // blocked until the key exists
  f.w(0)->send(f.coord, set("late", "v1"));
  f.run();
  CHECK(f.expect<proto::KvReply>(0)->getOk());
  auto got = f.expect<proto::KvReply>(1);
  REQUIRE(got->getOk());
  CHECK(std::string(got->getValue().begin(), got->getValue().end()) == "v1");

  f.w(0)->send(f.coord, set("late", "v2"));
  f.run();
  auto again = f.expect<proto::KvReply>(0);
  CHECK_FALSE(again->getOk());
  CHECK(str(again->getError()).find("already exists") != std::string::npos);

  // A sender outside the job can neither plant a key nor wait on one.
  caf::anon_send(f.coord, set("planted", "evil"));
  f.run();
  f.w(1)->send(f.coord, get("planted", 0));
  f.run();
  CHECK_FALSE(f.expect<proto::KvReply>(1)->getOk());

  f.w(1)->send(f.coord, get("never", 500));
  f.run();
  CHECK_FALSE(f.next<proto::KvReply>(1));
  f.sched->advance_time(std::chrono::milliseconds(600));
  f.run();
  auto to = f.expect<proto::KvReply>(1);
  CHECK_FALSE(to->getOk());
  CHECK(str(to->getError()).find("timeout") != std::string::npos);
}

TEST_CASE("coordinator: a barrier releases when everyone arrived", "[coordinator]") {
  fixture f(3);
  auto barrier = [](uint32_t rank) {
    return make<proto::Barrier>([&](auto b) {
      b.setName("b1");
      b.setRank(rank);
      b.setCount(3);
    });
  };
  f.join_all(3);
  f.w(0)->send(f.coord, barrier(0));
  f.w(1)->send(f.coord, barrier(1));
  f.run();
  CHECK_FALSE(f.next<proto::BarrierReply>(0));
  // Rank 2's arrival forged by a sender outside the job does not count.
  caf::anon_send(f.coord, barrier(2));
  f.run();
  CHECK_FALSE(f.next<proto::BarrierReply>(0));
  f.w(2)->send(f.coord, barrier(2));
  f.run();
  for (size_t r = 0; r < 3; ++r) CHECK(f.expect<proto::BarrierReply>(r)->getOk());
}

TEST_CASE("coordinator: notice, agreement, acknowledgement, save, commit", "[coordinator][agreement]") {
  fixture f(3);
  f.join_all(3);
  f.w(1)->send(f.coord, claim(1, 10));
  f.run();
  CHECK(f.expect<proto::ClaimReply>(1)->getWon());
  uint64_t id = 0;
  for (size_t r = 0; r < 3; ++r) {
    auto p = f.expect<proto::CheckpointAt>(r);
    CHECK_FALSE(p->getAgreed());
    CHECK(p->getStep() == 10);
    id = p->getAgreementId();
  }
  f.w(0)->send(f.coord, ack(id, 0, 10));
  f.w(1)->send(f.coord, ack(id, 1, 11));
  f.run();
  CHECK_FALSE(f.next<proto::CheckpointAt>(0));  // rank 2 has not acknowledged yet
  f.w(2)->send(f.coord, ack(id, 2, 10));
  f.run();
  for (size_t r = 0; r < 3; ++r) {
    auto a = f.expect<proto::CheckpointAt>(r);
    CHECK(a->getAgreed());
    CHECK(a->getStep() == 11);
    CHECK(a->getSaver() == 0);
    CHECK(a->getExitAfter());
  }
  f.w(0)->send(f.coord, make<proto::CheckpointSaved>([&](auto b) {
                 b.setAgreementId(id);
                 b.setRank(0);
                 b.setStep(11);
                 b.setOk(true);
               }));
  f.run();
  for (size_t r = 0; r < 3; ++r) {
    auto c = f.expect<proto::Committed>(r);
    CHECK(c->getStep() == 11);
    CHECK(c->getExitAfter());
  }
}

TEST_CASE("coordinator: a service whose leader lease lapsed decides nothing more and stops", "[coordinator][lease]") {
  bool lease = true;
  fixture f(3, "tok", std::chrono::milliseconds(5000),
            [&](coordinator_config& c) { c.lease_holds = [&lease] { return lease; }; });
  f.join_all(3);
  f.w(1)->send(f.coord, claim(1, 10));
  f.run();
  CHECK(f.expect<proto::ClaimReply>(1)->getWon());
  uint64_t id = 0;
  for (size_t r = 0; r < 3; ++r) id = f.expect<proto::CheckpointAt>(r)->getAgreementId();
  lease = false;  // the host was frozen past its lease: every ack arrives after the thaw
  for (uint32_t r = 0; r < 3; ++r) f.w(r)->send(f.coord, ack(id, r, 10));
  f.run();
  for (size_t r = 0; r < 3; ++r) CHECK_FALSE(f.next<proto::CheckpointAt>(r));  // no agreement
  bool down = false;
  f.w(0)->monitor(f.coord);
  f.run();
  f.w(0)->receive([&](caf::down_msg&) { down = true; }, caf::after(std::chrono::milliseconds(0)) >> [] {});
  CHECK(down);
}

TEST_CASE("coordinator: two notices at once, one wins", "[coordinator][agreement]") {
  fixture f(3);
  f.join_all(3);
  f.w(1)->send(f.coord, claim(1, 4));
  f.w(2)->send(f.coord, claim(2, 4));
  f.run();
  int wins = int(f.expect<proto::ClaimReply>(1)->getWon()) + int(f.expect<proto::ClaimReply>(2)->getWon());
  CHECK(wins == 1);
  for (size_t r = 0; r < 3; ++r) {
    REQUIRE(f.next<proto::CheckpointAt>(r));
    CHECK_FALSE(f.next<proto::CheckpointAt>(r));  // exactly one proposal
  }
}

TEST_CASE("coordinator: a member dying mid-agreement triggers a just-in-time save", "[coordinator][jit]") {
  fixture f(3);
  f.join_all(3);
  f.w(0)->send(f.coord, claim(0, 7));
  f.run();
  auto id = f.expect<proto::CheckpointAt>(0)->getAgreementId();
  f.expect<proto::CheckpointAt>(1);
  f.workers[2].reset();  // rank 2's process dies: the coordinator gets a down message
  f.run();
  for (size_t r = 0; r < 2; ++r) {
    auto lost = f.expect<proto::PeerLost>(r);
    CHECK(lost->getRank() == 2);
    auto jit = f.expect<proto::CheckpointAt>(r);
    CHECK(jit->getKind() == proto::CheckpointKind::JIT);
    CHECK(jit->getAgreementId() > id);
  }
}

TEST_CASE("coordinator: one member's error goes to all, naming its origin", "[coordinator][error]") {
  fixture f(3);
  f.join_all(3);
  f.w(2)->send(f.coord, make<proto::ErrorReport>([](auto b) {
                 b.setRank(2);
                 b.setStep(33);
                 b.setMessage("division by zero");
               }));
  f.run();
  for (size_t r = 0; r < 3; ++r) {
    auto e = f.expect<proto::ClusterError>(r);
    CHECK(e->getOriginRank() == 2);
    CHECK(e->getStep() == 33);
    CHECK(str(e->getMessage()).find("division by zero") != std::string::npos);
  }
}

TEST_CASE("coordinator: a silent member is declared dead in simulated time", "[coordinator][jit]") {
  fixture f(3, "tok", std::chrono::milliseconds(1000));
  f.join_all(3);
  auto beat = [](uint32_t rank, uint64_t step) {
    return make<proto::Heartbeat>([&](auto b) {
      b.setRank(rank);
      b.setCompletedStep(step);
    });
  };
  // Ranks 0 and 1 keep sending heartbeats; rank 2 is frozen (SIGSTOP).
  for (int i = 1; i <= 6; ++i) {
    f.w(0)->send(f.coord, beat(0, 10 + i));
    f.w(1)->send(f.coord, beat(1, 10 + i));
    f.run();
    f.sched->advance_time(std::chrono::milliseconds(250));
    f.run();
    if (i < 4) CHECK_FALSE(f.next<proto::PeerLost>(0));  // 750 ms of silence: not yet
  }
  for (size_t r = 0; r < 2; ++r) {
    auto lost = f.expect<proto::PeerLost>(r);
    CHECK(lost->getRank() == 2);
    CHECK(str(lost->getDetail()).find("no heartbeat") != std::string::npos);
    CHECK(f.expect<proto::CheckpointAt>(r)->getKind() == proto::CheckpointKind::JIT);
  }
}

TEST_CASE("coordinator: a committer declared dead hears no when it asks to commit", "[coordinator][fence]") {
  fixture f(3, "tok", std::chrono::milliseconds(1000));
  f.join_all(3);
  auto check = [](uint32_t rank, uint32_t incarnation) {
    return make<proto::CommitCheck>([&](auto b) {
      b.setRank(rank);
      b.setStep(140);
      b.setIncarnation(incarnation);
    });
  };
  f.w(2)->send(f.coord, check(2, 0));
  f.run();
  CHECK(f.expect<proto::CommitCheckReply>(2)->getOk());
  // For an incarnation that is over.
  f.w(2)->send(f.coord, check(2, 1));
  f.run();
  auto stale = f.expect<proto::CommitCheckReply>(2);
  CHECK_FALSE(stale->getOk());
  CHECK(str(stale->getReason()).find("incarnation 1") != std::string::npos);
  // Rank 2 frozen past dead-after (with the order to commit in hand), then thawed.
  for (int i = 1; i <= 6; ++i) {
    for (uint32_t r = 0; r < 2; ++r)
      f.w(r)->send(f.coord, make<proto::Heartbeat>([&](auto b) {
        b.setRank(r);
        b.setCompletedStep(140 + i);
      }));
    f.run();
    f.sched->advance_time(std::chrono::milliseconds(250));
    f.run();
  }
  REQUIRE(f.expect<proto::PeerLost>(0)->getRank() == 2);
  f.w(2)->send(f.coord, check(2, 0));
  f.run();
  auto late = f.expect<proto::CommitCheckReply>(2);
  CHECK_FALSE(late->getOk());
  CHECK(str(late->getReason()).find("declared lost") != std::string::npos);
  // The survivors may still commit.
  f.w(0)->send(f.coord, check(0, 0));
  f.run();
  CHECK(f.expect<proto::CommitCheckReply>(0)->getOk());
}

TEST_CASE("coordinator: a member declared dead is reported to the host once", "[coordinator][host]") {
  fixture f(3, "tok", std::chrono::milliseconds(1000));
  f.join_all(3);
  auto beat = [](uint32_t rank, uint64_t step) {
    return make<proto::Heartbeat>([&](auto b) {
      b.setRank(rank);
      b.setCompletedStep(step);
    });
  };
  // Rank 1 is frozen for good (SIGSTOP, never SIGCONT): silent.
  for (int i = 1; i <= 8; ++i) {
    f.w(0)->send(f.coord, beat(0, 10 + i));
    f.w(2)->send(f.coord, beat(2, 10 + i));
    f.run();
    f.sched->advance_time(std::chrono::milliseconds(250));
    f.run();
    if (i < 4) CHECK(f.host_verdicts.empty());  // 750 ms of silence: not yet
  }
  REQUIRE(f.host_verdicts.size() == 1);  // once, not on every later tick
  CHECK(std::get<0>(f.host_verdicts[0]) == 1);
  CHECK(std::get<1>(f.host_verdicts[0]) == 0);  // the current incarnation
  CHECK(std::get<2>(f.host_verdicts[0]).find("no heartbeat") != std::string::npos);
  // The survivors are told as before.
  CHECK(f.expect<proto::PeerLost>(0)->getRank() == 1);
  CHECK(f.expect<proto::PeerLost>(2)->getRank() == 1);
}

TEST_CASE("coordinator: a lost connection is reported to the host, a deliberate leave is not", "[coordinator][host]") {
  fixture f(3);
  f.join_all(3);
  // Rank 0 leaves on purpose (finished or stopping): the Leave is answered,
  // and its exit afterwards is no failure.
  f.w(0)->send(f.coord, make<proto::Leave>([](auto b) {
                 b.setRank(0);
                 b.setExitCode(3);
               }));
  f.run();
  bool answered = false;
  f.w(0)->receive([&](bool ok) { answered = ok; }, caf::after(std::chrono::milliseconds(0)) >> [] {});
  CHECK(answered);
  f.workers[0].reset();
  f.run();
  CHECK(f.host_verdicts.empty());
  // Rank 2's process dies without leaving: reported.
  f.workers[2].reset();
  f.run();
  REQUIRE(f.host_verdicts.size() == 1);
  CHECK(std::get<0>(f.host_verdicts[0]) == 2);
  CHECK(std::get<2>(f.host_verdicts[0]).find("connection lost") != std::string::npos);
}

TEST_CASE("coordinator: messages naming a member are accepted only from the process that joined as it",
          "[coordinator][security]") {
  fixture f(3);
  f.join_all(3);
  // No sender (a process that never joined, or an anonymous message): an
  // error report, a leave, a claim and a final-save proposal for member
  // ranks change nothing.
  caf::anon_send(f.coord, make<proto::ErrorReport>([](auto b) {
                   b.setRank(1);
                   b.setStep(3);
                   b.setMessage("forged");
                 }));
  caf::anon_send(f.coord, make<proto::Leave>([](auto b) {
                   b.setRank(2);
                   b.setExitCode(3);
                 }));
  caf::anon_send(f.coord, claim(0, 5));
  caf::anon_send(f.coord, make<proto::ProposeFinal>([](auto b) {
                   b.setRank(0);
                   b.setStartedStep(5);
                 }));
  f.run();
  for (size_t r = 0; r < 3; ++r) {
    CHECK_FALSE(f.next<proto::ClusterError>(r));
    CHECK_FALSE(f.next<proto::PeerLost>(r));
    CHECK_FALSE(f.next<proto::CheckpointAt>(r));
  }
  // The members themselves are still heard: a real claim, then forged
  // acknowledgements and a forged save report do not advance the round.
  f.w(1)->send(f.coord, claim(1, 10));
  f.run();
  REQUIRE(f.expect<proto::ClaimReply>(1)->getWon());
  uint64_t id = 0;
  for (size_t r = 0; r < 3; ++r) id = f.expect<proto::CheckpointAt>(r)->getAgreementId();
  for (uint32_t r = 0; r < 3; ++r) caf::anon_send(f.coord, ack(id, r, 10));
  f.run();
  for (size_t r = 0; r < 3; ++r) CHECK_FALSE(f.next<proto::CheckpointAt>(r));  // not agreed on forged acks
  for (uint32_t r = 0; r < 3; ++r) f.w(r)->send(f.coord, ack(id, r, 10));
  f.run();
  for (size_t r = 0; r < 3; ++r) REQUIRE(f.expect<proto::CheckpointAt>(r)->getAgreed());
  caf::anon_send(f.coord, make<proto::CheckpointSaved>([&](auto b) {
                   b.setAgreementId(id);
                   b.setRank(0);
                   b.setStep(10);
                   b.setOk(true);
                 }));
  f.run();
  for (size_t r = 0; r < 3; ++r) CHECK_FALSE(f.next<proto::Committed>(r));  // not committed on a forged report
  f.w(0)->send(f.coord, make<proto::CheckpointSaved>([&](auto b) {
                 b.setAgreementId(id);
                 b.setRank(0);
                 b.setStep(10);
                 b.setOk(true);
               }));
  f.run();
  for (size_t r = 0; r < 3; ++r) CHECK(f.expect<proto::Committed>(r)->getStep() == 10);
}

TEST_CASE("coordinator: launcher messages and timers are accepted only from launchers and the service itself",
          "[coordinator][security]") {
  fixture f(4);
  f.join_all(4);
  // No sender: a worker's exit, a launcher's notice, the service's timers.
  caf::anon_send(f.coord, exited(1, 0, 137));
  caf::anon_send(f.coord, claim(launcher_rank, 0));
  caf::anon_send(f.coord, rescue_atom::value, uint64_t{0});
  caf::anon_send(f.coord, cutoff_atom::value, uint64_t{0});
  caf::anon_send(f.coord, incarnation_query(5));
  f.run();
  CHECK(f.host_verdicts.empty());
  f.w(0)->send(f.coord, incarnation_query());
  f.run();
  uint32_t inc = 99;
  take_reply<proto::IncarnationReply>(f.w(0), [&](auto r) { inc = r.getIncarnation(); });
  CHECK(inc == 0);  // an anonymous incarnation change is refused
  for (size_t r = 0; r < 4; ++r) {
    CHECK_FALSE(f.next<proto::PeerLost>(r));
    CHECK_FALSE(f.next<proto::CheckpointAt>(r));
  }
  // A launcher registration: the secret and a node that fits the world.
  auto registered = [&](int32_t node, int32_t nproc, const std::string& token) {
    std::string answer = "no answer";
    f.w(0)->send(f.coord, registration(node, nproc, token, 2, 2));
    f.run();
    take_reply<proto::LauncherRegisterReply>(f.w(0), [&](auto r) { answer = str(r.getRefused()); });
    return answer;
  };
  CHECK(registered(1, 2, "wrong") == "wrong job token");
  CHECK(registered(2, 2, "tok").find("does not fit a world of 4") != std::string::npos);
  CHECK(registered(0, 2, "tok").find("does not fit") != std::string::npos);  // node 0 hosts the service
  CHECK(registered(1, 2, "tok").empty());
  // The service's own process (node 0's launcher) is trusted: its report of
  // a worker's exit is a verdict.
  f.w(3)->send(f.coord, exited(1, 0, 137));
  f.run();
  REQUIRE(f.host_verdicts.size() == 1);
  CHECK(std::get<0>(f.host_verdicts[0]) == 1);
  CHECK(std::get<2>(f.host_verdicts[0]).find("killed by signal 9") != std::string::npos);
}

TEST_CASE("coordinator: a successor takes the running group over", "[coordinator][takeover]") {
  using namespace std::chrono_literals;
  fixture f(3, "tok", 5000ms, [](coordinator_config& c) {
    c.takeover = true;
    c.first_agreement_id = 7'000'000;
    c.incarnation = 2;
    c.own_node = 0;
    c.nproc = 1;
    c.takeover_min = 300ms;
    c.takeover_window = 1500ms;
  });
  auto rejoin = [](uint32_t rank, uint64_t step, uint32_t incarnation = 2) {
    return make<proto::Join>([&](auto b) {
      b.setRank(rank);
      b.setWorldSize(3);
      b.setRunId("run");
      b.setToken("tok");
      b.setProtocolVersion(proto::PROTOCOL_VERSION);
      b.setIncarnation(incarnation);
      b.setCompletedStep(step);
      b.setRejoin(true);
    });
  };
  // A rejoin into another incarnation, and a first join of the next group,
  // are refused for now while the takeover runs.
  f.w(2)->send(f.coord, rejoin(2, 40, 1));
  f.run();
  auto stale = f.expect<proto::Welcome>(2);
  CHECK_FALSE(stale->getAccepted());
  CHECK(stale->getRestartable());
  f.w(2)->send(f.coord, fixture::join_msg(2, 3, "tok", proto::PROTOCOL_VERSION, 3));
  f.run();
  CHECK_FALSE(f.expect<proto::Welcome>(2)->getAccepted());
  f.w(0)->send(f.coord, rejoin(0, 40));
  f.w(1)->send(f.coord, rejoin(1, 41));
  f.run();
  CHECK(f.expect<proto::Welcome>(0)->getAccepted());
  CHECK(f.expect<proto::Welcome>(1)->getAccepted());
  f.w(1)->send(f.coord, rejoin(1, 41));  // once per rank
  f.run();
  CHECK_FALSE(f.expect<proto::Welcome>(1)->getAccepted());
  CHECK_FALSE(f.next<proto::CheckpointAt>(0));  // the launchers may still register: not yet
  f.sched->advance_time(300ms);
  f.run();
  // This node's rank is back and no other launcher registered: rank 2 is
  // lost, and the survivors' round has an id above the first one.
  uint64_t id = 0;
  for (size_t r = 0; r < 2; ++r) {
    CHECK(f.expect<proto::PeerLost>(r)->getRank() == 2);
    auto p = f.expect<proto::CheckpointAt>(r);
    CHECK(p->getKind() == proto::CheckpointKind::JIT);
    CHECK_FALSE(p->getAgreed());
    id = p->getAgreementId();
  }
  CHECK(id > 7'000'000);
  REQUIRE(f.host_verdicts.size() == 1);
  CHECK(std::get<0>(f.host_verdicts[0]) == 2);
  f.w(0)->send(f.coord, ack(id, 0, 40));
  f.w(1)->send(f.coord, ack(id, 1, 41));
  f.run();
  for (size_t r = 0; r < 2; ++r) {
    auto a = f.expect<proto::CheckpointAt>(r);
    CHECK(a->getAgreed());
    CHECK(a->getStep() == 41);
    CHECK(a->getSaver() == 1);
  }
  f.w(1)->send(f.coord, make<proto::CheckpointSaved>([&](auto b) {
                 b.setAgreementId(id);
                 b.setRank(1);
                 b.setStep(41);
                 b.setOk(true);
               }));
  f.run();
  for (size_t r = 0; r < 2; ++r) CHECK(f.expect<proto::Committed>(r)->getExitAfter());
  // The takeover is over: a late survivor is refused.
  f.w(2)->send(f.coord, rejoin(2, 40));
  f.run();
  CHECK_FALSE(f.expect<proto::Welcome>(2)->getAccepted());
}

TEST_CASE("coordinator: a takeover waits for registered launchers' ranks until its window closes",
          "[coordinator][takeover]") {
  using namespace std::chrono_literals;
  fixture f(4, "tok", 5000ms, [](coordinator_config& c) {
    c.takeover = true;
    c.own_node = 1;
    c.nproc = 2;
    c.takeover_min = 300ms;
    c.takeover_window = 1500ms;
  });
  auto rejoin = [](uint32_t rank) {
    return make<proto::Join>([&](auto b) {
      b.setRank(rank);
      b.setWorldSize(4);
      b.setRunId("run");
      b.setToken("tok");
      b.setProtocolVersion(proto::PROTOCOL_VERSION);
      b.setRejoin(true);
    });
  };
  // Node 0's launcher registers (node 0 is not this service's node here):
  // its ranks 0 and 1 are expected, but only rank 0 comes back.
  caf::scoped_actor launcher{*f.sys};
  launcher->send(f.coord, registration(0, 2, "tok", 2, 2));
  f.run();
  std::string refused = "?";
  take_reply<proto::LauncherRegisterReply>(launcher, [&](auto r) { refused = str(r.getRefused()); });
  CHECK(refused.empty());
  for (uint32_t r : {0u, 2u, 3u}) f.w(r)->send(f.coord, rejoin(r));
  f.run();
  f.sched->advance_time(300ms);
  f.run();
  CHECK_FALSE(f.next<proto::CheckpointAt>(0));  // rank 1 may still come
  f.sched->advance_time(1200ms);
  f.run();
  CHECK(f.expect<proto::PeerLost>(0)->getRank() == 1);
  CHECK(f.expect<proto::CheckpointAt>(0)->getKind() == proto::CheckpointKind::JIT);
}

TEST_CASE("coordinator: a node relay carries its node's orders, heartbeats and acknowledgements", "[coordinator][relay]") {
  using namespace std::chrono_literals;
  fixture f(4, "tok", 1000ms);
  node_relay_config rc;
  rc.node = 1;
  rc.nproc = 2;
  rc.heartbeat = 200ms;
  auto relay = spawn_node_relay(*f.sys, rc);
  caf::scoped_actor launcher{*f.sys};
  launcher->send(relay, incarnation_atom::value, uint32_t{0}, uint32_t{2});
  launcher->send(relay, coord_atom::value, caf::actor_cast<caf::actor>(f.coord));
  f.run();
  for (uint32_t r : {2u, 3u}) f.w(r)->send(relay, relay_atom::value, r, uint32_t{0});
  f.run();
  for (uint32_t r : {2u, 3u}) {
    bool ok = false;
    f.w(r)->receive([&](bool b) { ok = b; }, caf::after(0ms) >> [] {});
    CHECK(ok);
  }
  for (uint32_t r = 0; r < 4; ++r) {
    f.w(r)->send(f.coord, make<proto::Join>([&](auto b) {
                   b.setRank(r);
                   b.setWorldSize(4);
                   b.setRunId("run");
                   b.setToken("tok");
                   b.setProtocolVersion(proto::PROTOCOL_VERSION);
                   b.setRelayed(r >= 2);  // ranks 2 and 3 registered with node 1's relay
                 }));
  }
  f.run();
  for (uint32_t r = 0; r < 4; ++r) REQUIRE(f.expect<proto::Welcome>(r)->getAccepted());
  f.w(0)->send(f.coord, claim(0, 5));
  f.run();
  CHECK(f.expect<proto::ClaimReply>(0)->getWon());
  uint64_t id = 0;
  for (size_t r = 0; r < 4; ++r) {
    caf::strong_actor_ptr from;
    f.w(r)->receive(
        [&](msg<proto::CheckpointAt>& m) {
          from = f.w(r)->current_sender();
          id = decode(m)->get().getAgreementId();
        },
        caf::after(0ms) >> [] {});
    REQUIRE(from);
    CHECK((from == caf::actor_cast<caf::strong_actor_ptr>(relay)) == (r >= 2));  // 2, 3: via the relay
  }
  // A forged batch (not from node 1's relay) counts for nothing.
  f.w(0)->send(f.coord, make<proto::AckBatch>([&](auto b) {
                 b.setNode(1);
                 auto l = b.initAcks(2);
                 for (unsigned i = 0; i < 2; ++i) {
                   l[i].setAgreementId(id);
                   l[i].setRank(2 + i);
                   l[i].setEarliestStep(5);
                 }
               }));
  f.w(0)->send(f.coord, ack(id, 0, 5));
  f.w(1)->send(f.coord, ack(id, 1, 5));
  f.run();
  CHECK_FALSE(f.next<proto::CheckpointAt>(0));
  f.w(2)->send(relay, ack(id, 2, 6));
  f.run();
  CHECK_FALSE(f.next<proto::CheckpointAt>(0));  // the relay waits for rank 3
  f.w(3)->send(relay, ack(id, 3, 5));
  f.run();
  for (size_t r = 0; r < 4; ++r) {
    auto a = f.expect<proto::CheckpointAt>(r);
    CHECK(a->getAgreed());
    CHECK(a->getStep() == 6);
  }
  // Heartbeats: rank 2's reach the service in the relay's batches, rank 3
  // says nothing, ranks 0 and 1 beat directly: only rank 3 is declared dead.
  auto beat = [](uint32_t r) {
    return make<proto::Heartbeat>([&](auto b) {
      b.setRank(r);
      b.setCompletedStep(5);
    });
  };
  for (int i = 0; i < 8; ++i) {
    f.w(0)->send(f.coord, beat(0));
    f.w(1)->send(f.coord, beat(1));
    f.w(2)->send(relay, beat(2));
    f.run();
    f.sched->advance_time(200ms);
    f.run();
  }
  REQUIRE(f.host_verdicts.size() == 1);
  CHECK(std::get<0>(f.host_verdicts[0]) == 3);
  caf::anon_send_exit(relay, caf::exit_reason::user_shutdown);
  f.run();
}

namespace {
msg<proto::GroupPlanRequest> plan_request(int32_t node, uint32_t from) {
  return make<proto::GroupPlanRequest>([&](auto b) {
    b.setNode(node);
    b.setFromIncarnation(from);
    b.setHost("10.0.0." + std::to_string(node + 1));
  });
}
}  // namespace

TEST_CASE("coordinator: an elastic job forms its groups, shrinks after the wait and grows", "[coordinator][elastic]") {
  using namespace std::chrono_literals;
  fixture f(3, "tok", 5000ms, [](coordinator_config& c) {
    c.min_nodes = 2;
    c.max_nodes = 3;
    c.nproc = 1;
    c.elastic_wait = 1000ms;
  });
  caf::scoped_actor l0{*f.sys}, l1{*f.sys}, l2{*f.sys};
  auto plan_of = [&](caf::scoped_actor& l) {
    std::optional<reader<proto::GroupPlan>> out;
    l->receive([&](msg<proto::GroupPlan>& m) { out.emplace(std::move(decode(m).value())); },
               caf::after(std::chrono::milliseconds(0)) >> [] {});
    return out;
  };
  // Two of three ask: held until the wait passed, then a group of two.
  l0->send(f.coord, plan_request(0, 0));
  l1->send(f.coord, plan_request(1, 0));
  f.run();
  CHECK_FALSE(plan_of(l0));
  // Joins before the group formed are refused for now.
  f.w(0)->send(f.coord, fixture::join_msg(0, 2));
  f.run();
  auto early = f.expect<proto::Welcome>(0);
  CHECK_FALSE(early->getAccepted());
  CHECK(early->getRestartable());
  CHECK(str(early->getReason()).find("not formed yet") != std::string::npos);
  f.sched->advance_time(1100ms);
  f.run();
  for (auto* l : {&l0, &l1}) {
    auto p = plan_of(*l);
    REQUIRE(p);
    CHECK((*p)->getStatus() == proto::PlanStatus::PLAN);
    CHECK((*p)->getIncarnation() == 0);
    REQUIRE((*p)->getNodes().size() == 2);
    CHECK((*p)->getNodes()[1] == 1);
    CHECK(str((*p)->getHosts()[1]) == "10.0.0.2");
  }
  // A join for another world size is refused for now; the group's are welcome.
  f.w(0)->send(f.coord, fixture::join_msg(0, 3));
  f.run();
  auto wrong = f.expect<proto::Welcome>(0);
  CHECK_FALSE(wrong->getAccepted());
  CHECK(wrong->getRestartable());
  for (uint32_t r : {0u, 1u}) f.w(r)->send(f.coord, fixture::join_msg(r, 2));
  f.run();
  for (uint32_t r : {0u, 1u}) REQUIRE(f.expect<proto::Welcome>(r)->getAccepted());
  // Node 2 comes: excluded from this group, and the group saves to grow.
  l2->send(f.coord, plan_request(2, 0));
  f.run();
  auto ex = plan_of(l2);
  REQUIRE(ex);
  CHECK((*ex)->getStatus() == proto::PlanStatus::EXCLUDED);
  CHECK((*ex)->getIncarnation() == 0);
  for (uint32_t r : {0u, 1u}) {
    auto p = f.expect<proto::CheckpointAt>(r);
    CHECK_FALSE(p->getAgreed());
    CHECK(p->getKind() == proto::CheckpointKind::INITIAL);
  }
  bool grew = false;
  l0->send(f.coord, make<proto::ResizeQuery>([](auto b) { b.setIncarnation(0); }));
  f.run();
  take_reply<proto::ResizeReply>(l0, [&](auto r) { grew = r.getGrew(); });
  CHECK(grew);
  // The next incarnation: node 2 counted already, the group of three forms
  // as soon as the others ask.
  l2->send(f.coord, plan_request(2, 1));
  l0->send(f.coord, plan_request(0, 1));
  f.run();
  CHECK_FALSE(plan_of(l2));
  l1->send(f.coord, incarnation_query(1));
  f.run();
  take_reply<proto::IncarnationReply>(l1, [](auto) {});
  CHECK_FALSE(plan_of(l0));  // node 1 not yet: every node of the previous group is awaited
  l1->send(f.coord, plan_request(1, 1));
  f.run();
  for (auto* l : {&l0, &l1, &l2}) {
    auto p = plan_of(*l);
    REQUIRE(p);
    CHECK((*p)->getStatus() == proto::PlanStatus::PLAN);
    CHECK((*p)->getIncarnation() == 1);
    CHECK((*p)->getNodes().size() == 3);
  }
  // A refusal names what is wrong.
  l2->send(f.coord, plan_request(7, 1));
  f.run();
  auto bad = plan_of(l2);
  REQUIRE(bad);
  CHECK((*bad)->getStatus() == proto::PlanStatus::REFUSED);
  CHECK(str((*bad)->getReason()).find("at most 3 nodes") != std::string::npos);
  // A launcher given another node count than the job's is refused, saying so.
  std::string why = "no answer";
  l2->send(f.coord, registration(2, 1, "tok", 3, 3));
  f.run();
  take_reply<proto::LauncherRegisterReply>(l2, [&](auto r) { why = str(r.getRefused()); });
  CHECK(why.find("given --nnodes 3, the job's is --nnodes 2:3") != std::string::npos);
}
