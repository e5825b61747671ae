#pragma once
/// Elastic jobs (`grace-launch --nnodes MIN:MAX`): which nodes form each
/// incarnation's group, as pure rules the coordination service carries out.
///
/// A node keeps its identity (`--node-rank`: its launcher, its disk, its
/// relay) for the whole job, but its place in a group, the *slot*, is
/// decided per incarnation: the nodes of a group sorted by node rank take
/// slots 0, 1, ..., and a node's ranks are `slot * nproc + local rank`, so
/// the ranks of every group are 0..W-1 whoever is missing. Without
/// elasticity (MIN = MAX) the slot is the node rank and no plan is asked.
///
/// Before each group a launcher asks the service for the plan of the next
/// incarnation it may take part in (`group_planner::ask`). The plan of the
/// service's current incarnation is decided (`decide`) as soon as
///   a. every node (MAX) asked, or
///   b. every node of the previous group asked (a restart that lost nobody
///      does not wait), with at least MIN, or
///   c. `wait` passed since the service entered the incarnation, with at
///      least MIN: a node that did not ask by then (its host is gone, or
///      slow to come back) is left out, and the group trains smaller.
/// Fewer than MIN: no plan; the launchers wait (each up to its own join
/// timeout).
///
/// A node that asks once the plan was decided without it (a replacement, a
/// host back from a partition) is *excluded* from that group and counted
/// in the next incarnation's; while the group is smaller than MAX the
/// service then claims an agreed save (`growth_due`): the group saves,
/// every worker exits for a restart, and the next plan has the newcomer
/// (rule a or b). Its restart is a membership change, not a failure: it
/// does not count toward the launchers' --max-restarts.
///
/// Why every launcher ends up with one and the same plan: the plan of an
/// incarnation is decided once, by the one service, and only while the
/// service is in that incarnation; a launcher starts workers only with the
/// plan it was given, and the service refuses joins for a world size other
/// than its plan's.

#include "runtime/base/error.hpp"

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace grace {

/// `--nnodes N` or `--nnodes MIN:MAX`.
struct node_range {
  int min = 1;
  int max = 1;
  bool elastic() const noexcept { return min < max; }
};
/// An error names what is wrong ("--nnodes 3:2: MIN must not exceed MAX").
result<node_range> parse_node_range(const std::string& text);

/// One incarnation's group: the nodes in slot order and their addresses.
struct group_plan {
  uint32_t incarnation = 0;
  uint32_t nproc = 0;               ///< workers per node
  std::vector<int32_t> nodes;       ///< slot -> node rank, ascending
  std::vector<std::string> hosts;   ///< slot -> the address the node advertises
  uint32_t world_size() const noexcept { return static_cast<uint32_t>(nodes.size()) * nproc; }
  std::optional<uint32_t> slot_of(int32_t node) const;
  /// The node a rank of this group runs on.
  std::optional<int32_t> node_of_rank(uint32_t rank) const;
  bool has(int32_t node) const { return slot_of(node).has_value(); }
  /// "nodes 0, 2 (4 workers)".
  std::string describe() const;
};

struct planner_config {
  uint32_t min_nodes = 1;
  uint32_t max_nodes = 1;
  uint32_t nproc = 1;
  int64_t wait_ns = 30'000'000'000;  ///< rule c
};

class group_planner {
public:
  explicit group_planner(planner_config c) : c_(c) {}

  /// The service entered incarnation `inc` at `now_ns`: its plan is open.
  void enter(uint32_t inc, int64_t now_ns);
  /// A successor service (etcd failover) starts in an incarnation whose
  /// plan its predecessor decided.
  void adopt(const group_plan& p);

  enum class reply { plan, wait, excluded };
  struct answer {
    reply what = reply::wait;
    group_plan plan;           ///< reply::plan
    uint32_t incarnation = 0;  ///< plan: its incarnation; excluded: the one decided without this node
  };
  /// The launcher of `node` (advertising `host`) asks for the first group
  /// it may join in incarnation `from` or later: the current plan if it
  /// has this node; `wait` while that plan (or the next incarnation's, for
  /// `from` past the current one) is open; `excluded` when the current
  /// plan was decided without it (it is then counted in the next).
  answer ask(int32_t node, const std::string& host, uint32_t from);
  /// The current incarnation's plan if one of the rules above is met now;
  /// each plan is returned once.
  std::optional<group_plan> decide(int64_t now_ns);
  /// The node's launcher is gone (its relay's connection dropped): it no
  /// longer counts for a plan still open, nor for the next one.
  void forget(int32_t node);

  /// The current incarnation's plan, once decided.
  const std::optional<group_plan>& current() const noexcept { return plan_; }
  uint32_t incarnation() const noexcept { return inc_; }
  /// Nodes that asked too late for the current group and wait for the next.
  const std::map<int32_t, std::string>& waiting() const noexcept { return next_; }
  /// A newcomer waits while the current group is smaller than MAX: the
  /// group should save and restart with it.
  bool growth_due() const noexcept;
  /// While the current plan is open: "2 of 3 nodes (0, 1); at least 2 needed".
  std::string progress() const;

private:
  planner_config c_;
  uint32_t inc_ = 0;
  bool entered_ = false;
  int64_t entered_ns_ = 0;
  std::map<int32_t, std::string> asked_;  ///< node -> host: asked for the current incarnation
  std::map<int32_t, std::string> next_;   ///< node -> host: asked for the one after it
  std::optional<group_plan> plan_;        ///< the current incarnation's, once decided
  std::optional<group_plan> previous_;    ///< the last decided before it
  bool returned_ = false;                 ///< decide() returned plan_ already
};

}  // namespace grace
