// grace-chaos: the failure harness. Plays the cluster scheduler around
// grace-launch + a trainer, injects faults from a schedule (scripted or
// random from a seed), and proves the invariants of docs/RELIABILITY.md.
#include "apps/chaos/invariants.hpp"
#include "apps/chaos/job_support.hpp"
#include "runtime/base/atomic_file.hpp"
#include "runtime/base/error.hpp"
#include "runtime/ops/goodput.hpp"
#include "apps/chaos/report.hpp"
#include "apps/chaos/runner.hpp"
#include "apps/chaos/schedule.hpp"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

namespace fs = std::filesystem;
using namespace grace::chaos;
using grace::describe;
using grace::goodput_account;
using grace::read_goodput;

namespace {

constexpr int exit_pass = 0, exit_fail = 1, exit_usage = 2, exit_harness = 4;

/// `name` as execvp would find it: itself when it has a '/', else the first
/// executable of that name on PATH (unchanged when there is none).
std::string on_path(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/bin:/bin";
  for (size_t p = 0; p <= dirs.size();) {
    auto q = dirs.find(':', p);
    auto dir = dirs.substr(p, q == std::string::npos ? std::string::npos : q - p);
    auto candidate = (dir.empty() ? fs::path(".") : fs::path(dir)) / name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate.string();
    if (q == std::string::npos) break;
    p = q + 1;
  }
  return name;
}

std::string sibling(const char* env, const std::string& name) {
  if (const char* e = std::getenv(env); e && *e) return e;
  std::error_code ec;
  auto self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec && fs::exists(self.parent_path() / name)) return (self.parent_path() / name).string();
  return name;
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

/// A cached result of a run keyed by `key` (everything that determines its
/// weights): the file it lives in under `dir`, named by the key's hash.
fs::path cache_file(const fs::path& dir, const std::string& prefix, const nlohmann::json& key) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", (unsigned long long)fnv1a(key.dump()));
  std::error_code ec;
  fs::create_directories(dir, ec);
  return dir / (prefix + hex + ".json");
}

/// The cached record for `key` in `file`, if it is there and is for it.
std::optional<nlohmann::json> read_cached(const fs::path& file, const nlohmann::json& key) {
  std::ifstream f(file);
  if (!f) return std::nullopt;
  try {
    nlohmann::json j;
    f >> j;
    if (j.value("key", nlohmann::json()) == key && j.contains("weights_checksum")) return j;
  } catch (...) {}
  return std::nullopt;
}

/// Holds the cache entry `file` for this process: runs that share a cache
/// (tests side by side) compute a missing reference once, not at the same
/// time in the same run directory.
class cache_lock {
public:
  explicit cache_lock(const fs::path& file) : fd_(::open((file.string() + ".lock").c_str(), O_RDWR | O_CREAT, 0644)) {
    if (fd_ >= 0)
      while (::flock(fd_, LOCK_EX) != 0 && errno == EINTR) {}
  }
  ~cache_lock() {
    if (fd_ >= 0) ::close(fd_);  // releases the lock
  }
  cache_lock(const cache_lock&) = delete;
  cache_lock& operator=(const cache_lock&) = delete;

private:
  int fd_;
};

/// Writes a cache record whole or not at all (a reader never sees half).
void write_cached(const fs::path& file, const nlohmann::json& record) { (void)grace::write_json_atomically(file, record); }

struct reference {
  std::optional<std::string> checksum;
  double step_ns = 0;
  std::string note;
  bool wanted = true;  ///< false with --no-reference
};

