#include "runtime/net/net_address.hpp"

#include "runtime/base/posix_file.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace grace {

namespace {

bool is_loopback(const std::string& ip) { return ip.rfind("127.", 0) == 0; }

/// The interface holding `ip`. All of 127.0.0.0/8 is the loopback
/// interface's (Debian maps the host name to 127.0.1.1 in /etc/hosts).
const interface_addr* find_by_address(const std::vector<interface_addr>& ifs, const std::string& ip) {
  for (auto& i : ifs)
    if (i.address == ip) return &i;
  if (is_loopback(ip))
    for (auto& i : ifs)
      if (i.loopback) return &i;
  return nullptr;
}

const interface_addr* find_by_name(const std::vector<interface_addr>& ifs, const std::string& name) {
  for (auto& i : ifs)
    if (i.name == name) return &i;
  return nullptr;
}

std::string first_of_list(const std::string& list) { return list.substr(0, list.find(',')); }

/// An explicit address: it must be one of this host's.
result<advertise_choice> by_address(const std::string& ip, const std::string& what, const host_probe& host) {
  auto i = find_by_address(host.interfaces, ip);
  if (!i)
    return invalid_input(what + " " + ip +
               " is not an address of this host (its addresses: " + describe_interfaces(host.interfaces) + ")");
  return advertise_choice{ip, i->name, what};
}

/// An explicit interface: it must exist and have an IPv4 address.
result<advertise_choice> by_interface(const std::string& name, const std::string& what, const host_probe& host) {
  auto i = find_by_name(host.interfaces, name);
  if (!i)
    return invalid_input(what + "=" + name + ": this host has no interface of that name with an IPv4 address (it has: " +
               describe_interfaces(host.interfaces) + ")");
  return advertise_choice{i->address, i->name, what + "=" + name};
}

/// The first explicit choice, if any was made.
std::optional<result<advertise_choice>> explicit_choice(const address_request& r, const host_probe& host) {
  if (!r.host_flag.empty()) {
    auto c = by_address(r.host_flag, "--host", host);
    if (c && !r.iface_flag.empty() && c->iface != r.iface_flag)
      return result<advertise_choice>(invalid_input("--host " + r.host_flag + " is on interface " + c->iface +
                                          ", not on --iface " + r.iface_flag + ": give one of them"));
    return c;
  }
  if (!r.iface_flag.empty()) return by_interface(r.iface_flag, "--iface", host);
  if (!r.grace_host.empty()) return by_address(r.grace_host, "GRACE_HOST", host);
  if (!r.grace_ifname.empty()) return by_interface(first_of_list(r.grace_ifname), "GRACE_SOCKET_IFNAME", host);
  if (!r.gloo_ifname.empty()) return by_interface(first_of_list(r.gloo_ifname), "GLOO_SOCKET_IFNAME", host);
  return std::nullopt;
}

}  // namespace

std::string describe_interfaces(const std::vector<interface_addr>& ifs) {
  std::string s;
  for (auto& i : ifs) s += (s.empty() ? "" : ", ") + i.name + " " + i.address;
  return s.empty() ? "none" : s;
}

result<advertise_choice> choose_advertise_address(const address_request& r, const host_probe& host) {
  advertise_choice c;
  if (auto e = explicit_choice(r, host)) {
    if (!*e) return e->err();
    c = e->value();
  } else if (r.coordinator_ip.empty()) {
    return advertise_choice{"127.0.0.1", "lo", "single node (no coordinator address)"};
  } else {
    if (!host.route_source) return invalid_input("no route lookup available to reach the coordinator " + r.coordinator_ip);
    auto src = host.route_source(r.coordinator_ip);
    if (!src)
      return invalid_input("no route from this host to the coordinator " + r.coordinator_ip + ": " + src.err().message +
                 " (give this host's address with --host or GRACE_HOST)");
    auto i = find_by_address(host.interfaces, *src);
    c = advertise_choice{*src, i ? i->name : "", "route to the coordinator " + r.coordinator_ip};
  }
  if (is_loopback(c.address) && !r.coordinator_ip.empty() && !is_loopback(r.coordinator_ip))
    return invalid_input(c.source + " gives the loopback address " + c.address + ", but the coordinator " + r.coordinator_ip +
               " is not on loopback: peers on other hosts could not reach it (give "
               "--host/--iface with an address they can reach)");
  return c;
}

