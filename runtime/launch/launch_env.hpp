#pragma once
/// grace-launch's settings from a scheduler's environment, for the flags
/// that were not given: a torchrun-style job (MASTER_ADDR/MASTER_PORT and
/// the node's rank and count) or a SLURM allocation (SLURM_JOB_ID,
/// SLURM_NNODES, SLURM_NODEID, SLURM_JOB_NODELIST). Pure: the environment
/// comes in as a lookup function, so tests describe any job.
///
/// grace-launch is a per-node agent, like torchrun itself, so it reads the
/// node-level variables:
///   torchrun   only when MASTER_ADDR (or PET_MASTER_ADDR) is set:
///              coordinator MASTER_ADDR:MASTER_PORT (PET_MASTER_ADDR/PORT);
///              nodes PET_NNODES, else WORLD_SIZE; node rank PET_NODE_RANK,
///              NODE_RANK or GROUP_RANK, else RANK (an operator such as
///              Kubeflow's PyTorchJob sets WORLD_SIZE/RANK per pod);
///              workers per node PET_NPROC_PER_NODE or LOCAL_WORLD_SIZE;
///              run id TORCHELASTIC_RUN_ID or PET_RDZV_ID, else derived from
///              the master's address (the same on every node).
///   SLURM      run id slurm-<SLURM_JOB_ID>; nodes SLURM_NNODES
///              (SLURM_JOB_NUM_NODES); node rank SLURM_NODEID; coordinator the
///              first host of SLURM_JOB_NODELIST, port GRACE_COORDINATOR_PORT
///              or MASTER_PORT, else 29400 + SLURM_JOB_ID % 1000 (two jobs
///              sharing a first node do not collide; a requeued job keeps it).
/// Field by field, torchrun's variables come before SLURM's (a SLURM batch
/// script commonly exports MASTER_ADDR itself); flags come before both.

#include "runtime/base/error.hpp"

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace grace {

/// A value and where it came from.
template <class T>
struct env_value {
  T value;
  std::string from;    ///< "SLURM_NNODES", "MASTER_ADDR:MASTER_PORT", ...
  std::string source;  ///< "torchrun" or "SLURM"
};

struct launch_settings {
  std::optional<env_value<int>> nnodes;
  std::optional<env_value<int>> node_rank;
  std::optional<env_value<int>> nproc;
  std::optional<env_value<std::string>> coordinator;  ///< host:port
  std::optional<env_value<std::string>> run_id;
};

/// Which environments were used: "torchrun", "SLURM", "torchrun + SLURM", or
/// "" (none), from the sources of the values actually applied.
std::string describe_sources(const std::vector<std::string>& sources_used);

using env_lookup = std::function<const char*(const char*)>;

/// Errors (invalid_input, naming the variable): a malformed number, a
/// malformed SLURM_JOB_NODELIST, MASTER_ADDR without MASTER_PORT.
result<launch_settings> launch_settings_from_environment(const env_lookup& getenv);

/// The first host of a SLURM host list: "node[03-05,9],gpu1" -> "node03".
result<std::string> first_host_of_nodelist(const std::string& nodelist);

}  // namespace grace
