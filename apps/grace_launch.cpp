// grace-launch: the launcher and coordination service.
#include "actors/signal_watcher.hpp"
#include "runtime/coordination/elastic.hpp"
#include "runtime/base/exit_codes.hpp"
#include "runtime/launch/launch_env.hpp"
#include "actors/launcher.hpp"

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <cstdlib>

namespace {

/// Fills the settings whose flags were not given from a torchrun-style or
/// SLURM environment (runtime/launch/launch_env.hpp) and says which it used.
/// False (after a one-line error) when a variable is malformed.
bool apply_scheduler_environment(const CLI::App& app, grace::launch_options& o) {
  auto s = grace::launch_settings_from_environment([](const char* n) -> const char* { return std::getenv(n); });
  if (!s) {
    spdlog::error("grace-launch: {}", s.err().message);
    return false;
  }
  std::vector<std::string> used;
  std::string what;
  auto note = [&](const std::string& name, const std::string& value, const auto& found) {
    used.push_back(found.source);
    what += (what.empty() ? "" : ", ") + name + " " + value + " (" + found.from + ")";
  };
  auto take_int = [&](const char* flag, int& field, const auto& found, const char* name) {
    if (!found || app.count(flag)) return;
    field = found->value;
    note(name, std::to_string(field), *found);
  };
  auto take_str = [&](const char* flag, std::string& field, const auto& found, const char* name) {
    if (!found || app.count(flag)) return;
    field = found->value;
    note(name, field, *found);
  };
  take_int("--nnodes", o.nnodes, s->nnodes, "nodes");
  take_int("--node-rank", o.node_rank, s->node_rank, "node rank");
  take_int("--nproc", o.nproc, s->nproc, "workers per node");
  take_str("--coordinator", o.coordinator, s->coordinator, "coordinator");
  take_str("--run-id", o.run_id, s->run_id, "run id");
  if (!what.empty() && !o.quiet)
    std::fprintf(stderr, "[grace-launch] from the %s environment: %s\n", grace::describe_sources(used).c_str(),
                 what.c_str());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  grace::block_termination_signals();
  CLI::App app{
      "grace-launch: start N workers with a coordination service; restart them on the "
      "restart code; forward SIGTERM/SIGINT as a preemption notice.\n"
      "  grace-launch --nproc 4 -- grace-train --steps 1000"};
  grace::launch_options o;
  int grace_ms = 0, exit_timeout_ms = 15000, dead_ms = 3000, hang_ms = 0, coord_wait_ms = 30000;
  app.add_option("--nproc", o.nproc, "workers on this node")->check(CLI::Range(1, 4096));
  std::string nnodes;
  app.add_option("--nnodes", nnodes,
                 "nodes in the job, or MIN:MAX for an elastic job (each group has MIN to MAX nodes: it trains on "
                 "without a node lost for good and grows when one comes back; docs/DEPLOY.md)");
  int elastic_wait_ms = 30000, join_timeout_ms = 600000;
  app.add_option("--elastic-wait-ms", elastic_wait_ms,
                 "elastic: how long a group waits for a node that is missing (of the previous group, or at the "
                 "start) before it forms without it")
      ->check(CLI::Range(0, 86400000));
  app.add_option("--join-timeout-ms", join_timeout_ms,
                 "elastic: how long this launcher waits for a group that has its node before it stops with 44")
      ->check(CLI::Range(1, 86400000));
  app.add_option("--node-rank", o.node_rank, "this node's index (0 hosts the coordinator)");
  app.add_option("--coordinator", o.coordinator,
                 "host:port of the coordination service, a name or an "
                 "address (default 127.0.0.1 and a free port)");
  app.add_option("--max-restarts", o.max_restarts, "group restarts before giving up")->check(CLI::Range(0, 1000000));
  app.add_option("--restart-code", o.restart_code, "worker exit code that means 'restart me'");
  app.add_option("--run-id", o.run_id, "job id (same on every node)");
  app.add_option("--token-file", o.token_file,
                 "the job's secret, the same file content on every node (mode 600; default: GRACE_TOKEN, or "
                 "a random secret on one node)");
  app.add_option("--checkpoint-key-file", o.checkpoint_key_file,
                 "sign every checkpoint with this long-lived key (mode 600, at least 32 characters, e.g. "
                 "`openssl rand -hex 32`) and restore only steps it signed");
  app.add_option("--checkpoint-signing", o.checkpoint_signing,
                 "auto: sign with --checkpoint-key-file, else with a key derived from the job's secret when one "
                 "was given (--token-file, GRACE_TOKEN), else unsigned; job: with the job's secret even when it is "
                 "random (restorable within this run only); off: unsigned, nothing checked")
      ->check(CLI::IsMember({"auto", "job", "off"}));
  app.add_option("--tls-cert", o.tls.cert,
                 "PEM certificate (chain) this node presents; with --tls-key and --tls-ca every connection to the "
                 "coordination service is mutual TLS (default: GRACE_TLS_CERT)");
  app.add_option("--tls-key", o.tls.key, "PEM private key of --tls-cert, unencrypted, mode 600 (default: GRACE_TLS_KEY)");
  app.add_option("--tls-ca", o.tls.ca, "PEM CA certificate every peer must be signed by (default: GRACE_TLS_CA)");
  app.add_option("--checkpoint-dir", o.checkpoint_dir,
                 "exported as GRACE_CHECKPOINT_DIR; the reason "
                 "file grace-exit.json is written there");
  app.add_flag("--node-local-checkpoints", o.node_local_checkpoints,
               "every node's --checkpoint-dir is its own disk: sharded state is committed on every node (each "
               "holding its ranks' parts) and brought level between nodes before a group starts");
  app.add_option("--memory-dir", o.memory_dir,
                 "with --node-local-checkpoints: where replica holders mirror their sources' parts on a memory file "
                 "system that outlives the workers, so a host lost with its disk can be restored from memory "
                 "(default /dev/shm/grace-RUN_ID-nodeN; 'off': none)");
  app.add_option("--grace-period-ms", grace_ms, "grace period carried by a forwarded notice")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--exit-timeout-ms", exit_timeout_ms, "wait this long for the rest of the group to exit");
  app.add_option("--dead-after-ms", dead_ms, "declare a silent worker dead after this long");
  app.add_option("--coordinator-wait-ms", coord_wait_ms,
                 "node > 0: after a group ended, how long the coordination service (node 0) may stay "
                 "unreachable before this launcher stops with the restart code")
      ->check(CLI::PositiveNumber);
  app.add_option("--hang-timeout-ms", hang_ms,
                 "declare a worker hung (and treat it as dead) when its "
                 "completed step does not move for this long (0: off)");
  app.add_option("--host", o.host,
                 "the address this node advertises to its peers (default: GRACE_HOST, "
                 "GRACE_SOCKET_IFNAME, GLOO_SOCKET_IFNAME, else the interface that "
                 "routes to the coordinator)");
  app.add_option("--iface", o.iface, "advertise the IPv4 address of this interface");
  app.add_option("--max-rendezvous-failures", o.max_rendezvous_failures,
                 "groups in a row that fail to rendezvous before giving up with exit 44 (0: never)")
      ->check(CLI::Range(0, 1000000));
  app.add_option("--metrics-port", o.metrics_port,
                 "serve Prometheus metrics (steps, saves, restarts, goodput...) on this port (0: off)")
      ->check(CLI::Range(0, 65535));
  app.add_option("--metrics-host", o.metrics_host,
                 "the address the metrics are served on (default 127.0.0.1; 0.0.0.0 for every interface)");
  int linger_ms = 0;
  app.add_option("--metrics-linger-ms", linger_ms,
                 "after the job ends, serve the final metrics this long before exiting (a last scrape)")
      ->check(CLI::Range(0, 3600000));
  int standby_delay_ms = 3000, standby_wait_ms = 30000;
  app.add_flag("--standby", o.standby,
               "warm spares: while a group trains, start the next incarnation's processes up to their first call "
               "into Grace (import grace, grace::session), so a restart skips the program's start; the program "
               "must not do work or read its per-incarnation environment before that call");
  app.add_option("--standby-delay-ms", standby_delay_ms, "start the spares this long after a group started")
      ->check(CLI::Range(0, 86400000));
  app.add_option("--standby-wait-ms", standby_wait_ms,
                 "at a restart, wait this long for a spare still starting before starting its worker from scratch")
      ->check(CLI::Range(0, 3600000));
  std::string recovery = "restart";
  int replace_timeout_ms = 10000;
  app.add_option("--recovery", recovery,
                 "what a lost worker costs: 'in-place' replaces it (a ready spare, else a new process) while the "
                 "others train on and hand it their state from memory (trainers that re-form their collectives, "
                 "replicated state, one node); 'restart' (default) stops the group, saves and restarts it")
      ->check(CLI::IsMember({"in-place", "restart"}));
  app.add_option("--replace-timeout-ms", replace_timeout_ms,
                 "with --recovery in-place: a replacement not joined this long after the loss ends the recovery in "
                 "a just-in-time save and a restart")
      ->check(CLI::Range(100, 3600000));
  int takeover_ms = 1500;
  app.add_option("--etcd", o.etcd,
                 "etcd endpoints (http://ADDRESS:PORT,...; default GRACE_ETCD_ENDPOINTS): the launchers elect which "
                 "one hosts the coordination service, and when its host is lost another takes the group over "
                 "(docs/DEPLOY.md); --coordinator is then not needed");
  app.add_option("--etcd-ttl", o.etcd_ttl_seconds,
                 "seconds etcd keeps the leader's lease after its last renewal: how soon a lost leader is replaced")
      ->check(CLI::Range(1, 60));
  app.add_option("--coordinator-port", o.coordinator_port,
                 "with --etcd: the port the elected launcher hosts the coordination service on")
      ->check(CLI::Range(1, 65535));
  app.add_option("--takeover-window-ms", takeover_ms,
                 "with --etcd: how long a newly elected coordination service waits for the survivors to rejoin")
      ->check(CLI::Range(100, 600000));
  bool ignore_env = false;
  app.add_flag("--no-scheduler-env", ignore_env,
               "do not read torchrun (MASTER_ADDR, ...) or SLURM (SLURM_JOB_ID, "
               "...) variables for the flags not given");
  app.add_flag("--quiet", o.quiet, "no progress lines");
  app.add_option("command", o.command, "the worker program and its arguments (after --)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : grace::exit_code::usage;
  }
  if (!nnodes.empty()) {
    auto range = grace::parse_node_range(nnodes);
    if (!range) {
      spdlog::error("grace-launch: {}", range.err().message);
      return grace::exit_code::usage;
    }
    o.min_nodes = range->min;
    o.nnodes = range->max;
  }
  o.elastic_wait = std::chrono::milliseconds(elastic_wait_ms);
  o.join_timeout = std::chrono::milliseconds(join_timeout_ms);
  if (!ignore_env && !apply_scheduler_environment(app, o)) return grace::exit_code::usage;
  o.grace_period = std::chrono::milliseconds(grace_ms);
  o.exit_timeout = std::chrono::milliseconds(exit_timeout_ms);
  o.coordinator_wait = std::chrono::milliseconds(coord_wait_ms);
  o.dead_after = std::chrono::milliseconds(dead_ms);
  o.hang_after = std::chrono::milliseconds(hang_ms);
  o.metrics_linger = std::chrono::milliseconds(linger_ms);
  o.standby_delay = std::chrono::milliseconds(standby_delay_ms);
  o.in_place = recovery == "in-place";
  o.replace_timeout = std::chrono::milliseconds(replace_timeout_ms);
  o.standby_ready_wait = std::chrono::milliseconds(standby_wait_ms);
  o.takeover_window = std::chrono::milliseconds(takeover_ms);
  if (o.etcd.empty())
    if (const char* e = std::getenv("GRACE_ETCD_ENDPOINTS")) o.etcd = e;
  spdlog::set_pattern("[%H:%M:%S.%e] [launch] %v");
  return grace::run_launcher(o);
}
