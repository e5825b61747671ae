// grace-launch: the launcher and coordination service.
#include "actors/signal_watcher.hpp"
#include "runtime/exit_codes.hpp"
#include "runtime/launcher.hpp"

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

int main(int argc, char** argv) {
  grace::block_termination_signals();
  CLI::App app{"grace-launch: start N workers with a coordination service; restart them on the "
               "restart code; forward SIGTERM/SIGINT as a preemption notice.\n"
               "  grace-launch --nproc 4 -- grace-train --steps 1000"};
  grace::launch_options o;
  int grace_ms = 0, exit_timeout_ms = 15000, dead_ms = 3000, hang_ms = 0;
  app.add_option("--nproc", o.nproc, "workers on this node")->check(CLI::Range(1, 4096));
  app.add_option("--nnodes", o.nnodes, "nodes in the job")->check(CLI::Range(1, 4096));
  app.add_option("--node-rank", o.node_rank, "this node's index (0 hosts the coordinator)");
  app.add_option("--coordinator", o.coordinator, "host:port of the coordination service, a name or an "
                                                 "address (default 127.0.0.1 and a free port)");
  app.add_option("--max-restarts", o.max_restarts, "group restarts before giving up")->check(CLI::Range(0, 1000000));
  app.add_option("--restart-code", o.restart_code, "worker exit code that means 'restart me'");
  app.add_option("--run-id", o.run_id, "job id (same on every node)");
  app.add_option("--checkpoint-dir", o.checkpoint_dir, "exported as GRACE_CHECKPOINT_DIR; the reason "
                                                       "file grace-exit.json is written there");
  app.add_option("--grace-period-ms", grace_ms, "grace period carried by a forwarded notice")->check(CLI::NonNegativeNumber);
  app.add_option("--exit-timeout-ms", exit_timeout_ms, "wait this long for the rest of the group to exit");
  app.add_option("--dead-after-ms", dead_ms, "declare a silent worker dead after this long");
  app.add_option("--hang-timeout-ms", hang_ms, "declare a worker hung (and treat it as dead) when its "
                                               "completed step does not move for this long (0: off)");
  app.add_option("--host", o.host, "the address this node advertises to its peers (default: GRACE_HOST, "
                                   "GRACE_SOCKET_IFNAME, GLOO_SOCKET_IFNAME, else the interface that "
                                   "routes to the coordinator)");
  app.add_option("--iface", o.iface, "advertise the IPv4 address of this interface");
  app.add_option("--max-rendezvous-failures", o.max_rendezvous_failures,
                 "groups in a row that fail to rendezvous before giving up with exit 44 (0: never)")
      ->check(CLI::Range(0, 1000000));
  app.add_flag("--quiet", o.quiet, "no progress lines");
  app.add_option("command", o.command, "the worker program and its arguments (after --)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : grace::exit_code::usage;
  }
  o.grace_period = std::chrono::milliseconds(grace_ms);
  o.exit_timeout = std::chrono::milliseconds(exit_timeout_ms);
  o.dead_after = std::chrono::milliseconds(dead_ms);
  o.hang_after = std::chrono::milliseconds(hang_ms);
  spdlog::set_pattern("[%H:%M:%S.%e] [launch] %v");
  return grace::run_launcher(o);
}
