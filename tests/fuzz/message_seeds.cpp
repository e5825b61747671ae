// Writes one valid framed message of each kind into DIR (the seed corpus of
// fuzz_messages): tests/fuzz/make_corpus.sh runs it.
#include "messages/wire.hpp"

#include <cstdio>
#include <fstream>
#include <string>

namespace {

template <class S, class F>
void seed(const std::string& dir, const char* name, F&& fill) {
  auto m = grace::make<S>(fill);
  std::ofstream(dir + "/" + name, std::ios::binary).write(reinterpret_cast<const char*>(m.bytes.data()),
                                                          static_cast<std::streamsize>(m.bytes.size()));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  std::string d = argv[1];
  namespace p = grace::proto;
  seed<p::Join>(d, "join", [](auto b) {
    b.setRank(3);
    b.setIncarnation(2);
    b.setRunId("run-1");
    b.setToken("0123456789abcdef0123456789abcdef");
  });
  seed<p::Heartbeat>(d, "heartbeat", [](auto b) {
    b.setRank(1);
    b.setCompletedStep(120);
    b.setLastStepNs(25000000);
  });
  seed<p::Claim>(d, "claim", [](auto b) {
    auto n = b.initNotice();
    n.setRank(2);
    n.setSource(p::NoticeSource::SIGNAL);
    n.setDetail("SIGTERM");
    b.setStartedStep(77);
  });
  seed<p::Ack>(d, "ack", [](auto b) {
    b.setRank(1);
    b.setAgreementId(4);
    b.setEarliestStep(80);
  });
  seed<p::CheckpointSaved>(d, "saved", [](auto b) {
    b.setRank(0);
    b.setStep(80);
    b.setOk(true);
    b.setBytes(4096);
    b.setSnapshotNs(1000);
    b.setWriteNs(200000);
  });
  seed<p::ErrorReport>(d, "error", [](auto b) {
    b.setRank(2);
    b.setStep(9);
    b.setMessage("boom");
  });
  seed<p::KvSet>(d, "kvset", [](auto b) {
    b.setKey("run/0/gloo/1");
    b.setValue(grace::as_data(std::vector<uint8_t>{1, 2, 3, 4}));
  });
  seed<p::Barrier>(d, "barrier", [](auto b) {
    b.setName("start");
    b.setCount(4);
  });
  seed<p::CheckpointAt>(d, "checkpoint_at", [](auto b) {
    b.setAgreementId(5);
    b.setStep(100);
    b.setKind(p::CheckpointKind::JIT);
    b.setAgreed(true);
  });
  seed<p::Leave>(d, "leave", [](auto b) {
    b.setRank(1);
    b.setExitCode(42);
  });
  seed<p::GroupPlanRequest>(d, "group_plan_request", [](auto b) {
    b.setNode(2);
    b.setFromIncarnation(5);
    b.setHost("192.0.2.3");
  });
  seed<p::GroupPlan>(d, "group_plan", [](auto b) {
    b.setStatus(p::PlanStatus::PLAN);
    b.setIncarnation(5);
    auto n = b.initNodes(2);
    n.set(0, 0);
    n.set(1, 2);
    auto h = b.initHosts(2);
    h.set(0, "192.0.2.1");
    h.set(1, "192.0.2.3");
    b.setWorkersPerNode(2);
  });
  return 0;
}
