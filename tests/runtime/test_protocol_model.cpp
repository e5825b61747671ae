// The whole agreement protocol as a model, explored exhaustively.
//
// The coordination service is the real state machine (runtime/agreement);
// each of three workers is its real decision class (runtime/worker_policy)
// plus a peer watcher and a trainer that behave as actors/peer_watcher.cpp
// and session::run do, all connected by FIFO queues. Every interleaving of
// their events is explored, with states de-duplicated:
//   trainers start, complete or fail steps (a step completes only once every
//   member started it: the allreduce), decide at their boundaries, save;
//   watchers deliver orders, commits, losses and errors (and acknowledge);
//   members' messages reach the service when sent (a delay there adds no
//   behaviour: a member observes nothing of the service in between that it
//   could not observe after an immediate delivery; the service's messages
//   to members, which do race with the trainers, are queued);
//   faults: up to two notices, up to two deaths (each detected later, at any
//   point), a save that fails, the coordinator's own loss, the grace-period
//   clock running out, a member that joins late.
// Every end state is checked: no live member is left waiting (no deadlock);
// after any fault the newest checkpoint on disk is at most one step behind
// the most advanced survivor; exit codes are the restart code (or 3 after a
// failed save); never a protocol violation; at most one claim wins; an
// agreed step is at most the largest started step + 1.
#include "runtime/coordination/agreement.hpp"
#include "runtime/worker/worker_policy.hpp"

#include <catch2/catch.hpp>
#include <xxhash.h>

#include <cstring>
#include <algorithm>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

using namespace grace;

namespace {

constexpr uint64_t restored = 10;  // every member restored step 10 (on disk)
constexpr int64_t deadline = 1'000'000'000'000;

enum class tstate : uint8_t {
  between,   ///< started == completed: before run() stores the next step
  boundary,  ///< step started, deciding at the boundary (flag was up, or the step failed)
  in_step,   ///< running the step
  saving,    ///< blocked in a synchronous save
};

struct to_member {
  enum kind_t : uint8_t { order, commit, lost, failure, deadline_update, commit_parts, recover } kind;
  checkpoint_order o;
  recover_order ro;
  commit_info c;
  loss_info l;
  cluster_failure f;
  int64_t deadline_ns = 0;
};

struct to_coord {
  enum kind_t : uint8_t { ack, saved, leave, propose_final, recovered } kind;
  uint64_t id = 0;
  uint64_t step = 0;
  bool ok = true;
  int code = 0;
  bool part = false;  ///< a sharded save's part (phase 1)
};

struct member {
  uint32_t rank = 0;
  bool alive = true, joined = true, detected = false, stopped = false, coordinator_seen = false;
  int code = -1;
  std::string why;
  uint64_t started = restored, completed = restored;
  tstate t = tstate::between;
  boundary_mode mode = boundary_mode::step_start;
  bool pending = false, aborted = false, dirty = true;
  control_state ctl;
  worker_policy policy;
  std::vector<to_member> in;  ///< FIFO (a few entries; cheaper to copy than a deque)
  bool writing = false, w_sync = false;
  uint64_t w_step = 0, w_id = 0, last_ok_step = restored;
  bool committing = false;  ///< sharded: told to commit the parts of (c_id, c_step)
  uint64_t c_id = 0, c_step = 0;
  /// Replicas: the newest completed step whose copy reached this member's
  /// holder (restored: none), and the lost member whose part the write in
  /// flight also writes from the replica this member holds (-1: none).
  uint64_t shipped = restored;
  int w_replica = -1;

  /// Recovery in place: a replacement process holds no state until it took
  /// the donor's; a failed transfer leaves its state torn (never used).
  bool replacement = false, torn = false;
  /// The recovery round whose collectives this member formed (0: the
  /// group's first): a step completes only with every member in the same.
  uint64_t epoch = 0;
  member(uint32_t r, worker_policy_config c, uint64_t from = restored)
      : rank(r), started(from), completed(from), policy(c, from) {}
};

struct world {
  explicit world(uint32_t members) : coord{members} {}
  agreement coord;
  bool coordinator_alive = true;
  std::vector<member> m;
  std::set<uint64_t> disk{restored};
  int notices = 0, deaths = 0, save_failures = 0, coordinator_deaths = 0;
  bool has_deadline = false, time_up = false;
  int rescue = 0;  ///< the coordinator's deadline rescue: 0 not yet, 1 rescued (cutoff due), 2 done
  int wins = 0;
  bool fault = false, save_failed = false;
  bool parts = false;              ///< sharded state: every member writes its part
  bool replicas = false;           ///< ...and keeps copies (runtime/checkpoint/replica.hpp)
  std::set<uint64_t> parts_done;  ///< (agreement id << 8 | rank) of every durable part
  std::set<uint64_t> part_steps;  ///< (step << 8 | rank) of every durable part, of any round
  /// Node-local directories: members per node (0: one shared directory),
  /// and (step << 8 | node) of every node's commit of its parts.
  uint32_t local_world = 0;
  std::set<uint64_t> node_commits;
  /// Recovery in place: replacement processes still to come, rounds resumed.
  int replacements = 0, resumed = 0;
};

struct scenario {
  int notices = 0;
  int deaths = 0;
  int save_failures = 0;
  int coordinator_deaths = 0;
  bool deadline = false;
  bool late_join = false;
  uint64_t horizon = restored + 1;  ///< steps a member may complete: +1 lets members differ by one
  uint32_t members = 3;
  /// Start in a grace-period countdown: a notice with a deadline was agreed
  /// at the restored step, saved and committed, and training goes on.
  bool in_countdown = false;
  /// Sharded state: every member saves its part, the chief commits them.
  bool parts = false;
  /// With replicas: each member's copies reach its holder (the previous
  /// rank) at some point after each step, or not before a loss.
  bool replicas = false;
  /// Node-local directories with this many members per node: one
  /// committer per node, the round committed once every node's reported.
  uint32_t local_world = 0;
  /// Recovery in place with this many replacement processes (the
  /// replacement deadline may pass at any point while one is awaited).
  int in_place_replacements = 0;
};

/// REQUIRE evaluated by Catch only when the condition fails: its assertion
/// machinery (and INFO's message, built eagerly) cost more than the model's
/// own work when run at every transition of tens of millions.
#define MODEL_REQUIRE(cond)        \
  do {                             \
    if (!(cond)) REQUIRE(cond);    \
  } while (0)
#define MODEL_REQUIRE_INFO(cond, message) \
  do {                                    \
    if (!(cond)) {                        \
      INFO(message);                      \
      REQUIRE(cond);                      \
    }                                     \
  } while (0)

/// Appends raw bytes of plain fields to a fixed buffer (the key is hashed,
/// never read back; a world's key is a few hundred bytes).
struct key_writer {
  char buf[4096];
  size_t n = 0;
  template <class T>
  void put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (__builtin_expect(n + sizeof(T) > sizeof(buf), 0)) overflow();
    std::memcpy(buf + n, &v, sizeof(T));
    n += sizeof(T);
  }
  /// Out of line, so put() stays small enough to inline.
  [[noreturn]] __attribute__((noinline, cold)) static void overflow() {
    throw std::length_error("protocol model: state key over 4096 bytes");
  }
  void put_order(const std::optional<checkpoint_order>& o) {
    put(o.has_value());
    if (!o) return;
    put(o->id);
    put(o->step);
    put(o->kind);
    put(o->agreed);
    put(o->saver);
    put(o->exit_after);
    put(o->all_save);
    put(o->from_kept);
    for (auto q : o->from_replica) put(q);
  }
};

