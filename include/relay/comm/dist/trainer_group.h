#pragma once

// The data-parallel trainer's process group: trainer::Collectives over c10d
// (Gloo on CPU tensors, NCCL on CUDA in a CUDA build), with the rendezvous
// through a TCPStore that rank 0 opens. Where the rank, the world size and
// the rendezvous address come from: the config (trainer.world_size,
// trainer.rendezvous) and the torchrun / Slurm environment (RANK,
// WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT).

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "relay/common/status.h"
#include "relay/trainer/data_parallel.h"

namespace relay::comm {

// One trainer process's place in the group.
struct TrainerRank {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;  // index among the ranks on this node (picks cuda:<local_rank>)
  std::string host;    // the rendezvous store's host (rank 0's node)
  int port = 0;        // and port; rank 0 listens there
};

// Reads the environment through `getenv` (std::getenv in production) and
// checks it against the config: WORLD_SIZE, when set, must equal
// `config_world_size`; RANK must be set and in [0, world) when the world is
// larger than 1 (absent = 0 for a single rank); `rendezvous` ("host:port")
// wins over MASTER_ADDR / MASTER_PORT, one of which must give the address
// for a world larger than 1. Errors name the variable or the config key.
StatusOr<TrainerRank> trainer_rank_from_env(
    int config_world_size, const std::string& rendezvous,
    const std::function<std::optional<std::string>(const std::string&)>& getenv);

struct TrainerGroupOptions {
  TrainerRank rank;
  // Tensors the collectives run on: "cpu" (Gloo) or "cuda:<i>" (NCCL, CUDA
  // builds only). CPU tensors given to an NCCL group go through the device.
  std::string device = "cpu";
  // Gloo: the address this rank's device binds; empty = the address of the
  // host name, or loopback when the rendezvous host is loopback.
  std::string bind_host;
  std::chrono::milliseconds timeout{300000};
};

// Joins the group: rank 0 opens the store and every rank waits (up to the
// timeout) for all to arrive. Unavailable naming the endpoint and the rank
// when the rendezvous fails.
StatusOr<std::shared_ptr<trainer::Collectives>> join_trainer_group(
    const TrainerGroupOptions& options);

}  // namespace relay::comm
