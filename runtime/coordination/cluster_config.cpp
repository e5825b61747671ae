#include "runtime/coordination/cluster_config.hpp"

#include "runtime/coordination/leader_rules.hpp"
#include "runtime/net/job_token.hpp"

#include <fstream>

#include <nlohmann/json.hpp>

#include <cstdlib>

namespace grace {

namespace {

result<uint64_t> parse_uint(const std::string& name, const std::string& v, uint64_t max) {
  if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos || v.size() > 19)
    return invalid_input(name + "='" + v + "' is not a non-negative integer");
  auto n = std::stoull(v);
  if (n > max) return invalid_input(name + "=" + v + " is out of range (max " + std::to_string(max) + ")");
  return n;
}

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

}  // namespace

status check_run_id(const std::string& id, const std::string& origin) {
  if (id.empty() || id.size() > 256)
    return error{errc::invalid_input, origin + " must be 1 to 256 characters long (it is " + std::to_string(id.size()) + ")"};
  for (unsigned char c : id)
    if (c <= ' ' || c >= 127)
      return error{errc::invalid_input, origin + " may hold printable ASCII characters only, no blanks (byte " +
                                            std::to_string(c) + " found)"};
  return {};
}

result<std::pair<std::string, uint16_t>> parse_host_port(const std::string& s) {
  auto colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0) return invalid_input("'" + s + "' is not host:port");
  auto port = parse_uint("port in '" + s + "'", s.substr(colon + 1), 65535);
  if (!port) return port.err();
  if (*port == 0) return invalid_input("port 0 in '" + s + "' is not a usable port");
  return std::make_pair(s.substr(0, colon), static_cast<uint16_t>(*port));
}

