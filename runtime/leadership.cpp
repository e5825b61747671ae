#include "runtime/leadership.hpp"

#include "runtime/cluster_config.hpp"

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

} // namespace grace
