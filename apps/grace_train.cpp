// grace-train: the reference synchronous data-parallel trainer. Built only
// on Grace's public API (actors/session.hpp) plus a compute backend and its
// collective (the MLP and Gloo on CPU; in a CUDA build also mlp_cuda and
// NCCL), so it doubles as the example a research trainer copies.
#include "runtime/base/cancel_token.hpp"
#include "runtime/base/mutants.hpp"
#include "runtime/checkpoint/device_copy.hpp"
#include "runtime/worker/device_probe.hpp"
#include "runtime/train/gloo_comm.hpp"
#include "actors/session.hpp"
#include "runtime/train/mlp.hpp"
#ifdef GRACE_HAVE_CUDA
#include "runtime/train/cuda/device.hpp"
#include "runtime/train/cuda/device_snapshot.hpp"
#include "runtime/train/cuda/mlp_cuda.hpp"
#include "runtime/train/cuda/nccl_comm.hpp"
#endif

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cerrno>
#include <filesystem>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <unistd.h>

namespace {

/// What the training loop needs from a compute backend and its collective,
/// so one loop drives the CPU backend (grace::mlp + Gloo) and the CUDA one
/// (grace::mlp_cuda + NCCL). The model is shared by the closures; the
/// collective is connected after attach(), which gives rank and world size.
struct trainer_backend {
  /// Parameters and optimizer state, registered with the session (host or
  /// device memory; same names, shapes and dtypes on both backends).
  std::vector<grace::tensor_ref> tensors;
  std::function<float(uint64_t step, int rank, int world)> compute_gradients;
  std::function<void()> apply_gradients;
  std::function<uint64_t()> weights_checksum;
  /// A sharded optimizer (--shard-optimizer): after apply_gradients, the
  /// gradient buffer holds this rank's updated share; allreduced, this
  /// installs every rank's (the parameters' all-gather). Empty otherwise.
  std::function<void()> after_update;
  /// A sharded optimizer: puts this rank's momentum in the gradient buffer
  /// for an allreduce, so weights_checksum covers the whole state.
  std::function<void()> stage_checksum;
  /// Joins the collective of `world` > 1 ranks, registers its abort with the
  /// session, and returns the in-place gradient allreduce.
  std::function<grace::result<std::function<grace::status()>>(grace::session&, int rank, int world)> connect;
};

/// Bounds each rendezvous and collective (--collective-timeout-ms); set once
/// in main before any backend connects.
std::chrono::milliseconds collective_timeout{30000};

/// `shard`: ZeRO-1 for rank `rank` of `world` (--shard-optimizer).
trainer_backend cpu_backend(const grace::mlp_config& mc, bool shard, int rank, int world) {
  auto model = std::make_shared<grace::mlp>(mc);
  trainer_backend b;
  if (shard) {
    model->shard_optimizer(static_cast<uint32_t>(rank), static_cast<uint32_t>(world));
    b.after_update = [model] { model->take_parameters(); };
    b.stage_checksum = [model] { model->stage_momentum(); };
  }
  b.tensors = model->tensors();
  b.compute_gradients = [model](uint64_t step, int rank, int world) {
    return model->compute_gradients(step, rank, world);
  };
  b.apply_gradients = [model] { model->apply_gradients(); };
  b.weights_checksum = [model] { return model->weights_checksum(); };
  b.connect = [model](grace::session& g, int rank, int world) -> grace::result<std::function<grace::status()>> {
    // A peer lost during the rendezvous ends it at once (see cancel_token).
    auto rendezvous = std::make_shared<grace::cancel_token>();
    g.set_abort_handler([rendezvous] { rendezvous->cancel(); });
    auto c = grace::gloo_comm::connect(g.rendezvous_store(), g.rendezvous_prefix() + "gloo", rank, world,
                                       collective_timeout, g.cluster().host, rendezvous);
    if (!c) return grace::error{c.err().code, "gloo rendezvous failed: " + c.err().message};
    // Shared with the abort handler, which may run on another thread until
    // the session is gone.
    std::shared_ptr<grace::gloo_comm> comm = std::move(c.value());
    g.set_abort_handler([comm] { comm->abort(); });
    return std::function<grace::status()>(
        [comm, model] { return comm->allreduce_sum(model->grad_data(), model->grad_size()); });
  };
  return b;
}

#ifdef GRACE_HAVE_CUDA
grace::result<trainer_backend> cuda_backend(const grace::mlp_config& mc, int device) {
  auto created = grace::mlp_cuda::create(mc, device);
  if (!created) return created.err();
  std::shared_ptr<grace::mlp_cuda> model = std::move(created.value());
  trainer_backend b;
  b.tensors = model->tensors();
  // A CUDA failure in a step throws grace::cuda_error: Grace reports it to
  // the coordinator as a failed step, which stops the group.
  b.compute_gradients = [model](uint64_t step, int rank, int world) {
    return model->compute_gradients(step, rank, world);
  };
  b.apply_gradients = [model] { model->apply_gradients(); };
  b.weights_checksum = [model] { return model->weights_checksum(); };
  b.connect = [model](grace::session& g, int rank, int world) -> grace::result<std::function<grace::status()>> {
    // NCCL picks its bootstrap and socket interface from NCCL_SOCKET_IFNAME
    // (grace-launch sets it); otherwise the one Grace advertises. Set before
    // NCCL's first call, which reads it.
    if (!std::getenv("NCCL_SOCKET_IFNAME") && !g.cluster().iface.empty())
      ::setenv("NCCL_SOCKET_IFNAME", g.cluster().iface.c_str(), 0);
    auto rendezvous = std::make_shared<grace::cancel_token>();
    g.set_abort_handler([rendezvous] { rendezvous->cancel(); });
    auto c = grace::nccl_comm::connect(g.rendezvous_store(), g.rendezvous_prefix() + "nccl", rank, world,
                                       model->device(), collective_timeout, rendezvous);
    if (!c) return grace::error{c.err().code, "nccl rendezvous failed: " + c.err().message};
    std::shared_ptr<grace::nccl_comm> comm = std::move(c.value());
    g.set_abort_handler([comm] { comm->abort(); });
    return std::function<grace::status()>(
        [comm, model] { return comm->allreduce_sum(model->grad_data(), model->grad_size()); });
  };
  return b;
}

/// GRACE_LOCAL_RANK (set by grace-launch), 0 when unset; -1 when malformed.
int local_rank_from_environment() {
  const char* v = std::getenv("GRACE_LOCAL_RANK");
  if (!v || !*v) return 0;
  char* end = nullptr;
  long r = std::strtol(v, &end, 10);
  return (*end == '\0' && r >= 0 && r < (1 << 20)) ? static_cast<int>(r) : -1;
}
#endif

/// Zeroes a registered tensor wherever it lives.
grace::status zero_tensor(const grace::tensor_ref& t) {
  if (t.memory == grace::memory_kind::host) {
    std::memset(t.data, 0, t.bytes());
    return {};
  }
  std::vector<char> zeros(t.bytes(), 0);
  return grace::device_copy_to_device(t.data, zeros.data(), zeros.size(), t.device);
}

/// Deliberate bugs for the failure harness's own tests (tests/chaos/mutants.sh):
/// each must be caught by the invariant it names. Never use them for training.
/// Everything the command line sets.
struct train_args {
  grace::mlp_config mc;
  uint64_t steps = 200;
  std::string checkpoint_dir =
      std::getenv("GRACE_CHECKPOINT_DIR") ? std::getenv("GRACE_CHECKPOINT_DIR") : "grace-checkpoints";
  std::string workers, output, device = "auto", notice_file, notice_command, fallback_dir, token_file, checkpoint_key_file;
  int index = -1, keep = 3, restart_code = 42, step_delay_ms = 0, grace_ms = 0, commit_delay_ms = 0;
  uint64_t save_every = 0, fail_at = 0, commit_delay_step = 0;
  int fail_rank = 0;
  double save_every_seconds = 0, mtbf_prior_hours = 6;
  bool save_every_auto = false, keep_checkpoints = false, prune_on_save_failure = false;
  bool shard_optimizer = false;
  bool no_replicas = false, insecure = false;
  int save_retry_max_ms = 300000;
  int collective_timeout_ms = 30000;
  grace::mutants::switches broken;  ///< the test seam's --broken-* flags (runtime/base/mutants.hpp)
};

void add_training_options(CLI::App& app, train_args& a) {
  auto& mc = a.mc;
  app.add_option("--steps", a.steps, "total training steps")->check(CLI::Range(uint64_t(1), uint64_t(1) << 40));
  app.add_option("--input-dim", mc.input_dim, "features per sample")->check(CLI::Range(1, 1 << 20));
  app.add_option("--hidden", mc.hidden, "hidden layer widths, e.g. --hidden 256 256")->delimiter(',');
  app.add_option("--classes", mc.classes, "classes")->check(CLI::Range(2, 1 << 20));
  app.add_option("--batch", mc.global_batch, "global batch (split evenly over workers)")->check(CLI::Range(1, 1 << 24));
  app.add_option("--lr", mc.lr, "learning rate");
  app.add_option("--momentum", mc.momentum, "SGD momentum");
  app.add_option("--seed", mc.seed, "data and initialisation seed");
  app.add_flag("--shard-optimizer", a.shard_optimizer,
               "ZeRO-1: each rank keeps and updates only its share of the optimizer state (saved as its own part "
               "of every checkpoint); the parameters are all-gathered after each update");
  app.add_option("--device", a.device, "auto, cpu or cuda (given twice: the last wins)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_flag("--no-replicas", a.no_replicas,
               "with --shard-optimizer: keep no in-memory replicas (a lost rank then costs the work since the last "
               "checkpoint instead of at most two steps; benchmarks measure the replicas' cost with it)");
  app.add_option("--output", a.output, "write a JSON summary (steps, loss, weights checksum) here");
  app.add_option("--step-delay-ms", a.step_delay_ms, "sleep in every step (demos and tests)");
  app.add_option("--commit-delay-ms", a.commit_delay_ms,
                 "with --shard-optimizer: wait this long before committing the parts of a save, as a slow disk "
                 "would (tests land faults inside the commit)")
      ->check(CLI::Range(0, 600000));
  app.add_option("--commit-delay-step", a.commit_delay_step, "--commit-delay-ms for the save of this step only");
  app.add_option("--collective-timeout-ms", a.collective_timeout_ms,
                 "bound on the collectives' rendezvous and on each collective")
      ->check(CLI::Range(100, 3600000));
  app.add_option("--fail-at-step", a.fail_at, "raise an error in this step (tests)");
  app.add_option("--fail-rank", a.fail_rank, "rank that raises the error");
}

void add_grace_options(CLI::App& app, train_args& a) {
  app.add_option("--checkpoint-dir", a.checkpoint_dir, "checkpoint directory (default $GRACE_CHECKPOINT_DIR)");
  app.add_option("--keep", a.keep, "checkpoints to keep")->check(CLI::Range(1, 1000));
  const CLI::Validator steps_or_auto(
      [](std::string& v) -> std::string {
        bool digits = !v.empty() && v.size() < 20 && v.find_first_not_of("0123456789") == std::string::npos;
        return v == "auto" || digits ? "" : "expects a number of steps or 'auto', got '" + v + "'";
      },
      "N|auto");
  app.add_option_function<std::string>(
         "--save-every",
         [&a](const std::string& v) {
           a.save_every_auto = v == "auto";
           a.save_every = a.save_every_auto ? 0 : std::stoull(v);
         },
         "periodic checkpoint every N steps (0: off), or 'auto': Daly's interval for the measured save cost and "
         "the failure history beside the checkpoints")
      ->check(steps_or_auto);
  app.add_option("--mtbf-prior-hours", a.mtbf_prior_hours,
                 "with --save-every auto: the mean time between failures assumed until failures are seen")
      ->check(CLI::PositiveNumber);
  app.add_option("--save-every-seconds", a.save_every_seconds, "periodic checkpoint every T seconds (0: off)");
  app.add_flag("--keep-checkpoints", a.keep_checkpoints, "keep backups after a successful finish");
  app.add_option("--save-retry-max-ms", a.save_retry_max_ms,
                 "a failed periodic save is retried after 1 s, doubling up to this (training goes on)")
      ->check(CLI::Range(1000, 86400000));
  app.add_flag("--prune-on-save-failure", a.prune_on_save_failure,
               "before retrying a failed periodic save, remove every checkpoint but the newest that verifies");
  app.add_option("--fallback-checkpoint-dir", a.fallback_dir,
                 "where a preemption, final or just-in-time save goes when --checkpoint-dir cannot take it "
                 "(restarts restore the newest of both)");
  app.add_option("--grace-period-ms", a.grace_ms, "time from a notice to the kill (0: exit after the first save)");
  app.add_option("--notice-file", a.notice_file, "a file whose appearance is a preemption notice");
  app.add_option("--notice-command", a.notice_command, "a command whose exit 0 is a preemption notice");
  app.add_option("--restart-code", a.restart_code, "exit code after a preemption save");
  app.add_option("--workers", a.workers, "host:port,... of every worker (without grace-launch)");
  app.add_option("--index", a.index, "this worker's index in --workers");
  app.add_option("--token-file", a.token_file,
                 "the job's secret (mode 600; else GRACE_TOKEN): required with --workers across hosts");
  app.add_option("--checkpoint-key-file", a.checkpoint_key_file,
                 "sign checkpoints with this key (mode 600) and restore only steps it signed (default: "
                 "GRACE_CHECKPOINT_KEY_FILE, which grace-launch sets)");
  app.add_flag("--insecure", a.insecure, "let a --workers job across hosts run without a secret (anyone may join)");
}

/// Only in a build with the test seam (GRACE_MUTANTS).
void add_mutant_options(CLI::App& app, train_args& a) {
  if (!grace::mutants::compiled_in) return;
  const std::string b = "BROKEN ON PURPOSE (proves the failure harness catches it): ";
  app.add_flag("--broken-skip-optimizer-restore", a.broken.skip_optimizer_restore,
               b + "zero the optimizer state after a restore (bit_identical)");
  app.add_flag("--broken-repeat-step", a.broken.repeat_step,
               b + "run the first step after a restore twice (exactly_once)");
  app.add_flag("--broken-exit-zero", a.broken.exit_zero,
               b + "ranks other than 0 exit 0 instead of the restart code (exit_codes)");
  app.add_flag("--broken-restore-without-checksums", a.broken.restore_without_checksums,
               b + "restore a damaged checkpoint (no_corrupt_restore)");
  app.add_flag("--broken-keep-stale-temporaries", a.broken.keep_stale_temporaries,
               b + "never remove leftover temporary directories (no_temp_left)");
  app.add_flag("--broken-no-jit-save", a.broken.no_just_in_time_save,
               b + "stop without the just-in-time save when a peer is lost (work_lost)");
}

#ifndef GRACE_HAVE_CUDA
/// The CUDA backend lives in grace-train-cuda beside this binary, so a CPU
/// node never loads the CUDA libraries: loading them adds hundreds of ms to
/// every worker's start and exit, which a restart pays on its critical path
/// (docs/BENCHMARKS.md). Returns only when training stays on the CPU (with
/// the reason in `cpu_reason`), or an exit code.
std::optional<int> maybe_exec_cuda_trainer(const train_args& a, char** argv, std::string& cpu_reason) {
  cpu_reason = "--device cpu";
  if (a.device == "cpu") return std::nullopt;
  std::error_code ec;
  auto self_path = std::filesystem::read_symlink("/proc/self/exe", ec);
  auto cuda_bin = (ec ? std::filesystem::path("grace-train-cuda") : self_path.parent_path() / "grace-train-cuda");
  const bool have_bin = ::access(cuda_bin.c_str(), X_OK) == 0;
  std::string no_driver;
  const bool driver = grace::nvidia_driver_present(&no_driver);
  if (have_bin && driver) {
    ::execv(cuda_bin.c_str(), argv);
    spdlog::error("cannot run {}: {}", cuda_bin.string(), std::strerror(errno));
    return grace::exit_code::usage;
  }
  const std::string why = !driver ? no_driver + " on this node"
                                  : "this build has no CUDA backend (grace-train-cuda is not built: configure "
                                    "with -DGRACE_CUDA=ON, see docs/GPU.md)";
  if (a.device == "cuda") {
    spdlog::error("--device cuda: {}; use --device cpu", why);
    return grace::exit_code::usage;
  }
  cpu_reason = "--device auto: " + why;
  return std::nullopt;
}
#endif

grace::result<grace::options> make_options(const train_args& a) {
  grace::options opts;
  opts.checkpoint_dir = a.checkpoint_dir;
  opts.keep_last = a.keep;
  opts.commit_delay = std::chrono::milliseconds(a.commit_delay_ms);
  opts.commit_delay_step = a.commit_delay_step;
  opts.restart_exit_code = a.restart_code;
  opts.save_every_steps = a.save_every;
  opts.save_every_seconds = a.save_every_seconds;
  opts.save_every_auto = a.save_every_auto;
  opts.save_retry_max = std::chrono::milliseconds(a.save_retry_max_ms);
  opts.prune_on_save_failure = a.prune_on_save_failure;
  opts.fallback_checkpoint_dir = a.fallback_dir;
  opts.mtbf_prior_seconds = a.mtbf_prior_hours * 3600;
  opts.keep_checkpoints_on_success = a.keep_checkpoints;
  opts.replicas = !a.no_replicas;
  opts.notice_file = a.notice_file;
  opts.notice_command = a.notice_command;
  opts.grace_period = std::chrono::milliseconds(a.grace_ms);
  opts.token_file = a.token_file;
  opts.insecure = a.insecure;
  opts.checkpoint_key_file = a.checkpoint_key_file;
  if (!a.workers.empty()) {
    auto c = grace::cluster_from_workers(a.workers, a.index);
    if (!c) return c.err();
    opts.cluster = *c;
  }
  return opts;
}

/// The compute backend --device chose (after the session exists: the CUDA
/// driver may start threads, and they must inherit the blocked signals).
grace::result<trainer_backend> make_backend(const train_args& a, const std::string& cpu_reason, int rank, int world) {
#ifdef GRACE_HAVE_CUDA
  (void)cpu_reason;
  const int local_rank = local_rank_from_environment();
  if (local_rank < 0)
    return grace::error{grace::errc::invalid_input, std::string("GRACE_LOCAL_RANK='") +
                                                        std::getenv("GRACE_LOCAL_RANK") +
                                                        "': expected a non-negative integer (grace-launch sets it)"};
  auto choice = grace::choose_backend(a.device, local_rank);
  if (!choice) return choice.err();
  spdlog::info("{}", choice->explanation);
  if (choice->kind == grace::backend_kind::cuda) {
    if (a.shard_optimizer)
      return grace::error{grace::errc::invalid_input,
                          "--shard-optimizer: the CUDA backend does not shard its optimizer state; use --device cpu"};
    // Device tensors are snapshotted and restored through this hook.
    grace::register_cuda_device_copy();
    auto b = cuda_backend(a.mc, choice->device);
    if (!b) return grace::error{b.err().code, "cuda backend: " + b.err().message};
    return b;
  }
#else
  spdlog::info("device: cpu ({})", cpu_reason);
#endif
  return cpu_backend(a.mc, a.shard_optimizer, rank, world);
}

/// The exit code for a failed attach() (runtime/base/exit_codes.hpp).
int attach_failure_code(const grace::error& e, int restart_code) {
  spdlog::error("{}", e.message);
  return grace::attach_failure_exit(e.code, restart_code);
}

/// Joins the collective; on failure the process ends here. Usually a peer
/// died before its rendezvous: the session waits for the cluster's verdict
/// and gives the exit code. Without one (no peer lost, e.g. an address the
/// peers cannot reach) it is no_rendezvous, which the launcher counts
/// toward giving up; with one the group still never got past its
/// rendezvous, and the launcher counts it too. A group that recovered in
/// place meanwhile formed the collectives again through the session's
/// world-change hook, which set `allreduce`.
void connect_or_exit(grace::session& g, trainer_backend& backend, int restart_code,
                     std::function<grace::status()>& allreduce) {
  const int rank = static_cast<int>(g.rank()), world = static_cast<int>(g.world_size());
  if (world == 1) return;
  auto c = backend.connect(g, rank, world);
  if (c) {
    allreduce = std::move(c.value());
    return;
  }
  spdlog::error("{} (this worker advertised {}: {})", c.err().message, g.cluster().host, g.cluster().host_source);
  int code = g.stop_after_failure(c.err(), grace::exit_code::no_rendezvous);
  if (code == grace::exit_code::success) return;
  g.quick_exit(code == restart_code ? grace::exit_code::no_rendezvous : code);
}

/// Rank 0's progress line: a live one on a terminal, a log line otherwise.
class progress {
public:
  progress(bool on, uint64_t first, uint64_t steps)
      : on_(on), tty_(on && ::isatty(STDERR_FILENO)), first_(first), steps_(steps) {}
  void step(uint64_t s, float loss) {
    auto now = std::chrono::steady_clock::now();
    if (!on_ || (now - last_ <= std::chrono::milliseconds(tty_ ? 200 : 2000) && s != steps_)) return;
    double el = std::chrono::duration<double>(now - t0_).count();
    double rate = el > 0 ? double(s - first_ + 1) / el : 0;
    double eta = rate > 0 ? double(steps_ - s) / rate : 0;
    if (tty_)
      std::fprintf(stderr, "\rstep %llu/%llu  %.1f steps/s  loss %.4f  ETA %.0fs   ", (unsigned long long)s,
                   (unsigned long long)steps_, rate, loss, eta);
    else
      spdlog::info("step {}/{}  {:.1f} steps/s  loss {:.4f}  ETA {:.0f}s", s, steps_, rate, loss, eta);
    last_ = now;
  }
  void end_line() {
    if (tty_) std::fprintf(stderr, "\n");
  }

private:
  bool on_, tty_;
  uint64_t first_, steps_;
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now(), last_ = t0_;
};

/// What the run counts, checkpointed as counters: exactly-once accounting.
struct tally {
  int64_t steps_done = 0, step_index_sum = 0;
  float loss = 0;
};

/// Steps from the restored one to the last; returns only when every step ran.
/// Counted by the session: a recovery in place may abandon a step or take
/// a peer's newer state.
void train(grace::session& g, const train_args& a, trainer_backend& backend,
           const std::function<grace::status()>& allreduce, uint64_t start, tally& t) {
  const int rank = static_cast<int>(g.rank()), world = static_cast<int>(g.world_size());
  progress pr(rank == 0, start + 1, a.steps);
  bool repeat = a.broken.repeat_step && start > 0;
  auto one_step = [&](uint64_t step) {
    if (a.fail_at == step && rank == a.fail_rank)
      throw std::runtime_error("injected failure at step " + std::to_string(step));
    t.loss = backend.compute_gradients(step - 1, rank, world);
    if (allreduce)
      if (auto st = allreduce(); !st) throw grace::step_failure(st.err());
    backend.apply_gradients();
    if (backend.after_update) {
      if (allreduce)
        if (auto st = allreduce(); !st) throw grace::step_failure(st.err());
      backend.after_update();
    }
    ++t.steps_done;
    t.step_index_sum += static_cast<int64_t>(step);
    if (a.step_delay_ms) std::this_thread::sleep_for(std::chrono::milliseconds(a.step_delay_ms));
  };
  while (g.completed_steps() < a.steps) {
    auto r = g.run([&](uint64_t step) {
      if (repeat) {
        repeat = false;
        spdlog::warn("--broken-repeat-step: step {} runs twice (broken on purpose)", step);
        one_step(step);
      }
      one_step(step);
    });
    if (r == grace::step_result::stop) {
      pr.end_line();
      int code = g.exit_code();
      if (a.broken.exit_zero && code == a.restart_code && rank != 0) {
        spdlog::warn("--broken-exit-zero: exit 0 instead of {} (broken on purpose)", code);
        code = 0;
      }
      g.quick_exit(code);  // the checkpoint is committed: skip slow teardown
    }
    pr.step(g.completed_steps(), t.loss * world);
  }
  pr.end_line();
}

void write_output(const train_args& a, const tally& t, const std::string& checksum, int world) {
  spdlog::info("finished {} steps; weights checksum {}", a.steps, checksum);
  if (a.output.empty()) return;
  std::ofstream f(a.output);
  f << nlohmann::json{{"steps", a.steps},
                      {"steps_done", t.steps_done},
                      {"step_index_sum", t.step_index_sum},
                      {"weights_checksum", checksum},
                      {"world_size", world},
                      {"loss", t.loss * world}}
           .dump(2)
    << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "grace-train: data-parallel MLP training that survives preemption.\n"
      "  grace-launch --nproc 4 -- grace-train --steps 400"};
  train_args a;
  if (const char* rc = std::getenv("GRACE_RESTART_CODE")) a.restart_code = std::atoi(rc);
  add_training_options(app, a);
  add_grace_options(app, a);
  add_mutant_options(app, a);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : grace::exit_code::usage;
  }
  collective_timeout = std::chrono::milliseconds(a.collective_timeout_ms);
  if constexpr (grace::mutants::compiled_in) grace::mutants::active() = a.broken;
  std::string cpu_reason;