/// Everything about the trainer and its configuration that determines the
/// final weights, but the number of workers: the key of a cached reference.
nlohmann::json trainer_key(const run_config& base) {
  std::error_code ec;
  struct stat st {};
  ::stat(base.trainer.c_str(), &st);
  nlohmann::json key = {{"steps", base.steps},
                        {"save_every", base.save_every},
                        {"trainer_args", base.trainer_args},
                        {"trainer", fs::absolute(base.trainer, ec).string()},
                        {"trainer_size", st.st_size},
                        {"trainer_mtime", st.st_mtime},
                        {"device", base.device}};
  // A script after an interpreter determines the weights as much as a binary.
  for (auto& a : base.trainer_prefix) {
    struct stat ps {};
    if (::stat(a.c_str(), &ps) == 0 && S_ISREG(ps.st_mode))
      key["trainer_prefix"].push_back({a, ps.st_size, ps.st_mtime});
    else
      key["trainer_prefix"].push_back(a);
  }
  return key;
}

/// The uninterrupted run for this configuration, cached by a key over
/// everything that determines the final weights.
reference get_reference(const run_config& base, const fs::path& cache_dir) {
  reference ref;
  std::error_code ec;
  auto key = trainer_key(base);
  key["workers"] = base.total_workers();
  const auto file = cache_file(cache_dir, "reference-", key);
  cache_lock lock(file);
  if (auto j = read_cached(file, key)) {
    ref.checksum = (*j)["weights_checksum"].get<std::string>();
    ref.step_ns = j->value("step_ns", 0.0);
    ref.note = "cached " + file.string();
    return ref;
  }
  run_config rc = base;
  rc.mutant_args.clear();  // the reference is the correct trainer's run
  // The same world on one host: the weights depend on the world size, not
  // on where the ranks run.
  rc.workers = base.total_workers();
  rc.hosts = 0;
  rc.dir = file.parent_path() / (file.stem().string() + "-run");
  std::fprintf(stderr, "grace-chaos: running the uninterrupted reference (cached as %s)\n", file.c_str());
  auto res = run_job(rc, {});
  bool ok = !res.launches.empty() && res.launches.back().exit_code == 0 && res.out.contains("weights_checksum");
  fs::remove_all(rc.dir, ec);
  if (!ok) {
    ref.note = "the uninterrupted reference run failed (launcher exit " +
               std::to_string(res.launches.empty() ? -1 : res.launches.back().exit_code) + ")";
    return ref;
  }
  ref.checksum = res.out["weights_checksum"].get<std::string>();
  ref.step_ns = res.step_ns;
  write_cached(file, {{"key", key}, {"weights_checksum", *ref.checksum}, {"step_ns", ref.step_ns}, {"out", res.out}});
  ref.note = "fresh run, cached " + file.string();
  return ref;
}

/// An elastic run's reference: the same trainer, one phase per size the
/// run trained at (size_phases), each resuming the previous phase's final
/// checkpoint; cached by the phases.
reference elastic_reference(const run_config& base, const run_result& res, const fs::path& cache_dir) {
  reference ref;
  const auto phases = size_phases(res.events, base.steps);
  if (phases.empty()) {
    ref.note = "no group formed: no elastic reference";
    return ref;
  }
  auto key = trainer_key(base);
  std::string sizes;
  for (auto& p : phases) {
    key["phases"].push_back({p.workers, p.from, p.to});
    sizes += (sizes.empty() ? "" : ", ") + std::to_string(p.workers) + " workers to step " + std::to_string(p.to);
  }
  const auto file = cache_file(cache_dir, "elastic-", key);
  cache_lock lock(file);
  if (auto j = read_cached(file, key)) {
    ref.checksum = (*j)["weights_checksum"].get<std::string>();
    ref.note = "the same size changes without a fault (" + sizes + "), cached " + file.string();
    return ref;
  }
  std::error_code ec;
  const auto dir = file.parent_path() / (file.stem().string() + "-run");
  fs::remove_all(dir, ec);
  fs::create_directories(dir, ec);
  std::fprintf(stderr, "grace-chaos: running the reference with the run's size changes (%s)\n", sizes.c_str());
  for (auto& p : phases) {
    run_config rc = base;
    rc.steps = static_cast<uint64_t>(p.to);
    rc.step_delay_ms = 0;  // the weights do not depend on it
    std::vector<std::string> a = {base.launcher, "--nproc", std::to_string(p.workers), "--max-restarts", "0",
                                  "--checkpoint-dir", (dir / "ckpt").string(), "--quiet", "--"};
    for (auto& x : trainer_argv(rc, dir / "out.json")) a.push_back(x);
    a.insert(a.end(), base.trainer_args.begin(), base.trainer_args.end());
    const pid_t pid = spawn(a, dir / "log.txt", {}, false);
    int st = 0;
    while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      ref.note = "the elastic reference failed at " + std::to_string(p.workers) + " workers to step " +
                 std::to_string(p.to) + " (see " + (dir / "log.txt").string() + ")";
      return ref;
    }
  }
  try {
    nlohmann::json out;
    std::ifstream(dir / "out.json") >> out;
    ref.checksum = out.at("weights_checksum").get<std::string>();
  } catch (const std::exception& e) {
    ref.note = std::string("the elastic reference wrote no usable out.json: ") + e.what();
    return ref;
  }
  write_cached(file, {{"key", key}, {"weights_checksum", *ref.checksum}});
  fs::remove_all(dir, ec);
  ref.note = "the same size changes without a fault (" + sizes + "), cached " + file.string();
  return ref;
}