uint64_t key(const world& w) {
  key_writer k;
  auto put = [&k](const auto& v) { k.put(v); };
  w.coord.visit_state(put);
  k.put(w.coordinator_alive);
  for (auto s : w.disk) k.put(s);
  k.put(w.notices);
  k.put(w.deaths);
  k.put(w.save_failures);
  k.put(w.coordinator_deaths);
  k.put(w.time_up);
  k.put(w.fault);
  k.put(w.save_failed);
  k.put(w.rescue);
  for (auto p : w.parts_done) k.put(p);
  for (auto p : w.part_steps) k.put(p);
  for (auto p : w.node_commits) k.put(p);
  k.put(w.replacements);
  k.put(w.resumed);
  for (auto& x : w.m) {
    auto& c = x.ctl;
    k.put(x.alive);
    k.put(x.joined);
    k.put(x.detected);
    k.put(x.stopped);
    k.put(x.coordinator_seen);
    k.put(x.code);
    k.put(x.started);
    k.put(x.completed);
    k.put(x.t);
    k.put(x.mode);
    k.put(x.pending);
    k.put(x.aborted);
    k.put(x.dirty);
    k.put_order(c.order);
    k.put(c.committed.has_value());
    if (c.committed) {
      k.put(c.committed->id);
      k.put(c.committed->step);
      k.put(c.committed->exit_after);
    }
    k.put(c.failure.has_value());
    k.put(c.lost.has_value());
    k.put(c.coordinator_gone);
    k.put(c.deadline_ns != 0);
    k.put(c.acked_for_trainer);
    k.put(c.recover ? c.recover->id : 0);
    k.put(x.replacement);
    k.put(x.torn);
    k.put(x.epoch);
    x.policy.visit_state(put);
    k.put(x.writing);
    k.put(x.w_sync);
    k.put(x.w_step);
    k.put(x.w_id);
    k.put(x.last_ok_step);
    k.put(x.committing);
    k.put(x.c_id);
    k.put(x.c_step);
    k.put(x.shipped);
    k.put(x.w_replica);
    k.put(x.in.size());
    for (auto& q : x.in) {
      k.put(q.kind);
      k.put_order(q.o);
      k.put(q.c.id);
      k.put(q.c.step);
      k.put(q.ro.id);
    }
  }
  return XXH3_64bits(k.buf, k.n);
}

/// The keys of the states explored so far: open addressing in one array
/// (tens of millions of keys; a node-based set spent a third of the run in
/// malloc and cache misses). Key 0 marks an empty slot and is stored apart.
class key_set {
public:
  /// Adds `k`; false when it was there already.
  bool insert(uint64_t k) {
    if (k == 0) return !std::exchange(has_zero_, true);
    if ((size_ + 1) * 2 > slots_.size()) grow();
    if (!place(slots_, k)) return false;
    ++size_;
    return true;
  }

private:
  static bool place(std::vector<uint64_t>& slots, uint64_t k) {
    const size_t mask = slots.size() - 1;
    for (size_t i = k & mask;; i = (i + 1) & mask) {
      if (slots[i] == k) return false;
      if (slots[i] == 0) {
        slots[i] = k;
        return true;
      }
    }
  }
  void grow() {
    std::vector<uint64_t> bigger(slots_.empty() ? 1024 : slots_.size() * 2, 0);
    for (uint64_t k : slots_)
      if (k) place(bigger, k);
    slots_.swap(bigger);
  }
  std::vector<uint64_t> slots_;
  size_t size_ = 0;
  bool has_zero_ = false;
};

class explorer {
public:
  explicit explorer(scenario sc) : sc_(sc) {}

