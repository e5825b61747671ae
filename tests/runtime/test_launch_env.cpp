#include "runtime/launch/launch_env.hpp"

#include <catch2/catch.hpp>

#include <map>

using namespace grace;

namespace {

struct fake_env {
  std::map<std::string, std::string> vars;
  env_lookup lookup() const {
    return [this](const char* n) -> const char* {
      auto it = vars.find(n);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
  }
};

}  // namespace

TEST_CASE("launch env: nothing set, nothing found", "[launch_env]") {
  fake_env e{{{"WORLD_SIZE", "8"}, {"RANK", "3"}, {"HOME", "/root"}}};
  auto s = launch_settings_from_environment(e.lookup());
  REQUIRE(s);
  CHECK_FALSE(s->nnodes);  // RANK/WORLD_SIZE without MASTER_ADDR are not a torchrun job
  CHECK_FALSE(s->coordinator);
  CHECK_FALSE(s->run_id);
}

TEST_CASE("launch env: a torchrun-style job (PyTorchJob per pod)", "[launch_env]") {
  fake_env e{{{"MASTER_ADDR", "job-master-0"}, {"MASTER_PORT", "23456"}, {"WORLD_SIZE", "4"}, {"RANK", "2"}}};
  auto s = launch_settings_from_environment(e.lookup());
  REQUIRE(s);
  CHECK(s->coordinator->value == "job-master-0:23456");
  CHECK(s->coordinator->from == "MASTER_ADDR:MASTER_PORT");
  CHECK(s->nnodes->value == 4);
  CHECK(s->node_rank->value == 2);
  CHECK(s->node_rank->from == "RANK");
  CHECK(s->run_id->value == "torchrun-job-master-0:23456");
  CHECK(s->nnodes->source == "torchrun");
  CHECK_FALSE(s->nproc);
}

TEST_CASE("launch env: torchrun's own node-level variables win over WORLD_SIZE/RANK", "[launch_env]") {
  fake_env e{{{"PET_MASTER_ADDR", "10.0.0.1"},
              {"PET_MASTER_PORT", "29500"},
              {"PET_NNODES", "2"},
              {"PET_NODE_RANK", "1"},
              {"PET_NPROC_PER_NODE", "8"},
              {"WORLD_SIZE", "16"},
              {"RANK", "9"},
              {"TORCHELASTIC_RUN_ID", "exp7"}}};
  auto s = launch_settings_from_environment(e.lookup());
  REQUIRE(s);
  CHECK(s->nnodes->value == 2);
  CHECK(s->node_rank->value == 1);
  CHECK(s->nproc->value == 8);
  CHECK(s->run_id->value == "exp7");
}

TEST_CASE("launch env: a SLURM allocation", "[launch_env]") {
  fake_env e{
      {{"SLURM_JOB_ID", "4711"}, {"SLURM_NNODES", "3"}, {"SLURM_NODEID", "2"}, {"SLURM_JOB_NODELIST", "gpu[07-09]"}}};
  auto s = launch_settings_from_environment(e.lookup());
  REQUIRE(s);
  CHECK(s->run_id->value == "slurm-4711");
  CHECK(s->nnodes->value == 3);
  CHECK(s->node_rank->value == 2);
  CHECK(s->coordinator->value == "gpu07:30111");  // 29400 + 4711 % 1000
  CHECK(s->coordinator->source == "SLURM");
  e.vars["GRACE_COORDINATOR_PORT"] = "6000";
  CHECK(launch_settings_from_environment(e.lookup())->coordinator->value == "gpu07:6000");
}

TEST_CASE("launch env: torchrun's variables before SLURM's, field by field", "[launch_env]") {
  fake_env e{{{"SLURM_JOB_ID", "12"},
              {"SLURM_NNODES", "2"},
              {"SLURM_NODEID", "1"},
              {"SLURM_JOB_NODELIST", "a,b"},
              {"MASTER_ADDR", "a"},
              {"MASTER_PORT", "7000"}}};
  auto s = launch_settings_from_environment(e.lookup());
  REQUIRE(s);
  CHECK(s->coordinator->value == "a:7000");
  CHECK(s->coordinator->source == "torchrun");
  CHECK(s->node_rank->value == 1);
  CHECK(s->node_rank->source == "SLURM");
  CHECK(describe_sources({s->coordinator->source, s->node_rank->source}) == "torchrun + SLURM");
  CHECK(describe_sources({"SLURM"}) == "SLURM");
  CHECK(describe_sources({}).empty());
}

TEST_CASE("launch env: malformed variables are named", "[launch_env]") {
  fake_env e{{{"SLURM_JOB_ID", "12"}, {"SLURM_NODEID", "one"}}};
  auto s = launch_settings_from_environment(e.lookup());
  REQUIRE_FALSE(s);
  CHECK(s.err().message == "SLURM_NODEID='one' is not a non-negative integer");
  fake_env m{{{"MASTER_ADDR", "x"}}};
  auto t = launch_settings_from_environment(m.lookup());
  REQUIRE_FALSE(t);
  CHECK(t.err().message.find("MASTER_PORT is not") != std::string::npos);
  fake_env l{{{"SLURM_JOB_ID", "12"}, {"SLURM_JOB_NODELIST", "n[1-"}}};
  auto u = launch_settings_from_environment(l.lookup());
  REQUIRE_FALSE(u);
  CHECK(u.err().message.find("SLURM_JOB_NODELIST") != std::string::npos);
}

TEST_CASE("launch env: first host of a SLURM host list", "[launch_env]") {
  CHECK(*first_host_of_nodelist("vm") == "vm");
  CHECK(*first_host_of_nodelist("a,b,c") == "a");
  CHECK(*first_host_of_nodelist("node[03-05,9],gpu1") == "node03");
  CHECK(*first_host_of_nodelist("node[7,3]") == "node7");
  CHECK(*first_host_of_nodelist("rack[1-2]-n[4-5]") == "rack1-n4");
  CHECK_FALSE(first_host_of_nodelist(""));
  CHECK_FALSE(first_host_of_nodelist("n[x-y]"));
  CHECK_FALSE(first_host_of_nodelist("n]"));
}
