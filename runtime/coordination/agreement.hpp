#pragma once
/// The coordinator's agreement protocol as a pure state machine: events in,
/// actions out, no clock, no I/O, no CAF. The coordinator actor feeds it and
/// carries out the actions; tests drive it exhaustively over event orders.
///
/// ## Protocol
/// A notice becomes a *claim*; the first claim wins (set-once). The winner's
/// claim starts an *agreement*: the coordinator proposes a lower bound `N`
/// (the claimant's step in progress) to every live member. Each member
/// acknowledges with the earliest step at which it can still stop:
/// `max(N, step it has started)` (read with a Dekker-style pair of seq_cst
/// atomics, so the trainer never starts a step past it). The agreed step is
/// the maximum of the acknowledgements; it is sent to everyone, each trainer
/// stops after completing it, and the `saver` writes the checkpoint.
///
/// Why the maximum is safe: synchronous workers differ by at most one step,
/// a member stops no earlier than the step it acknowledged, and no member
/// saves before the agreed step is known; a member that reached the lower
/// bound first waits at its step boundary (never inside a step) until the
/// agreed step arrives, then runs on to it if needed.
///
/// ## States and transitions
/// | phase        | event                         | next          | actions                                   |
/// |--------------|-------------------------------|---------------|-------------------------------------------|
/// | idle         | claim, all joined             | proposing     | claim_reply(won), propose(initial)        |
/// | idle         | claim, not all joined         | waiting       | claim_reply(won)                          |
/// | waiting      | join completes membership     | proposing     | propose(initial)                          |
/// | not idle     | claim                         | (same)        | claim_reply(lost); earlier deadline ->    |
/// |              |                               |               |   deadline_update to the chief            |
/// | proposing    | ack (current id)              | proposing     | -                                         |
/// | proposing    | last live ack                 | saving        | agreed(max ack, saver = chief)            |
/// | any          | ack/saved with an old id      | (same)        | - (late: ignored)                         |
/// | saving       | saved ok, no deadline / final | stopping      | committed(exit_after)                     |
/// | saving       | saved ok, initial w/ deadline | countdown     | committed(continue)                       |
/// | saving       | saved failed                  | failed        | cluster_error                             |
/// | countdown    | propose_final                 | proposing     | propose(final)                            |
/// | idle, waiting| member lost (joined or not),  | jit_collect   | peer_lost, propose(jit) to survivors      |
/// | proposing,   | member gone (leave, code != 0)|               |                                           |
/// | saving,      |                               |               |                                           |
/// | countdown    |                               |               |                                           |
/// | jit_collect  | last survivor ack, best step  | saving        | agreed(max completed, saver = its owner,  |
/// |              |   not yet durable             |               |   ties: lowest rank)                      |
/// | jit_collect  | last survivor ack, best step  | stopping      | committed(exit) - no save: the state is   |
/// |              |   already durable             |               |   on disk already                         |
/// | jit_collect  | member lost                   | jit_collect   | peer_lost (and agree if all others acked) |
/// | any live     | error report                  | failed        | cluster_error (names origin, step)        |
/// | stopping,    | member lost / leave           | (same)        | - (expected exits)                        |
/// | failed,      |                               |               |                                           |
/// | finishing    |                               |               |                                           |
/// | not failed/  | leave with exit code 0        | finishing     | - (claims are answered lost from now on)  |
/// |   stopping   |                               |               |                                           |
/// | any          | no survivor left              | stopping      | -                                         |
/// | unsettled,   | rescue (deadline near, the    | jit_collect   | propose(jit): abort stuck collectives     |
/// | deadline set |   round not committed)        |               |                                           |
/// | jit_collect  | cutoff (deadline nearer)      | saving /      | agree among the acks received (a member   |
/// |              |                               | stopping      |   frozen but not yet declared dead cannot |
/// |              |                               |               |   hold the save past the deadline)        |
///
/// A join is refused (restartable, `join_refusal`) once a member of the
/// incarnation was lost or left: the group can no longer train together,
/// so a late joiner restarts with the next incarnation.
///
/// ## Takeover (the coordination service moved: etcd failover)
/// A service elected after its predecessor's host was lost starts in the
/// group's incarnation with nobody joined. The survivors *rejoin*
/// (`on_rejoin`) with the step they completed - which is not known to be on
/// disk, so it never counts as restored. When the takeover ends
/// (`end_takeover`: every rank rejoined, or the window closed and the
/// service declared the rest lost), one just-in-time round among the
/// rejoined members saves the most advanced state and everyone exits for a
/// restart: the old group's collectives were torn with the old service, so
/// it cannot train on. Agreement ids start at `first_id` (derived from the
/// service's epoch), above any id a predecessor handed out, so a survivor
/// never mistakes an old order for a new one.
///
/// ## Faults on top of faults
/// Every loss while anything is unsettled (a claim waiting for members, a
/// proposal out, an agreed step not yet reached, a save in flight by the
/// saver or by anyone, a grace-period countdown, a restart still joining)
/// becomes one just-in-time round among the survivors: each acknowledges its
/// completed step (a survivor still inside a step first has its collective
/// aborted), the most advanced one saves, so the committed checkpoint is at
/// most one step behind the most advanced survivor. A survivor that is not
/// inside a step (waiting at a boundary, restoring, in its rendezvous) is
/// acknowledged for by its peer watcher at once. When the best completed
/// step is already durable - every member restored it, or an agreement of
/// this incarnation committed it - nothing is written and the round commits
/// at once. A loss once a commit with exit is out (stopping) changes nothing.
/// A second notice during any of this defers to the holder; a cluster error
/// fails the job (exit 3) whatever the phase.
///
/// ## Sharded state: two-phase commit of parts
/// With `set_parts(true)` (members hold sharded state, runtime/checkpoint/checkpoint.hpp)
/// no member can save for everyone: every agreed step is saved by every
/// member (`all_save`), each writing its own part and reporting it
/// (`on_saved` with `part`). Once every live member's part is durable, the
/// saver (the committer) is told to commit them (`commit_parts`); its report
/// then commits the round as above. A part that failed fails the round like
/// a failed save. A member lost before the commit takes its part with it:
/// the round becomes a just-in-time round whose agreement writes nothing
/// (committed at the durable step, everyone exits for a restart from the
/// newest complete checkpoint) - unless the members keep copies.
///
/// ### Replicas
/// With in-memory replicas (runtime/checkpoint/replica.hpp) every member keeps copies
/// of its own part of its last few completed steps, and a copy (replica) of
/// one other member's part. Its just-in-time acknowledgement reports both
/// (`replica_report`). The round then agrees on the newest step T above the
/// durable one for which every member's part exists: an acknowledging
/// member's kept copy, or, for a member that did not acknowledge (lost,
/// silent), a replica held by one that did. Every acknowledging member
/// writes its kept copy of T (not its live state: a step aborted in a
/// collective may have left it half updated), the holders write the
/// missing members' parts from their replicas, and the lowest acknowledging
/// rank commits. No such T: committed at the durable step, as above.
/// Periodic saves (agreement id 0) are tracked
/// per step: when every live member reported its part of step N durable
/// (a failed part is not counted: the rank may write it again), the chief
/// commits it; its report makes N durable.
///
/// | phase        | event                         | next          | actions                                   |
/// |--------------|-------------------------------|---------------|-------------------------------------------|
/// | saving       | part ok (current id), the     | saving        | commit_parts(saver)                       |
/// |              |   last live member's (or last |               |                                           |
/// |              |   part writer's, from copies) |               |                                           |
/// | saving       | part failed                   | failed        | cluster_error                             |
/// | jit_collect  | last survivor ack (parts),    | saving        | agreed(T, from_kept, from_replica,        |
/// |              |   copies cover a step T >     |               |   saver = lowest acked rank)              |
/// |              |   the durable one             |               |                                           |
/// | jit_collect  | last survivor ack (parts),    | stopping      | committed(exit) at the durable step       |
/// |              |   no such step                |               |                                           |
/// | saving (from | a part writer lost before its | stopping      | committed(exit) at the durable step       |
/// |   copies)    |   part, or the saver lost     |               |                                           |
/// | any          | periodic part ok, the last    | (same)        | commit_parts(chief, id 0)                 |
/// |              |   live member's of its step   |               |                                           |
/// | any          | periodic commit ok            | (same)        | - (the step is durable)                   |
///
/// ### Node-local directories
/// With `set_node_local(k)` a node's parts are in its own directory, so no
/// single rank can commit them all: once every part is durable,
/// `commit_parts` goes to one committer per node that holds parts (its
/// lowest live rank; a part written from a replica is held on its
/// writer's node), and the round, or the periodic step, is committed only
/// when every committer reported its commit. A committer lost before its
/// report counts as a lost saver.
///
/// ## Recovery in place
/// With `set_in_place(true)` (every member can re-form its collectives and
/// serve its state; replicated state only) a loss while nothing else is
/// unsettled does not end the incarnation. The just-in-time round runs as
/// above, but its outcome is `recover`: the group resumes after the most
/// advanced survivor's step S, that survivor (ties: lowest rank) is the
/// donor whose state every member not at S takes over the bulk channel,
/// and a replacement process takes each lost rank. The replacement joins
/// the same incarnation (`on_replacement_join`) and gets the same `recover`.
/// Each member reports `on_recovered` once it holds S and its collectives
/// are formed again; when all did (and every lost rank was replaced) the
/// round is over (`resumed`) and training goes on with step S + 1. A
/// notice during the recovery is held and claimed again once resumed.
/// The chief (rank 0) is never replaced in place: it saves alone when the
/// coordination service is lost, which a replacement holding no state yet
/// could not (its loss, even during the round, is today's save and restart).
/// Anything that would leave the state incomplete falls back to the
/// just-in-time save and restart: a loss or a non-zero leave while
/// recovering, or the replacement's deadline (`on_replace_timeout`).
///
/// | phase        | event                         | next          | actions                                   |
/// |--------------|-------------------------------|---------------|-------------------------------------------|
/// | idle         | member lost, in place on      | jit_collect   | peer_lost, propose(jit) (in place)        |
/// | jit_collect  | member lost (in place round)  | jit_collect   | peer_lost; it is replaced too             |
/// | jit_collect  | last survivor ack (in place)  | recovering    | recover(S, donor) to every live member    |
/// | jit_collect, | replacement joins             | (same)        | recovering: recover to it; jit_collect:   |
/// |   recovering |                               |               |   it gets recover with everyone else      |
/// | recovering   | last member recovered         | idle          | resumed (+ a held claim proposed again)   |
/// | recovering   | member lost / leave != 0 /    | jit_collect   | propose(jit) (save and restart, as above) |
/// |              |   replacement deadline        |               |                                           |
///
/// ## A save that respects its deadline
/// With a grace period the platform kills the job at the deadline, whether
/// or not the agreement finished: a member frozen after the notice holds the
/// agreed step's collectives and is declared dead only after dead-after,
/// which may be later. So the coordinator acts on the deadline itself: if
/// nothing with exit is committed by `deadline - rescue margin` (a step and
/// a save, from the members' heartbeats), it starts a just-in-time round
/// (`on_rescue`), and at the cutoff a little later agrees among the
/// acknowledgements it has (`on_cutoff`). The chief's own final-save margin
/// is larger, so the rescue only acts when the normal path is stuck.
///
#include "runtime/checkpoint/checkpoint_kind.hpp"
#include "runtime/checkpoint/replica_report.hpp"

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace grace {

enum class agreement_phase : uint8_t {
  idle,
  waiting,
  proposing,
  saving,
  countdown,
  jit_collect,
  stopping,
  failed,
  finishing,
  recovering,  ///< recovery in place: members take the agreed state and re-form
};
const char* to_string(agreement_phase p) noexcept;

/// Rank used by the launcher when it claims on behalf of a signal it received.
constexpr uint32_t launcher_rank = 0xffffffffu;

/// Why a member was lost (the wire's LossReason): a typed value, never text.
enum class loss_reason : uint8_t {
  dead,  ///< connection lost, heartbeats silent, or the process exited
  hung,  ///< alive but no progress for longer than the hang timeout
  left,  ///< left on purpose with a non-zero exit code while others trained
};
const char* to_string(loss_reason r) noexcept;

struct agreement_action {
  enum class type : uint8_t {
    claim_reply,      ///< to `rank`: won, holder, id
    propose,          ///< to every live member: lower bound `step`, `kind`
    agreed,           ///< to every live member: `step`, `kind`, `saver`, `exit_after`
    committed,        ///< to every live member: `step`, `exit_after`
    peer_lost,        ///< to every live member: `rank` was lost (`reason`, `message` says why)
    cluster_error,    ///< to every live member: origin `rank`, `step`, `message`
    deadline_update,  ///< to the chief: `deadline_ns`
    commit_parts,     ///< to `rank`: every part of `step` (agreement `id`, 0: periodic) is durable
    recover,          ///< in place: resume after `step` with the state of `saver` (the donor);
                      ///< to every live member, or only to `rank` when `to_one`; `replaced`: the lost ranks
    resumed,          ///< in place: every member recovered round `id` at `step` (a log line, an event)
  };
  agreement_action() = default;
  explicit agreement_action(type t) : what(t) {}
  type what = type::claim_reply;
  uint32_t rank = 0;
  uint64_t id = 0;
  uint64_t step = 0;
  checkpoint_kind kind = checkpoint_kind::initial;
  bool won = false;
  uint32_t holder = 0;
  uint32_t saver = 0;
  bool exit_after = false;
  bool all_save = false;  ///< agreed: every member writes its part (sharded state)
  /// agreed (sharded state, just in time): every member writes its kept
  /// copy of `step`; the holders of these members' replicas write theirs.
  bool from_kept = false;
  std::vector<uint32_t> from_replica;
  bool to_one = false;            ///< recover: to `rank` alone (a replacement that joined late)
  std::vector<uint32_t> replaced;  ///< recover: the ranks replaced in this round
  int64_t deadline_ns = 0;
  loss_reason reason = loss_reason::dead;
  std::string message;
};
const char* to_string(agreement_action::type t) noexcept;

using actions = std::vector<agreement_action>;

class agreement {
public:
  /// `first_id`: ids handed out are above it (a successor service's ids
  /// above every id of its predecessor, see "Takeover").
  explicit agreement(uint32_t world_size, uint64_t first_id = 0);

  /// Why `rank` may not join now (nullopt: it may). A refusal here is
  /// restartable: the member should exit with the restart code.
  /// `completed`: the step the member restored. Members that restored
  /// different steps hold different states and must never train together
  /// (node-local checkpoint directories that were not brought level).
  std::optional<std::string> join_refusal(uint32_t rank, uint64_t completed) const;
  /// Whether refusing a member that restored `completed` ends this
  /// incarnation: a step other than the group's means the directories were
  /// not level, so that member can never join it and the group would wait
  /// for it until its collectives time out. The caller then declares the
  /// member lost (on_member_lost): everyone restarts, and every node brings
  /// its directory level again first. Any other refusal is for now only.
  bool refusal_ends_group(uint64_t completed) const;
  /// A member that restored `completed` holds another state than the group.
  bool restored_differs(uint64_t completed) const;
  /// A member joined with `completed` steps restored (call only when
  /// join_refusal() said yes).
  actions on_join(uint32_t rank, uint64_t completed);
  /// Takeover: a survivor of this incarnation rejoins a successor service
  /// with the step it completed (not restored: nothing is known durable).
  /// Refused (nothing happens) for a rank out of range, lost or joined.
  actions on_rejoin(uint32_t rank, uint64_t completed);
  /// Takeover over (the ranks that did not rejoin were declared lost
  /// before): the just-in-time round among the rejoined, unless a loss
  /// already started it or nobody rejoined.
  actions end_takeover();
  /// A termination notice claimed by `rank` (or launcher_rank), whose step in
  /// progress is `started`; `deadline_ns` is 0 without a grace period.
  actions on_claim(uint32_t rank, uint64_t started, int64_t deadline_ns);
  /// A member's acknowledgement of agreement `id`; `copies`: its kept
  /// copies and the replica it holds (sharded state, "Replicas").
  actions on_ack(uint32_t rank, uint64_t id, uint64_t earliest, replica_report copies = {});
  /// The saver's report for agreement `id`; with `part`, a member's part of
  /// a sharded save (`id` 0: a periodic save of `step`).
  actions on_saved(uint32_t rank, uint64_t id, uint64_t step, bool ok, const std::string& error, bool part = false);
  /// Members hold sharded state: every member saves its part, the saver
  /// commits them (see "Sharded state").
  void set_parts(bool on) noexcept { shards_.on = on; }
  bool parts() const noexcept { return shards_.on; }
  /// Sharded state in node-local directories: a node's `local_world`
  /// ranks share one directory (the node of rank r is r / local_world) and
  /// every node holding parts of a step commits them in its own (see
  /// "Node-local directories"). 0: one directory every rank shares.
  void set_node_local(uint32_t local_world) noexcept { shards_.local_world = local_world; }
  /// Members recover in place from a loss (see "Recovery in place").
  void set_in_place(bool on) noexcept { recovery_.enabled = on; }
  bool in_place() const noexcept { return recovery_.enabled; }
  /// True while a recovery in place waits for a replacement of `rank`.
  bool awaits_replacement(uint32_t rank) const noexcept { return recovery_.awaited.count(rank) > 0; }
  /// A replacement process for lost `rank` joined (call only when
  /// awaits_replacement(rank)).
  actions on_replacement_join(uint32_t rank);
  /// `rank` holds the agreed state of recovery round `id` and formed its
  /// collectives again.
  actions on_recovered(uint32_t rank, uint64_t id);
  /// No replacement joined in time: the just-in-time save and restart.
  actions on_replace_timeout();
  /// The chief says the grace period's margin is reached.
  actions on_propose_final(uint32_t rank, uint64_t started);
  /// A member (joined or not yet joined) was declared lost with its last
  /// completed step.
  actions on_member_lost(uint32_t rank, uint64_t completed, loss_reason why, const std::string& detail);
  /// A member reported an error in its step.
  actions on_error(uint32_t rank, uint64_t step, const std::string& message);
  /// A member left on purpose: exit code 0 (finished) or another code
  /// (stopping after a commit, or giving up on its own).
  actions on_leave(uint32_t rank, int exit_code);
  /// The deadline is near and the round is not committed: start a
  /// just-in-time round (no-op without a deadline, when settled, or when a
  /// just-in-time round is already collecting or saving).
  /// `silent`: members whose heartbeats stopped a while ago (frozen, most
  /// likely): the round does not wait for their acknowledgements.
  actions on_rescue(const std::set<uint32_t>& silent = {});
  /// The rescue's cutoff: agree among the acknowledgements received so far
  /// (no-op unless collecting; nothing to agree without any).
  actions on_cutoff();
  /// True while a round with a deadline is unsettled: the coordinator keeps
  /// a rescue timer armed.
  bool needs_rescue() const noexcept;

  agreement_phase phase() const noexcept { return round_.phase; }
  uint64_t current_id() const noexcept { return round_.id; }
  std::optional<uint32_t> holder() const noexcept { return round_.holder; }
  int64_t deadline_ns() const noexcept { return round_.deadline_ns; }
  uint64_t agreed_step() const noexcept { return round_.agreed_step; }
  /// The newest step known to be on disk for everyone: the lowest step the
  /// members restored, or a step an agreement of this incarnation committed.
  uint64_t durable_step() const noexcept { return std::max(roster_.restored_min.value_or(0), round_.committed_step); }
  const std::set<uint32_t>& live() const noexcept { return roster_.live; }
  uint32_t world_size() const noexcept { return roster_.world_size; }
  bool all_joined() const noexcept { return roster_.joined.size() == roster_.world_size && roster_.lost.empty() && roster_.gone.empty(); }
  /// Every field, readable: a debug aid.
  std::string state_key() const;
  /// Calls `put(v)` for every field (sets and the acks as their size, then
  /// their elements): the protocol model's de-duplication key.
  template <class Put>
  void visit_state(Put&& put) const {
    for (auto* s : {&roster_.joined, &roster_.live, &roster_.lost, &roster_.gone, &round_.not_awaited}) {
      put(s->size());
      for (auto r : *s) put(r);
    }
    put(round_.acks.size());
    for (auto& [r, step] : round_.acks) {
      put(r);
      put(step);
    }
    put(round_.copies.size());
    for (auto& [r, c] : round_.copies) {
      put(r), put(c.of.value_or(UINT32_MAX)), put(c.kept.size()), put(c.replica.size());
      for (auto s : c.kept) put(s);
      for (auto s : c.replica) put(s);
    }
    put(shards_.writers.size());
    for (auto r : shards_.writers) put(r);
    put(round_.phase), put(round_.holder.value_or(UINT32_MAX)), put(round_.id), put(round_.kind), put(round_.lower_bound), put(round_.deadline_ns);
    put(round_.claim_started), put(round_.agreed_step), put(round_.saver), put(round_.exit_after), put(roster_.restored_min.value_or(UINT64_MAX));
    put(round_.committed_step);
    put(shards_.on), put(shards_.in.size());
    for (auto r : shards_.in) put(r);
    for (auto* m : {&shards_.periodic, &shards_.periodic_commits}) {
      put(m->size());
      for (auto& [step, ranks] : *m) {
        put(step), put(ranks.size());
        for (auto r : ranks) put(r);
      }
    }
    put(shards_.local_world), put(shards_.commits_pending.size());
    for (auto r : shards_.commits_pending) put(r);
    put(recovery_.enabled), put(recovery_.round);
    for (auto* s : {&recovery_.replaced, &recovery_.awaited, &recovery_.joined_early, &recovery_.recovered}) {
      put(s->size());
      for (auto r : *s) put(r);
    }
    put(recovery_.held_claim.has_value());
  }

private:
  actions propose(checkpoint_kind kind, uint64_t lower_bound);
  actions maybe_agree();
  actions agree_jit();
  actions agree_from_copies();
  std::optional<std::vector<uint32_t>> copies_cover(uint64_t step, const std::set<uint32_t>& writers) const;
  actions stop_at_durable();
  actions member_gone(uint32_t rank);
  actions recover_in_place(uint64_t step, uint32_t donor);
  actions maybe_resumed();
  actions fall_back();
  actions on_part(uint32_t rank, uint64_t id, uint64_t step, bool ok, const std::string& error);
  actions on_periodic(uint32_t rank, uint64_t step, bool ok, bool part);
  bool all_live_in(const std::set<uint32_t>& s) const;
  uint32_t chief() const;
  std::set<uint32_t> committers(const std::set<uint32_t>& writers, uint32_t single) const;
  static actions order_commits(uint64_t id, uint64_t step, const std::set<uint32_t>& committers);

  /// Who is in the group, and what each restored.
  struct roster {
    uint32_t world_size;
    std::set<uint32_t> joined;
    std::set<uint32_t> live;
    std::set<uint32_t> lost;  ///< declared lost (dead or hung)
    std::set<uint32_t> gone;  ///< left on purpose
    std::optional<uint64_t> restored_min;  ///< lowest step restored by a member that joined
    std::optional<uint64_t> restored_max;  ///< highest (equal to the lowest while the group is sound)
  };
  /// The current round (a claim, its acknowledgements, the agreed step)
  /// and the newest step a round committed.
  struct round {
    agreement_phase phase = agreement_phase::idle;
    std::optional<uint32_t> holder;
    uint64_t id = 0;
    checkpoint_kind kind = checkpoint_kind::initial;
    uint64_t lower_bound = 0;
    int64_t deadline_ns = 0;
    uint64_t claim_started = 0;
    std::map<uint32_t, uint64_t> acks;
    uint64_t agreed_step = 0;
    uint32_t saver = 0;
    bool exit_after = false;
    std::set<uint32_t> not_awaited;             ///< live members a rescue round does not wait for
    std::map<uint32_t, replica_report> copies;  ///< the just-in-time acks' kept copies and replicas
    uint64_t committed_step = 0;                ///< newest step an agreement committed
  };
  /// Sharded state: the parts each save waits for, and their commits.
  struct shards {
    bool on = false;      ///< every member saves its part
    std::set<uint32_t> in;  ///< members whose part of the agreed step is durable
    /// A round that writes kept copies: the members that write a part (the
    /// commit waits for these, not for every live member).
    std::set<uint32_t> writers;
    /// Periodic sharded saves: the members whose part of each step is durable.
    std::map<uint64_t, std::set<uint32_t>> periodic;
    uint32_t local_world = 0;            ///< node-local directories: ranks per node (0: shared)
    std::set<uint32_t> commits_pending;  ///< committers of the agreed step yet to report
    /// Node-local periodic saves: the committers of each step yet to report.
    std::map<uint64_t, std::set<uint32_t>> periodic_commits;
  };
  /// Recovery in place: the round's lost ranks and their replacements.
  struct recovery {
    bool enabled = false;
    bool round = false;               ///< the current just-in-time round recovers in place
    std::set<uint32_t> replaced;      ///< ranks lost in this round
    std::set<uint32_t> awaited;       ///< ...whose replacement has not joined
    std::set<uint32_t> joined_early;  ///< replacements that joined before the agreement
    std::set<uint32_t> recovered;     ///< members that reported the round done
    struct claim {
      uint32_t rank;
      uint64_t started;
      int64_t deadline_ns;
    };
    std::optional<claim> held_claim;  ///< a notice during the recovery, claimed once resumed
  };
  roster roster_;
  round round_;
  shards shards_;
  recovery recovery_;
};

}  // namespace grace