  size_t states = 0, terminals = 0, checked = 0, incomplete = 0;
  std::set<std::string> outcomes;  ///< distinct end summaries (coverage)

  void run() {
    const uint32_t N = sc_.members;
    world w{N};
    for (uint32_t r = 0; r < N; ++r) {
      worker_policy_config c;
      c.rank = r;
      c.is_chief = r == 0;
      c.restart_code = 42;
      c.fatal_code = 3;
      w.m.emplace_back(r, c);
    }
    for (uint32_t r = 0; r < N; ++r) {
      if (sc_.late_join && r == N - 1) {
        w.m[r].joined = false;
        continue;
      }
      w.coord.on_join(r, restored);
    }
    w.notices = sc_.notices;
    w.deaths = sc_.deaths;
    w.save_failures = sc_.save_failures;
    w.coordinator_deaths = sc_.coordinator_deaths;
    w.has_deadline = sc_.deadline || sc_.in_countdown;
    w.parts = sc_.parts;
    w.replicas = sc_.replicas;
    w.coord.set_parts(sc_.parts);
    w.local_world = sc_.local_world;
    if (sc_.local_world) w.coord.set_node_local(sc_.local_world);
    if (sc_.in_countdown) enter_countdown(w);
    if (sc_.in_place_replacements) {
      w.coord.set_in_place(true);
      w.replacements = sc_.in_place_replacements;
    }
    explore(w);
  }

  /// The agreement and every worker as they are once the first save of a
  /// notice with a grace period committed (the countdown runs).
  void enter_countdown(world& w) {
    auto acts = w.coord.on_claim(1, restored, deadline);
    uint64_t id = w.coord.current_id();
    for (uint32_t r = 0; r < w.m.size(); ++r) acts = w.coord.on_ack(r, id, restored);
    MODEL_REQUIRE(w.coord.phase() == agreement_phase::saving);
    w.coord.on_saved(0, id, restored, true, "");
    MODEL_REQUIRE(w.coord.phase() == agreement_phase::countdown);
    w.wins = 1;
    w.fault = true;
    for (auto& x : w.m) {
      x.ctl.deadline_ns = deadline;
      x.ctl.committed = commit_info{id, restored, false};
      x.policy.reached(id);
      x.pending = true;
      x.dirty = true;
    }
  }

private:
  scenario sc_;
  key_set seen_;

  uint64_t max_started(const world& w) const {
    uint64_t s = 0;
    for (auto& x : w.m) s = std::max(s, x.started);
    return s;
  }

  void dispatch(world& w, const actions& acts) {
    using ty = agreement_action::type;
    // A dead or stopped member never reads its queue: leave it out (it
    // would only tell states apart that behave the same).
    auto to_live = [&](const to_member& msg) {
      for (auto r : w.coord.live())
        if (w.m[r].alive && !w.m[r].stopped) w.m[r].in.push_back(msg);
    };
    for (auto& a : acts) {
      to_member msg{};
      switch (a.what) {
        case ty::claim_reply:
          if (a.won) ++w.wins;
          MODEL_REQUIRE(w.wins <= 1);
          break;
        case ty::propose:
        case ty::agreed:
          if (a.what == ty::agreed) MODEL_REQUIRE(a.step <= max_started(w) + 1);
          msg.kind = to_member::order;
          msg.o = checkpoint_order{a.id, a.step, a.kind, a.what == ty::agreed, a.saver, a.exit_after, a.deadline_ns};
          msg.o.all_save = a.all_save;
          msg.o.from_kept = a.from_kept;
          msg.o.from_replica = a.from_replica;
          MODEL_REQUIRE(a.all_save == (a.what == ty::agreed && w.parts));
          // Copies only with replicas, and only above the durable step.
          MODEL_REQUIRE((!a.from_kept || (w.replicas && a.step > *w.disk.rbegin())));
          to_live(msg);
          break;
        case ty::committed:
          msg.kind = to_member::commit;
          msg.c = commit_info{a.id, a.step, a.exit_after};
          if (w.local_world) committed_everywhere(w, a.step);
          MODEL_REQUIRE(w.disk.count(a.step));  // a commit names a step that is on disk
          to_live(msg);
          break;
        case ty::peer_lost:
          msg.kind = to_member::lost;
          msg.l = loss_info{loss_kind::peer_dead, a.rank, a.step, a.message};
          to_live(msg);
          break;
        case ty::cluster_error:
          msg.kind = to_member::failure;
          msg.f = cluster_failure{a.rank, a.step, a.message};
          to_live(msg);
          break;
        case ty::deadline_update:
          msg.kind = to_member::deadline_update;
          msg.deadline_ns = a.deadline_ns;
          if (a.rank < w.m.size() && w.m[a.rank].alive && !w.m[a.rank].stopped) w.m[a.rank].in.push_back(msg);
          break;
        case ty::commit_parts:
          // Phase 2 only once every rank's part of the round is durable:
          // a lost member's part is never missing from a commit.
          MODEL_REQUIRE(w.parts);
          for (uint32_t r = 0; r < w.m.size(); ++r) MODEL_REQUIRE(w.parts_done.count(a.id << 8 | r));
          msg.kind = to_member::commit_parts;
          msg.c = commit_info{a.id, a.step, false};
          if (a.rank < w.m.size() && w.m[a.rank].alive) w.m[a.rank].in.push_back(msg);
          break;
        case ty::recover: {
          // The donor holds the agreed step (it acknowledged it).
          auto& donor = w.m[a.saver];
          if (donor.alive && !donor.stopped)
            MODEL_REQUIRE_INFO((donor.completed == a.step && !donor.torn),
                               "donor " << a.saver << " completed " << donor.completed << " torn " << donor.torn
                                        << " started " << donor.started << " replacement " << donor.replacement
                                        << " step " << a.step << " to_one " << a.to_one << " agreement "
                                        << w.coord.state_key());
          msg.kind = to_member::recover;
          msg.ro = recover_order{a.id, a.step, a.saver, "", "", a.replaced};
          if (!a.to_one) {
            to_live(msg);
          } else if (a.rank < w.m.size() && w.m[a.rank].alive && !w.m[a.rank].stopped) {
            w.m[a.rank].in.push_back(msg);
          }
          break;
        }
        case ty::resumed:
          // Every member holds the agreed step: the group is whole again.
          ++w.resumed;
          for (auto& x : w.m)
            if (x.alive && !x.stopped) MODEL_REQUIRE((x.joined && !x.torn && x.completed == a.step));
          break;
      }
    }
  }