result<cluster_config> cluster_from_workers(const std::string& workers, int index) {
  std::vector<std::string> list;
  size_t start = 0;
  while (start <= workers.size()) {
    auto comma = workers.find(',', start);
    auto item = workers.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (item.empty()) return invalid_input("--workers '" + workers + "' has an empty entry");
    list.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (list.empty()) return invalid_input("--workers is empty");
  cluster_config c;
  c.source = "--workers";
  c.world_size = static_cast<uint32_t>(list.size());
  if (index < 0) {
    if (list.size() > 1)
      return invalid_input("--workers lists " + std::to_string(list.size()) +
                 " workers but no --index was given: say which one this process is");
    index = 0;
  }
  if (static_cast<size_t>(index) >= list.size())
    return invalid_input("--index " + std::to_string(index) + " is out of range for " + std::to_string(list.size()) + " workers");
  for (auto& w : list) {
    auto hp = parse_host_port(w);
    if (!hp) return hp.err();
    if (!is_loopback_host(hp->first)) c.spans_hosts = true;
  }
  c.rank = static_cast<uint32_t>(index);
  c.local_rank = c.rank;
  if (list.size() > 1) {
    auto hp = parse_host_port(list[0]).value();
    c.coordinator_host = hp.first;
    c.coordinator_port = hp.second;
  }
  return c;  // the secret: resolve_member_secret
}

bool is_loopback_host(const std::string& host) {
  return host == "localhost" || host == "ip6-localhost" || host == "::1" || host == "[::1]" ||
         host.rfind("127.", 0) == 0;
}

result<secret_mode> resolve_member_secret(cluster_config& c, const secret_inputs& in,
                                          const char* (*getenv)(const char*)) {
  if (c.source != "--workers" && c.source != "TF_CONFIG") return secret_mode::launcher;
  auto set = [getenv](const char* name) -> std::string {
    const char* v = getenv(name);
    return v ? v : "";
  };
  if (auto t = set("GRACE_TOKEN"); !t.empty()) {
    if (auto st = check_token(t, "GRACE_TOKEN"); !st) return st.err();
    c.token = t;
    return secret_mode::given;
  }
  const std::string file = !in.token_file.empty() ? in.token_file : set("GRACE_TOKEN_FILE");
  if (!file.empty()) {
    auto t = read_token_file(file);
    if (!t) return t.err();
    c.token = *t;
    return secret_mode::given;
  }
  c.token.clear();
  if (!c.spans_hosts) return secret_mode::loopback_only;
  if (in.insecure || set("GRACE_INSECURE") == "1") return secret_mode::insecure;
  return invalid_input(c.source + " lists workers on other hosts but this worker has no job secret: give every "
                       "worker the same secret with GRACE_TOKEN or a token file (--token-file or GRACE_TOKEN_FILE, "
                       "mode 600), or pass --insecure (GRACE_INSECURE=1) to let anyone who reaches the "
                       "coordination port join");
}

result<cluster_config> cluster_from_tf_config(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    return invalid_input(std::string("TF_CONFIG is not valid JSON: ") + e.what());
  }
  if (!j.is_object() || !j.contains("cluster") || !j["cluster"].is_object())
    return invalid_input("TF_CONFIG has no \"cluster\" object");
  auto& cl = j["cluster"];
  std::vector<std::string> workers;
  for (const char* role : {"chief", "worker"}) {
    if (!cl.contains(role)) continue;
    if (!cl[role].is_array()) return invalid_input(std::string("TF_CONFIG cluster.") + role + " is not a list");
    for (auto& w : cl[role]) {
      if (!w.is_string()) return invalid_input(std::string("TF_CONFIG cluster.") + role + " has a non-string entry");
      workers.push_back(w.get<std::string>());
    }
  }
  if (workers.empty()) return invalid_input("TF_CONFIG cluster lists no workers");
  int index = -1;
  if (j.contains("task")) {
    auto& t = j["task"];
    if (!t.is_object()) return invalid_input("TF_CONFIG task is not an object");
    if (t.contains("type") && !t["type"].is_string()) return invalid_input("TF_CONFIG task.type is not a string");
    std::string type = t.value("type", "worker");
    if (type != "worker" && type != "chief")
      return invalid_input("TF_CONFIG task.type '" + type + "' is not supported (worker or chief)");
    if (!t.contains("index") || !t["index"].is_number_integer())
      return invalid_input("TF_CONFIG task.index is missing or not an integer");
    auto raw = t["index"].get<int64_t>();
    if (raw < 0 || raw >= (1 << 20)) return invalid_input("TF_CONFIG task.index " + std::to_string(raw) + " is out of range");
    index = static_cast<int>(raw);
    // With a separate "chief" entry, worker i is index i + 1 in our list.
    if (type == "worker" && cl.contains("chief")) index += static_cast<int>(cl["chief"].size());
  }
  std::string joined;
  for (auto& w : workers) joined += (joined.empty() ? "" : ",") + w;
  auto c = cluster_from_workers(joined, index);
  if (!c) return error{errc::invalid_input, "TF_CONFIG: " + c.err().message};
  c->source = "TF_CONFIG";
  return c;
}

/// GRACE_COORDINATOR_FILE / GRACE_FAILOVER_WAIT_MS (etcd failover): the
/// service's current location, newer than GRACE_COORDINATOR.
static status failover_from_environment(cluster_config& c) {
  auto file = env("GRACE_COORDINATOR_FILE");
  if (!file) return {};
  std::ifstream in(file);
  std::string line;
  if (!in || !std::getline(in, line))
    return invalid_input(std::string("GRACE_COORDINATOR_FILE=") + file + ": cannot read the coordination service's location");
  auto loc = coordinator_location::parse(line);
  if (!loc) return error{errc::invalid_input, std::string("GRACE_COORDINATOR_FILE=") + file + ": " + loc.err().message};
  auto hp = parse_host_port(loc->endpoint);
  if (!hp) return hp.err();
  c.coordinator_file = file;
  c.coordinator_host = hp->first;
  c.coordinator_port = hp->second;
  c.coordinator_epoch = loc->epoch;
  auto w = parse_uint("GRACE_FAILOVER_WAIT_MS", env("GRACE_FAILOVER_WAIT_MS") ? env("GRACE_FAILOVER_WAIT_MS") : "10000",
                      600000);
  if (!w) return w.err();
  c.failover_wait_ms = static_cast<uint32_t>(*w);
  return {};
}

