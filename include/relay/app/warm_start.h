#pragma once

// The supervised warm start before RL: SFT steps on the task's target
// solutions, with an optimizer of its own.

#include <cstdint>
#include <functional>

#include "relay/app/setup.h"
#include "relay/trainer/data_parallel.h"
#include "relay/trainer/trainer.h"

namespace relay::app {

// A demonstration for supervised steps: the task's target solution as the
// response (FailedPrecondition naming the prompt when the task has none).
StatusOr<rollout::TrajectoryGroup> demonstration(const RolloutSetup& s, int64_t index,
                                                 int64_t version);

struct WarmStart {
  int64_t steps = 0;
  double lr = 1e-3;
  int64_t batch = 32;  // demonstrations per step
};
// Supervised warm start of s.policy from `version`: `ws.steps` SFT steps on
// the training prompts' targets, with an optimizer of its own (Adam's
// moments from supervised steps are no guide for the RL objective). Returns
// the version after it; `on_step(k, metrics)` sees each step. With `dp`
// active, this is rank 0 of a data-parallel trainer (comm/trainer_ranks.h)
// whose other ranks already run a trainer of warm_start_options().
StatusOr<int64_t> warm_start(
    const RolloutSetup& s, const trainer::TrainerOptions& options, const PromptSplit& split,
    int64_t version, const WarmStart& ws,
    const std::function<void(int64_t, const trainer::StepMetrics&)>& on_step,
    const trainer::DataParallel& dp = {});
// The warm start's trainer options: the RL trainer's with the SFT learning rate.
trainer::TrainerOptions warm_start_options(const trainer::TrainerOptions& options,
                                           const WarmStart& ws);

}  // namespace relay::app
