#pragma once

// relay-trainer as one rank of a data-parallel trainer (trainer.world_size
// > 1): where this process stands in the group, joining it, and the loop
// the ranks other than 0 run (comm/trainer_ranks.h has the protocol).

#include <memory>

#include "relay/app/setup.h"
#include "relay/comm/dist/trainer_group.h"
#include "relay/common/status.h"
#include "relay/trainer/data_parallel.h"
#include "relay/trainer/trainer.h"

namespace relay::app {

// This process's rank from the config and the environment (RANK,
// WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT).
StatusOr<comm::TrainerRank> trainer_rank(const ExperimentConfig& config);

// Joins the group of trainer.world_size ranks, whose collectives run on
// `device` (the model's: Gloo on the CPU, NCCL on a GPU); null for a single
// rank.
StatusOr<std::shared_ptr<trainer::Collectives>> join_trainer_ranks(const ExperimentConfig& config,
                                                                   const comm::TrainerRank& rank,
                                                                   const std::string& device);

// A rank > 0: makes rank 0's trainer calls on its own shard of each batch
// until rank 0 stops it. `rl_options` is the RL trainer's options (the warm
// start's are derived from them as on rank 0). Returns the exit code.
int run_follower_rank(const RolloutSetup& s, const trainer::TrainerOptions& rl_options,
                      const comm::TrainerRank& rank, std::shared_ptr<trainer::Collectives> group);

// "trainer rank R: weights digest D": the XXH3 digest of the policy's
// weights, equal on every rank of a data-parallel trainer.
void print_weights_digest(const model::PolicyImpl& policy, int rank);

}  // namespace relay::app