result<std::string> choose_listen_address(const std::string& coordinator_ip, const advertise_choice& adv,
                                          const host_probe& host) {
  if (find_by_address(host.interfaces, coordinator_ip)) return coordinator_ip;
  bool chosen =
      adv.source.rfind("--", 0) == 0 || adv.source.rfind("GRACE_", 0) == 0 || adv.source.rfind("GLOO_", 0) == 0;
  if (chosen) return adv.address;
  return invalid_input("the coordinator address " + coordinator_ip +
             " is not an address of this host, and node 0 "
             "hosts the coordination service (this host's addresses: " +
             describe_interfaces(host.interfaces) +
             "); give node 0's address to --coordinator, or --host ADDR to listen on behind a forwarding "
             "service");
}

result<std::string> resolve_ipv4(const std::string& name) {
  if (name.empty()) return invalid_input("empty host name");
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(name.c_str(), nullptr, &hints, &res);
  if (rc != 0 || !res) return invalid_input("cannot resolve host '" + name + "' to an IPv4 address: " + ::gai_strerror(rc));
  char buf[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr, buf, sizeof buf);
  ::freeaddrinfo(res);
  return std::string(buf);
}

namespace {

std::vector<interface_addr> list_interfaces() {
  std::vector<interface_addr> out;
  ifaddrs* ifa = nullptr;
  if (::getifaddrs(&ifa) != 0) return out;
  for (auto* p = ifa; p; p = p->ifa_next) {
    if (!p->ifa_addr || p->ifa_addr->sa_family != AF_INET || !(p->ifa_flags & IFF_UP)) continue;
    char buf[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(p->ifa_addr)->sin_addr, buf, sizeof buf);
    out.push_back({p->ifa_name, buf, (p->ifa_flags & IFF_LOOPBACK) != 0});
  }
  ::freeifaddrs(ifa);
  return out;
}

/// connect() on a UDP socket only asks the routing table; nothing is sent.
result<std::string> kernel_route_source(const std::string& dest) {
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(9);  // any port: no datagram leaves
  if (::inet_pton(AF_INET, dest.c_str(), &to.sin_addr) != 1) return invalid_input("'" + dest + "' is not an IPv4 address");
  fd_guard fd(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (fd.fd < 0) return error{errc::failed, std::string("socket: ") + std::strerror(errno)};
  if (::connect(fd.fd, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0)
    return error{errc::disconnected, std::strerror(errno)};
  sockaddr_in me{};
  socklen_t len = sizeof me;
  if (::getsockname(fd.fd, reinterpret_cast<sockaddr*>(&me), &len) != 0)
    return error{errc::failed, std::string("getsockname: ") + std::strerror(errno)};
  char buf[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &me.sin_addr, buf, sizeof buf);
  return std::string(buf);
}

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

}  // namespace

result<advertise_choice> advertised_address_from_environment(const std::string& coordinator_host) {
  std::string ip;
  if (!coordinator_host.empty()) {
    auto r = resolve_ipv4(coordinator_host);
    if (!r) return error{errc::invalid_input, "coordinator: " + r.err().message};
    ip = *r;
  }
  auto req = address_request_from_environment(ip);
  if (!req) return req.err();
  return choose_advertise_address(*req, probe_host());
}

host_probe probe_host() { return host_probe{list_interfaces(), kernel_route_source}; }

result<address_request> address_request_from_environment(const std::string& coordinator_ip) {
  address_request r;
  r.coordinator_ip = coordinator_ip;
  r.grace_host = env_or_empty("GRACE_HOST");
  r.grace_ifname = env_or_empty("GRACE_SOCKET_IFNAME");
  r.gloo_ifname = env_or_empty("GLOO_SOCKET_IFNAME");
  if (!r.grace_host.empty()) {
    auto ip = resolve_ipv4(r.grace_host);
    if (!ip) return error{errc::invalid_input, "GRACE_HOST: " + ip.err().message};
    r.grace_host = *ip;
  }
  return r;
}

}  // namespace grace
