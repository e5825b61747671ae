#include "runtime/launch/launch_env.hpp"

#include <cctype>

namespace grace {

namespace {

/// The first of `names` that is set and not empty.
std::optional<std::pair<std::string, std::string>> first_set(const env_lookup& getenv,
                                                             std::initializer_list<const char*> names) {
  for (auto n : names) {
    const char* v = getenv(n);
    if (v && *v) return std::make_pair(std::string(n), std::string(v));
  }
  return std::nullopt;
}

result<int> to_int(const std::pair<std::string, std::string>& var, int max) {
  auto& v = var.second;
  if (v.empty() || v.size() > 9 || v.find_first_not_of("0123456789") != std::string::npos)
    return invalid_input(var.first + "='" + v + "' is not a non-negative integer");
  int n = std::stoi(v);
  if (n > max) return invalid_input(var.first + "=" + v + " is out of range (max " + std::to_string(max) + ")");
  return n;
}

/// Sets `field` from the first variable of `names` that is set, unless an
/// earlier source set it already.
status take_int(std::optional<env_value<int>>& field, const char* source, const env_lookup& getenv,
                std::initializer_list<const char*> names) {
  if (field) return {};
  auto var = first_set(getenv, names);
  if (!var) return {};
  auto n = to_int(*var, 1 << 20);
  if (!n) return n.err();
  field = env_value<int>{*n, var->first, source};
  return {};
}

status from_torchrun(launch_settings& s, const env_lookup& getenv) {
  const char* src = "torchrun";
  auto addr = first_set(getenv, {"PET_MASTER_ADDR", "MASTER_ADDR"});
  auto port = first_set(getenv, {"PET_MASTER_PORT", "MASTER_PORT"});
  if (!addr) return {};  // RANK/WORLD_SIZE alone may mean anything: not a torchrun-style job
  if (!port) return invalid_input(addr->first + " is set but MASTER_PORT is not: give both (or --coordinator)");
  auto p = to_int(*port, 65535);
  if (!p) return p.err();
  s.coordinator = env_value<std::string>{addr->second + ":" + std::to_string(*p), addr->first + ":" + port->first, src};
  for (auto st : {take_int(s.nnodes, src, getenv, {"PET_NNODES", "WORLD_SIZE"}),
                  take_int(s.node_rank, src, getenv, {"PET_NODE_RANK", "NODE_RANK", "GROUP_RANK", "RANK"}),
                  take_int(s.nproc, src, getenv, {"PET_NPROC_PER_NODE", "LOCAL_WORLD_SIZE"})})
    if (!st) return st;
  if (auto id = first_set(getenv, {"TORCHELASTIC_RUN_ID", "PET_RDZV_ID"}))
    s.run_id = env_value<std::string>{id->second, id->first, src};
  else
    s.run_id = env_value<std::string>{"torchrun-" + s.coordinator->value, s.coordinator->from, src};
  return {};
}

status from_slurm(launch_settings& s, const env_lookup& getenv) {
  const char* src = "SLURM";
  auto job = first_set(getenv, {"SLURM_JOB_ID", "SLURM_JOBID"});
  if (!job) return {};
  auto id = to_int(*job, 2000000000);
  if (!id) return id.err();
  if (!s.run_id) s.run_id = env_value<std::string>{"slurm-" + job->second, job->first, src};
  for (auto st : {take_int(s.nnodes, src, getenv, {"SLURM_NNODES", "SLURM_JOB_NUM_NODES"}),
                  take_int(s.node_rank, src, getenv, {"SLURM_NODEID"})})
    if (!st) return st;
  auto list = first_set(getenv, {"SLURM_JOB_NODELIST", "SLURM_NODELIST"});
  if (s.coordinator || !list) return {};
  auto host = first_host_of_nodelist(list->second);
  if (!host) return invalid_input(list->first + ": " + host.err().message);
  int port = 29400 + *id % 1000;
  std::string port_from = "SLURM_JOB_ID";
  if (auto p = first_set(getenv, {"GRACE_COORDINATOR_PORT", "MASTER_PORT"})) {
    auto n = to_int(*p, 65535);
    if (!n) return n.err();
    port = *n;
    port_from = p->first;
  }
  s.coordinator = env_value<std::string>{*host + ":" + std::to_string(port), list->first + ":" + port_from, src};
  return {};
}

}  // namespace

result<std::string> first_host_of_nodelist(const std::string& list) {
  if (list.empty()) return invalid_input("empty host list");
  size_t depth = 0, end = list.size();
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i] == '[')
      ++depth;
    else if (list[i] == ']') {
      if (depth == 0) return invalid_input("unbalanced ']' in '" + list + "'");
      --depth;
    } else if (list[i] == ',' && depth == 0) {
      end = i;
      break;
    }
  }
  if (depth != 0) return invalid_input("unbalanced '[' in '" + list + "'");
  auto host = list.substr(0, end);
  if (host.empty()) return invalid_input("empty host in '" + list + "'");
  // Each bracket group stands for its first item: "rack[1-2]-n[4,6]" -> "rack1-n4".
  for (auto open = host.find('['); open != std::string::npos; open = host.find('[')) {
    auto close = host.find(']', open);
    auto inside = host.substr(open + 1, close - open - 1);
    auto item = inside.substr(0, inside.find_first_of(",-"));
    if (item.empty() || item.find_first_not_of("0123456789") != std::string::npos)
      return invalid_input("cannot read the range '[" + inside + "]' in '" + list + "'");
    host = host.substr(0, open) + item + host.substr(close + 1);
  }
  return host;
}

result<launch_settings> launch_settings_from_environment(const env_lookup& getenv) {
  launch_settings s;
  if (auto st = from_torchrun(s, getenv); !st) return st.err();
  if (auto st = from_slurm(s, getenv); !st) return st.err();
  return s;
}

std::string describe_sources(const std::vector<std::string>& used) {
  bool torchrun = false, slurm = false;
  for (auto& u : used) {
    torchrun |= u == "torchrun";
    slurm |= u == "SLURM";
  }
  return torchrun && slurm ? "torchrun + SLURM" : torchrun ? "torchrun" : slurm ? "SLURM" : "";
}

}  // namespace grace
