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
    case agreement_phase::recovering: return "recovering";
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
    case ty::recover: return "recover";
    case ty::resumed: return "resumed";
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
    : roster_{world_size, {}, {}, {}, {}, std::nullopt, std::nullopt} {
  round_.id = first_id;
}

uint32_t agreement::chief() const { return roster_.live.empty() ? 0 : *roster_.live.begin(); }

std::optional<std::string> agreement::join_refusal(uint32_t rank, uint64_t completed) const {
  if (rank >= roster_.world_size) return "rank " + std::to_string(rank) + " out of range";
  if (restored_differs(completed))
    return "rank " + std::to_string(rank) + " restored step " + std::to_string(completed) +
           " but the group restored step " + std::to_string(*roster_.restored_max) +
           ": the checkpoint directories differ (node-local directories not brought level?); "
           "restart after fetching the newest checkpoint";
  if (roster_.lost.count(rank)) return "rank " + std::to_string(rank) + " was declared lost in this incarnation";
  if (!roster_.lost.empty() || !roster_.gone.empty())
    return "the group lost a member in this incarnation and is stopping; restart into the next one";
  if (settled(round_.phase) && round_.phase != agreement_phase::finishing)
    return std::string("the group is ") + to_string(round_.phase) + "; restart into the next incarnation";
  return std::nullopt;
}

bool agreement::restored_differs(uint64_t completed) const {
  return roster_.restored_min && (completed != *roster_.restored_min || completed != *roster_.restored_max);
}

bool agreement::refusal_ends_group(uint64_t completed) const {
  return restored_differs(completed) && !settled(round_.phase);
}

actions agreement::on_join(uint32_t rank, uint64_t completed) {
  if (join_refusal(rank, completed)) return {};
  roster_.joined.insert(rank);
  roster_.live.insert(rank);
  roster_.restored_min = std::min(roster_.restored_min.value_or(completed), completed);
  roster_.restored_max = std::max(roster_.restored_max.value_or(completed), completed);
  if (round_.phase == agreement_phase::waiting && all_joined()) return propose(checkpoint_kind::initial, round_.claim_started);
  return {};
}

actions agreement::on_rejoin(uint32_t rank, uint64_t completed) {
  if (rank >= roster_.world_size || roster_.lost.count(rank) || roster_.gone.count(rank) || roster_.joined.count(rank)) return {};
  (void)completed;  // the round's acknowledgements carry the steps that count
  roster_.joined.insert(rank);
  roster_.live.insert(rank);
  return {};
}

actions agreement::end_takeover() {
  if (round_.phase != agreement_phase::idle && round_.phase != agreement_phase::waiting) return {};
  if (roster_.live.empty()) {
    round_.phase = agreement_phase::stopping;
    return {};
  }
  if (!round_.holder) round_.holder = launcher_rank;
  return propose(checkpoint_kind::jit, 0);
}

actions agreement::on_claim(uint32_t rank, uint64_t started, int64_t deadline_ns) {
  agreement_action reply{ty::claim_reply};
  reply.rank = rank;
  if (recovery_.round && !recovery_.held_claim) {
    // The group trains on after the recovery: the notice must not be lost
    // with the round. It is claimed again once the group resumed.
    recovery_.held_claim = recovery::claim{rank, started, deadline_ns};
    reply.won = false;
    reply.holder = launcher_rank;
    reply.id = round_.id;
    return {reply};
  }
  if (round_.phase == agreement_phase::idle) {
    round_.holder = rank;
    round_.deadline_ns = deadline_ns;
    round_.claim_started = started;
    reply.won = true;
    reply.holder = rank;
    reply.id = round_.id + 1;
    actions out{reply};
    if (all_joined())
      append(out, propose(checkpoint_kind::initial, started));
    else
      round_.phase = agreement_phase::waiting;
    return out;
  }
  // The claim is taken: the second notice defers to the holder. A later
  // notice with an earlier deadline shortens a grace period still running.
  reply.won = false;
  reply.holder = round_.holder.value_or(launcher_rank);
  reply.id = round_.id;
  actions out{reply};
  bool running = round_.phase == agreement_phase::waiting || round_.phase == agreement_phase::proposing ||
                 round_.phase == agreement_phase::saving || round_.phase == agreement_phase::countdown;
  if (running && round_.kind != checkpoint_kind::jit && round_.deadline_ns != 0 && deadline_ns != 0 && deadline_ns < round_.deadline_ns) {
    round_.deadline_ns = deadline_ns;
    agreement_action upd{ty::deadline_update};
    upd.rank = chief();
    upd.id = round_.id;
    upd.deadline_ns = deadline_ns;
    out.push_back(upd);
  }
  return out;
}

