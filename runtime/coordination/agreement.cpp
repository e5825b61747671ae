#include "runtime/coordination/agreement.hpp"

#include <functional>

namespace grace {

const char* to_string(agreement_phase p) noexcept {
  switch (p) {
    case agreement_phase::idle: return "idle";
    case agreement_phase::waiting: return "waiting";
    case agreement_phase::proposing: return "proposing";
    case agreement_phase::saving: return "saving";
    case agreement_phase::countdown: return "countdown";
    case agreement_phase::jit_collect: return "jit_collect";
    case agreement_phase::stopping: return "stopping";
    case agreement_phase::failed: return "failed";
    case agreement_phase::finishing: return "finishing";
  }
  return "?";
}

const char* to_string(loss_reason r) noexcept {
  switch (r) {
    case loss_reason::dead: return "dead";
    case loss_reason::hung: return "hung";
    case loss_reason::left: return "left";
  }
  return "?";
}

const char* to_string(agreement_action::type t) noexcept {
  using ty = agreement_action::type;
  switch (t) {
    case ty::claim_reply: return "claim_reply";
    case ty::propose: return "propose";
    case ty::agreed: return "agreed";
    case ty::committed: return "committed";
    case ty::peer_lost: return "peer_lost";
    case ty::cluster_error: return "cluster_error";
    case ty::deadline_update: return "deadline_update";
    case ty::commit_parts: return "commit_parts";
  }
  return "?";
}

using ty = agreement_action::type;

namespace {

bool settled(agreement_phase p) {
  return p == agreement_phase::stopping || p == agreement_phase::failed || p == agreement_phase::finishing;
}

void append(actions& out, actions more) { out.insert(out.end(), more.begin(), more.end()); }

}  // namespace

agreement::agreement(uint32_t world_size, uint64_t first_id)
    : world_size_(world_size), id_(first_id) {}

uint32_t agreement::chief() const { return live_.empty() ? 0 : *live_.begin(); }

std::optional<std::string> agreement::join_refusal(uint32_t rank, uint64_t completed) const {
  if (rank >= world_size_) return "rank " + std::to_string(rank) + " out of range";
  if (restored_differs(completed))
    return "rank " + std::to_string(rank) + " restored step " + std::to_string(completed) +
           " but the group restored step " + std::to_string(*restored_max_) +
           ": the checkpoint directories differ (node-local directories not brought level?); "
           "restart after fetching the newest checkpoint";
  if (lost_.count(rank)) return "rank " + std::to_string(rank) + " was declared lost in this incarnation";
  if (!lost_.empty() || !gone_.empty())
    return "the group lost a member in this incarnation and is stopping; restart into the next one";
  if (settled(phase_) && phase_ != agreement_phase::finishing)
    return std::string("the group is ") + to_string(phase_) + "; restart into the next incarnation";
  return std::nullopt;
}

bool agreement::restored_differs(uint64_t completed) const {
  return restored_min_ && (completed != *restored_min_ || completed != *restored_max_);
}

bool agreement::refusal_ends_group(uint64_t completed) const {
  return restored_differs(completed) && !settled(phase_);
}

actions agreement::on_join(uint32_t rank, uint64_t completed) {
  if (join_refusal(rank, completed)) return {};
  joined_.insert(rank);
  live_.insert(rank);
  restored_min_ = std::min(restored_min_.value_or(completed), completed);
  restored_max_ = std::max(restored_max_.value_or(completed), completed);
  if (phase_ == agreement_phase::waiting && all_joined()) return propose(checkpoint_kind::initial, claim_started_);
  return {};
}

actions agreement::on_rejoin(uint32_t rank, uint64_t completed) {
  if (rank >= world_size_ || lost_.count(rank) || gone_.count(rank) || joined_.count(rank)) return {};
  (void)completed;  // the round's acknowledgements carry the steps that count
  joined_.insert(rank);
  live_.insert(rank);
  return {};
}

actions agreement::end_takeover() {
  if (phase_ != agreement_phase::idle && phase_ != agreement_phase::waiting) return {};
  if (live_.empty()) {
    phase_ = agreement_phase::stopping;
    return {};
  }
  if (!holder_) holder_ = launcher_rank;
  return propose(checkpoint_kind::jit, 0);
}

actions agreement::on_claim(uint32_t rank, uint64_t started, int64_t deadline_ns) {
  agreement_action reply{ty::claim_reply};
  reply.rank = rank;
  if (phase_ == agreement_phase::idle) {
    holder_ = rank;
    deadline_ns_ = deadline_ns;
    claim_started_ = started;
    reply.won = true;
    reply.holder = rank;
    reply.id = id_ + 1;
    actions out{reply};
    if (all_joined())
      append(out, propose(checkpoint_kind::initial, started));
    else
      phase_ = agreement_phase::waiting;
    return out;
  }
  // The claim is taken: the second notice defers to the holder. A later
  // notice with an earlier deadline shortens a grace period still running.
  reply.won = false;
  reply.holder = holder_.value_or(launcher_rank);
  reply.id = id_;
  actions out{reply};
  bool running = phase_ == agreement_phase::waiting || phase_ == agreement_phase::proposing ||
                 phase_ == agreement_phase::saving || phase_ == agreement_phase::countdown;
  if (running && kind_ != checkpoint_kind::jit && deadline_ns_ != 0 && deadline_ns != 0 && deadline_ns < deadline_ns_) {
    deadline_ns_ = deadline_ns;
    agreement_action upd{ty::deadline_update};
    upd.rank = chief();
    upd.id = id_;
    upd.deadline_ns = deadline_ns;
    out.push_back(upd);
  }
  return out;
}

actions agreement::propose(checkpoint_kind kind, uint64_t lower_bound) {
  ++id_;
  not_awaited_.clear();  // a rescue sets it again right after
  kind_ = kind;
  lower_bound_ = lower_bound;
  acks_.clear();
  copies_.clear();
  part_writers_.clear();
  phase_ = kind == checkpoint_kind::jit ? agreement_phase::jit_collect : agreement_phase::proposing;
  agreement_action p{ty::propose};
  p.id = id_;
  p.step = lower_bound;
  p.kind = kind;
  p.deadline_ns = deadline_ns_;
  actions out{p};
  append(out, maybe_agree());
  return out;
}

actions agreement::maybe_agree() {
  // Cheap test first: with one ack per message a full scan per ack would make
  // an agreement quadratic in the cluster size.
  if (acks_.size() + not_awaited_.size() < live_.size()) return {};
  bool any = false;
  for (auto r : live_) {
    if (acks_.count(r))
      any = true;
    else if (!not_awaited_.count(r))
      return {};
  }
  if (!any && !live_.empty()) return {};  // nobody answered yet
  if (live_.empty()) {
    phase_ = agreement_phase::stopping;
    return {};
  }
  if (kind_ == checkpoint_kind::jit) return agree_jit();
  agreement_action a{ty::agreed};
  a.id = id_;
  a.kind = kind_;
  a.deadline_ns = deadline_ns_;
  uint64_t step = lower_bound_;
  for (auto& [r, s] : acks_)
    if (live_.count(r)) step = std::max(step, s);
  a.step = step;
  a.saver = chief();
  a.exit_after = kind_ == checkpoint_kind::final || deadline_ns_ == 0;
  a.all_save = parts_;
  parts_in_.clear();
  commits_pending_.clear();
  agreed_step_ = a.step;
  saver_ = a.saver;
  exit_after_ = a.exit_after;
  phase_ = agreement_phase::saving;
  return {a};
}

actions agreement::agree_jit() {
  // The survivor with the most completed steps saves; ties: lowest rank
  // (std::map iterates in rank order and only a strictly larger step wins).
  uint64_t best = 0;
  uint32_t saver = chief();
  bool first = true;
  for (auto& [r, s] : acks_) {
    if (!live_.count(r)) continue;
    if (first || s > best) {
      best = s;
      saver = r;
      first = false;
    }
  }
  agreed_step_ = best;
  saver_ = saver;
  exit_after_ = true;
  // With sharded state only copies can stand in for a lost member's part.
  if (parts_) return agree_from_copies();
  // Every survivor's state is already on disk: nothing to write.
  if (best <= durable_step()) return stop_at_durable();
  agreement_action a{ty::agreed};
  a.id = id_;
  a.kind = checkpoint_kind::jit;
  a.deadline_ns = deadline_ns_;
  a.step = best;
  a.saver = saver;
  a.exit_after = true;
  phase_ = agreement_phase::saving;
  return {a};
}

actions agreement::on_ack(uint32_t rank, uint64_t id, uint64_t earliest, replica_report copies) {
  if (id != id_ || !live_.count(rank)) return {};
  if (phase_ != agreement_phase::proposing && phase_ != agreement_phase::jit_collect) return {};
  acks_[rank] = earliest;
  if (parts_ && phase_ == agreement_phase::jit_collect) copies_[rank] = std::move(copies);
  return maybe_agree();
}

actions agreement::stop_at_durable() {
  phase_ = agreement_phase::stopping;
  agreement_action c{ty::committed};
  c.id = id_;
  c.step = durable_step();
  c.kind = checkpoint_kind::jit;
  c.exit_after = true;
  return {c};
}

namespace {
bool holds(const std::vector<uint64_t>& steps, uint64_t s) {
  return std::find(steps.begin(), steps.end(), s) != steps.end();
}
}  // namespace

/// Whether `writers`' copies hold every member's part of `step`: the
/// members whose part comes from a replica, or nullopt.
std::optional<std::vector<uint32_t>> agreement::copies_cover(uint64_t step, const std::set<uint32_t>& writers) const {
  std::vector<uint32_t> from_replica;
  for (uint32_t q = 0; q < world_size_; ++q) {
    if (writers.count(q)) {
      if (!holds(copies_.at(q).kept, step)) return std::nullopt;
      continue;
    }
    bool found = false;
    for (auto w : writers) {
      auto& c = copies_.at(w);
      found |= c.of == q && holds(c.replica, step);
    }
    if (!found) return std::nullopt;
    from_replica.push_back(q);
  }
  return from_replica;
}

actions agreement::agree_from_copies() {
  std::set<uint32_t> writers;
  std::set<uint64_t, std::greater<>> candidates;
  for (auto& [r, c] : copies_) {
    if (!live_.count(r) || !acks_.count(r)) continue;
    writers.insert(r);
    candidates.insert(c.kept.begin(), c.kept.end());
  }
  for (auto step : candidates) {
    if (step <= durable_step()) break;
    auto from_replica = copies_cover(step, writers);
    if (!from_replica) continue;
    agreement_action a{ty::agreed};
    a.id = id_;
    a.kind = checkpoint_kind::jit;
    a.deadline_ns = deadline_ns_;
    a.step = step;
    a.saver = *writers.begin();
    a.exit_after = true;
    a.all_save = true;
    a.from_kept = true;
    a.from_replica = std::move(*from_replica);
    agreed_step_ = step;
    saver_ = a.saver;
    parts_in_.clear();
    commits_pending_.clear();
    part_writers_ = std::move(writers);
    phase_ = agreement_phase::saving;
    return {a};
  }
  return stop_at_durable();
}

actions agreement::on_saved(uint32_t rank, uint64_t id, uint64_t step, bool ok, const std::string& error,
                            bool part) {
  if (id == 0) return on_periodic(rank, step, ok, part);
  if (part) return on_part(rank, id, step, ok, error);
  // A commit of every part, even one a later round overtook (a loss during
  // the commit): the step is durable, and copies of it are not written again.
  // (In node-local directories one node's commit is only its share.)
  if (parts_ && ok && !local_world_) committed_step_ = std::max(committed_step_, step);
  const bool committer = parts_ && local_world_ ? commits_pending_.count(rank) > 0 : rank == saver_;
  if (id != id_ || phase_ != agreement_phase::saving || !committer) return {};
  if (!ok) {
    phase_ = agreement_phase::failed;
    agreement_action e{ty::cluster_error};
    e.rank = rank;
    e.step = step;
    e.message = "checkpoint save at step " + std::to_string(step) + " failed: " + error;
    return {e};
  }
  if (commits_pending_.erase(rank) && !commits_pending_.empty()) return {};
  committed_step_ = std::max(committed_step_, step);
  agreement_action c{ty::committed};
  c.id = id;
  c.step = step;
  c.kind = kind_;
  c.exit_after = exit_after_;
  phase_ = exit_after_ ? agreement_phase::stopping : agreement_phase::countdown;
  return {c};
}

bool agreement::all_live_in(const std::set<uint32_t>& s) const {
  for (auto r : live_)
    if (!s.count(r)) return false;
  return !live_.empty();
}

actions agreement::on_part(uint32_t rank, uint64_t id, uint64_t step, bool ok, const std::string& error) {
  if (!parts_ || id != id_ || phase_ != agreement_phase::saving || step != agreed_step_ || !live_.count(rank))
    return {};
  if (!ok) {
    phase_ = agreement_phase::failed;
    agreement_action e{ty::cluster_error};
    e.rank = rank;
    e.step = step;
    e.message = "rank " + std::to_string(rank) + " could not save its part of step " + std::to_string(step) + ": " +
                error;
    return {e};
  }
  if (!parts_in_.insert(rank).second) return {};
  if (part_writers_.empty() ? !all_live_in(parts_in_)
                            : !std::includes(parts_in_.begin(), parts_in_.end(), part_writers_.begin(),
                                             part_writers_.end()))
    return {};
  commits_pending_ = committers(part_writers_.empty() ? live_ : part_writers_, saver_);
  return order_commits(id_, step, commits_pending_);
}

/// Who commits the parts `writers` wrote: `single` when every rank shares
/// one directory, else the lowest live rank of every node a writer is on.
std::set<uint32_t> agreement::committers(const std::set<uint32_t>& writers, uint32_t single) const {
  if (!local_world_) return {single};
  std::set<uint32_t> nodes, out;
  for (auto w : writers) nodes.insert(w / local_world_);
  for (auto r : live_)
    if (nodes.erase(r / local_world_)) out.insert(r);  // live_ is ordered: the node's lowest rank first
  return out;
}

actions agreement::order_commits(uint64_t id, uint64_t step, const std::set<uint32_t>& committers) {
  actions out;
  for (auto r : committers) {
    agreement_action c{ty::commit_parts};
    c.rank = r;
    c.id = id;
    c.step = step;
    out.push_back(c);
  }
  return out;
}

actions agreement::on_periodic(uint32_t rank, uint64_t step, bool ok, bool part) {
  if (!parts_ || !live_.count(rank)) return {};
  if (!part) {
    if (!ok) return {};
    if (!local_world_) {
      if (rank == chief()) committed_step_ = std::max(committed_step_, step);
      return {};
    }
    auto c = periodic_commits_.find(step);
    if (c != periodic_commits_.end() && c->second.erase(rank) && c->second.empty()) {
      committed_step_ = std::max(committed_step_, step);
      periodic_commits_.erase(c);
    }
    return {};
  }
  // A failed part is not counted; the rank may write it again (its final
  // save of that step), and the commit comes once every part is in.
  if (!ok) return {};
  periodic_parts_[step].insert(rank);
  // A member's writer may lag a few saves behind; a step older than the
  // last few is abandoned (its parts are removed by the next commit).
  constexpr size_t kept = 4;
  while (periodic_parts_.size() > kept) periodic_parts_.erase(periodic_parts_.begin());
  auto it = periodic_parts_.find(step);
  if (it == periodic_parts_.end() || !all_live_in(it->second)) return {};
  periodic_parts_.erase(it);
  auto who = committers(live_, chief());
  if (local_world_) {
    periodic_commits_[step] = who;
    while (periodic_commits_.size() > kept) periodic_commits_.erase(periodic_commits_.begin());
  }
  return order_commits(0, step, who);
}

actions agreement::on_propose_final(uint32_t rank, uint64_t started) {
  if (phase_ != agreement_phase::countdown || rank != chief()) return {};
  return propose(checkpoint_kind::final, started);
}

actions agreement::member_gone(uint32_t rank) {
  actions out;
  switch (phase_) {
    case agreement_phase::stopping:
    case agreement_phase::failed:
    case agreement_phase::finishing: break;
    case agreement_phase::jit_collect:
      acks_.erase(rank);
      append(out, maybe_agree());
      break;
    case agreement_phase::saving:
      // Writing kept copies: without this member's part (or its commit)
      // the round cannot complete; the durable step is the restart point.
      if (!part_writers_.empty()) {
        if (rank == saver_ || commits_pending_.count(rank) || (part_writers_.count(rank) && !parts_in_.count(rank)))
          append(out, stop_at_durable());
        break;
      }
      // A just-in-time saver needs nobody else: it stopped at a step
      // boundary and holds its state. Only its own loss moves the save.
      if (kind_ == checkpoint_kind::jit && rank != saver_) break;
      [[fallthrough]];
    case agreement_phase::idle:
    case agreement_phase::waiting:
    case agreement_phase::proposing:
    case agreement_phase::countdown:
      // The group cannot train on without it, and whatever was agreed may
      // never be reached (the collectives of the agreed step need every
      // member): the survivors save their own most advanced state. A saver
      // that already holds the agreed step acknowledges it and saves it.
      if (!holder_) holder_ = rank;
      if (live_.empty())
        phase_ = agreement_phase::stopping;
      else
        append(out, propose(checkpoint_kind::jit, 0));
      break;
  }
  return out;
}

actions agreement::on_member_lost(uint32_t rank, uint64_t completed, loss_reason why, const std::string& detail) {
  if (rank >= world_size_ || lost_.count(rank) || gone_.count(rank)) return {};
  live_.erase(rank);
  lost_.insert(rank);
  agreement_action lost{ty::peer_lost};
  lost.rank = rank;
  lost.step = completed;
  lost.reason = why;
  lost.message = detail;
  actions out{lost};
  append(out, member_gone(rank));
  return out;
}

actions agreement::on_error(uint32_t rank, uint64_t step, const std::string& message) {
  if (phase_ == agreement_phase::failed || phase_ == agreement_phase::stopping) return {};
  phase_ = agreement_phase::failed;
  agreement_action e{ty::cluster_error};
  e.rank = rank;
  e.step = step;
  e.message = message;
  return {e};
}

actions agreement::on_leave(uint32_t rank, int exit_code) {
  if (!live_.count(rank)) return {};
  live_.erase(rank);
  gone_.insert(rank);
  if (exit_code == 0) {
    // Members leave with 0 only after the last step and the final save:
    // everyone is finishing, no agreement can complete any more.
    if (!settled(phase_)) phase_ = agreement_phase::finishing;
    return {};
  }
  return member_gone(rank);
}

bool agreement::needs_rescue() const noexcept {
  if (deadline_ns_ == 0 || settled(phase_)) return false;
  if (phase_ == agreement_phase::saving && kind_ == checkpoint_kind::jit) return false;  // already saving it
  return phase_ != agreement_phase::idle;
}

actions agreement::on_rescue(const std::set<uint32_t>& silent) {
  if (!needs_rescue() || phase_ == agreement_phase::jit_collect) return {};
  if (live_.empty()) {
    phase_ = agreement_phase::stopping;
    return {};
  }
  auto out = propose(checkpoint_kind::jit, 0);
  not_awaited_ = silent;
  if (phase_ == agreement_phase::jit_collect) append(out, maybe_agree());
  return out;
}

actions agreement::on_cutoff() {
  if (phase_ != agreement_phase::jit_collect || deadline_ns_ == 0) return {};
  bool any = false;
  for (auto& [r, s] : acks_) any |= live_.count(r) != 0;
  if (!any) return {};
  return agree_jit();
}

std::string agreement::state_key() const {
  std::string k = std::to_string(static_cast<int>(phase_)) + "|";
  auto set = [&](const std::set<uint32_t>& v) {
    for (auto r : v) k += std::to_string(r) + ",";
    k += "|";
  };
  set(joined_);
  set(live_);
  set(lost_);
  set(gone_);
  set(not_awaited_);
  k += (holder_ ? std::to_string(*holder_) : "-") + "|" + std::to_string(id_) + "|" +
       std::to_string(static_cast<int>(kind_)) + "|" + std::to_string(lower_bound_) + "|" +
       std::to_string(deadline_ns_) + "|" + std::to_string(claim_started_) + "|";
  for (auto& [r, s] : acks_) k += std::to_string(r) + ":" + std::to_string(s) + ",";
  k += "|" + std::to_string(agreed_step_) + "|" + std::to_string(saver_) + "|" + std::to_string(exit_after_) + "|" +
       (restored_min_ ? std::to_string(*restored_min_) : "-") + "|" + std::to_string(committed_step_);
  // restored_max_ equals restored_min_ whenever a join was accepted.
  return k;
}

}  // namespace grace