struct one_result {
  bool passed = false;
  int injected = 0;
  std::vector<std::string> failures;
  std::optional<goodput_account> goodput;  ///< what grace-launch persisted for the job
};

one_result run_one(const run_config& base, const std::vector<fault>& schedule, const fs::path& out_dir,
                   const reference& uninterrupted, const nlohmann::json& origin, bool print_table,
                   const fs::path& cache_dir) {
  run_config cfg = base;
  cfg.dir = out_dir / "run";
  if (uninterrupted.step_ns > 0) cfg.step_ns_hint = uninterrupted.step_ns;
  auto res = run_job(cfg, schedule);
  // An elastic job is held to a reference that changed size where it did.
  reference ref = uninterrupted;
  if (cfg.elastic_min > 0 && uninterrupted.wanted) ref = elastic_reference(cfg, res, cache_dir);
  one_result r;
  check_input in;
  in.cfg = &cfg;
  in.res = &res;
  in.reference_checksum = ref.checksum;
  in.reference_note = ref.note;
  in.reference_wanted = ref.wanted;
  auto chk = check_invariants(in);
  nlohmann::json extra = origin;
  extra["schedule"] = schedule_to_json(schedule);
  extra["reference"] = {{"weights_checksum", ref.checksum ? nlohmann::json(*ref.checksum) : nlohmann::json()},
                        {"note", ref.note}};
  // A tmpfs checkpoint directory (fs_full) is copied to ckpt-final and unmounted.
  r.goodput = read_goodput(cfg.dir / "ckpt");
  if (!r.goodput) r.goodput = read_goodput(cfg.dir / "ckpt-final");
  // --node-local: grace-launch keeps the account on host 0's disk, which
  // a host_lost of host 0 replaces (then it covers only what came after).
  const bool host0_replaced = std::any_of(res.faults.begin(), res.faults.end(), [](const fault_record& f) {
    return f.status == "injected" && f.f.kind == fault_kind::host_lost && f.f.host == 0;
  });
  if (!r.goodput && !host0_replaced) r.goodput = read_goodput(cfg.dir / "h0" / "ckpt");
  if (cfg.node_local && host0_replaced)
    res.notes.push_back("goodput not reported: host 0's node-local disk, which holds the account, was replaced");
  if (r.goodput) extra["goodput"] = r.goodput->to_json();
  auto report = make_report(cfg, res, chk, extra);
  auto note = draw_timeline(out_dir, cfg, res);
  report["timeline"] = note;
  std::ofstream(out_dir / "report.json") << report.dump(2) << "\n";
  r.passed = chk.passed();
  for (auto& f : res.faults) r.injected += f.status == "injected";
  for (auto& v : chk.verdicts)
    if (v.status == verdict_status::fail) r.failures.push_back(v.name + ": " + v.detail);
  if (print_table) {
    std::cout << render_table(res, chk);
    for (auto& n : res.notes) std::cout << "note: " << n << "\n";
    if (r.goodput) std::cout << describe(*r.goodput) << "\n";
    std::cout << note << "\nreport: " << (out_dir / "report.json").string() << "\n";
  }
  return r;
}