actions agreement::propose(checkpoint_kind kind, uint64_t lower_bound) {
  ++round_.id;
  round_.not_awaited.clear();  // a rescue sets it again right after
  round_.kind = kind;
  round_.lower_bound = lower_bound;
  round_.acks.clear();
  round_.copies.clear();
  shards_.writers.clear();
  round_.phase = kind == checkpoint_kind::jit ? agreement_phase::jit_collect : agreement_phase::proposing;
  agreement_action p{ty::propose};
  p.id = round_.id;
  p.step = lower_bound;
  p.kind = kind;
  p.deadline_ns = round_.deadline_ns;
  actions out{p};
  append(out, maybe_agree());
  return out;
}

actions agreement::maybe_agree() {
  // Cheap test first: with one ack per message a full scan per ack would make
  // an agreement quadratic in the cluster size.
  if (round_.acks.size() + round_.not_awaited.size() < roster_.live.size()) return {};
  bool any = false;
  for (auto r : roster_.live) {
    if (round_.acks.count(r))
      any = true;
    else if (!round_.not_awaited.count(r))
      return {};
  }
  if (!any && !roster_.live.empty()) return {};  // nobody answered yet
  if (roster_.live.empty()) {
    round_.phase = agreement_phase::stopping;
    return {};
  }
  if (round_.kind == checkpoint_kind::jit) return agree_jit();
  agreement_action a{ty::agreed};
  a.id = round_.id;
  a.kind = round_.kind;
  a.deadline_ns = round_.deadline_ns;
  uint64_t step = round_.lower_bound;
  for (auto& [r, s] : round_.acks)
    if (roster_.live.count(r)) step = std::max(step, s);
  a.step = step;
  a.saver = chief();
  a.exit_after = round_.kind == checkpoint_kind::final || round_.deadline_ns == 0;
  a.all_save = shards_.on;
  shards_.in.clear();
  shards_.commits_pending.clear();
  round_.agreed_step = a.step;
  round_.saver = a.saver;
  round_.exit_after = a.exit_after;
  round_.phase = agreement_phase::saving;
  return {a};
}

actions agreement::agree_jit() {
  // The survivor with the most completed steps saves; ties: lowest rank
  // (std::map iterates in rank order and only a strictly larger step wins).
  uint64_t best = 0;
  uint32_t saver = chief();
  bool first = true;
  for (auto& [r, s] : round_.acks) {
    if (!roster_.live.count(r)) continue;
    if (first || s > best) {
      best = s;
      saver = r;
      first = false;
    }
  }
  if (recovery_.round) return recover_in_place(best, saver);
  round_.agreed_step = best;
  round_.saver = saver;
  round_.exit_after = true;
  // With sharded state only copies can stand in for a lost member's part.
  if (shards_.on) return agree_from_copies();
  // Every survivor's state is already on disk: nothing to write.
  if (best <= durable_step()) return stop_at_durable();
  agreement_action a{ty::agreed};
  a.id = round_.id;
  a.kind = checkpoint_kind::jit;
  a.deadline_ns = round_.deadline_ns;
  a.step = best;
  a.saver = saver;
  a.exit_after = true;
  round_.phase = agreement_phase::saving;
  return {a};
}

