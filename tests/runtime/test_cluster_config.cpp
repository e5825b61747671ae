#include "runtime/coordination/cluster_config.hpp"
#include "../temp_dir.hpp"

#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <map>

using namespace grace;

TEST_CASE("cluster: --workers with --index", "[cluster]") {
  auto c = cluster_from_workers("10.0.0.1:5000,10.0.0.2:5000,10.0.0.3:5000", 2);
  REQUIRE(c);
  CHECK(c->rank == 2);
  CHECK(c->world_size == 3);
  CHECK(c->coordinator_host == "10.0.0.1");
  CHECK(c->coordinator_port == 5000);
  CHECK_FALSE(c->is_chief());
}

TEST_CASE("cluster: more than one worker and no index is an error", "[cluster]") {
  auto c = cluster_from_workers("a:1,b:2", -1);
  REQUIRE_FALSE(c);
  CHECK(c.err().code == errc::invalid_input);
  CHECK(c.err().message.find("no --index") != std::string::npos);
}

TEST_CASE("cluster: one worker needs no index and runs in local mode", "[cluster]") {
  auto c = cluster_from_workers("localhost:7000", -1);
  REQUIRE(c);
  CHECK(c->rank == 0);
  CHECK(c->local_mode());
}

TEST_CASE("cluster: bad --workers entries are named", "[cluster]") {
  CHECK_FALSE(cluster_from_workers("a:1,,b:2", 0));
  CHECK_FALSE(cluster_from_workers("a:1,b", 0));
  CHECK_FALSE(cluster_from_workers("a:99999", 0));
  CHECK_FALSE(cluster_from_workers("a:0", 0));
  auto r = cluster_from_workers("a:1,b:2", 5);
  REQUIRE_FALSE(r);
  CHECK(r.err().message.find("out of range") != std::string::npos);
}

TEST_CASE("cluster: TF_CONFIG", "[cluster]") {
  auto c = cluster_from_tf_config(
      R"({"cluster": {"worker": ["h0:2222", "h1:2222"]}, "task": {"type": "worker", "index": 1}})");
  REQUIRE(c);
  CHECK(c->rank == 1);
  CHECK(c->world_size == 2);
  CHECK(c->source == "TF_CONFIG");
  auto chief = cluster_from_tf_config(
      R"({"cluster": {"chief": ["c:1"], "worker": ["w:1", "w:2"]}, "task": {"type": "worker", "index": 0}})");
  REQUIRE(chief);
  CHECK(chief->rank == 1);
  CHECK(chief->world_size == 3);
  CHECK_FALSE(cluster_from_tf_config("{not json"));
  CHECK_FALSE(cluster_from_tf_config(R"({"cluster": {"worker": ["a:1", "b:1"]}})"));
  CHECK_FALSE(cluster_from_tf_config(R"({"task": {"index": 0}})"));
}

TEST_CASE("cluster: GRACE_* environment", "[cluster]") {
  ::setenv("GRACE_WORLD_SIZE", "4", 1);
  ::setenv("GRACE_RANK", "3", 1);
  ::setenv("GRACE_COORDINATOR", "127.0.0.1:4567", 1);
  ::setenv("GRACE_RUN_ID", "r1", 1);
  ::setenv("GRACE_INCARNATION", "2", 1);
  auto c = cluster_from_environment();
  REQUIRE(c);
  CHECK(c->rank == 3);
  CHECK(c->world_size == 4);
  CHECK(c->coordinator_port == 4567);
  CHECK(c->incarnation == 2);
  CHECK(c->source == "GRACE_*");
  CHECK(c->group_nodes.empty());
  ::setenv("GRACE_GROUP_NODES", "0,2", 1);  // an elastic job's group
  auto e = cluster_from_environment();
  REQUIRE(e);
  CHECK(e->group_nodes == "0,2");
  ::setenv("GRACE_GROUP_NODES", "0;rm -rf", 1);
  auto bad_nodes = cluster_from_environment();
  REQUIRE_FALSE(bad_nodes);
  CHECK(bad_nodes.err().message.find("GRACE_GROUP_NODES") != std::string::npos);
  ::unsetenv("GRACE_GROUP_NODES");
  ::setenv("GRACE_RANK", "4", 1);
  CHECK_FALSE(cluster_from_environment());
  ::unsetenv("GRACE_RANK");
  auto missing = cluster_from_environment();
  REQUIRE_FALSE(missing);
  CHECK(missing.err().message.find("GRACE_RANK") != std::string::npos);
  for (auto v : {"GRACE_WORLD_SIZE", "GRACE_COORDINATOR", "GRACE_RUN_ID", "GRACE_INCARNATION"}) ::unsetenv(v);
  auto local = cluster_from_environment();
  REQUIRE(local);
  CHECK(local->local_mode());
}

TEST_CASE("cluster: a run id is printable ASCII without blanks, 1 to 256 characters", "[cluster]") {
  CHECK(check_run_id("exp1", "--run-id"));
  CHECK(check_run_id("torchrun-10.0.0.1:29400", "--run-id"));
  CHECK(check_run_id(std::string(256, 'a'), "--run-id"));
  CHECK_FALSE(check_run_id("", "--run-id"));
  CHECK_FALSE(check_run_id(std::string(257, 'a'), "--run-id"));
  CHECK_FALSE(check_run_id("two words", "--run-id"));
  auto st = check_run_id("a\xff" "b", "GRACE_RUN_ID");
  REQUIRE_FALSE(st);
  CHECK(st.err().message == "GRACE_RUN_ID may hold printable ASCII characters only, no blanks (byte 255 found)");
}