  /// Node-local directories: a newly committed round's step is committed on
  /// every node that still has a live member (a node whose members are all
  /// lost has its parts written elsewhere from replicas); only then is it
  /// on disk as a whole.
  static void committed_everywhere(world& w, uint64_t step) {
    if (w.disk.count(step)) return;  // an earlier round's (a stop at the durable step)
    for (auto& x : w.m)
      if (x.alive) {
        MODEL_REQUIRE_INFO(w.node_commits.count(step << 8 | x.rank / w.local_world),
                           "node " << x.rank / w.local_world << " of live rank " << x.rank
                                   << " has not committed step " << step);
      }
    w.disk.insert(step);
  }

  /// The newest step a restart resumes from (runtime/node_local_sync's
  /// leveling): every rank's part durable somewhere, committed or not.
  static uint64_t restorable(const world& w) {
    uint64_t best = *w.disk.rbegin();
    for (auto p : w.part_steps) {
      uint64_t step = p >> 8;
      bool all = true;
      for (uint32_t r = 0; r < w.m.size() && all; ++r) all = w.part_steps.count(step << 8 | r) > 0;
      if (all) best = std::max(best, step);
    }
    return best;
  }

  /// A member's message, taken by the service at once (if it is alive).
  void send(world& w, member& x, const to_coord& msg) {
    if (!w.coordinator_alive) return;
    auto r = x.rank;
    switch (msg.kind) {
      case to_coord::ack: dispatch(w, w.coord.on_ack(r, msg.id, msg.step, copies(w, x))); break;
      case to_coord::saved: dispatch(w, w.coord.on_saved(r, msg.id, msg.step, msg.ok, "disk full", msg.part)); break;
      case to_coord::leave: dispatch(w, w.coord.on_leave(r, msg.code)); break;
      case to_coord::propose_final: dispatch(w, w.coord.on_propose_final(r, msg.step)); break;
      case to_coord::recovered: dispatch(w, w.coord.on_recovered(r, msg.id)); break;
    }
  }

  /// What a member's acknowledgement reports with replicas: its kept
  /// copies (every completed step above the restored one: the model's
  /// horizon is within the last three) and the replica of the next rank.
  replica_report copies(const world& w, const member& x) const {
    replica_report c;
    if (!w.replicas) return c;
    for (uint64_t s = restored + 1; s <= x.completed; ++s) c.kept.push_back(s);
    uint32_t src = (x.rank + 1) % static_cast<uint32_t>(w.m.size());
    c.of = src;
    if (w.m[src].shipped > restored) c.replica.push_back(w.m[src].shipped);
    return c;
  }

  // ---- trainer ---------------------------------------------------------

  void start_write(member& x, uint64_t step, uint64_t id, bool sync, world& w) {
    x.policy.saved(step);
    if (!w.parts && x.last_ok_step == step && w.disk.count(step)) {
      // session::impl::reuse_save: the same step is on disk already.
      if (id) send(w, x, {to_coord::saved, id, step, true, 0});
      return;
    }
    x.writing = true;
    x.w_step = step;
    x.w_id = id;
    x.w_sync = sync;
    if (sync) x.t = tstate::saving;
  }

  void stop(world& w, member& x, int code, std::string why) {
    x.stopped = true;
    x.in.clear();
    x.code = code;
    x.why = std::move(why);
    if (!x.ctl.coordinator_gone) send(w, x, {to_coord::leave, 0, 0, true, code});
  }

  /// One decision at the boundary, carried out as session::impl::boundary does.
  void decide(world& w, member& x) {
    using ty = worker_decision::type;
    boundary_input in;
    in.completed = x.completed;
    in.mode = x.mode;
    in.mono_ns = 0;  // waits never time out here: each must end on an event
    in.wall_ns = w.time_up ? deadline : 0;
    auto d = x.policy.next(x.ctl, in);
    x.dirty = false;
    // save() first waits for the writer: a decision that saves waits until
    // the write in flight finished (finish_write marks the trainer dirty).
    if (x.writing && (d.what == ty::save_own || (d.what == ty::reach && d.save))) return;
    switch (d.what) {
      case ty::run: x.t = tstate::in_step; break;
      case ty::run_clear:
        x.pending = false;
        x.t = tstate::in_step;
        break;
      case ty::ack_jit:
        send(w, x, {to_coord::ack, d.id, d.step, true, 0});
        x.policy.acked(d.id);
        x.dirty = true;
        break;
      case ty::reach:
        x.policy.reached(d.id);
        if (d.from_kept) {
          // Its kept copy of the agreed step exists, and so does the
          // replica it writes (the agreement picked the step from reports).
          MODEL_REQUIRE(d.step > restored);
          MODEL_REQUIRE(d.step <= x.completed);
          for (auto q : d.from_replica)
            if (q == (x.rank + 1) % w.m.size()) x.w_replica = static_cast<int>(q);
        }
        if (d.save) start_write(x, d.step, d.id, d.sync, w);
        x.dirty = true;
        break;
      case ty::continue_grace:
        if (x.ctl.order && x.ctl.order->id == d.id) x.ctl.order.reset();
        x.policy.grace_continues();
        x.dirty = true;
        break;
      case ty::propose_final:
        send(w, x, {to_coord::propose_final, 0, d.step, true, 0});
        x.policy.proposed_final();
        x.t = tstate::in_step;
        break;
      case ty::save_own:
        start_write(x, d.step, 0, true, w);
        x.dirty = true;
        break;
      case ty::recover: recover(w, x); break;
      case ty::wait: break;
      case ty::stop:
        MODEL_REQUIRE(d.message.find("protocol violation") == std::string::npos);
        stop(w, x, d.code, d.message);
        break;
    }
  }

