#include "relay/app/warm_start.h"

#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace relay::app {

// A demonstration: the task's target solution as the response.
StatusOr<rollout::TrajectoryGroup> demonstration(const RolloutSetup& s, int64_t index,
                                                 int64_t version) {
  RELAY_ASSIGN_OR_RETURN(rollout::TaskPrompt p, s.task->prompt(index));
  if (!p.target) {
    return FailedPreconditionError(absl::StrCat(p.id,
                                                ": a warm start needs target solutions; task '",
                                                s.task->name(), "' gave none for this prompt"));
  }
  rollout::Trajectory t;
  RELAY_ASSIGN_OR_RETURN(t.prompt_tokens, s.tokenizer->encode(p.prompt));
  RELAY_ASSIGN_OR_RETURN(t.response_tokens, s.tokenizer->encode(*p.target));
  const size_t n = t.response_tokens.size();
  t.behavior_logprobs.assign(n, std::numeric_limits<float>::quiet_NaN());
  t.token_versions.assign(n, version);
  t.proximal_logprobs.assign(n, std::numeric_limits<float>::quiet_NaN());
  t.proximal_versions.assign(n, -1);
  t.offpolicy_mask.assign(n, 1);
  t.version_digests = {{version, 0}};
  t.reward = 1.0;
  rollout::TrajectoryGroup g;
  g.group_id = p.id;
  g.trajectories.push_back(std::move(t));
  return g;
}

StatusOr<int64_t> warm_start(
    const RolloutSetup& s, const trainer::TrainerOptions& options, const PromptSplit& split,
    int64_t version, const WarmStart& ws,
    const std::function<void(int64_t, const trainer::StepMetrics&)>& on_step,
    const trainer::DataParallel& dp) {
  RELAY_ASSIGN_OR_RETURN(
      std::unique_ptr<trainer::Trainer> sft,
      trainer::Trainer::create(s.policy, warm_start_options(options, ws), version, nullptr, dp));
  for (int64_t k = 0; k < ws.steps; ++k) {
    std::vector<rollout::TrajectoryGroup> demos;
    for (int64_t i = 0; i < ws.batch; ++i) {
      RELAY_ASSIGN_OR_RETURN(rollout::TrajectoryGroup d,
                             demonstration(s, split.train_index(k * ws.batch + i), sft->version()));
      d.group_id = absl::StrCat(d.group_id, "#", i);
      demos.push_back(std::move(d));
    }
    RELAY_ASSIGN_OR_RETURN(trainer::StepMetrics m, sft->sft_step(demos));
    if (on_step) on_step(k + 1, m);
  }
  return sft->version();
}

trainer::TrainerOptions warm_start_options(const trainer::TrainerOptions& options,
                                           const WarmStart& ws) {
  trainer::TrainerOptions sft = options;
  sft.optimizer.lr = ws.lr;
  return sft;
}

}  // namespace relay::app