result<cluster_config> cluster_from_environment() {
  if (env("GRACE_WORLD_SIZE")) {
    cluster_config c;
    c.source = "GRACE_*";
    auto ws = parse_uint("GRACE_WORLD_SIZE", env("GRACE_WORLD_SIZE"), 1u << 20);
    if (!ws) return ws.err();
    if (*ws == 0) return invalid_input("GRACE_WORLD_SIZE=0: at least one worker is needed");
    c.world_size = static_cast<uint32_t>(*ws);
    if (!env("GRACE_RANK")) {
      if (c.world_size > 1) return invalid_input("GRACE_WORLD_SIZE is set but GRACE_RANK is not: say which worker this is");
    } else {
      auto r = parse_uint("GRACE_RANK", env("GRACE_RANK"), c.world_size - 1);
      if (!r) return r.err();
      c.rank = static_cast<uint32_t>(*r);
    }
    c.local_rank = c.rank;
    if (auto lr = env("GRACE_LOCAL_RANK")) {
      auto v = parse_uint("GRACE_LOCAL_RANK", lr, 1u << 20);
      if (!v) return v.err();
      c.local_rank = static_cast<uint32_t>(*v);
    }
    if (auto co = env("GRACE_COORDINATOR")) {
      auto hp = parse_host_port(co);
      if (!hp) return error{errc::invalid_input, "GRACE_COORDINATOR: " + hp.err().message};
      c.coordinator_host = hp->first;
      c.coordinator_port = hp->second;
    } else if (c.world_size > 1) {
      return invalid_input("GRACE_WORLD_SIZE > 1 but GRACE_COORDINATOR is not set");
    }
    if (auto st = failover_from_environment(c); !st) return st.err();
    if (auto nl = env("GRACE_NODE_LOCAL_CHECKPOINTS")) {
      if (std::string(nl) != "0" && std::string(nl) != "1")
        return invalid_input(std::string("GRACE_NODE_LOCAL_CHECKPOINTS=") + nl + ": expected 0 or 1");
      c.node_local_checkpoints = std::string(nl) == "1";
    }
    if (auto md = env("GRACE_MEMORY_DIR")) c.memory_dir = md;
    if (auto v = env("GRACE_RELAY")) {
      if (auto hp = parse_host_port(v); !hp) return error{errc::invalid_input, "GRACE_RELAY: " + hp.err().message};
      c.relay = v;
    }
    if (auto v = env("GRACE_GROUP_NODES")) {
      const std::string nodes = v;
      if (nodes.empty() || nodes.size() > 64 * 1024 || nodes.find_first_not_of("0123456789,") != std::string::npos)
        return invalid_input("GRACE_GROUP_NODES=" + nodes.substr(0, 64) + ": expected node ranks separated by commas");
      c.group_nodes = nodes;
    }
    if (auto v = env("GRACE_RUN_ID")) {
      if (auto st = check_run_id(v, "GRACE_RUN_ID"); !st) return st.err();
      c.run_id = v;
    }
    if (auto v = env("GRACE_TOKEN")) c.token = v;
    if (auto v = env("GRACE_INCARNATION")) {
      auto n = parse_uint("GRACE_INCARNATION", v, 0xffffffffu);
      if (!n) return n.err();
      c.incarnation = static_cast<uint32_t>(*n);
    }
    return c;
  }
  if (auto tf = env("TF_CONFIG")) return cluster_from_tf_config(tf);
  return cluster_config{};
}

}  // namespace grace
