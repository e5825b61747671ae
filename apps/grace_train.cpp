// grace-train: the reference synchronous data-parallel trainer. Built only
// on Grace's public API (runtime/grace.hpp) plus a compute backend and its
// collective (the MLP and Gloo on CPU; in a CUDA build also mlp_cuda and
// NCCL), so it doubles as the example a research trainer copies.
#include "runtime/cancel_token.hpp"
#include "runtime/device_copy.hpp"
#include "runtime/gloo_comm.hpp"
#include "runtime/grace.hpp"
#include "runtime/mlp.hpp"
#ifdef GRACE_HAVE_CUDA
#include "runtime/cuda/device.hpp"
#include "runtime/cuda/device_snapshot.hpp"
#include "runtime/cuda/mlp_cuda.hpp"
#include "runtime/cuda/nccl_comm.hpp"
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
  /// Joins the collective of `world` > 1 ranks, registers its abort with the
  /// session, and returns the in-place gradient allreduce.
  std::function<grace::result<std::function<grace::status()>>(grace::session&, int rank, int world)>
      connect;
};

constexpr std::chrono::seconds collective_timeout{30};

trainer_backend cpu_backend(const grace::mlp_config& mc) {
  auto model = std::make_shared<grace::mlp>(mc);
  trainer_backend b;
  b.tensors = model->tensors();
  b.compute_gradients = [model](uint64_t step, int rank, int world) {
    return model->compute_gradients(step, rank, world);
  };
  b.apply_gradients = [model] { model->apply_gradients(); };
  b.weights_checksum = [model] { return model->weights_checksum(); };
  b.connect = [model](grace::session& g, int rank,
                      int world) -> grace::result<std::function<grace::status()>> {
    // A peer lost during the rendezvous ends it at once (see cancel_token).
    auto rendezvous = std::make_shared<grace::cancel_token>();
    g.set_abort_handler([rendezvous] { rendezvous->cancel(); });
    auto c = grace::gloo_comm::connect(g.rendezvous_store(), g.rendezvous_prefix() + "gloo", rank, world,
                                       collective_timeout, "127.0.0.1", rendezvous);
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
  b.connect = [model](grace::session& g, int rank,
                      int world) -> grace::result<std::function<grace::status()>> {
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

} // namespace

int main(int argc, char** argv) {
  // Before any thread: SIGTERM/SIGINT are read by Grace's signal watcher.
  grace::session* current = nullptr;
  (void)current;
  CLI::App app{"grace-train: data-parallel MLP training that survives preemption.\n"
               "  grace-launch --nproc 4 -- grace-train --steps 400"};
  grace::mlp_config mc;
  uint64_t steps = 200;
  std::string checkpoint_dir = std::getenv("GRACE_CHECKPOINT_DIR") ? std::getenv("GRACE_CHECKPOINT_DIR")
                                                                   : "grace-checkpoints";
  std::string workers, output, device = "auto", notice_file, notice_command;
  int index = -1, keep = 3, restart_code = 42, step_delay_ms = 0, grace_ms = 0;
  uint64_t save_every = 0, fail_at = 0;
  int fail_rank = 0;
  double save_every_seconds = 0;
  bool skip_optimizer_restore = false, keep_checkpoints = false;
  if (const char* rc = std::getenv("GRACE_RESTART_CODE")) restart_code = std::atoi(rc);
  app.add_option("--steps", steps, "total training steps")->check(CLI::Range(uint64_t(1), uint64_t(1) << 40));
  app.add_option("--input-dim", mc.input_dim, "features per sample")->check(CLI::Range(1, 1 << 20));
  app.add_option("--hidden", mc.hidden, "hidden layer widths, e.g. --hidden 256 256")->delimiter(',');
  app.add_option("--classes", mc.classes, "classes")->check(CLI::Range(2, 1 << 20));
  app.add_option("--batch", mc.global_batch, "global batch (split evenly over workers)")->check(CLI::Range(1, 1 << 24));
  app.add_option("--lr", mc.lr, "learning rate");
  app.add_option("--momentum", mc.momentum, "SGD momentum");
  app.add_option("--seed", mc.seed, "data and initialisation seed");
  app.add_option("--checkpoint-dir", checkpoint_dir, "checkpoint directory (default $GRACE_CHECKPOINT_DIR)");
  app.add_option("--keep", keep, "checkpoints to keep")->check(CLI::Range(1, 1000));
  app.add_option("--save-every", save_every, "periodic checkpoint every N steps (0: off)");
  app.add_option("--save-every-seconds", save_every_seconds, "periodic checkpoint every T seconds (0: off)");
  app.add_flag("--keep-checkpoints", keep_checkpoints, "keep backups after a successful finish");
  app.add_option("--grace-period-ms", grace_ms, "time from a notice to the kill (0: exit after the first save)");
  app.add_option("--notice-file", notice_file, "a file whose appearance is a preemption notice");
  app.add_option("--notice-command", notice_command, "a command whose exit 0 is a preemption notice");
  app.add_option("--restart-code", restart_code, "exit code after a preemption save");
  app.add_option("--workers", workers, "host:port,... of every worker (without grace-launch)");
  app.add_option("--index", index, "this worker's index in --workers");
  app.add_option("--device", device, "auto, cpu or cuda")->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--output", output, "write a JSON summary (steps, loss, weights checksum) here");
  app.add_option("--step-delay-ms", step_delay_ms, "sleep in every step (demos and tests)");
  app.add_option("--fail-at-step", fail_at, "raise an error in this step (tests)");
  app.add_option("--fail-rank", fail_rank, "rank that raises the error");
  app.add_flag("--skip-optimizer-restore", skip_optimizer_restore,
               "BROKEN ON PURPOSE: do not restore the optimizer state (proves the harness catches lost state)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : grace::exit_code::usage;
  }

#ifndef GRACE_HAVE_CUDA
  // The CUDA backend lives in grace-train-cuda beside this binary, so a CPU
  // node never loads the CUDA libraries: loading them adds hundreds of ms to
  // every worker's start and exit, which a restart pays on its critical path
  // (docs/BENCHMARKS.md).
  std::string cpu_reason = "--device cpu";
  if (device != "cpu") {
    std::error_code ec;
    auto self_path = std::filesystem::read_symlink("/proc/self/exe", ec);
    auto cuda_bin = (ec ? std::filesystem::path("grace-train-cuda") : self_path.parent_path() / "grace-train-cuda");
    const bool have_bin = ::access(cuda_bin.c_str(), X_OK) == 0;
    const bool driver = ::access("/proc/driver/nvidia/version", F_OK) == 0 || ::access("/dev/nvidiactl", F_OK) == 0;
    if (have_bin && driver) {
      ::execv(cuda_bin.c_str(), argv);
      spdlog::error("cannot run {}: {}", cuda_bin.string(), std::strerror(errno));
      return grace::exit_code::usage;
    }
    const std::string why = !driver ? "no NVIDIA driver on this node (/proc/driver/nvidia/version and /dev/nvidiactl are absent)"
                                    : "this build has no CUDA backend (grace-train-cuda is not built: configure with -DGRACE_CUDA=ON, see docs/GPU.md)";
    if (device == "cuda") {
      spdlog::error("--device cuda: {}; use --device cpu", why);
      return grace::exit_code::usage;
    }
    cpu_reason = "--device auto: " + why;
  }
#endif

  grace::options opts;
  opts.checkpoint_dir = checkpoint_dir;
  opts.keep_last = keep;
  opts.restart_exit_code = restart_code;
  opts.save_every_steps = save_every;
  opts.save_every_seconds = save_every_seconds;
  opts.keep_checkpoints_on_success = keep_checkpoints;
  opts.notice_file = notice_file;
  opts.notice_command = notice_command;
  opts.grace_period = std::chrono::milliseconds(grace_ms);
  if (!workers.empty()) {
    auto c = grace::cluster_from_workers(workers, index);
    if (!c) {
      spdlog::error("{}", c.err().message);
      return grace::exit_code::usage;
    }
    opts.cluster = *c;
  }
  grace::session g(opts);  // blocks SIGTERM/SIGINT for every later thread

  // After the session: initialising the CUDA driver may start threads, and
  // they must inherit the blocked signals.
#ifdef GRACE_HAVE_CUDA
  const int local_rank = local_rank_from_environment();
  if (local_rank < 0) {
    spdlog::error("GRACE_LOCAL_RANK='{}': expected a non-negative integer (grace-launch sets it)",
                  std::getenv("GRACE_LOCAL_RANK"));
    return grace::exit_code::usage;
  }
  auto choice = grace::choose_backend(device, local_rank);
  if (!choice) {
    spdlog::error("{}", choice.err().message);
    return grace::exit_code::usage;
  }
  spdlog::info("{}", choice->explanation);
  const bool use_cuda = choice->kind == grace::backend_kind::cuda;
#else
  spdlog::info("device: cpu ({})", cpu_reason);
  const bool use_cuda = false;
#endif

  auto world_hint = opts.cluster ? opts.cluster->world_size
                                 : (std::getenv("GRACE_WORLD_SIZE") ? std::atoi(std::getenv("GRACE_WORLD_SIZE")) : 1);
  if (auto st = grace::validate(mc, world_hint); !st) {
    spdlog::error("{}", st.err().message);
    return grace::exit_code::usage;
  }
  trainer_backend backend;
  if (!use_cuda) {
    backend = cpu_backend(mc);
  } else {
#ifdef GRACE_HAVE_CUDA
    // Device tensors are snapshotted and restored through this hook.
    grace::register_cuda_device_copy();
    auto b = cuda_backend(mc, choice->device);
    if (!b) {
      spdlog::error("cuda backend: {}", b.err().message);
      return b.err().code == grace::errc::invalid_input ? grace::exit_code::usage : restart_code;
    }
    backend = std::move(b.value());
#endif
  }
  int64_t steps_done = 0, step_index_sum = 0;
  const auto& tensors = backend.tensors;
  for (auto& t : tensors) g.register_tensor(t);
  g.register_counter("steps_done", &steps_done);
  g.register_counter("step_index_sum", &step_index_sum);

  auto start = g.attach();
  if (!start) {
    spdlog::error("{}", start.err().message);
    return start.err().code == grace::errc::invalid_input ? grace::exit_code::usage : grace::exit_code::restart;
  }
  if (skip_optimizer_restore && *start > 0) {
    for (auto& t : tensors)
      if (t.name.rfind("optimizer.", 0) == 0)
        if (auto st = zero_tensor(t); !st) {
          spdlog::error("--skip-optimizer-restore: {}", st.err().message);
          return grace::exit_code::fatal;
        }
    spdlog::warn("--skip-optimizer-restore: optimizer state zeroed after restore (broken on purpose)");
  }
  const int rank = static_cast<int>(g.rank()), world = static_cast<int>(g.world_size());

  std::function<grace::status()> allreduce_gradients; // empty for a world of one
  if (world > 1) {
    auto c = backend.connect(g, rank, world);
    if (!c) {
      // Usually a peer that died before its rendezvous: the session waits
      // for the cluster's verdict and gives the exit code.
      spdlog::error("{}", c.err().message);
      g.quick_exit(g.stop_after_failure(c.err()));
    }
    allreduce_gradients = std::move(c.value());
  }

  const bool tty = ::isatty(STDERR_FILENO) && rank == 0;
  auto t_start = std::chrono::steady_clock::now();
  auto last_print = t_start;
  uint64_t first = *start + 1;
  float loss = 0;
  for (uint64_t s = first; s <= steps; ++s) {
    auto r = g.run([&](uint64_t step) {
      if (fail_at == step && rank == fail_rank)
        throw std::runtime_error("injected failure at step " + std::to_string(step));
      loss = backend.compute_gradients(step - 1, rank, world);
      if (allreduce_gradients) {
        auto st = allreduce_gradients();
        if (!st) throw grace::step_failure(st.err());
      }
      backend.apply_gradients();
      ++steps_done;
      step_index_sum += static_cast<int64_t>(step);
      if (step_delay_ms) std::this_thread::sleep_for(std::chrono::milliseconds(step_delay_ms));
    });
    if (r == grace::step_result::stop) {
      if (tty) std::fprintf(stderr, "\n");
      g.quick_exit(g.exit_code());  // the checkpoint is committed: skip slow teardown
    }
    auto now = std::chrono::steady_clock::now();
    if (rank == 0 && (now - last_print > std::chrono::milliseconds(tty ? 200 : 2000) || s == steps)) {
      double el = std::chrono::duration<double>(now - t_start).count();
      double rate = el > 0 ? double(s - first + 1) / el : 0;
      double eta = rate > 0 ? double(steps - s) / rate : 0;
      if (tty)
        std::fprintf(stderr, "\rstep %llu/%llu  %.1f steps/s  loss %.4f  ETA %.0fs   ",
                     (unsigned long long)s, (unsigned long long)steps, rate, loss * world, eta);
      else
        spdlog::info("step {}/{}  {:.1f} steps/s  loss {:.4f}  ETA {:.0f}s", s, steps, rate, loss * world, eta);
      last_print = now;
    }
  }
  if (tty) std::fprintf(stderr, "\n");
  if (auto st = g.finish(); !st) {
    spdlog::error("finish: {}", st.err().message);
    return grace::exit_code::fatal;
  }
  char hex[32];
  std::snprintf(hex, sizeof hex, "%016llx", (unsigned long long)backend.weights_checksum());
  if (rank == 0) {
    spdlog::info("finished {} steps; weights checksum {}", steps, hex);
    if (!output.empty()) {
      std::ofstream f(output);
      f << nlohmann::json{{"steps", steps}, {"steps_done", steps_done}, {"step_index_sum", step_index_sum},
                          {"weights_checksum", hex}, {"world_size", world}, {"loss", loss * world}}
               .dump(2)
        << "\n";
    }
  }
  g.quick_exit(0);
}