TEST_CASE("cluster: GRACE_COORDINATOR_FILE (etcd failover) names the service and wins over GRACE_COORDINATOR",
          "[cluster][takeover]") {
  grace::testing::temp_dir tmp;
  auto file = (tmp.path / "coordinator").string();
  ::setenv("GRACE_WORLD_SIZE", "4", 1);
  ::setenv("GRACE_RANK", "1", 1);
  ::setenv("GRACE_COORDINATOR", "127.0.0.1:4567", 1);
  ::setenv("GRACE_COORDINATOR_FILE", file.c_str(), 1);
  ::setenv("GRACE_FAILOVER_WAIT_MS", "7500", 1);
  auto missing = cluster_from_environment();
  REQUIRE_FALSE(missing);
  CHECK(missing.err().message.find(file) != std::string::npos);
  std::ofstream(file) << "192.0.2.2:29500 17 1\n";
  auto c = cluster_from_environment();
  REQUIRE(c);
  CHECK(c->coordinator_host == "192.0.2.2");
  CHECK(c->coordinator_port == 29500);
  CHECK(c->coordinator_epoch == 17);
  CHECK(c->coordinator_file == file);
  CHECK(c->failover_wait_ms == 7500);
  std::ofstream(file) << "not a location\n";
  auto bad = cluster_from_environment();
  REQUIRE_FALSE(bad);
  CHECK(bad.err().message.find("coordinator location") != std::string::npos);
  CHECK(bad.err().message.find(file) != std::string::npos);
  for (auto v : {"GRACE_WORLD_SIZE", "GRACE_RANK", "GRACE_COORDINATOR", "GRACE_COORDINATOR_FILE", "GRACE_FAILOVER_WAIT_MS"})
    ::unsetenv(v);
}

namespace {
std::map<std::string, std::string> fake_env;
const char* fake_getenv(const char* name) {
  auto it = fake_env.find(name);
  return it == fake_env.end() ? nullptr : it->second.c_str();
}
}  // namespace

TEST_CASE("cluster: --workers across hosts without a secret is refused, naming both ways to give one", "[cluster][token]") {
  fake_env.clear();
  auto c = cluster_from_workers("10.0.0.1:5000,10.0.0.2:5000", 1);
  REQUIRE(c);
  CHECK(c->spans_hosts);
  auto r = resolve_member_secret(*c, {}, fake_getenv);
  REQUIRE_FALSE(r);
  CHECK(r.err().code == errc::invalid_input);
  CHECK(r.err().message.find("GRACE_TOKEN") != std::string::npos);
  CHECK(r.err().message.find("--token-file") != std::string::npos);
  CHECK(r.err().message.find("--insecure") != std::string::npos);

  fake_env["GRACE_INSECURE"] = "1";
  auto insecure = resolve_member_secret(*c, {}, fake_getenv);
  REQUIRE(insecure);
  CHECK(*insecure == secret_mode::insecure);
  CHECK(c->token.empty());
  fake_env.clear();
  CHECK(*resolve_member_secret(*c, {"", true}, fake_getenv) == secret_mode::insecure);
}

TEST_CASE("cluster: a loopback-only --workers job may run without a secret", "[cluster][token]") {
  fake_env.clear();
  auto c = cluster_from_workers("127.0.0.1:5000,localhost:5001", 0);
  REQUIRE(c);
  CHECK_FALSE(c->spans_hosts);
  auto r = resolve_member_secret(*c, {}, fake_getenv);
  REQUIRE(r);
  CHECK(*r == secret_mode::loopback_only);
  CHECK(is_loopback_host("127.3.2.1"));
  CHECK(is_loopback_host("::1"));
  CHECK_FALSE(is_loopback_host("128.0.0.1"));
  CHECK_FALSE(is_loopback_host("node7"));
}

TEST_CASE("cluster: a member's secret comes from GRACE_TOKEN, else the token file, and is checked", "[cluster][token]") {
  fake_env.clear();
  auto tf = cluster_from_tf_config(R"({"cluster": {"worker": ["10.0.0.1:1", "10.0.0.2:1"]}, "task": {"index": 1}})");
  REQUIRE(tf);
  CHECK(tf->spans_hosts);
  fake_env["GRACE_TOKEN"] = "short";
  auto bad = resolve_member_secret(*tf, {}, fake_getenv);
  REQUIRE_FALSE(bad);
  CHECK(bad.err().message.find("GRACE_TOKEN is 5") != std::string::npos);
  fake_env["GRACE_TOKEN"] = "0123456789abcdef0123";
  auto given = resolve_member_secret(*tf, {}, fake_getenv);
  REQUIRE(given);
  CHECK(*given == secret_mode::given);
  CHECK(tf->token == "0123456789abcdef0123");

  fake_env.clear();
  grace::testing::temp_dir dir;
  const auto file = (dir.path / "token").string();
  std::ofstream(file) << "fedcba9876543210fedcba\n";
  ::chmod(file.c_str(), 0644);
  auto open = resolve_member_secret(*tf, {file, false}, fake_getenv);
  REQUIRE_FALSE(open);  // others may read it
  ::chmod(file.c_str(), 0600);
  fake_env["GRACE_TOKEN_FILE"] = file;
  auto from_env_file = resolve_member_secret(*tf, {}, fake_getenv);
  REQUIRE(from_env_file);
  CHECK(tf->token == "fedcba9876543210fedcba");

  cluster_config launched;
  launched.source = "GRACE_*";
  launched.token = "from-the-launcher-0000";
  CHECK(*resolve_member_secret(launched, {}, fake_getenv) == secret_mode::launcher);
  CHECK(launched.token == "from-the-launcher-0000");
}