#ifndef GRACE_HAVE_CUDA
  if (auto code = maybe_exec_cuda_trainer(a, argv, cpu_reason)) return *code;
#endif
  auto opts = make_options(a);
  if (!opts) {
    spdlog::error("{}", opts.err().message);
    return grace::exit_code::usage;
  }
  grace::session g(*opts);  // blocks SIGTERM/SIGINT for every later thread

  auto world_hint = opts->cluster ? opts->cluster->world_size
                                  : (std::getenv("GRACE_WORLD_SIZE") ? std::atoi(std::getenv("GRACE_WORLD_SIZE")) : 1);
  if (auto st = grace::validate(a.mc, world_hint); !st) {
    spdlog::error("{}", st.err().message);
    return grace::exit_code::usage;
  }
  const int rank_hint = opts->cluster ? static_cast<int>(opts->cluster->rank)
                                      : (std::getenv("GRACE_RANK") ? std::atoi(std::getenv("GRACE_RANK")) : 0);
  auto backend = make_backend(a, cpu_reason, rank_hint, world_hint);
  if (!backend) {
    spdlog::error("{}", backend.err().message);
    return backend.err().code == grace::errc::invalid_input ? grace::exit_code::usage : a.restart_code;
  }
  tally t;
  // Recovery in place (grace-launch --recovery in-place): the collectives
  // are formed again for the new group; the old communicator was aborted.
  std::function<grace::status()> allreduce;
  g.on_world_change([&]() -> grace::status {
    auto c = backend->connect(g, static_cast<int>(g.rank()), static_cast<int>(g.world_size()));
    if (!c) return c.err();
    allreduce = std::move(c.value());
    return {};
  });
  for (auto& tr : backend->tensors) g.register_tensor(tr);
  g.register_counter("steps_done", &t.steps_done);
  g.register_counter("step_index_sum", &t.step_index_sum);

  auto start = g.attach();
  if (!start) return attach_failure_code(start.err(), a.restart_code);
  if (a.broken.skip_optimizer_restore && *start > 0) {
    for (auto& tr : backend->tensors)
      if (tr.name.rfind("optimizer.", 0) == 0)
        if (auto st = zero_tensor(tr); !st) {
          spdlog::error("--broken-skip-optimizer-restore: {}", st.err().message);
          return grace::exit_code::fatal;
        }
    spdlog::warn("--broken-skip-optimizer-restore: optimizer state zeroed after restore (broken on purpose)");
  }
  if (!allreduce) connect_or_exit(g, *backend, a.restart_code, allreduce);  // a replacement's attach formed it
  train(g, a, *backend, allreduce, *start, t);
  if (backend->stage_checksum) {
    // The checksum covers every rank's share of the optimizer state.
    backend->stage_checksum();
    if (allreduce)
      if (auto st = allreduce(); !st) g.quick_exit(g.stop_after_failure(st.err()));
  }
  if (auto st = g.finish(); !st) {
    spdlog::error("finish: {}", st.err().message);
    return grace::exit_code::fatal;
  }
  char hex[32];
  std::snprintf(hex, sizeof hex, "%016llx", (unsigned long long)backend->weights_checksum());
  if (g.rank() == 0) write_output(a, t, hex, static_cast<int>(g.world_size()));
  g.quick_exit(0);
}