  bool can_complete(const world& w, const member& x) const {
    if (x.aborted || x.started > sc_.horizon) return false;
    for (auto& y : w.m)
      if (y.started < x.started || y.epoch != x.epoch) return false;  // the allreduce needs everyone's part
    return true;
  }

  // ---- the explorer ------------------------------------------------------

  void explore(const world& w) {
    if (!seen_.insert(key(w))) return;
    ++states;
    MODEL_REQUIRE(states < 400'000'000);
    bool any = false;
    auto branch = [&](auto&& f) {
      any = true;
      world n = w;
      f(n);
      explore(n);
    };
    for (uint32_t r = 0; r < w.m.size(); ++r) trainer_events(w, r, branch);
    for (uint32_t r = 0; r < w.m.size(); ++r) watcher_events(w, r, branch);
    fault_events(w, branch);
    if (!any) check_end(w);
  }

  template <class B>
  void trainer_events(const world& w, uint32_t r, B& branch) {
    auto& x = w.m[r];
    if (!x.alive || x.stopped) return;
    if (!x.joined) {
      branch([r](world& n) {
        auto& y = n.m[r];
        if (n.coord.join_refusal(r, restored)) {
          y.stopped = true;  // attach() fails as restartable: exit 42, nothing to leave
          y.code = 42;
          y.why = "refused";
          return;
        }
        y.joined = true;
        n.coord.on_join(r, restored);
      });
      return;
    }
    switch (x.t) {
      case tstate::between:
        branch([r](world& n) {
          auto& y = n.m[r];
          y.started = y.completed + 1;
          if (y.pending) {
            y.t = tstate::boundary;
            y.mode = boundary_mode::step_start;
            y.dirty = true;
          } else {
            y.t = tstate::in_step;
          }
        });
        break;
      case tstate::boundary:
        // A decision needs the writer idle (save() waits for it) and news
        // since a wait.
        if (x.dirty) branch([this, r](world& n) { decide(n, n.m[r]); });
        break;
      case tstate::in_step:
        if (can_complete(w, x))
          branch([r](world& n) {
            auto& y = n.m[r];
            y.completed = y.started;
            y.t = tstate::between;
          });
        if (x.aborted)
          branch([r](world& n) {
            auto& y = n.m[r];
            y.aborted = false;
            y.t = tstate::boundary;
            y.mode = boundary_mode::collective_failed;
            y.dirty = true;
          });
        break;
      case tstate::saving: break;
    }
    if (w.replicas && x.shipped < x.completed)
      branch([r](world& n) { n.m[r].shipped = n.m[r].completed; });  // the copy reached the holder
    if (x.committing)
      branch([this, r](world& n) {
        auto& y = n.m[r];
        y.committing = false;
        if (n.local_world)
          n.node_commits.insert(y.c_step << 8 | y.rank / n.local_world);
        else
          n.disk.insert(y.c_step);
        send(n, y, {to_coord::saved, y.c_id, y.c_step, true, 0});
      });
    if (x.writing) {
      branch([this, r](world& n) { finish_write(n, n.m[r], true); });
      if (w.save_failures > 0 && x.w_id != 0)
        branch([this, r](world& n) {
          --n.save_failures;
          finish_write(n, n.m[r], false);
        });
    }
  }

  void finish_write(world& n, member& y, bool ok) {
    y.writing = false;
    const int replica_part = y.w_replica;
    y.w_replica = -1;
    if (ok && n.parts) {
      n.parts_done.insert(y.w_id << 8 | y.rank);  // durable, not committed
      n.part_steps.insert(y.w_step << 8 | y.rank);
      if (replica_part >= 0) {
        n.parts_done.insert(y.w_id << 8 | static_cast<uint64_t>(replica_part));
        n.part_steps.insert(y.w_step << 8 | static_cast<uint64_t>(replica_part));
      }
    } else if (ok) {
      n.disk.insert(y.w_step);
      y.last_ok_step = y.w_step;
    } else {
      n.save_failed = true;
    }
    if (y.w_id) send(n, y, {to_coord::saved, y.w_id, y.w_step, ok, 0, n.parts});
    if (y.t == tstate::saving) {
      y.t = tstate::boundary;
      if (!ok && y.w_id) {  // reach() failed: session stops with the fatal code
        y.stopped = true;
        y.in.clear();
        y.code = 3;
        y.why = "checkpoint save failed";
        if (!y.ctl.coordinator_gone) send(n, y, {to_coord::leave, 0, 0, true, 3});
      }
    }
    y.dirty = true;
  }

