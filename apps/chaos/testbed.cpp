#include "apps/chaos/testbed.hpp"

#include "apps/chaos/job_support.hpp"
#include "apps/chaos/runner.hpp"

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <sys/stat.h>
#include <unistd.h>

namespace fs = std::filesystem;

namespace grace::chaos {

namespace {

/// Runs `ip ARGS...`; throws with its output when it fails.
void ip(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"ip"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::string out;
  if (run_command(argv, &out) == 0) return;
  std::string cmd;
  for (auto& a : argv) cmd += (cmd.empty() ? "" : " ") + a;
  while (!out.empty() && out.back() == '\n') out.pop_back();
  throw std::runtime_error("the multi-host test bed: '" + cmd + "' failed: " + out);
}

void ip_quiet(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"ip"};
  argv.insert(argv.end(), args.begin(), args.end());
  run_command(argv);
}

void write_sysctl(const std::string& path, const std::string& value) { std::ofstream(path) << value << "\n"; }

/// The (device, inode) of a network namespace handle, or {0, 0}.
std::pair<dev_t, ino_t> ns_id(const std::string& path) {
  struct stat sb {};
  if (::stat(path.c_str(), &sb) != 0) return {0, 0};
  return {sb.st_dev, sb.st_ino};
}

/// The processes whose network namespace is the one at `handle`.
std::vector<pid_t> pids_in(const std::string& handle) {
  std::vector<pid_t> out;
  auto want = ns_id(handle);
  if (want.second == 0) return out;
  std::error_code ec;
  for (auto it = fs::directory_iterator("/proc", ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    auto name = it->path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    if (ns_id(it->path().string() + "/ns/net") == want) out.push_back(static_cast<pid_t>(std::stol(name)));
  }
  return out;
}

void kill_all(const std::vector<pid_t>& ps, int sig) {
  for (pid_t p : ps) ::kill(p, sig);
}

}  // namespace

netns_testbed::netns_testbed(int hosts) : hosts_(hosts), prefix_("gch" + std::to_string(::getpid())) {
  if (::geteuid() != 0) throw std::runtime_error("--hosts makes network namespaces, which needs root");
  if (run_command({"sh", "-c", "command -v ip"}) != 0)
    throw std::runtime_error("--hosts needs the 'ip' command (Debian iproute2)");
  reap_stale();
  try {
    build();
  } catch (...) {
    teardown();
    throw;
  }
}

netns_testbed::~netns_testbed() { teardown(); }

std::string netns_testbed::ns(int h) const { return prefix_ + "-h" + std::to_string(h); }

std::string netns_testbed::address(int h) const { return "198.18.7." + std::to_string(h + 1); }

std::vector<std::string> netns_testbed::exec_prefix(int h) const { return {"ip", "netns", "exec", ns(h)}; }

void netns_testbed::build() {
  const std::string br = prefix_ + "b";
  ip({"link", "add", br, "type", "bridge"});
  bridge_ = true;
  // The machine's own namespace sits on the bridge and must never answer
  // ARP for a test address it may hold itself.
  write_sysctl("/proc/sys/net/ipv4/conf/" + br + "/arp_ignore", "8");
  write_sysctl("/proc/sys/net/ipv6/conf/" + br + "/disable_ipv6", "1");
  ip({"link", "set", br, "up"});
  for (int h = 0; h < hosts_; ++h) {
    const std::string n = ns(h), v = prefix_ + "v" + std::to_string(h), peer = v + "p";
    ip_quiet({"link", "del", v});  // left by an earlier run of this process, if any
    ip({"netns", "add", n});
    made_.push_back(n);
    ip({"link", "add", v, "type", "veth", "peer", "name", peer});
    ip({"link", "set", peer, "netns", n});
    ip({"-n", n, "link", "set", peer, "name", "eth0"});
    ip({"-n", n, "addr", "add", address(h) + "/24", "dev", "eth0"});
    ip({"-n", n, "link", "set", "eth0", "up"});
    ip({"-n", n, "link", "set", "lo", "up"});
    ip({"link", "set", v, "master", br});
    ip({"link", "set", v, "up"});
  }
}

void netns_testbed::teardown() noexcept {
  for (int h = 0; h < static_cast<int>(made_.size()); ++h) kill_all(pids(h), SIGKILL);
  // Killed processes leave a namespace once reaped: give their parents a
  // moment (the harness reaps its own children as their subreaper).
  for (int i = 0; i < 50; ++i) {
    bool left = false;
    for (int h = 0; h < static_cast<int>(made_.size()); ++h) left |= !pids(h).empty();
    if (!left) break;
    sleep_ms(100);
  }
  // The veth pairs first, synchronously: a deleted namespace is torn down
  // by the kernel later, its link with it, and the next run of this
  // process (a soak) makes links of the same names at once.
  for (int h = 0; h < static_cast<int>(made_.size()); ++h) ip_quiet({"link", "del", prefix_ + "v" + std::to_string(h)});
  for (auto& n : made_) ip_quiet({"netns", "del", n});
  made_.clear();
  if (bridge_) ip_quiet({"link", "del", prefix_ + "b"});
  bridge_ = false;
}

void netns_testbed::set_link(int h, bool up) {
  ip({"link", "set", prefix_ + "v" + std::to_string(h), up ? "up" : "down"});
}

void netns_testbed::kill_host(int h) {
  set_link(h, false);
  kill_all(pids(h), SIGKILL);
}

void netns_testbed::signal_host(int h, int sig) { kill_all(pids(h), sig); }

std::vector<pid_t> netns_testbed::pids(int h) const { return pids_in("/run/netns/" + ns(h)); }

void netns_testbed::reap_stale() {
  std::error_code ec;
  for (auto it = fs::directory_iterator("/run/netns", ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    auto name = it->path().filename().string();
    unsigned long pid = 0;
    unsigned host = 0;
    char rest = 0;
    if (std::sscanf(name.c_str(), "gch%lu-h%u%c", &pid, &host, &rest) != 2) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0) continue;  // its grace-chaos still runs
    kill_all(pids_in(it->path().string()), SIGKILL);
    ip_quiet({"netns", "del", name});
    ip_quiet({"link", "del", "gch" + std::to_string(pid) + "b"});
  }
}

}  // namespace grace::chaos
