#pragma once

// How trainer rank 0 drives the other ranks of a data-parallel trainer.
//
// Rank 0 is the whole trainer as a single rank would be: it serves workers,
// owns the store, evaluates and checkpoints. The other ranks (followers)
// hold only a Trainer and make the calls rank 0 makes, with the same groups,
// when rank 0 tells them to. A command is announced by bumping a counter in
// the group's rendezvous store and then broadcast through the group: a
// follower waits on the counter, which has no deadline (rank 0 may wait
// minutes for rollouts), not inside a collective, which has one. When rank 0
// dies, its store goes with it and the followers' next poll fails.

#include <functional>
#include <memory>
#include <string>

#include "relay/common/status.h"
#include "relay/model/policy.h"
#include "relay/model/value_model.h"
#include "relay/trainer/data_parallel.h"
#include "relay/trainer/trainer.h"

namespace relay::comm {

// Rank 0's side.
class RankLeader {
 public:
  explicit RankLeader(std::shared_ptr<trainer::Collectives> group) : group_(std::move(group)) {}

  // The data-parallel setting for a trainer on rank 0: each step() and
  // sft_step() (and a sharded trainer's save_state()) is forwarded to the
  // followers before it runs.
  trainer::DataParallel data_parallel(int64_t bucket_bytes);

  // The followers build a trainer for `role` ("sft" or "rl") over `policy`'s
  // weights at `version`, restore `trainer_state` (Trainer::save_state; empty
  // = a fresh trainer) and use `reference`'s weights as the KL reference
  // (null = the trainer's default, a frozen copy of the policy).
  // `critic`: the value model of a trainer with advantage.estimator gae
  // (null = none).
  Status start(const std::string& role, const model::PolicyImpl& policy, int64_t version,
               const model::Policy& reference, const std::string& trainer_state,
               const model::ValueModel& critic = nullptr);

  // The followers exit. Safe to call more than once; later calls do nothing.
  Status stop();

 private:
  Status announce(const std::string& command);

  std::shared_ptr<trainer::Collectives> group_;
  bool stopped_ = false;
};

struct FollowerOptions {
  // The trainer options of a role named by rank 0 ("sft" or "rl"): the same
  // function of the config as rank 0's.
  std::function<StatusOr<trainer::TrainerOptions>(const std::string& role)> options;
  int64_t bucket_bytes = int64_t{25} << 20;
  // Called after every step with that call's result, for logging, and
  // with the error of a state save that failed ("save_state").
  std::function<void(const std::string& call, const StatusOr<trainer::StepMetrics>&)> on_step;
};

// Rank > 0: follows rank 0's commands with `policy` (the model built from
// the same config; its weights are overwritten by rank 0's) until told to
// stop. A failed step is reported to on_step and followed like rank 0 does
// (it fails there the same way, and rank 0 decides what comes next).
// Returns OK after a stop, an error when rank 0 is gone or a command
// cannot be carried out.
Status follow_rank_leader(std::shared_ptr<trainer::Collectives> group, model::Policy policy,
                          const FollowerOptions& options);

}  // namespace relay::comm