/// Everything the command line sets.
struct chaos_args {
  run_config cfg;
  uint64_t seed = 1;
  int faults = 3, soak = 0, timeout_s = 240;
  double overlap = 0;
  std::string schedule_file, out = "grace-chaos-out", kinds_arg, cache_dir;
  std::vector<std::string> trainer_args, command;
  bool print_only = false, no_reference = false;
};

void add_job_options(CLI::App& app, chaos_args& a) {
  auto& cfg = a.cfg;
  app.add_option("--workers", cfg.workers, "workers (grace-launch --nproc; per host with --hosts)")
      ->check(CLI::Range(1, 64));
  app.add_option("--hosts", cfg.hosts,
                 "run on a multi-host test bed of this many hosts (network namespaces on this machine, one "
                 "grace-launch each; needs root): host faults host_lost, host_partition, host_freeze")
      ->check(CLI::Range(2, 16));
  app.add_option("--dead-after-ms", cfg.dead_after_ms, "--hosts: grace-launch --dead-after-ms")
      ->check(CLI::Range(200, 600000));
  app.add_flag("--etcd", cfg.etcd,
               "--hosts (3 or more): a three-member etcd on hosts 0..2 elects the coordination host "
               "(grace-launch --etcd), so host faults may hit host 0, the coordinator's (needs etcd-server)");
  app.add_option("--etcd-ttl", cfg.etcd_ttl_s, "--etcd: grace-launch --etcd-ttl (seconds)")->check(CLI::Range(1, 60));
  app.add_flag("--node-local", cfg.node_local,
               "--hosts: a checkpoint directory per host (node-local disks) instead of one shared by all; a lost "
               "host's replacement starts with an empty one");
  app.add_option("--elastic", cfg.elastic_min,
                 "--hosts: an elastic job (grace-launch --nnodes MIN:HOSTS): a host lost for longer than "
                 "--elastic-wait-ms is left out of the group until its replacement comes; the reference changes "
                 "size at the same steps")
      ->check(CLI::Range(1, 15));
  app.add_option("--elastic-wait-ms", cfg.elastic_wait_ms, "--elastic: grace-launch --elastic-wait-ms")
      ->check(CLI::Range(0, 600000));
  app.add_option("--steps", cfg.steps, "training steps")->check(CLI::Range(uint64_t(10), uint64_t(1) << 30));
  app.add_option("--save-every", cfg.save_every,
                 "periodic checkpoint interval (bounds work lost to a damaged checkpoint)")
      ->check(CLI::Range(1, 1 << 30));
  app.add_option("--device", cfg.device, "trainer --device (auto, cpu or cuda)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--step-delay-ms", cfg.step_delay_ms, "trainer --step-delay-ms: slows steps so 'at step X' is precise")
      ->check(CLI::Range(0, 60000));
  app.add_option("--trainer", cfg.trainer, "trainer program (default $GRACE_TRAIN or grace-train next to this binary)");
  app.add_option("--launcher", cfg.launcher, "launcher (default $GRACE_LAUNCH or grace-launch next to this binary)");
  app.add_option("--ckpt-tool", cfg.ckpt_tool,
                 "checkpoint tool (default $GRACE_CKPT or grace-ckpt next to this binary)");
  app.add_option("--mutant-arg", cfg.mutant_args,
                 "a broken-on-purpose trainer flag (e.g. --mutant-arg=--broken-repeat-step): given to the "
                 "faulted runs, not to the reference")
      ->allow_extra_args(false);
  app.add_option("--trainer-arg", a.trainer_args, "extra trainer argument (repeat; use --trainer-arg=--flag for flags)")
      ->allow_extra_args(false);
  app.add_option("--launcher-arg", cfg.launcher_args,
                 "extra grace-launch flag for every launch (repeat; e.g. --launcher-arg=--standby)")
      ->allow_extra_args(false);
  app.add_option("--max-restarts", cfg.max_relaunches, "scheduler relaunches of grace-launch before giving up")
      ->check(CLI::Range(0, 10000));
  app.add_option("--timeout-s", a.timeout_s, "give up on one job after this long")->check(CLI::Range(10, 86400));
  app.add_option("--fs-size-mb", cfg.fs_size_mb,
                 "fs_full: size of the tmpfs on the checkpoint directory (room for the kept checkpoints)")
      ->check(CLI::Range(1, 65536));
  app.add_flag("-v,--verbose", cfg.verbose, "log each launch and fault");
  app.add_option("command", a.command,
                 "trainer command after --, instead of --trainer (e.g. an interpreter "
                 "and its script); it gets grace-train's flags appended");
}

