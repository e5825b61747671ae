// grace-hostile: a process outside the job that reaches the coordination
// service's port and tries what an attacker on the network could, for
// tests/integration/hostile.sh.
//
//   grace-hostile HOST PORT WORLD join    joins as rank 1 with a wrong secret:
//                                         must be refused
//   grace-hostile HOST PORT WORLD forge   without joining, sends every message
//                                         that names a member (acks, heartbeat,
//                                         save report, error, leave, final
//                                         proposal, claim) and the rendezvous
//                                         requests (key-value set/get, barrier),
//                                         and the launchers' messages (a
//                                         launcher's notice, a worker's exit,
//                                         the incarnation, a checkpoint server,
//                                         a launcher registration with a wrong
//                                         secret) and the service's own timers:
//                                         the ones with replies must be refused
//   grace-hostile HOST PORT WORLD stale   a worker of the previous incarnation
//                                         (it has GRACE_TOKEN and GRACE_RUN_ID):
//                                         joins as rank 1 in the incarnation
//                                         before the current one, then sends
//                                         rank 1's acks, save reports and a
//                                         heartbeat: the join must be refused
//                                         (restartable), the rest changes
//                                         nothing
//
// GRACE_TLS_CERT/KEY/CA, when set, make it connect over TLS with those
// files (tests/integration/tls.sh: a certificate of another CA, or none).
//
// Exit 0 when every attempt was refused as it must be, 1 otherwise (the
// line printed says which one got through), 2 on a usage or connect error.
#include "actors/coordinator.hpp"
#include "actors/caf_types.hpp"
#include "runtime/coordination/agreement.hpp"
#include "actors/actor_runtime.hpp"

#include <caf/scoped_actor.hpp>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

using namespace grace;
constexpr auto wait = std::chrono::seconds(10);

int failed(const std::string& what) {
  std::printf("NOT REFUSED: %s\n", what.c_str());
  return 1;
}

int join_with_wrong_secret(caf::scoped_actor& self, const coordinator_actor& coord, uint32_t world) {
  int rc = 1;
  self->request(coord, wait, make<proto::Join>([&](auto b) {
                  b.setRank(1);
                  b.setWorldSize(world);
                  b.setToken("not-the-job-secret-at-all");
                  b.setProtocolVersion(proto::PROTOCOL_VERSION);
                }))
      .receive(
          [&](msg<proto::Welcome>& m) {
            auto w = decode(m);
            if (w && !w->get().getAccepted()) {
              std::printf("refused join: %s\n", str(w->get().getReason()).c_str());
              rc = 0;
            }
          },
          [&](caf::error& e) { std::printf("join: %s\n", to_string(e).c_str()); });
  return rc ? failed("a join with a wrong secret") : 0;
}

void send_forgeries(caf::scoped_actor& self, const coordinator_actor& coord) {
  for (uint64_t id = 0; id < 4; ++id)
    self->send(coord, make<proto::Ack>([&](auto b) {
                 b.setAgreementId(id);
                 b.setRank(0);
                 b.setEarliestStep(1);
               }));
  self->send(coord, make<proto::Heartbeat>([](auto b) {
               b.setRank(1);
               b.setCompletedStep(1000000);
             }));
  self->send(coord, make<proto::CheckpointSaved>([](auto b) {
               b.setAgreementId(1);
               b.setRank(0);
               b.setStep(999);
               b.setOk(true);
             }));
  self->send(coord, make<proto::ErrorReport>([](auto b) {
               b.setRank(1);
               b.setMessage("forged error");
             }));
  self->send(coord, make<proto::ProposeFinal>([](auto b) {
               b.setRank(0);
               b.setStartedStep(2);
             }));
}

template <class Reply, class Msg, class Ok>
int expect_refused(caf::scoped_actor& self, const coordinator_actor& coord, Msg m, const std::string& what, Ok ok) {
  bool accepted = true;
  self->request(coord, wait, std::move(m))
      .receive(
          [&](msg<Reply>& r) {
            auto d = decode(r);
            accepted = d && ok(d->get());
          },
          [&](caf::error&) { accepted = false; });
  if (accepted) return failed(what);
  std::printf("refused %s\n", what.c_str());
  return 0;
}

