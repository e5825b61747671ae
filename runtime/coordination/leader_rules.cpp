#include "runtime/coordination/leader_rules.hpp"

#include "runtime/coordination/cluster_config.hpp"

#include <sstream>

namespace grace {

std::string coordinator_location::to_line() const {
  return endpoint + " " + std::to_string(epoch) + " " + std::to_string(node);
}

result<coordinator_location> coordinator_location::parse(const std::string& line) {
  std::istringstream in(line);
  coordinator_location c;
  std::string epoch, node, extra;
  if (!(in >> c.endpoint >> epoch >> node) || (in >> extra))
    return error{errc::invalid_input, "coordinator location '" + line + "': expected 'ADDRESS:PORT EPOCH NODE'"};
  if (auto hp = parse_host_port(c.endpoint); !hp)
    return error{errc::invalid_input, "coordinator location '" + line + "': " + hp.err().message};
  auto digits = [](const std::string& t) {
    return !t.empty() && t.size() <= 19 && t.find_first_not_of("0123456789") == std::string::npos;
  };
  if (!digits(epoch) || !digits(node) || node.size() > 9)
    return error{errc::invalid_input, "coordinator location '" + line + "': epoch and node must be numbers"};
  c.epoch = std::stoull(epoch);
  c.node = static_cast<uint32_t>(std::stoul(node));
  return c;
}

follow_action next_follow_action(const std::optional<coordinator_location>& known,
                                 const std::optional<coordinator_location>& seen) {
  if (!seen) return follow_action::campaign;
  if (!known || seen->epoch > known->epoch) return follow_action::moved;
  return follow_action::keep;
}

bool may_campaign(bool member, bool saw_other_leader, int64_t absent_ns, int64_t defer_ns) {
  return member || !saw_other_leader || absent_ns >= defer_ns;
}

job_mark read_job_key(const std::optional<std::string>& value) {
  job_mark m;
  if (!value) return m;
  m.what = job_mark::state::running;
  std::istringstream in(*value);
  std::string word, epoch, extra;
  if (!(in >> word)) return m;
  const bool digits = (in >> epoch) && !(in >> extra) && epoch.size() <= 19 &&
                      epoch.find_first_not_of("0123456789") == std::string::npos;
  if (word == "finished" && digits) m.what = job_mark::state::finished;
  if (digits) m.epoch = std::stoull(epoch);
  return m;
}

std::string job_key_value(job_mark::state s, uint64_t epoch) {
  return std::string(s == job_mark::state::finished ? "finished " : "running ") + std::to_string(epoch);
}

bool job_finished_without_us(const job_mark& m, bool first_look, uint64_t newest_leader_epoch) {
  return m.what == job_mark::state::finished && !first_look && m.epoch >= newest_leader_epoch;
}

const char* to_string(takeover_end e) noexcept {
  switch (e) {
    case takeover_end::wait: return "waiting";
    case takeover_end::everyone: return "every rank rejoined";
    case takeover_end::all_but_lost_leader: return "every rank but the lost leader's node's rejoined";
    case takeover_end::live_nodes: return "every rank of the live nodes rejoined";
    case takeover_end::window: return "window closed";
  }
  return "?";
}

namespace {
/// Whether every rank on the nodes `on` picks rejoined.
template <class Pick>
bool all_back(const takeover_progress& p, const std::function<bool(uint32_t)>& back, Pick on) {
  for (uint32_t r = 0; r < p.world_size; ++r)
    if (on(static_cast<int32_t>(r / p.nproc)) && !back(r)) return false;
  return true;
}
}  // namespace

takeover_end takeover_outcome(const takeover_progress& p, const std::function<bool(uint32_t)>& back) {
  if (p.rejoined_count >= p.world_size) return takeover_end::everyone;
  if (p.age_ns >= p.window_ns) return takeover_end::window;
  if (p.nproc == 0) return takeover_end::wait;
  if (p.lost_leader >= 0 && p.lost_leader != p.own_node &&
      all_back(p, back, [&](int32_t node) { return node != p.lost_leader; }))
    return takeover_end::all_but_lost_leader;
  if (p.age_ns < p.min_ns) return takeover_end::wait;
  if (all_back(p, back, [&](int32_t node) { return node == p.own_node || p.registered.count(node) > 0; }))
    return takeover_end::live_nodes;
  return takeover_end::wait;
}

} // namespace grace
