#include "runtime/net/net_address.hpp"

#include <catch2/catch.hpp>

#include <map>

using namespace grace;

namespace {

/// A host with loopback, a cluster-facing interface and a second one, and
/// a routing table given as destination -> source (missing: unreachable).
host_probe two_nics(std::map<std::string, std::string> routes = {
                        {"192.0.2.1", "192.0.2.2"}, {"127.0.0.1", "127.0.0.1"}, {"198.51.100.7", "198.51.100.2"}}) {
  host_probe h;
  h.interfaces = {{"lo", "127.0.0.1", true}, {"eth0", "192.0.2.2", false}, {"eth1", "198.51.100.2", false}};
  h.route_source = [routes](const std::string& dest) -> result<std::string> {
    auto it = routes.find(dest);
    if (it == routes.end()) return error{errc::disconnected, "Network is unreachable"};
    return it->second;
  };
  return h;
}

address_request to(const std::string& coordinator) {
  address_request r;
  r.coordinator_ip = coordinator;
  return r;
}

}  // namespace

TEST_CASE("address: by default the interface that routes to the coordinator", "[net]") {
  auto c = choose_advertise_address(to("192.0.2.1"), two_nics());
  REQUIRE(c);
  CHECK(c->address == "192.0.2.2");
  CHECK(c->iface == "eth0");
  CHECK(c->source == "route to the coordinator 192.0.2.1");
  // Several interfaces: the one facing this coordinator, not the first.
  auto d = choose_advertise_address(to("198.51.100.7"), two_nics());
  REQUIRE(d);
  CHECK(d->address == "198.51.100.2");
  CHECK(d->iface == "eth1");
}

TEST_CASE("address: a single host advertises loopback", "[net]") {
  auto c = choose_advertise_address(to("127.0.0.1"), two_nics());
  REQUIRE(c);
  CHECK(c->address == "127.0.0.1");
  // A host name that /etc/hosts maps to 127.0.1.1 (Debian's default).
  auto debian = two_nics({{"127.0.1.1", "127.0.0.1"}});
  auto d = choose_advertise_address(to("127.0.1.1"), debian);
  REQUIRE(d);
  CHECK(d->address == "127.0.0.1");
  CHECK(*choose_listen_address("127.0.1.1", *d, debian) == "127.0.1.1");
  auto none = choose_advertise_address(to(""), two_nics());
  REQUIRE(none);
  CHECK(none->address == "127.0.0.1");
}

TEST_CASE("address: explicit choices win, strongest first", "[net]") {
  auto r = to("192.0.2.1");
  r.gloo_ifname = "eth1,eth0";
  CHECK(choose_advertise_address(r, two_nics())->source == "GLOO_SOCKET_IFNAME=eth1");
  r.grace_ifname = "eth0";
  CHECK(choose_advertise_address(r, two_nics())->address == "192.0.2.2");
  r.grace_host = "198.51.100.2";
  CHECK(choose_advertise_address(r, two_nics())->source == "GRACE_HOST");
  r.iface_flag = "eth0";
  CHECK(choose_advertise_address(r, two_nics())->address == "192.0.2.2");
  r.host_flag = "192.0.2.2";
  auto c = choose_advertise_address(r, two_nics());
  REQUIRE(c);
  CHECK(c->source == "--host");
  CHECK(c->iface == "eth0");
}

TEST_CASE("address: bad choices are one-line errors naming the value", "[net]") {
  auto r = to("192.0.2.1");
  r.host_flag = "10.9.9.9";
  auto a = choose_advertise_address(r, two_nics());
  REQUIRE_FALSE(a);
  CHECK(a.err().code == errc::invalid_input);
  CHECK(a.err().message.find("--host 10.9.9.9 is not an address of this host") != std::string::npos);
  CHECK(a.err().message.find("eth0 192.0.2.2") != std::string::npos);

  r = to("192.0.2.1");
  r.grace_ifname = "ib0";
  auto b = choose_advertise_address(r, two_nics());
  REQUIRE_FALSE(b);
  CHECK(b.err().message.find("GRACE_SOCKET_IFNAME=ib0") != std::string::npos);

  r = to("192.0.2.1");
  r.host_flag = "192.0.2.2";
  r.iface_flag = "eth1";
  auto c = choose_advertise_address(r, two_nics());
  REQUIRE_FALSE(c);
  CHECK(c.err().message.find("not on --iface eth1") != std::string::npos);
}

TEST_CASE("address: loopback advertised to a remote coordinator is refused", "[net]") {
  auto r = to("192.0.2.1");
  r.iface_flag = "lo";
  auto c = choose_advertise_address(r, two_nics());
  REQUIRE_FALSE(c);
  CHECK(c.err().message.find("loopback address 127.0.0.1") != std::string::npos);
  CHECK(c.err().message.find("coordinator 192.0.2.1") != std::string::npos);
  // A routing table that sends the coordinator's address through loopback
  // (a misconfigured /etc/hosts) is caught the same way.
  auto bad_route = two_nics({{"192.0.2.1", "127.0.0.1"}});
  auto d = choose_advertise_address(to("192.0.2.1"), bad_route);
  REQUIRE_FALSE(d);
  CHECK(d.err().message.find("route to the coordinator 192.0.2.1 gives the loopback") != std::string::npos);
}

TEST_CASE("address: an unreachable coordinator is named", "[net]") {
  auto c = choose_advertise_address(to("203.0.113.5"), two_nics());
  REQUIRE_FALSE(c);
  CHECK(c.err().code == errc::invalid_input);
  CHECK(c.err().message.find("no route from this host to the coordinator 203.0.113.5") != std::string::npos);
  CHECK(c.err().message.find("Network is unreachable") != std::string::npos);
}

TEST_CASE("address: node 0 listens on the coordinator address when it is its own", "[net]") {
  auto h = two_nics();
  auto adv = *choose_advertise_address(to("192.0.2.1"), h);
  CHECK(*choose_listen_address("192.0.2.2", adv, h) == "192.0.2.2");
  // A forwarding address (e.g. a Service) only with an explicit --host.
  auto l = choose_listen_address("203.0.113.5", adv, h);
  REQUIRE_FALSE(l);
  CHECK(l.err().message.find("203.0.113.5 is not an address of this host") != std::string::npos);
  auto r = to("203.0.113.5");
  r.host_flag = "192.0.2.2";
  auto forwarded = choose_listen_address("203.0.113.5", *choose_advertise_address(r, h), h);
  REQUIRE(forwarded);
  CHECK(*forwarded == "192.0.2.2");
}

TEST_CASE("address: the real host resolves names and routes loopback", "[net]") {
  auto ip = resolve_ipv4("localhost");
  REQUIRE(ip);
  CHECK(ip->rfind("127.", 0) == 0);
  CHECK(*resolve_ipv4("192.0.2.9") == "192.0.2.9");
  auto bad = resolve_ipv4("no-such-host.invalid");
  REQUIRE_FALSE(bad);
  CHECK(bad.err().message.find("no-such-host.invalid") != std::string::npos);
  auto h = probe_host();
  auto c = choose_advertise_address(to("127.0.0.1"), h);
  REQUIRE(c);
  CHECK(c->address == "127.0.0.1");
  CHECK(c->iface == "lo");
}