void add_schedule_options(CLI::App& app, chaos_args& a) {
  app.add_option("--seed", a.seed, "random schedule seed (same seed, same schedule)");
  app.add_option("--faults", a.faults, "faults in a random schedule")->check(CLI::Range(0, 100));
  app.add_option("--kinds", a.kinds_arg, "random schedules use only these kinds (comma separated)");
  app.add_option("--overlap", a.overlap,
                 "chance (0..1) that a random fault brings overlapping companions: a second notice, a SIGKILL or "
                 "SIGSTOP ms later or during the agreement, the save or the restart, the launcher's SIGKILL "
                 "during the agreement")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--schedule", a.schedule_file, "scripted schedule (JSON array) instead of --seed/--faults");
  app.add_option("--soak", a.soak, "run N random schedules (seeds seed..seed+N-1)")->check(CLI::Range(0, 1000000));
  app.add_option("--out", a.out, "output directory (run/, report.json, timeline.png)");
  app.add_option("--cache-dir", a.cache_dir, "reference runs cache (default ~/.cache/grace-chaos)");
  app.add_flag("--no-reference", a.no_reference, "skip the reference run (bit_identical is SKIP)");
  app.add_flag("--print-schedule", a.print_only, "print the schedule and exit");
}

/// Trainer, launcher and checkpoint tool: given, or beside this binary;
/// each must be executable. An error names the one that is not.
std::optional<std::string> resolve_programs(chaos_args& a) {
  auto& cfg = a.cfg;
  cfg.trainer_args = a.trainer_args;
  if (!a.command.empty()) {
    if (!cfg.trainer.empty()) return "give the trainer either as --trainer or after --, not both";
    cfg.trainer = on_path(a.command.front());
    cfg.trainer_prefix.assign(a.command.begin() + 1, a.command.end());
  }
  cfg.job_timeout_ms = int64_t(a.timeout_s) * 1000;
  if (cfg.trainer.empty()) cfg.trainer = sibling("GRACE_TRAIN", "grace-train");
  if (cfg.launcher.empty()) cfg.launcher = sibling("GRACE_LAUNCH", "grace-launch");
  if (cfg.ckpt_tool.empty()) cfg.ckpt_tool = sibling("GRACE_CKPT", "grace-ckpt");
  for (auto* p : {&cfg.launcher, &cfg.trainer, &cfg.ckpt_tool}) {
    if (::access(p->c_str(), X_OK) != 0)
      return "cannot execute " + *p + " (set --launcher/--trainer/--ckpt-tool or GRACE_LAUNCH/GRACE_TRAIN/GRACE_CKPT)";
    *p = fs::absolute(*p).string();
  }
  return std::nullopt;
}