/// What only a launcher, or the service itself, may send.
int forge_launcher(caf::scoped_actor& self, const coordinator_actor& coord) {
  self->send(coord, make<proto::WorkerExited>([](auto b) {
               b.setRank(0);
               b.setIncarnation(0);
               b.setCode(137);
             }));
  self->send(coord, tick_atom::value);
  self->send(coord, rescue_atom::value, uint64_t{1});
  self->send(coord, cutoff_atom::value, uint64_t{1});
  int rc = expect_refused<proto::ClaimReply>(self, coord, make<proto::Claim>([](auto b) {
                                               auto n = b.initNotice();
                                               n.setRank(launcher_rank);
                                               n.setSource(proto::NoticeSource::LAUNCHER);
                                               n.setDetail("forged launcher notice");
                                             }),
                                             "a launcher's notice", [](auto r) { return r.getWon(); });
  auto& sys = self->system();
  auto reg = register_launcher(sys, coord, 1, 1, "not-the-job-secret-at-all", 2, 2);
  if (reg) rc |= failed("a launcher registration with a wrong secret");
  std::printf("refused a launcher registration: %s\n", reg ? "" : reg.err().message.c_str());
  auto inc = ask_incarnation(sys, coord, 77, wait);
  if (inc == 77u) rc |= failed("an incarnation change");
  std::printf("refused an incarnation change (still %u)\n", inc.value_or(0));
  ask_checkpoint_peers(sys, coord, 1, "127.0.0.1:1", wait);
  auto after = ask_checkpoint_peers(sys, coord, 2, "", wait).value_or(std::vector<std::string>{});
  if (std::find(after.begin(), after.end(), "127.0.0.1:1") != after.end())
    rc |= failed("a checkpoint server registration");
  std::printf("refused a checkpoint server registration\n");
  // A place in an elastic job's group: refused (the job under attack is
  // not elastic, and this process is no launcher of it either way).
  rc |= expect_refused<proto::GroupPlan>(self, coord, make<proto::GroupPlanRequest>([](auto b) {
                                           b.setNode(1);
                                           b.setHost("127.0.0.1");
                                         }),
                                         "a group plan request for node 1",
                                         [](auto r) { return r.getStatus() != proto::PlanStatus::REFUSED; });
  if (ask_resized(sys, coord, 0, wait).value_or(true)) rc |= failed("a membership-change question");
  std::printf("refused a membership-change question\n");
  return rc;
}

int forge(caf::scoped_actor& self, const coordinator_actor& coord) {
  send_forgeries(self, coord);
  int rc = forge_launcher(self, coord);
  rc |= expect_refused<proto::ClaimReply>(self, coord, make<proto::Claim>([](auto b) {
                                            auto n = b.initNotice();
                                            n.setRank(1);
                                            n.setSource(proto::NoticeSource::SIGNAL);
                                            n.setDetail("forged notice");
                                            b.setStartedStep(1);
                                          }),
                                          "a claim for rank 1", [](auto r) { return r.getWon(); });
  rc |= expect_refused<proto::KvReply>(self, coord, make<proto::KvSet>([](auto b) { b.setKey("planted"); }),
                                       "a key-value set", [](auto r) { return r.getOk(); });
  rc |= expect_refused<proto::KvReply>(self, coord, make<proto::KvGet>([](auto b) { b.setKey("planted"); }),
                                       "a key-value get", [](auto r) { return r.getOk(); });
  rc |= expect_refused<proto::BarrierReply>(self, coord, make<proto::Barrier>([](auto b) {
                                              b.setName("b");
                                              b.setRank(1);
                                              b.setCount(2);
                                            }),
                                            "a barrier arrival for rank 1", [](auto r) { return r.getOk(); });
  rc |= expect_refused<proto::CommitCheckReply>(self, coord, make<proto::CommitCheck>([](auto b) {
                                                  b.setRank(1);
                                                  b.setStep(1);
                                                }),
                                                "a commit check for rank 1", [](auto r) { return r.getOk(); });
  // Sent last: a leave needs no answer, and a refused one leaves the member in.
  self->send(coord, make<proto::Leave>([](auto b) {
               b.setRank(1);
               b.setExitCode(3);
             }));
  return rc;
}