  template <class B>
  void watcher_events(const world& w, uint32_t r, B& branch) {
    auto& x = w.m[r];
    if (!x.alive || x.stopped) return;
    if (!x.in.empty()) branch([this, r](world& n) { deliver(n, n.m[r]); });
    if (!n_coordinator_alive(w) && !x.coordinator_seen && x.joined)
      branch([r](world& n) {
        auto& y = n.m[r];
        y.coordinator_seen = true;
        y.ctl.coordinator_gone = true;
        raise(y, true);
      });
  }

  static bool n_coordinator_alive(const world& w) { return w.coordinator_alive; }

  static void raise(member& y, bool abort) {
    y.pending = true;
    y.dirty = true;
    if (abort && y.t == tstate::in_step) y.aborted = true;
  }

  /// The peer watcher's handling of one message (actors/peer_watcher.cpp).
  void deliver(world& w, member& y) {
    auto msg = y.in.front();
    y.in.erase(y.in.begin());
    switch (msg.kind) {
      case to_member::order: {
        auto& o = msg.o;
        y.ctl.order = o;
        if (o.deadline_ns) y.ctl.deadline_ns = o.deadline_ns;
        raise(y, false);
        if (o.agreed) break;
        if (o.kind != checkpoint_kind::jit) {
          send(w, y, {to_coord::ack, o.id, std::max(o.step, y.started), true, 0});
          break;
        }
        if (y.started == y.completed && y.t == tstate::between) {
          send(w, y, {to_coord::ack, o.id, y.completed, true, 0});
          y.ctl.acked_for_trainer = std::max(y.ctl.acked_for_trainer, o.id);
        }
        raise(y, true);
        break;
      }
      case to_member::commit:
        if (!y.ctl.committed || y.ctl.committed->id <= msg.c.id) y.ctl.committed = msg.c;
        raise(y, false);
        break;
      case to_member::lost:
        if (!y.ctl.lost) y.ctl.lost = msg.l;
        raise(y, true);
        break;
      case to_member::failure:
        if (!y.ctl.failure) y.ctl.failure = msg.f;
        raise(y, true);
        break;
      case to_member::deadline_update:
        y.ctl.deadline_ns = msg.deadline_ns;
        raise(y, false);
        break;
      case to_member::recover:
        y.ctl.recover = msg.ro;
        raise(y, false);
        break;
      case to_member::commit_parts:  // to the writer (actors/checkpoint_writer.cpp)
        y.committing = true;
        y.c_id = msg.c.id;
        y.c_step = msg.c.step;
        break;
    }
  }

  template <class B>
  void fault_events(const world& w, B& branch) {
    for (uint32_t r = 0; r < w.m.size(); ++r) {
      auto& x = w.m[r];
      if (w.notices > 0 && x.alive && x.joined && !x.stopped && w.coordinator_alive)
        branch([this, r](world& n) {
          --n.notices;
          n.fault = true;
          dispatch(n, n.coord.on_claim(r, n.m[r].started, n.has_deadline ? deadline : 0));
        });
      if (w.deaths > 0 && x.alive && !x.stopped)
        branch([r](world& n) {
          --n.deaths;
          n.fault = true;
          n.m[r].alive = false;
          n.m[r].in.clear();
        });
      if (!x.alive && !x.detected && w.coordinator_alive)
        branch([this, r](world& n) {
          n.m[r].detected = true;
          dispatch(n, n.coord.on_member_lost(r, n.m[r].completed, loss_reason::dead, "dead: model"));
        });
    }
    if (w.coordinator_deaths > 0 && w.coordinator_alive)
      branch([](world& n) {
        --n.coordinator_deaths;
        n.fault = true;
        n.coordinator_alive = false;
      });
    in_place_events(w, branch);
    if (w.has_deadline && !w.time_up) branch([](world& n) { n.time_up = true; });
    // The coordinator's deadline rescue and its cutoff, once the deadline
    // is near, at any point after that.
    if (w.time_up && w.coordinator_alive && w.rescue == 0)
      branch([this](world& n) {
        n.rescue = 1;
        dispatch(n, n.coord.on_rescue());
      });
    if (w.coordinator_alive && w.rescue == 1)
      branch([this](world& n) {
        n.rescue = 2;
        dispatch(n, n.coord.on_cutoff());
      });
  }

  /// Recovery in place as session::impl::recover_in_place carries it out
  /// (one step here: the collectives' re-form is the step barrier that
  /// follows): take the donor's state unless at its step, forget the loss,
  /// report. A donor that is gone or holds another step fails the
  /// transfer: the state is torn and the worker stops for a restart.
  void recover(world& w, member& x) {
    const auto o = *x.ctl.recover;
    if (o.donor != x.rank && (x.completed != o.step || x.replacement)) {
      auto& d = w.m[o.donor];
      if (!d.alive || d.stopped || d.torn || d.completed != o.step) {
        x.torn = true;
        stop(w, x, 42, "recovery in place: the transfer from the donor failed");
        return;
      }
      x.completed = o.step;
    }
    MODEL_REQUIRE(x.completed == o.step);
    x.replacement = false;
    x.epoch = o.id;
    x.policy.recovered();
    auto replaced = [&](uint32_t r) { return std::find(o.replaced.begin(), o.replaced.end(), r) != o.replaced.end(); };
    if (x.ctl.lost && replaced(x.ctl.lost->rank)) x.ctl.lost.reset();
    if (x.ctl.order && x.ctl.order->id <= o.id) x.ctl.order.reset();
    x.ctl.recover.reset();
    x.started = x.completed;
    x.t = tstate::between;
    x.mode = boundary_mode::step_start;
    x.dirty = true;
    send(w, x, {to_coord::recovered, o.id, o.step, true, 0});
  }

