#pragma once
/// Which address a process advertises to its peers (the coordinator's CAF
/// listener, Gloo pairs, NCCL's socket interface), and where node 0's
/// coordination service listens.
///
/// An advertised address must be one the peers can reach. The default is the
/// address of the interface through which this host reaches the coordinator
/// (the kernel's route, asked with a connected UDP socket that sends
/// nothing): on a host with several interfaces that is the one facing the
/// cluster, and on a single host (coordinator on loopback) it is loopback.
/// Explicit choices, strongest first: `--host ADDR`, `--iface NAME`,
/// GRACE_HOST, GRACE_SOCKET_IFNAME, GLOO_SOCKET_IFNAME (first entry of its
/// comma-separated list, as PyTorch reads it).
///
/// The decision (`choose_advertise_address`, `choose_listen_address`) is
/// pure: the host's interfaces and its route lookup come in as values, so
/// unit tests describe any topology. `probe_host()` gathers the real ones.

#include "runtime/base/error.hpp"

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace grace {

/// One IPv4 address of one interface of this host.
struct interface_addr {
  std::string name;     ///< "eth0", "lo"
  std::string address;  ///< dotted IPv4
  bool loopback = false;
};

/// What is known about this host: its interfaces, and which local address
/// the kernel would use to reach a destination.
struct host_probe {
  std::vector<interface_addr> interfaces;
  std::function<result<std::string>(const std::string& dest_ip)> route_source;
};

/// The real host: getifaddrs() and a connected UDP socket + getsockname().
host_probe probe_host();

/// Resolves a name or dotted address to one IPv4 address (getaddrinfo).
/// The error names the host and the resolver's reason.
result<std::string> resolve_ipv4(const std::string& host);

/// The explicit choices, as given (empty: not given).
struct address_request {
  std::string host_flag;       ///< --host (an IPv4 address of this host, already resolved)
  std::string iface_flag;      ///< --iface
  std::string grace_host;      ///< GRACE_HOST
  std::string grace_ifname;    ///< GRACE_SOCKET_IFNAME
  std::string gloo_ifname;     ///< GLOO_SOCKET_IFNAME (comma-separated list: the first entry)
  std::string coordinator_ip;  ///< resolved coordinator address; empty: single process, no peers
};

struct advertise_choice {
  std::string address;  ///< what peers are told to connect to
  std::string iface;    ///< the interface holding it ("" if unknown)
  std::string source;   ///< why: "--host", "GRACE_SOCKET_IFNAME=eth1", "route to 192.0.2.1", ...
};

/// Picks the advertised address (precedence in the file comment). Errors
/// (invalid_input, one line, naming the value and this host's addresses): an
/// address that is not this host's, an interface that does not exist or has
/// no IPv4 address, no route to the coordinator, a loopback address
/// advertised to a coordinator that is not on loopback (peers on other
/// hosts could not reach it), --host and --iface that disagree.
result<advertise_choice> choose_advertise_address(const address_request& req, const host_probe& host);

/// Where node 0's coordination service listens: the coordinator's address
/// when it is one of this host's; otherwise (a name that resolves to a
/// forwarding address, e.g. a Kubernetes Service) the advertised address
/// if it was chosen explicitly. Anything else is an error naming both.
result<std::string> choose_listen_address(const std::string& coordinator_ip, const advertise_choice& adv,
                                          const host_probe& host);

/// GRACE_HOST, GRACE_SOCKET_IFNAME and GLOO_SOCKET_IFNAME from this
/// process's environment, with GRACE_HOST resolved if it is a name.
result<address_request> address_request_from_environment(const std::string& coordinator_ip);

/// A worker's advertised address: from GRACE_HOST / GRACE_SOCKET_IFNAME /
/// GLOO_SOCKET_IFNAME (grace-launch sets GRACE_HOST), else the route to
/// `coordinator_host` (a name or an address; empty: 127.0.0.1).
result<advertise_choice> advertised_address_from_environment(const std::string& coordinator_host);

/// "lo 127.0.0.1, eth0 192.0.2.1": for error messages.
std::string describe_interfaces(const std::vector<interface_addr>& ifs);

}  // namespace grace
