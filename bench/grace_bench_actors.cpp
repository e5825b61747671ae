// grace-bench-actors: the benchmarks that need the actor system.
//
//   grace-bench-actors step --iters 20000000 --reps 5
//       per-step cost of session::run(step_fn) with nothing pending (local
//       mode) against calling the same std::function directly
//   grace-bench-actors coordinator --members 64 --reps 20
//       one agreement through the real coordinator actor (CAF scheduler,
//       in process): claim -> proposal to every member -> every ack ->
//       agreed received by every member
//
// One JSON object per line on stdout, as grace-bench.
#include "actors/coordinator.hpp"
#include "actors/caf_types.hpp"
#include "actors/session.hpp"
#include "actors/actor_runtime.hpp"

#include <caf/actor_system.hpp>
#include <caf/after.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

using clk = std::chrono::steady_clock;

double secs(clk::time_point a, clk::time_point b) { return std::chrono::duration<double>(b - a).count(); }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

uint64_t arg_u(int argc, char** argv, const char* key, uint64_t def) {
  for (int i = 2; i + 1 < argc; ++i)
    if (std::string(argv[i]) == key) return std::strtoull(argv[i + 1], nullptr, 10);
  return def;
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "grace-bench-actors: %s\n", what.c_str());
  std::exit(2);
}

// ------------------------------------------------------------------ step

volatile uint64_t step_sink = 0;

int mode_step(int argc, char** argv) {
  const uint64_t iters = arg_u(argc, argv, "--iters", 20000000);
  const uint64_t reps = arg_u(argc, argv, "--reps", 5);
  auto dir = std::filesystem::temp_directory_path() / ("grace-bench-step-" + std::to_string(::getpid()));
  grace::options o;
  o.checkpoint_dir = dir.string();
  grace::cluster_config local;  // one worker, no coordinator address: local mode
  o.cluster = local;
  float w[16] = {};
  {
    grace::session g(o);
    g.register_tensor({"w", grace::dtype::f32, {16}, w});
    auto start = g.attach();
    if (!start) die("step: attach failed: " + start.err().message);
    // The same callable both ways: an empty step (one volatile store).
    std::function<void(uint64_t)> fn = [](uint64_t s) { step_sink = s; };
    std::vector<double> direct_ns, run_ns;
    uint64_t k = 0;
    for (uint64_t r = 0; r < reps; ++r) {
      auto t0 = clk::now();
      for (uint64_t i = 0; i < iters; ++i) fn(++k);
      auto t1 = clk::now();
      for (uint64_t i = 0; i < iters; ++i)
        if (g.run(fn) != grace::step_result::ok) die("step: run() stopped");
      auto t2 = clk::now();
      direct_ns.push_back(secs(t0, t1) * 1e9 / double(iters));
      run_ns.push_back(secs(t1, t2) * 1e9 / double(iters));
    }
    std::vector<double> diff;
    for (size_t i = 0; i < run_ns.size(); ++i) diff.push_back(run_ns[i] - direct_ns[i]);
    std::printf(
        "{\"row\":\"step\",\"iters\":%llu,\"reps\":%llu,\"direct_ns\":%.2f,\"run_ns\":%.2f,"
        "\"overhead_ns\":%.2f}\n",
        (unsigned long long)iters, (unsigned long long)reps, median(direct_ns), median(run_ns), median(diff));
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return 0;
}

// ------------------------------------------------------------------ coordinator

int mode_coordinator(int argc, char** argv) {
  using namespace grace;
  const uint32_t members = static_cast<uint32_t>(arg_u(argc, argv, "--members", 64));
  const uint64_t reps = arg_u(argc, argv, "--reps", 20);
  actor_runtime rt;
  auto& sys = rt.sys();
  std::vector<double> ms;
  for (uint64_t rep = 0; rep < reps; ++rep) {
    coordinator_config cc;
    cc.world_size = members;
    cc.run_id = "bench";
    cc.token = "tok";
    cc.dead_after = std::chrono::minutes(10);
    cc.log = spdlog::default_logger();
    auto coord = spawn_coordinator(sys, cc);
    std::vector<std::unique_ptr<caf::scoped_actor>> w;
    for (uint32_t r = 0; r < members; ++r) w.push_back(std::make_unique<caf::scoped_actor>(sys));
    const auto wait = std::chrono::seconds(30);
    for (uint32_t r = 0; r < members; ++r) {
      auto join = make<proto::Join>([&](auto b) {
        b.setRank(r);
        b.setWorldSize(members);
        b.setRunId("bench");
        b.setToken("tok");
        b.setProtocolVersion(proto::PROTOCOL_VERSION);
        b.setIncarnation(0);
        b.setCompletedStep(100);
      });
      bool ok = false;
      (*w[r])
          ->request(coord, wait, std::move(join))
          .receive([&](msg<proto::Welcome>& m) { ok = decode(m)->get().getAccepted(); }, [&](caf::error&) {});
      if (!ok) die("coordinator: join refused");
    }
    auto t0 = clk::now();
    (*w[1])->send(coord, make<proto::Claim>([&](auto b) {
                    auto n = b.initNotice();
                    n.setRank(1);
                    n.setSource(proto::NoticeSource::TEST);
                    n.setDetail("bench");
                    b.setStartedStep(105);
                  }));
    // Every member answers the proposal as its peer watcher would.
    for (uint32_t r = 0; r < members; ++r) {
      bool got = false;
      while (!got) {
        (*w[r])->receive(
            [&](msg<proto::CheckpointAt>& m) {
              auto d = decode(m);
              if (d->get().getAgreed()) die("coordinator: agreed before every ack");
              auto id = d->get().getAgreementId();
              (*w[r])->send(coord, make<proto::Ack>([&](auto b) {
                              b.setAgreementId(id);
                              b.setRank(r);
                              b.setEarliestStep(105 + (r & 1));
                            }));
              got = true;
            },
            [&](msg<proto::ClaimReply>&) {}, caf::after(wait) >> [&] { die("coordinator: no proposal"); });
      }
    }
    for (uint32_t r = 0; r < members; ++r) {
      bool got = false;
      while (!got)
        (*w[r])->receive([&](msg<proto::CheckpointAt>& m) { got = decode(m)->get().getAgreed(); },
                         [&](msg<proto::ClaimReply>&) {},
                         caf::after(wait) >> [&] { die("coordinator: no agreement"); });
    }
    auto t1 = clk::now();
    ms.push_back(secs(t0, t1) * 1e3);
    caf::anon_send_exit(coord, caf::exit_reason::user_shutdown);
    w.clear();
  }
  std::printf("{\"row\":\"coordinator\",\"members\":%u,\"median_ms\":%.3f,\"reps\":%llu}\n", members, median(ms),
              (unsigned long long)reps);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  spdlog::set_level(spdlog::level::warn);
  if (argc < 2) die("usage: grace-bench-actors step|coordinator [--options]");
  std::string mode = argv[1];
  if (mode == "step") return mode_step(argc, argv);
  if (mode == "coordinator") return mode_coordinator(argc, argv);
  die("unknown mode '" + mode + "'");
}