  /// A replacement process joins for a lost rank, or its deadline passes.
  template <class B>
  void in_place_events(const world& w, B& branch) {
    if (!w.coordinator_alive) return;
    bool awaited = false;
    for (uint32_t r = 0; r < w.m.size(); ++r) {
      awaited |= w.coord.awaits_replacement(r);
      if (w.replacements == 0 || !w.coord.awaits_replacement(r) || w.m[r].alive) continue;
      branch([this, r](world& n) {
        --n.replacements;
        worker_policy_config c = n.m[r].policy.config();
        c.replacement = true;
        member y(r, c, 0);
        y.replacement = true;
        y.t = tstate::boundary;  // attach() waits at the first boundary for its order
        y.dirty = true;
        n.m[r] = y;
        dispatch(n, n.coord.on_replacement_join(r));
      });
    }
    // The deadline runs from the loss and fires once while a replacement is
    // awaited (a fallback awaits nothing more).
    if (awaited) branch([this](world& n) { dispatch(n, n.coord.on_replace_timeout()); });
  }

  /// A group that recovered in place and trained on to the horizon: every
  /// live member trains on the same state, nobody stopped. (Ends that fall
  /// back to a restart are judged below like every other fault.)
  bool in_place_end(const world& w) {
    if (w.coord.phase() != agreement_phase::idle) return false;  // a later round ran into the horizon
    std::optional<uint64_t> step;
    for (auto& x : w.m) {
      if (!x.alive) continue;
      MODEL_REQUIRE_INFO((!x.stopped && !x.torn && x.t == tstate::in_step && x.started > sc_.horizon),
                         "rank " << x.rank << " stopped " << x.stopped << " (" << x.why << ") after the group resumed");
      MODEL_REQUIRE((!step || *step == x.completed));
      step = x.completed;
    }
    ++checked;
    outcomes.insert("in place at " + std::to_string(step.value_or(0)));
    return true;
  }

  void check_end(const world& w) {
    ++terminals;
    for (auto& x : w.m)
      if (x.alive && x.t == tstate::in_step && !x.stopped && x.started > sc_.horizon && !x.aborted) {
        if (w.resumed && in_place_end(w)) return;
        ++incomplete;  // ran into the model's step horizon: nothing to judge
        return;
      }
    ++checked;
    std::string summary;
    uint64_t best = 0;
    for (auto& x : w.m) {
      if (!x.alive) continue;
      const auto says = [&] {
        return "rank " + std::to_string(x.rank) + " stopped " + std::to_string(x.stopped) + " code " +
               std::to_string(x.code) + " why " + x.why + " agreement " + w.coord.state_key();
      };
      MODEL_REQUIRE_INFO(x.stopped, says());  // no live member left waiting
      best = std::max(best, x.completed);
      if (w.save_failed)
        MODEL_REQUIRE_INFO((x.code == 3 || x.code == 42), says());
      else if (w.fault)
        MODEL_REQUIRE_INFO(x.code == 42, says());
      summary += std::to_string(x.code) + ",";
    }
    if (w.fault && !w.save_failed && (w.m[0].alive || w.coordinator_alive)) {
      // A committed checkpoint at most one step behind the most advanced
      // survivor (without the service and without the chief, nobody may
      // save: that case is only required to stop cleanly).
      uint64_t newest = w.local_world ? restorable(w) : *w.disk.rbegin();
      MODEL_REQUIRE_INFO(newest + 1 >= best, "newest on disk " << newest << ", most advanced survivor " << best
                                                             << " agreement " << w.coord.state_key());
      summary += "lost" + std::to_string(best > newest ? best - newest : 0);
    }
    outcomes.insert(summary);
  }
};

void explore(scenario sc) {
  explorer e(sc);
  e.run();
  CAPTURE(sc.notices, sc.deaths, sc.save_failures, sc.coordinator_deaths, sc.deadline, sc.late_join, e.states,
          e.terminals, e.checked, e.incomplete);
  REQUIRE(e.checked > 0);
  std::string outcomes;
  for (auto& o : e.outcomes) outcomes += (outcomes.empty() ? "" : "; ") + o;
  WARN("states " << e.states << " terminals " << e.terminals << " checked " << e.checked << " incomplete "
                 << e.incomplete << " outcomes " << e.outcomes.size() << " (" << outcomes << ")");
}

}  // namespace

TEST_CASE("protocol model: one notice no fault on top", "[model]") { explore({1, 0, 0, 0, false, false}); }

TEST_CASE("protocol model: a death alone and a death during every phase of an agreement", "[model]") {
  explore({0, 1, 0, 0, false, false});
  explore({1, 1, 0, 0, false, false});
}

// Sharded state: every member writes its part, the chief commits them once
// the service knows all are durable; a death at any point of the two phases
// (and a part that fails) leaves the previous complete checkpoint.
scenario sharded(int notices, int deaths, int save_failures) {
  scenario s{notices, deaths, save_failures, 0, false, false};
  s.parts = true;
  return s;
}

TEST_CASE("protocol model: sharded state, a notice, a death at every phase of the two-phase commit", "[model]") {
  explore(sharded(1, 0, 0));
  explore(sharded(1, 1, 0));
  explore(sharded(0, 1, 0));
}

TEST_CASE("protocol model: sharded state, a notice, a failed part and a death", "[model]") {
  explore(sharded(1, 1, 1));
}

// With replicas, a death becomes a just-in-time save from the survivors'
// kept copies and the lost member's replica whenever its copy arrived:
// every part of the committed step is durable (commit_parts), the step is
// above the durable one, and no survivor is left behind.
TEST_CASE("protocol model: sharded state with replicas, a death and a notice", "[model]") {
  auto s = sharded(0, 1, 0);
  s.replicas = true;
  explore(s);
  s = sharded(1, 1, 0);
  s.replicas = true;
  explore(s);
}