/// A worker left over from the previous incarnation, with the job's secret.
int stale_worker(caf::scoped_actor& self, const coordinator_actor& coord, uint32_t world) {
  const char* token = std::getenv("GRACE_TOKEN");
  const char* run_id = std::getenv("GRACE_RUN_ID");
  if (!token || !run_id) {
    std::fprintf(stderr, "grace-hostile stale: GRACE_TOKEN and GRACE_RUN_ID (a worker's) must be set\n");
    return 2;
  }
  const uint32_t current = ask_incarnation(self->system(), coord, std::nullopt, wait).value_or(0);
  if (current == 0) {
    std::fprintf(stderr, "grace-hostile stale: the job is still in incarnation 0: nothing is stale yet\n");
    return 2;
  }
  int rc = 1;
  self->request(coord, wait, make<proto::Join>([&](auto b) {
                  b.setRank(1);
                  b.setWorldSize(world);
                  b.setToken(token);
                  b.setRunId(run_id);
                  b.setProtocolVersion(proto::PROTOCOL_VERSION);
                  b.setIncarnation(current - 1);
                }))
      .receive(
          [&](msg<proto::Welcome>& m) {
            auto w = decode(m);
            if (w && !w->get().getAccepted()) {
              std::printf("refused stale join: %s\n", str(w->get().getReason()).c_str());
              rc = 0;
            }
          },
          [&](caf::error& e) { std::printf("stale join: %s\n", to_string(e).c_str()); });
  if (rc) return failed("a join in the previous incarnation");
  for (uint64_t id = 0; id < 8; ++id) {
    self->send(coord, make<proto::Ack>([&](auto b) {
                 b.setAgreementId(id);
                 b.setRank(1);
                 b.setEarliestStep(1);
               }));
    self->send(coord, make<proto::CheckpointSaved>([&](auto b) {
                 b.setAgreementId(id);
                 b.setRank(1);
                 b.setStep(1);
                 b.setOk(true);
               }));
  }
  self->send(coord, make<proto::Heartbeat>([&](auto b) {
               b.setRank(1);
               b.setIncarnation(current - 1);
               b.setCompletedStep(1);
             }));
  std::printf("sent stale acknowledgements, save reports and a heartbeat for rank 1 (incarnation %u)\n", current - 1);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  spdlog::set_level(spdlog::level::warn);
  if (argc != 5) {
    std::fprintf(stderr, "usage: grace-hostile HOST PORT WORLD join|forge|stale\n");
    return 2;
  }
  system_options so;
  so.tls = tls_files_from({}, [](const char* v) { return std::getenv(v); });
  if (auto st = check_tls_files(so.tls, "GRACE_TLS_"); !st) {
    std::fprintf(stderr, "grace-hostile: %s\n", st.err().message.c_str());
    return 2;
  }
  actor_runtime rt(so);
  auto& sys = rt.sys();
  // GRACE_HOSTILE_CONNECT_MS: how long to retry a connect that is refused.
  const char* ms = std::getenv("GRACE_HOSTILE_CONNECT_MS");
  auto connect_for = std::chrono::milliseconds(ms ? std::stol(ms) : 10000);
  auto coord = connect_coordinator(sys, argv[1], static_cast<uint16_t>(std::stoul(argv[2])), connect_for);
  if (!coord) {
    std::fprintf(stderr, "grace-hostile: %s\n", coord.err().message.c_str());
    return 2;
  }
  caf::scoped_actor self{sys};
  std::string what = argv[4];
  int rc = what == "join"    ? join_with_wrong_secret(self, *coord, static_cast<uint32_t>(std::stoul(argv[3])))
           : what == "forge" ? forge(self, *coord)
           : what == "stale" ? stale_worker(self, *coord, static_cast<uint32_t>(std::stoul(argv[3])))
                             : 2;
  std::fflush(stdout);
  return rc;
}
