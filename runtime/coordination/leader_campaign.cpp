#include "runtime/coordination/leader_campaign.hpp"

#include "runtime/base/events.hpp"

#include <algorithm>
#include <fcntl.h>
#include <sstream>
#include <unistd.h>

namespace grace {

namespace {
int64_t mono_now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

const char* to_string(leadership_event::type t) noexcept {
  using ty = leadership_event::type;
  switch (t) {
    case ty::elected: return "elected";
    case ty::following: return "following";
    case ty::deposed: return "deposed";
    case ty::unreachable: return "unreachable";
    case ty::finished: return "finished";
  }
  return "?";
}

std::string leader_value(const std::string& endpoint, uint32_t node) {
  return endpoint + " " + std::to_string(node);
}

std::optional<coordinator_location> location_from(const etcd_value& v) {
  std::istringstream in(v.value);
  std::string endpoint, node;
  if (!(in >> endpoint >> node)) return std::nullopt;
  auto loc = coordinator_location::parse(endpoint + " " + std::to_string(v.create_revision) + " " + node);
  if (!loc) return std::nullopt;
  return *loc;
}

result<std::unique_ptr<leader_campaign>> leader_campaign::create(elector_config cfg, std::function<void()> depose) {
  if (cfg.ttl_seconds < 1) return error{errc::invalid_input, "--etcd-ttl must be at least 1 second"};
  // Every call must end well within the time a leader may go unrenewed.
  auto timeout = std::chrono::milliseconds(std::clamp(cfg.ttl_seconds * 1000 / 6, 100, 1000));
  auto c = etcd_client::create(cfg.endpoints, timeout);
  if (!c) return c.err();
  return std::unique_ptr<leader_campaign>(new leader_campaign(std::move(cfg), std::move(*c), std::move(depose)));
}

leader_campaign::leader_campaign(elector_config cfg, etcd_client client, std::function<void()> depose)
    : cfg_(std::move(cfg)),
      client_(std::move(client)),
      depose_(std::move(depose)),
      lease_(static_cast<int64_t>(cfg_.ttl_seconds) * 1'000'000'000) {}

leader_campaign::~leader_campaign() { stop(false); }

void leader_campaign::start() { thread_ = std::thread([this] { loop(); }); }

void leader_campaign::stop(bool release, bool finished) {
  {
    std::lock_guard<std::mutex> g(m_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (release && leading_ && lease_id_) {
    if (finished)
      mark_finished();
    else if (!cfg_.job_key.empty() && known_)
      (void)client_.delete_if_value(cfg_.job_key, job_key_value(job_mark::state::running, known_->epoch));
    (void)client_.revoke(lease_id_);
    leading_ = false;
  }
}

/// The job finished with success: "finished EPOCH" under a lease of its
/// own, before the leader key goes, so a launcher left behind that looks
/// for a leader finds it and stops instead of hosting a service for a job
/// that is over. The lease ends the mark: a later job of the same run id
/// is not stopped by it for long (and never on its launchers' first look).
void leader_campaign::mark_finished() {
  if (cfg_.job_key.empty() || !known_) return;
  const auto running = job_key_value(job_mark::state::running, known_->epoch);
  auto lease = client_.grant_lease(cfg_.finished_ttl_seconds);
  if (lease && client_.put(cfg_.job_key, job_key_value(job_mark::state::finished, known_->epoch), *lease)) return;
  // No finished mark: at least no running mark that would make every later
  // job of this run id's launchers newcomers.
  if (lease) (void)client_.revoke(*lease);
  (void)client_.delete_if_value(cfg_.job_key, running);
}

std::vector<leadership_event> leader_campaign::take() {
  wake_.drain();
  std::lock_guard<std::mutex> g(m_);
  return std::exchange(events_, {});
}

void leader_campaign::push(leadership_event e) {
  {
    std::lock_guard<std::mutex> g(m_);
    events_.push_back(std::move(e));
  }
  wake_.wake();
}

void leader_campaign::renewed(int64_t t0) {
  lease_.renewed(t0);
  valid_until_ = t0 + lease_.ttl_ns() / 2;
  ++lease_news_;
}

bool leader_campaign::lease_holds(std::chrono::milliseconds limit) const {
  const int64_t start = mono_now();
  const int64_t until = valid_until_;
  if (until < 0) return false;  // deposed, or never elected
  if (start < until) return true;
  // Lapsed: the elector's thread is about to try a renewal (its wait ended
  // while the host was frozen). Wait for its outcome, not for the clock.
  const uint64_t seen = lease_news_;
  const int64_t give_up = start + std::chrono::duration_cast<std::chrono::nanoseconds>(limit).count();
  while (lease_news_ == seen && mono_now() < give_up) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  return mono_now() < valid_until_;
}

/// At the first poll and before each campaign. The first look: a job in
/// progress makes this launcher a newcomer (may_campaign), as if it had seen
/// another launcher lead; a finished mark is an earlier run's (this one
/// starts anew). A later look: a job that finished without this launcher
/// ends its part (false, and a `finished` event).
bool leader_campaign::check_job_key() {
  if (cfg_.job_key.empty()) {
    job_key_checked_ = true;
    return true;
  }
  auto r = client_.get(cfg_.job_key);
  if (!r) return false;  // asked again at the next poll; a campaign would fail as well
  std::optional<std::string> value;
  if (*r) value = (*r)->value;
  const auto mark = read_job_key(value);
  const bool first_look = !std::exchange(job_key_checked_, true);
  if (first_look && mark.what == job_mark::state::running) saw_other_ = true;
  if (first_look && mark.what == job_mark::state::finished) earlier_run_ = mark.epoch + 1;
  if (!job_finished_without_us(mark, first_look, std::max(known_ ? known_->epoch : 0, earlier_run_))) return true;
  finished_elsewhere_ = true;
  leadership_event e;
  e.what = leadership_event::type::finished;
  if (known_) e.where = *known_;
  e.detail = "the job finished without this node (its last leader, epoch " + std::to_string(mark.epoch) +
             ", marked it finished)";
  push(e);
  return false;
}

/// A leader marks the job as running under its epoch (once per election;
/// the mark has no lease, so it outlives the leader).
void leader_campaign::mark_job() {
  if (cfg_.job_key.empty() || !known_ ||
      client_.put(cfg_.job_key, job_key_value(job_mark::state::running, known_->epoch)))
    job_marked_ = true;
}

void leader_campaign::etcd_failed(const std::string& why) {
  if (std::exchange(said_unreachable_, true)) return;
  leadership_event e;
  e.what = leadership_event::type::unreachable;
  e.detail = why;
  push(e);
}

void leader_campaign::loop() {
  for (;;) {
    if (leading_)
      lead_once();
    else
      follow_once();
    auto wait = cfg_.poll;
    if (leading_) {
      auto until_renew = std::chrono::nanoseconds(std::max<int64_t>(0, lease_.renew_at() - mono_now()));
      wait = std::min(wait, std::chrono::duration_cast<std::chrono::milliseconds>(until_renew) +
                                std::chrono::milliseconds(1));
    }
    std::unique_lock<std::mutex> lk(m_);
    if (cv_.wait_for(lk, wait, [this] { return stop_; })) return;
  }
}

/// Renews the lease when due; once it has gone unrenewed for half the TTL,
/// stops leading (the hook fences the service first).
void leader_campaign::lead_once() {
  if (!job_marked_) mark_job();
  const int64_t t0 = mono_now();
  if (t0 >= lease_.renew_at()) {
    auto r = client_.keep_alive(lease_id_);
    if (r) {
      renewed(t0);
      said_unreachable_ = false;
    } else {
      etcd_failed("lease renewal: " + r.err().message);
    }
  }
  if (lease_.may_lead(mono_now())) return;
  leading_ = false;
  valid_until_ = -1;
  ++lease_news_;
  if (depose_) depose_();
  leadership_event e;
  e.what = leadership_event::type::deposed;
  e.where = *known_;
  e.detail = "the lease was not renewed for half its TTL (" + std::to_string(cfg_.ttl_seconds) + " s)";
  push(e);
}

void leader_campaign::follow_once() {
  if (finished_elsewhere_ || (!job_key_checked_ && !check_job_key())) return;
  auto r = client_.get(cfg_.key);
  if (!r) return etcd_failed(r.err().message);
  said_unreachable_ = false;
  std::optional<coordinator_location> seen;
  if (*r) seen = location_from(**r);
  const int64_t now = mono_now();
  if (*r) absent_since_ = 0;
  switch (next_follow_action(known_, *r ? seen : std::nullopt)) {
    case follow_action::keep: return;
    case follow_action::campaign:
      if (!absent_since_) absent_since_ = now;
      if (!check_job_key()) return;
      if (!may_campaign(member_, saw_other_, now - absent_since_,
                        std::chrono::duration_cast<std::chrono::nanoseconds>(cfg_.newcomer_defer).count()))
        return;
      return campaign();
    case follow_action::moved:
      if (!seen) return;  // a malformed value: wait for it to expire
      known_ = seen;
      saw_other_ = true;
      push({leadership_event::type::following, *seen, {}});
      return;
  }
}

/// The key is absent: try to create it under a fresh lease.
void leader_campaign::campaign() {
  const int64_t t0 = mono_now();
  auto lease = client_.grant_lease(cfg_.ttl_seconds);
  if (!lease) return etcd_failed("lease grant: " + lease.err().message);
  std::optional<etcd_value> current;
  auto won = client_.create_if_absent(cfg_.key, leader_value(cfg_.endpoint, cfg_.node), *lease, &current);
  if (!won || !*won) {
    (void)client_.revoke(*lease);
    if (!won) return etcd_failed("campaign: " + won.err().message);
    if (current)
      if (auto loc = location_from(*current); loc && (!known_ || loc->epoch > known_->epoch)) {
        known_ = loc;
        saw_other_ = true;
        push({leadership_event::type::following, *loc, {}});
      }
    return;
  }
  auto mine = client_.get(cfg_.key);
  std::optional<coordinator_location> loc;
  if (mine && *mine && (*mine)->lease == *lease) loc = location_from(**mine);
  if (!loc) {
    // Created, but not readable back (etcd lost between the calls, or the
    // lease already gone): give the key up rather than lead blind.
    (void)client_.revoke(*lease);
    return etcd_failed("campaign: the leader key could not be read back");
  }
  lease_id_ = *lease;
  renewed(t0);
  leading_ = true;
  job_marked_ = false;
  known_ = loc;
  push({leadership_event::type::elected, *loc, {}});
}

}  // namespace grace