/// --kinds as fault kinds; an error names the unknown one.
grace::result<std::vector<fault_kind>> parse_kinds(const std::string& arg) {
  std::vector<fault_kind> kinds;
  for (size_t p = 0; !arg.empty() && p <= arg.size();) {
    auto q = arg.find(',', p);
    auto name = arg.substr(p, q == std::string::npos ? std::string::npos : q - p);
    auto k = parse_fault_kind(name);
    if (!k) return grace::error{grace::errc::invalid_input, "--kinds: unknown fault '" + name + "'"};
    kinds.push_back(*k);
    if (q == std::string::npos) break;
    p = q + 1;
  }
  return kinds;
}

/// What is wrong with a schedule for this job (targets out of range, a
/// fault the topology cannot carry out), or nullopt.
std::optional<std::string> check_schedule(const run_config& cfg, const std::vector<fault>& schedule) {
  const bool bed = cfg.hosts >= 2;
  for (size_t i = 0; i < schedule.size(); ++i) {
    auto& f = schedule[i];
    const std::string which = "entry " + std::to_string(i) + " (" + to_string(f.kind) + "): ";
    for (int t : f.targets)
      if (t >= cfg.total_workers())
        return which + "target rank " + std::to_string(t) + " but only " + std::to_string(cfg.total_workers()) +
               " workers";
    if (is_host_fault(f.kind) && !bed) return which + "a host fault needs the multi-host test bed (--hosts N)";
    if (!bed) continue;
    auto& ok = multi_host_kinds();
    if (std::find(ok.begin(), ok.end(), f.kind) == ok.end())
      return which + "not available on the multi-host test bed (there: host_lost, host_partition, host_freeze, "
                     "sigterm_worker, sigkill_worker, sigstop_worker)";
    if (f.grace_ms) return which + "grace_ms is not available on the multi-host test bed";
    if (is_host_fault(f.kind) && f.host >= cfg.hosts)
      return which + "host " + std::to_string(f.host) + " but the test bed has hosts 0.." +
             std::to_string(cfg.hosts - 1);
    if (is_host_fault(f.kind) && (f.host == 0 || f.host == coordinator_host) && !cfg.etcd)
      return which + "host 0 runs the coordination service: faults on it need --etcd (an elected successor)";
  }
  return std::nullopt;
}

/// What is wrong with the test bed options (--etcd, --node-local), or nullopt.
std::optional<std::string> check_test_bed(const run_config& cfg) {
  if (cfg.node_local && cfg.hosts < 2) return std::string("--node-local needs the multi-host test bed (--hosts N)");
  if (cfg.elastic_min > 0 && (cfg.hosts < 2 || cfg.elastic_min >= cfg.hosts))
    return std::string("--elastic MIN needs the multi-host test bed with more hosts than MIN (--hosts N, N > MIN)");
  if (!cfg.etcd) return std::nullopt;
  if (cfg.hosts < 3)
    return std::string("--etcd runs a three-member etcd on hosts 0..2: it needs --hosts 3 or more");
  if (run_command({"sh", "-c", "command -v etcd && command -v etcdctl"}) != 0)
    return std::string("--etcd needs etcd and etcdctl (Debian etcd-server, etcd-client)");
  return std::nullopt;
}

/// A scripted schedule, checked against the job (targets in range).
grace::result<std::vector<fault>> load_schedule(const chaos_args& a) {
  if (a.soak)
    return grace::error{grace::errc::invalid_input,
                        "--soak generates schedules; it cannot be combined with --schedule"};
  std::ifstream f(a.schedule_file);
  if (!f) return grace::error{grace::errc::invalid_input, "cannot read --schedule " + a.schedule_file};
  std::vector<fault> scripted;
  try {
    nlohmann::json j;
    f >> j;
    scripted = schedule_from_json(j);
  } catch (const std::exception& e) {
    return grace::error{grace::errc::invalid_input, "--schedule " + a.schedule_file + ": " + e.what()};
  }
  if (auto why = check_schedule(a.cfg, scripted)) return grace::error{grace::errc::invalid_input, "--schedule: " + *why};
  return scripted;
}

