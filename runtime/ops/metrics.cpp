#include "runtime/ops/metrics.hpp"
#include "runtime/base/notice_source.hpp"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <map>
#include <mutex>

namespace grace {

namespace {

using prometheus::Counter;
using prometheus::Family;
using prometheus::Gauge;
using prometheus::Histogram;

/// Exponential buckets from `start`, `n` of them, each `factor` wider.
Histogram::BucketBoundaries exponential(double start, double factor, int n) {
  Histogram::BucketBoundaries b;
  for (int i = 0; i < n; ++i, start *= factor) b.push_back(start);
  return b;
}

}  // namespace

/// Many fields for a reason: one Prometheus family or gauge handle per
/// exported metric; the handles hold no state of their own.
struct job_metrics::impl {
  std::mutex m;
  std::shared_ptr<prometheus::Registry> reg = std::make_shared<prometheus::Registry>();
  Family<Gauge>& step = prometheus::BuildGauge()
                            .Name("grace_completed_step")
                            .Help("The last step a rank completed, from its heartbeats")
                            .Register(*reg);
  Family<Histogram>& step_time = prometheus::BuildHistogram()
                                     .Name("grace_step_duration_seconds")
                                     .Help("Step time, the last step's duration at each heartbeat that saw progress")
                                     .Register(*reg);
  Family<Counter>& notices = prometheus::BuildCounter()
                                 .Name("grace_notices_total")
                                 .Help("Termination notices reported to the coordination service, by source")
                                 .Register(*reg);
  Family<Counter>& agreements =
      prometheus::BuildCounter().Name("grace_agreements_total").Help("Agreed checkpoint steps, by kind").Register(*reg);
  Family<Histogram>& agreement_latency = prometheus::BuildHistogram()
                                             .Name("grace_agreement_latency_seconds")
                                             .Help("From a claim or a failure verdict to the agreed step")
                                             .Register(*reg);
  Family<Counter>& saves = prometheus::BuildCounter()
                               .Name("grace_saves_total")
                               .Help("Checkpoint saves by kind and outcome (committed, failed)")
                               .Register(*reg);
  Family<Histogram>& snapshot_time = prometheus::BuildHistogram()
                                         .Name("grace_save_snapshot_seconds")
                                         .Help("Time the trainer paused to snapshot its state, by kind")
                                         .Register(*reg);
  Family<Histogram>& write_time = prometheus::BuildHistogram()
                                      .Name("grace_save_write_seconds")
                                      .Help("Writing a checkpoint in the background until durable, by kind")
                                      .Register(*reg);
  Family<Histogram>& commit_time = prometheus::BuildHistogram()
                                       .Name("grace_save_commit_seconds")
                                       .Help("From an agreed step to the job-wide commit, by kind")
                                       .Register(*reg);
  Family<Counter>& save_bytes =
      prometheus::BuildCounter().Name("grace_save_bytes_total").Help("Bytes of committed checkpoints").Register(*reg);
  Family<Counter>& restores =
      prometheus::BuildCounter().Name("grace_restores_total").Help("Checkpoint restores by the workers").Register(*reg);
  Family<Histogram>& restore_time =
      prometheus::BuildHistogram().Name("grace_restore_duration_seconds").Help("Restore time").Register(*reg);
  Family<Counter>& restarts =
      prometheus::BuildCounter().Name("grace_restarts_total").Help("Group restarts by reason").Register(*reg);
  Family<Counter>& lost = prometheus::BuildCounter()
                              .Name("grace_members_lost_total")
                              .Help("Members the coordination service declared lost, by verdict")
                              .Register(*reg);
  Family<Histogram>& steps_lost = prometheus::BuildHistogram()
                                      .Name("grace_steps_lost")
                                      .Help("Completed steps lost per restore (done again after it)")
                                      .Register(*reg);
  Family<Counter>& steps_lost_total =
      prometheus::BuildCounter().Name("grace_steps_lost_total").Help("Completed steps lost").Register(*reg);
  Family<Gauge>& incarnation =
      prometheus::BuildGauge().Name("grace_incarnation").Help("The group incarnation running").Register(*reg);
  Family<Gauge>& goodput = prometheus::BuildGauge()
                               .Name("grace_goodput_ratio")
                               .Help("Productive step time over wall time, all runs of the job")
                               .Register(*reg);
  Family<Gauge>& wall =
      prometheus::BuildGauge().Name("grace_wall_seconds").Help("The job's wall time, all runs").Register(*reg);
  Family<Gauge>& productive = prometheus::BuildGauge()
                                  .Name("grace_productive_seconds")
                                  .Help("Step time whose steps were kept, all runs")
                                  .Register(*reg);
  Family<Gauge>& lost_time =
      prometheus::BuildGauge().Name("grace_lost_seconds").Help("Wall time not spent on kept steps, by cause").Register(*reg);