// Node-local directories (ranks 0 and 1 on node 0, rank 2 on node 1): each
// node's lowest live rank commits its node's parts; the round is committed
// only once every such node reported, a committer's loss stops at the
// durable step, and a restart resumes from the newest step whose every part
// is durable somewhere.
scenario node_local(int notices, bool replicas) {
  auto s = sharded(notices, 1, 0);
  s.local_world = 2;
  s.replicas = replicas;
  return s;
}

TEST_CASE("protocol model: node-local parts, a death at every phase, and a notice on top", "[model]") {
  explore(node_local(0, false));
  explore(node_local(0, true));
  explore(node_local(1, false));
}

// 23 million states, about four minutes: outside CI
// (build/tests/grace_model_tests "[full]").
TEST_CASE("protocol model full: node-local parts with replicas, a notice and a death", "[.][full]") {
  explore(node_local(1, true));
}

// Recovery in place (runtime/coordination/agreement.hpp): a loss while the
// group trains ends in a recover order; replacement processes join for the
// lost ranks (or their deadline passes first), members behind the donor
// take its state, and the group trains on - or, when a loss, a failed
// transfer or a missing replacement leaves state incomplete, everyone
// stops at a committed checkpoint at most one step behind.
scenario in_place(int notices, int deaths, int replacements, int coordinator_deaths = 0, uint64_t room = 2) {
  scenario s{notices, deaths, 0, coordinator_deaths, false, false, restored + room};
  s.in_place_replacements = replacements;
  return s;
}

TEST_CASE("protocol model: in place: a death with a replacement or its deadline", "[model][in_place]") {
  explore(in_place(0, 1, 1));
}

// One step of room: a second death anywhere before the group trains on
// (the donor during a transfer, the replacement before or after it joined).
// Tens of millions of states: outside CI (build/tests/grace_model_tests "[full]").
TEST_CASE("protocol model full: in place: a second death (the replacement or the donor)", "[.][full][in_place]") {
  explore(in_place(0, 2, 1, 0, 1));
}

// Two members (the survivor is the donor): with three, tens of millions of
// states (the "[full]" versions below, outside CI).
scenario in_place_pair(int notices, int coordinator_deaths) {
  auto s = in_place(notices, 1, 1, coordinator_deaths);
  s.members = 2;
  return s;
}

TEST_CASE("protocol model: in place: a notice during the recovery or the coordinator lost", "[model][in_place]") {
  explore(in_place_pair(1, 0));
  explore(in_place_pair(0, 1));
}

TEST_CASE("protocol model full: in place: three members and the coordinator lost", "[.][full][in_place]") {
  explore(in_place(0, 1, 1, 1, 1));
}

TEST_CASE("protocol model full: in place: three members with a notice and a death", "[.][full][in_place]") {
  explore(in_place(1, 1, 1, 0, 1));
}

TEST_CASE("protocol model: two notices and a death", "[model]") { explore({2, 1, 0, 0, false, false}); }

// One scenario per test case where a scenario takes minutes: CTest runs
// test cases in parallel (-j2), never the scenarios inside one.
TEST_CASE("protocol model: two deaths", "[model]") { explore({0, 2, 0, 0, false, false}); }

TEST_CASE("protocol model: a notice and two deaths", "[model]") { explore({1, 2, 0, 0, false, false}); }

// The grace-period scenarios: the deadline clock, the coordinator's rescue
// and its cutoff may fire between any two events, which multiplies the
// states. With two members each runs in seconds (CI); the three-member
// versions (tens of millions of states, 10-20 minutes and several GiB each)
// are tagged [full] and run outside CI:
//   build/tests/grace_model_tests "[full]"
scenario grace_from_start(uint32_t members, uint64_t horizon) {
  scenario s{1, 0, 0, 0, true, false, horizon};
  s.members = members;
  return s;
}

scenario countdown(uint32_t members, int deaths, int notices) {
  // From a running countdown: the first save of a notice with a grace
  // period committed, training goes on towards the final save.
  scenario s;
  s.in_countdown = true;
  s.deaths = deaths;
  s.notices = notices;
  s.members = members;
  return s;
}

TEST_CASE("protocol model: grace period initial save training on and the final save", "[model][grace]") {
  // Two steps of room: the initial save, training on, the final save.
  explore(grace_from_start(2, restored + 2));
}

TEST_CASE("protocol model: a death or a death and a second notice anywhere in a grace-period countdown",
          "[model][grace]") {
  explore(countdown(2, 1, 0));
  explore(countdown(2, 1, 1));
}

TEST_CASE("protocol model full: three members through a grace period", "[.][full][grace]") {
  explore(grace_from_start(3, restored + 1));
}

TEST_CASE("protocol model full: three members and a death in a grace-period countdown", "[.][full][grace]") {
  explore(countdown(3, 1, 0));
}

TEST_CASE("protocol model full: three members a death and a second notice in a grace-period countdown",
          "[.][full][grace]") {
  explore(countdown(3, 1, 1));
}

TEST_CASE("protocol model: a save that fails alone and with a death", "[model]") {
  explore({1, 0, 1, 0, false, false});
  explore({1, 1, 1, 0, false, false});
}

TEST_CASE("protocol model: the coordinator lost alone and on top of a notice or a death", "[model]") {
  explore({0, 0, 0, 1, false, false});
  explore({1, 0, 0, 1, false, false});
  explore({0, 1, 0, 1, false, false});
}

TEST_CASE("protocol model: a member that joins late dies before joining or joins after a loss", "[model]") {
  explore({0, 1, 0, 0, false, true});
  explore({1, 1, 0, 0, false, true});
}