/// Runs one schedule with its table on the terminal.
int run_single(const chaos_args& a, const std::vector<fault>& schedule, const fs::path& out_dir, const reference& ref) {
  std::cout << "schedule"
            << (a.schedule_file.empty() ? " (seed " + std::to_string(a.seed) + ")" : " (" + a.schedule_file + ")")
            << ":\n";
  for (auto& f : schedule) std::cout << "  " << to_json(f).dump() << "\n";
  std::cout.flush();
  nlohmann::json origin =
      a.schedule_file.empty() ? nlohmann::json{{"seed", a.seed}} : nlohmann::json{{"schedule_file", a.schedule_file}};
  return run_one(a.cfg, schedule, out_dir, ref, origin, true, a.cache_dir).passed ? exit_pass : exit_fail;
}

/// Runs seeds seed..seed+soak-1, one line each, and writes soak.json.
/// SIGINT/SIGTERM: the job was killed and what the harness made removed.
int interrupted_exit() {
  std::fprintf(stderr,
               "grace-chaos: interrupted (SIGINT/SIGTERM): the job was killed and what grace-chaos made (test bed, "
               "tmpfs) removed; a run cut short proves nothing\n");
  return 130;
}

int run_soak(const chaos_args& a, const std::function<std::vector<fault>(uint64_t)>& schedule_for,
             const fs::path& out_dir, const reference& ref) {
  int failed = 0, total_faults = 0;
  std::map<std::string, int> kind_count;
  goodput_account soak_goodput;
  auto runs = nlohmann::json::array();
  for (int i = 0; i < a.soak && !interrupted(); ++i) {
    uint64_t s = a.seed + static_cast<uint64_t>(i);
    auto schedule = schedule_for(s);
    std::string kinds_str;
    for (auto& f : schedule) {
      kinds_str += std::string(kinds_str.empty() ? "" : " ") + to_string(f.kind);
      ++kind_count[to_string(f.kind)];
    }
    auto dir = out_dir / ("seed-" + std::to_string(s));
    std::error_code ec;
    fs::create_directories(dir, ec);
    auto r = run_one(a.cfg, schedule, dir, ref, {{"seed", s}}, false, a.cache_dir);
    total_faults += r.injected;
    failed += !r.passed;
    std::printf("seed %-6llu %s  %d/%zu faults injected  [%s]%s\n", (unsigned long long)s, r.passed ? "PASS" : "FAIL",
                r.injected, schedule.size(), kinds_str.c_str(),
                r.goodput ? fmt::format("  goodput {:.1f}%", 100 * r.goodput->ratio()).c_str() : "");
    if (r.goodput) soak_goodput += *r.goodput;
    for (auto& f : r.failures) std::printf("    %s\n", f.c_str());
    std::fflush(stdout);
    runs.push_back({{"seed", s},
                    {"passed", r.passed},
                    {"injected", r.injected},
                    {"failures", r.failures},
                    {"schedule", schedule_to_json(schedule)}});
  }
  std::printf("soak: %d schedule(s), %d fault(s) injected, %d failed\n", a.soak, total_faults, failed);
  if (soak_goodput.runs) std::printf("soak %s\n", describe(soak_goodput).c_str());
  std::ofstream(out_dir / "soak.json") << nlohmann::json{{"schedules", a.soak},
                                                         {"faults_injected", total_faults},
                                                         {"failed", failed},
                                                         {"kinds", kind_count},
                                                         {"goodput", soak_goodput.to_json()},
                                                         {"runs", runs}}
                                              .dump(2)
                                       << "\n";
  return failed ? exit_fail : exit_pass;
}