actions agreement::on_ack(uint32_t rank, uint64_t id, uint64_t earliest, replica_report copies) {
  if (id != round_.id || !roster_.live.count(rank)) return {};
  if (round_.phase != agreement_phase::proposing && round_.phase != agreement_phase::jit_collect) return {};
  round_.acks[rank] = earliest;
  if (shards_.on && round_.phase == agreement_phase::jit_collect) round_.copies[rank] = std::move(copies);
  return maybe_agree();
}

actions agreement::stop_at_durable() {
  round_.phase = agreement_phase::stopping;
  agreement_action c{ty::committed};
  c.id = round_.id;
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
  for (uint32_t q = 0; q < roster_.world_size; ++q) {
    if (writers.count(q)) {
      if (!holds(round_.copies.at(q).kept, step)) return std::nullopt;
      continue;
    }
    bool found = false;
    for (auto w : writers) {
      auto& c = round_.copies.at(w);
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
  for (auto& [r, c] : round_.copies) {
    if (!roster_.live.count(r) || !round_.acks.count(r)) continue;
    writers.insert(r);
    candidates.insert(c.kept.begin(), c.kept.end());
  }
  for (auto step : candidates) {
    if (step <= durable_step()) break;
    auto from_replica = copies_cover(step, writers);
    if (!from_replica) continue;
    agreement_action a{ty::agreed};
    a.id = round_.id;
    a.kind = checkpoint_kind::jit;
    a.deadline_ns = round_.deadline_ns;
    a.step = step;
    a.saver = *writers.begin();
    a.exit_after = true;
    a.all_save = true;
    a.from_kept = true;
    a.from_replica = std::move(*from_replica);
    round_.agreed_step = step;
    round_.saver = a.saver;
    shards_.in.clear();
    shards_.commits_pending.clear();
    shards_.writers = std::move(writers);
    round_.phase = agreement_phase::saving;
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
  if (shards_.on && ok && !shards_.local_world) round_.committed_step = std::max(round_.committed_step, step);
  const bool committer = shards_.on && shards_.local_world ? shards_.commits_pending.count(rank) > 0 : rank == round_.saver;
  if (id != round_.id || round_.phase != agreement_phase::saving || !committer) return {};
  if (!ok) {
    round_.phase = agreement_phase::failed;
    agreement_action e{ty::cluster_error};
    e.rank = rank;
    e.step = step;
    e.message = "checkpoint save at step " + std::to_string(step) + " failed: " + error;
    return {e};
  }
  if (shards_.commits_pending.erase(rank) && !shards_.commits_pending.empty()) return {};
  round_.committed_step = std::max(round_.committed_step, step);
  agreement_action c{ty::committed};
  c.id = id;
  c.step = step;
  c.kind = round_.kind;
  c.exit_after = round_.exit_after;
  round_.phase = round_.exit_after ? agreement_phase::stopping : agreement_phase::countdown;
  return {c};
}

bool agreement::all_live_in(const std::set<uint32_t>& s) const {
  for (auto r : roster_.live)
    if (!s.count(r)) return false;
  return !roster_.live.empty();
}

actions agreement::on_part(uint32_t rank, uint64_t id, uint64_t step, bool ok, const std::string& error) {
  if (!shards_.on || id != round_.id || round_.phase != agreement_phase::saving || step != round_.agreed_step || !roster_.live.count(rank))
    return {};
  if (!ok) {
    round_.phase = agreement_phase::failed;
    agreement_action e{ty::cluster_error};
    e.rank = rank;
    e.step = step;
    e.message = "rank " + std::to_string(rank) + " could not save its part of step " + std::to_string(step) + ": " +
                error;
    return {e};
  }
  if (!shards_.in.insert(rank).second) return {};
  if (shards_.writers.empty() ? !all_live_in(shards_.in)
                            : !std::includes(shards_.in.begin(), shards_.in.end(), shards_.writers.begin(),
                                             shards_.writers.end()))
    return {};
  shards_.commits_pending = committers(shards_.writers.empty() ? roster_.live : shards_.writers, round_.saver);
  return order_commits(round_.id, step, shards_.commits_pending);
}

/// Who commits the parts `writers` wrote: `single` when every rank shares
/// one directory, else the lowest live rank of every node a writer is on.
std::set<uint32_t> agreement::committers(const std::set<uint32_t>& writers, uint32_t single) const {
  if (!shards_.local_world) return {single};
  std::set<uint32_t> nodes, out;
  for (auto w : writers) nodes.insert(w / shards_.local_world);
  for (auto r : roster_.live)
    if (nodes.erase(r / shards_.local_world)) out.insert(r);  // live_ is ordered: the node's lowest rank first
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
  if (!shards_.on || !roster_.live.count(rank)) return {};
  if (!part) {
    if (!ok) return {};
    if (!shards_.local_world) {
      if (rank == chief()) round_.committed_step = std::max(round_.committed_step, step);
      return {};
    }
    auto c = shards_.periodic_commits.find(step);
    if (c != shards_.periodic_commits.end() && c->second.erase(rank) && c->second.empty()) {
      round_.committed_step = std::max(round_.committed_step, step);
      shards_.periodic_commits.erase(c);
    }
    return {};
  }
  // A failed part is not counted; the rank may write it again (its final
  // save of that step), and the commit comes once every part is in.
  if (!ok) return {};
  shards_.periodic[step].insert(rank);
  // A member's writer may lag a few saves behind; a step older than the
  // last few is abandoned (its parts are removed by the next commit).
  constexpr size_t kept = 4;
  while (shards_.periodic.size() > kept) shards_.periodic.erase(shards_.periodic.begin());
  auto it = shards_.periodic.find(step);
  if (it == shards_.periodic.end() || !all_live_in(it->second)) return {};
  shards_.periodic.erase(it);
  auto who = committers(roster_.live, chief());
  if (shards_.local_world) {
    shards_.periodic_commits[step] = who;
    while (shards_.periodic_commits.size() > kept) shards_.periodic_commits.erase(shards_.periodic_commits.begin());
  }
  return order_commits(0, step, who);
}

actions agreement::on_propose_final(uint32_t rank, uint64_t started) {
  if (round_.phase != agreement_phase::countdown || rank != chief()) return {};
  return propose(checkpoint_kind::final, started);
}

actions agreement::member_gone(uint32_t rank) {
  actions out;
  switch (round_.phase) {
    case agreement_phase::recovering:
      append(out, fall_back());
      break;
    case agreement_phase::stopping:
    case agreement_phase::failed:
    case agreement_phase::finishing: break;
    case agreement_phase::jit_collect:
      round_.acks.erase(rank);
      append(out, maybe_agree());
      break;
    case agreement_phase::saving:
      // Writing kept copies: without this member's part (or its commit)
      // the round cannot complete; the durable step is the restart point.
      if (!shards_.writers.empty()) {
        if (rank == round_.saver || shards_.commits_pending.count(rank) || (shards_.writers.count(rank) && !shards_.in.count(rank)))
          append(out, stop_at_durable());
        break;
      }
      // A just-in-time saver needs nobody else: it stopped at a step
      // boundary and holds its state. Only its own loss moves the save.
      if (round_.kind == checkpoint_kind::jit && rank != round_.saver) break;
      [[fallthrough]];
    case agreement_phase::idle:
    case agreement_phase::waiting:
    case agreement_phase::proposing:
    case agreement_phase::countdown:
      // The group cannot train on without it, and whatever was agreed may
      // never be reached (the collectives of the agreed step need every
      // member): the survivors save their own most advanced state. A saver
      // that already holds the agreed step acknowledges it and saves it.
      if (!round_.holder) round_.holder = rank;
      if (roster_.live.empty())
        round_.phase = agreement_phase::stopping;
      else
        append(out, propose(checkpoint_kind::jit, 0));
      break;
  }
  return out;
}

actions agreement::on_member_lost(uint32_t rank, uint64_t completed, loss_reason why, const std::string& detail) {
  if (recovery_.joined_early.erase(rank)) return {};  // a replacement lost before it counted: still awaited
  if (rank >= roster_.world_size || roster_.lost.count(rank) || roster_.gone.count(rank)) return {};
  // Not for the chief (rank 0): it saves alone when the coordination
  // service is lost, which a replacement without state could not.
  const bool start_in_place = recovery_.enabled && !shards_.on && round_.phase == agreement_phase::idle &&
                              roster_.lost.empty() && roster_.gone.empty() && roster_.live.size() > 1 && rank != 0;
  roster_.live.erase(rank);
  roster_.lost.insert(rank);
  agreement_action lost{ty::peer_lost};
  lost.rank = rank;
  lost.step = completed;
  lost.reason = why;
  lost.message = detail;
  actions out{lost};
  if (start_in_place) {
    recovery_ = recovery{};
    recovery_.enabled = true;
    recovery_.round = true;
  }
  if (recovery_.round && round_.phase == agreement_phase::jit_collect && rank == 0) {
    append(out, fall_back());  // the chief lost before the agreement: save and restart
    return out;
  }
  if (recovery_.round && round_.phase != agreement_phase::recovering) {
    recovery_.replaced.insert(rank);
    recovery_.awaited.insert(rank);
  }
  append(out, member_gone(rank));
  return out;
}

actions agreement::recover_in_place(uint64_t step, uint32_t donor) {
  round_.phase = agreement_phase::recovering;
  round_.agreed_step = step;
  round_.saver = donor;
  round_.exit_after = false;
  for (auto r : recovery_.joined_early) {
    roster_.lost.erase(r);
    roster_.joined.insert(r);
    roster_.live.insert(r);
    recovery_.awaited.erase(r);
  }
  recovery_.joined_early.clear();
  recovery_.recovered.clear();
  agreement_action a{ty::recover};
  a.id = round_.id;
  a.step = step;
  a.saver = donor;
  a.replaced.assign(recovery_.replaced.begin(), recovery_.replaced.end());
  return {a};
}

actions agreement::on_replacement_join(uint32_t rank) {
  if (!recovery_.awaited.count(rank)) return {};
  if (round_.phase == agreement_phase::jit_collect) {
    recovery_.joined_early.insert(rank);
    return {};
  }
  if (round_.phase != agreement_phase::recovering) return {};
  recovery_.awaited.erase(rank);
  roster_.lost.erase(rank);
  roster_.joined.insert(rank);
  roster_.live.insert(rank);
  agreement_action a{ty::recover};
  a.id = round_.id;
  a.step = round_.agreed_step;
  a.saver = round_.saver;
  a.rank = rank;
  a.to_one = true;
  a.replaced.assign(recovery_.replaced.begin(), recovery_.replaced.end());
  return {a};
}

actions agreement::on_recovered(uint32_t rank, uint64_t id) {
  if (round_.phase != agreement_phase::recovering || id != round_.id || !roster_.live.count(rank)) return {};
  recovery_.recovered.insert(rank);
  return maybe_resumed();
}

actions agreement::maybe_resumed() {
  if (!recovery_.awaited.empty()) return {};
  for (auto r : roster_.live)
    if (!recovery_.recovered.count(r)) return {};
  round_.phase = agreement_phase::idle;
  round_.holder.reset();
  round_.deadline_ns = 0;
  agreement_action a{ty::resumed};
  a.id = round_.id;
  a.step = round_.agreed_step;
  a.replaced.assign(recovery_.replaced.begin(), recovery_.replaced.end());
  actions out{a};
  auto held = recovery_.held_claim;
  recovery_ = recovery{};
  recovery_.enabled = true;
  if (held)
    for (auto& c : on_claim(held->rank, held->started, held->deadline_ns))
      if (c.what != ty::claim_reply) out.push_back(c);  // the claimant was answered when it claimed
  return out;
}

actions agreement::fall_back() {
  recovery_.round = false;
  // Replacements that joined before the agreement hold no state: they take
  // part in the just-in-time round (acknowledging nothing to save) and
  // stop with everyone else instead of waiting for an order that never comes.
  for (auto r : recovery_.joined_early) {
    roster_.lost.erase(r);
    roster_.joined.insert(r);
    roster_.live.insert(r);
  }
  recovery_.awaited.clear();
  recovery_.joined_early.clear();
  recovery_.held_claim.reset();
  if (roster_.live.empty()) {
    round_.phase = agreement_phase::stopping;
    return {};
  }
  if (!round_.holder) round_.holder = launcher_rank;
  return propose(checkpoint_kind::jit, 0);
}

actions agreement::on_replace_timeout() {
  if (!recovery_.round || recovery_.awaited.empty()) return {};
  // The survivors hear why the recovery ends (their loss was settled).
  actions out;
  for (auto r : recovery_.awaited) {
    agreement_action lost{ty::peer_lost};
    lost.rank = r;
    lost.message = "no replacement joined in time";
    out.push_back(lost);
  }
  append(out, fall_back());
  return out;
}

actions agreement::on_error(uint32_t rank, uint64_t step, const std::string& message) {
  if (round_.phase == agreement_phase::failed || round_.phase == agreement_phase::stopping) return {};
  round_.phase = agreement_phase::failed;
  agreement_action e{ty::cluster_error};
  e.rank = rank;
  e.step = step;
  e.message = message;
  return {e};
}

actions agreement::on_leave(uint32_t rank, int exit_code) {
  if (!roster_.live.count(rank)) return {};
  roster_.live.erase(rank);
  roster_.gone.insert(rank);
  if (exit_code == 0) {
    // Members leave with 0 only after the last step and the final save:
    // everyone is finishing, no agreement can complete any more.
    if (!settled(round_.phase)) round_.phase = agreement_phase::finishing;
    return {};
  }
  return member_gone(rank);
}

bool agreement::needs_rescue() const noexcept {
  if (round_.deadline_ns == 0 || settled(round_.phase)) return false;
  if (round_.phase == agreement_phase::saving && round_.kind == checkpoint_kind::jit) return false;  // already saving it
  return round_.phase != agreement_phase::idle;
}

actions agreement::on_rescue(const std::set<uint32_t>& silent) {
  if (!needs_rescue() || round_.phase == agreement_phase::jit_collect) return {};
  if (roster_.live.empty()) {
    round_.phase = agreement_phase::stopping;
    return {};
  }
  auto out = propose(checkpoint_kind::jit, 0);
  round_.not_awaited = silent;
  if (round_.phase == agreement_phase::jit_collect) append(out, maybe_agree());
  return out;
}

actions agreement::on_cutoff() {
  if (round_.phase != agreement_phase::jit_collect || round_.deadline_ns == 0) return {};
  bool any = false;
  for (auto& [r, s] : round_.acks) any |= roster_.live.count(r) != 0;
  if (!any) return {};
  return agree_jit();
}

std::string agreement::state_key() const {
  std::string k = std::to_string(static_cast<int>(round_.phase)) + "|";
  auto set = [&](const std::set<uint32_t>& v) {
    for (auto r : v) k += std::to_string(r) + ",";
    k += "|";
  };
  set(roster_.joined);
  set(roster_.live);
  set(roster_.lost);
  set(roster_.gone);
  set(round_.not_awaited);
  k += (round_.holder ? std::to_string(*round_.holder) : "-") + "|" + std::to_string(round_.id) + "|" +
       std::to_string(static_cast<int>(round_.kind)) + "|" + std::to_string(round_.lower_bound) + "|" +
       std::to_string(round_.deadline_ns) + "|" + std::to_string(round_.claim_started) + "|";
  for (auto& [r, s] : round_.acks) k += std::to_string(r) + ":" + std::to_string(s) + ",";
  k += "|" + std::to_string(round_.agreed_step) + "|" + std::to_string(round_.saver) + "|" + std::to_string(round_.exit_after) + "|" +
       (roster_.restored_min ? std::to_string(*roster_.restored_min) : "-") + "|" + std::to_string(round_.committed_step);
  // restored_max_ equals restored_min_ whenever a join was accepted.
  return k;
}

}  // namespace grace
