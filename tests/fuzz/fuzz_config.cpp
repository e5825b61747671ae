// libFuzzer: cluster configuration from outside the process. The first
// byte picks the parser: TF_CONFIG, host:port, --workers, a SLURM node list,
// the torchrun/SLURM environment (KEY=VALUE lines), the job's secret,
// checkpoint directory names and kinds.
#include "runtime/checkpoint/checkpoint_kind.hpp"
#include "runtime/coordination/cluster_config.hpp"
#include "runtime/net/job_token.hpp"
#include "runtime/launch/launch_env.hpp"
#include "runtime/checkpoint/manifest.hpp"

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

namespace {

std::map<std::string, std::string> env_lines(const std::string& s) {
  std::map<std::string, std::string> env;
  size_t start = 0;
  while (start <= s.size()) {
    auto nl = s.find('\n', start);
    auto line = s.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
    auto eq = line.find('=');
    if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
    if (nl == std::string::npos) break;
    start = nl + 1;
  }
  return env;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string s(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (data[0] % 6) {
    case 0: (void)grace::cluster_from_tf_config(s); break;
    case 1: (void)grace::parse_host_port(s); break;
    case 2: (void)grace::cluster_from_workers(s, static_cast<int>(data[0] / 6) - 2); break;
    case 3: (void)grace::first_host_of_nodelist(s); break;
    case 4: {
      auto env = env_lines(s);
      (void)grace::launch_settings_from_environment([&](const char* k) -> const char* {
        auto it = env.find(k);
        return it == env.end() ? nullptr : it->second.c_str();
      });
      break;
    }
    default: {
      (void)grace::check_token(s, "fuzz");
      uint64_t step = 0;
      long pid = 0;
      (void)grace::parse_step_name(s, step);
      (void)grace::parse_tmp_name(s, step, pid);
      grace::checkpoint_kind k;
      (void)grace::parse_checkpoint_kind(s, k);
    }
  }
  return 0;
}
