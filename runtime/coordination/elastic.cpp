#include "runtime/coordination/elastic.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

namespace grace {

namespace {

std::optional<int> parse_count(const std::string& s) {
  if (s.empty() || s.size() > 6 || !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  return std::atoi(s.c_str());
}

std::string join_nodes(const std::vector<int32_t>& nodes) {
  std::string s;
  for (auto n : nodes) s += (s.empty() ? "" : ", ") + std::to_string(n);
  return s;
}

}  // namespace

result<node_range> parse_node_range(const std::string& text) {
  const auto colon = text.find(':');
  auto lo = parse_count(text.substr(0, colon));
  auto hi = colon == std::string::npos ? lo : parse_count(text.substr(colon + 1));
  if (!lo || !hi)
    return error{errc::invalid_input, "--nnodes " + text + ": expected N or MIN:MAX (whole numbers, e.g. 2:4)"};
  if (*lo < 1 || *hi > 4096)
    return error{errc::invalid_input, "--nnodes " + text + ": the number of nodes must be between 1 and 4096"};
  if (*lo > *hi) return error{errc::invalid_input, "--nnodes " + text + ": MIN must not exceed MAX"};
  return node_range{*lo, *hi};
}

std::optional<uint32_t> group_plan::slot_of(int32_t node) const {
  auto it = std::find(nodes.begin(), nodes.end(), node);
  if (it == nodes.end()) return std::nullopt;
  return static_cast<uint32_t>(it - nodes.begin());
}

std::optional<int32_t> group_plan::node_of_rank(uint32_t rank) const {
  if (nproc == 0 || rank >= world_size()) return std::nullopt;
  return nodes[rank / nproc];
}

std::string group_plan::describe() const {
  return std::string(nodes.size() == 1 ? "node " : "nodes ") + join_nodes(nodes) + " (" +
         std::to_string(world_size()) + " workers)";
}

void group_planner::enter(uint32_t inc, int64_t now_ns) {
  if (entered_ && inc == inc_) return;
  if (plan_) previous_ = plan_;
  plan_.reset();
  // Whoever asked for the incarnation after the old one asked for this one.
  asked_ = std::move(next_);
  next_.clear();
  inc_ = inc;
  entered_ = true;
  entered_ns_ = now_ns;
}

void group_planner::adopt(const group_plan& p) {
  inc_ = p.incarnation;
  entered_ = true;
  plan_ = p;
  asked_.clear();
  for (size_t i = 0; i < p.nodes.size(); ++i) asked_[p.nodes[i]] = i < p.hosts.size() ? p.hosts[i] : "";
}

group_planner::answer group_planner::ask(int32_t node, const std::string& host, uint32_t from) {
  answer a;
  if (from > inc_) {
    next_[node] = host;
    return a;
  }
  if (!plan_) {
    asked_[node] = host;
    return a;
  }
  a.incarnation = inc_;
  if (plan_->has(node)) {
    a.what = reply::plan;
    a.plan = *plan_;
    return a;
  }
  next_[node] = host;
  a.what = reply::excluded;
  return a;
}

std::optional<group_plan> group_planner::decide(int64_t now_ns) {
  if (!entered_ || plan_) return std::nullopt;
  const auto n = static_cast<uint32_t>(asked_.size());
  if (n < c_.min_nodes) return std::nullopt;
  const bool all = n >= c_.max_nodes;
  const bool previous_back =
      previous_ && std::all_of(previous_->nodes.begin(), previous_->nodes.end(),
                               [&](int32_t node) { return asked_.count(node) > 0; });
  const bool waited = now_ns - entered_ns_ >= c_.wait_ns;
  if (!all && !previous_back && !waited) return std::nullopt;
  group_plan p;
  p.incarnation = inc_;
  p.nproc = c_.nproc;
  for (auto& [node, host] : asked_) {  // a map: ascending node ranks
    p.nodes.push_back(node);
    p.hosts.push_back(host);
  }
  plan_ = p;
  return p;
}

void group_planner::forget(int32_t node) {
  if (!plan_) asked_.erase(node);
  next_.erase(node);
}

bool group_planner::growth_due() const noexcept {
  if (!plan_ || plan_->nodes.size() >= c_.max_nodes) return false;
  for (auto& [node, host] : next_)
    if (!plan_->has(node)) return true;
  return false;
}

std::string group_planner::progress() const {
  std::vector<int32_t> nodes;
  for (auto& [node, host] : asked_) nodes.push_back(node);
  std::string s = std::to_string(nodes.size()) + " of " + std::to_string(c_.max_nodes) + " nodes ready";
  if (!nodes.empty()) s += " (" + join_nodes(nodes) + ")";
  return s + ", at least " + std::to_string(c_.min_nodes) + " needed";
}

}  // namespace grace
