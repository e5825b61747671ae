#pragma once
/// The multi-host test bed of grace-chaos --hosts: K "hosts" on one
/// machine, each a network namespace `gch<pid>-h<i>` with one veth link
/// (eth0, 198.18.7.<i+1>/24) into a bridge `gch<pid>b`. No default route
/// and no address on the bridge: nothing leaves the machine. Host i's
/// link down is a partition (or, with its processes killed, a lost host).
/// Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN) and iproute2.

#include <string>
#include <sys/types.h>
#include <vector>

namespace grace::chaos {

class netns_testbed {
public:
  /// Creates `hosts` namespaces. Throws std::runtime_error saying why they
  /// cannot be made here (not root, no `ip`, the kernel refuses).
  explicit netns_testbed(int hosts);
  /// Kills every process inside, removes the namespaces and the bridge.
  ~netns_testbed();
  netns_testbed(const netns_testbed&) = delete;
  netns_testbed& operator=(const netns_testbed&) = delete;

  int hosts() const noexcept { return hosts_; }
  std::string ns(int h) const;
  std::string address(int h) const;
  /// `ip netns exec <ns>`: prepend to a command to run it on host h.
  std::vector<std::string> exec_prefix(int h) const;
  /// Host h's link up or down (down: a partition).
  void set_link(int h, bool up);
  /// A lost host: link down, every process on it SIGKILLed.
  void kill_host(int h);
  /// `sig` to every process on host h (SIGSTOP: a frozen host).
  void signal_host(int h, int sig);
  /// The processes on host h (those whose network namespace is h's).
  std::vector<pid_t> pids(int h) const;

  /// Removes test beds left by grace-chaos runs that no longer exist
  /// (killed with SIGKILL, so their destructor never ran).
  static void reap_stale();

private:
  void build();
  void teardown() noexcept;

  int hosts_;
  std::string prefix_;
  std::vector<std::string> made_;  ///< namespaces created so far
  bool bridge_ = false;
};

}  // namespace grace::chaos