  std::map<uint32_t, uint64_t> seen_step;
  int64_t trigger_ns = 0;  ///< the pending agreement's claim or verdict
  std::map<int64_t, std::pair<int64_t, std::string>> agreed;  ///< id -> (time, kind)

  Histogram& seconds_hist(Family<Histogram>& f, const std::map<std::string, std::string>& labels) {
    return f.Add(labels, exponential(0.001, 2.5, 14));  // 1 ms .. ~150 s
  }
  void on_coordinator(const event& e);
  void on_worker(const event& e);
};

void job_metrics::impl::on_coordinator(const event& e) {
  if (e.name == "claim") {
    notices.Add({{"source", notice_source_name(e.num("source", -1))}}).Increment();
    if (!trigger_ns) trigger_ns = e.t_ns;
  } else if (e.name == "peer_lost") {
    auto v = e.str("verdict");
    lost.Add({{"verdict", v.empty() ? "dead" : v}}).Increment();
    if (!trigger_ns) trigger_ns = e.t_ns;
  } else if (e.name == "agreed") {
    auto kind = e.str("kind");
    agreements.Add({{"kind", kind}}).Increment();
    if (trigger_ns) seconds_hist(agreement_latency, {{"kind", kind}}).Observe((e.t_ns - trigger_ns) / 1e9);
    trigger_ns = 0;
    agreed[e.num("id")] = {e.t_ns, kind};
  } else if (e.name == "committed") {
    auto it = agreed.find(e.num("id"));
    if (it == agreed.end()) return;
    seconds_hist(commit_time, {{"kind", it->second.second}}).Observe((e.t_ns - it->second.first) / 1e9);
    agreed.erase(it);
  } else if (e.name == "group_started") {
    incarnation.Add({}).Set(static_cast<double>(e.incarnation));
    trigger_ns = 0;
  }
}

void job_metrics::impl::on_worker(const event& e) {
  auto kind = e.str("kind");
  if (e.name == "snapshot_done") {
    seconds_hist(snapshot_time, {{"kind", kind}}).Observe(e.num("ns") / 1e9);
  } else if (e.name == "committed_local") {
    saves.Add({{"kind", kind}, {"outcome", "committed"}}).Increment();
    seconds_hist(write_time, {{"kind", kind}}).Observe(e.num("write_ns") / 1e9);
    save_bytes.Add({{"kind", kind}}).Increment(static_cast<double>(e.num("bytes")));
  } else if (e.name == "save_failed") {
    saves.Add({{"kind", kind}, {"outcome", "failed"}}).Increment();
  } else if ((e.name == "exit" || e.name == "finished") && e.step() >= 0) {
    // The last heartbeat may predate the last step.
    step.Add({{"rank", std::to_string(e.rank)}}).Set(static_cast<double>(e.step()));
  } else if (e.name == "restored") {
    restores.Add({}).Increment();
    seconds_hist(restore_time, {}).Observe(e.num("ns") / 1e9);
  }
}

job_metrics::job_metrics() : d_(std::make_unique<impl>()) {}
job_metrics::~job_metrics() = default;

void job_metrics::on_event(const event& e, std::optional<uint64_t> steps_lost) {
  std::lock_guard<std::mutex> g(d_->m);
  if (e.rank < 0)
    d_->on_coordinator(e);
  else
    d_->on_worker(e);
  if (steps_lost) {
    d_->steps_lost.Add({}, Histogram::BucketBoundaries{0, 1, 2, 5, 10, 20, 50, 100, 1000})
        .Observe(static_cast<double>(*steps_lost));
    d_->steps_lost_total.Add({}).Increment(static_cast<double>(*steps_lost));
  }
}

void job_metrics::on_progress(uint32_t rank, uint64_t completed, int64_t last_step_ns) {
  std::lock_guard<std::mutex> g(d_->m);
  auto r = std::to_string(rank);
  d_->step.Add({{"rank", r}}).Set(static_cast<double>(completed));
  auto& seen = d_->seen_step[rank];
  if (completed > seen && last_step_ns > 0)
    d_->step_time.Add({{"rank", r}}, exponential(0.0005, 2, 16)).Observe(last_step_ns / 1e9);
  seen = completed;
}

void job_metrics::on_restart(const std::string& reason) {
  std::lock_guard<std::mutex> g(d_->m);
  d_->restarts.Add({{"reason", reason}}).Increment();
}

void job_metrics::set_goodput(const goodput_account& a) {
  std::lock_guard<std::mutex> g(d_->m);
  d_->goodput.Add({}).Set(a.ratio());
  d_->wall.Add({}).Set(a.wall_s);
  d_->productive.Add({}).Set(a.productive_s);
  for (auto& c : goodput_causes) d_->lost_time.Add({{"cause", c.name}}).Set(a.*c.seconds);
}

std::shared_ptr<prometheus::Registry> job_metrics::registry() const { return d_->reg; }

std::string job_metrics::text() const { return prometheus::TextSerializer().Serialize(d_->reg->Collect()); }

}  // namespace grace