int usage_error(const std::string& what) {
  std::fprintf(stderr, "grace-chaos: %s\n", what.c_str());
  return exit_usage;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "grace-chaos: run a Grace job under injected faults (kills, freezes, notices, damaged "
      "checkpoints, a full disk) and prove nothing was lost.\n"
      "  grace-chaos --seed 7 --faults 4 --out /tmp/chaos\n"
      "  grace-chaos --schedule faults.json --out /tmp/chaos\n"
      "  grace-chaos --soak 50 --seed 1000 --out /tmp/soak\n"
      "  grace-chaos --soak 200 --seed 1 --overlap 0.7 --out /tmp/soak   # faults on top of faults\n"
      "  grace-chaos --seed 7 --out /tmp/chaos -- /usr/bin/python3 examples/pytorch_train.py\n"
      "  grace-chaos --hosts 3 --workers 2 --seed 3 --out /tmp/hosts   # whole hosts lost, cut off, frozen (root)"};
  chaos_args a;
  add_job_options(app, a);
  add_schedule_options(app, a);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : exit_usage;
  }
  spdlog::set_pattern("[%H:%M:%S.%e] [chaos] %v");
  install_interrupt_handlers();
  auto kinds = parse_kinds(a.kinds_arg);
  if (!kinds) return usage_error(kinds.err().message);
  for (auto k : *kinds) {
    fault probe;
    probe.kind = k;
    if (auto why = check_schedule(a.cfg, {probe}))
      return usage_error(std::string("--kinds ") + to_string(k) + ": " + why->substr(why->find("): ") + 3));
  }
  if (a.cfg.hosts >= 2 && a.overlap > 0)
    return usage_error("--overlap draws single-host companions; on the test bed script overlaps with after_ms");
  if (auto why = check_test_bed(a.cfg)) return usage_error(*why);
  std::vector<fault> scripted;
  if (!a.schedule_file.empty()) {
    auto s = load_schedule(a);
    if (!s) return usage_error(s.err().message);
    scripted = std::move(s.value());
  }
  auto schedule_for = [&](uint64_t seed) {
    if (!a.schedule_file.empty()) return scripted;
    generate_options g;
    g.seed = seed;
    g.faults = a.faults;
    g.workers = a.cfg.total_workers();
    g.hosts = a.cfg.hosts;
    g.coordinator_host_faults = a.cfg.etcd;
    g.steps = a.cfg.steps;
    g.kinds = *kinds;
    g.overlap = a.overlap;
    if (a.cfg.elastic_min > 0) g.elastic_wait_ms = a.cfg.elastic_wait_ms;
    return generate(g);
  };
  if (a.print_only) {
    std::cout << schedule_to_json(schedule_for(a.seed)).dump(1) << "\n";
    return exit_pass;
  }
  if (auto why = resolve_programs(a)) return usage_error(*why);
  std::error_code ec;
  fs::path out_dir = fs::absolute(a.out);
  fs::create_directories(out_dir, ec);
  if (ec) return usage_error("cannot create --out " + a.out + ": " + ec.message());
  if (a.cache_dir.empty()) {
    const char* home = std::getenv("HOME");
    a.cache_dir = home && *home ? std::string(home) + "/.cache/grace-chaos" : (out_dir / "reference").string();
  }
  try {
    reference ref;
    if (a.no_reference) {
      ref.note = "--no-reference";
      ref.wanted = false;
    } else {
      ref = get_reference(a.cfg, a.cache_dir);
      if (!ref.checksum) std::fprintf(stderr, "grace-chaos: %s\n", ref.note.c_str());
    }
    if (interrupted()) return interrupted_exit();
    const int code = a.soak == 0 ? run_single(a, schedule_for(a.seed), out_dir, ref) : run_soak(a, schedule_for, out_dir, ref);
    return interrupted() ? interrupted_exit() : code;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "grace-chaos: %s\n", e.what());
    return exit_harness;
  }
}
