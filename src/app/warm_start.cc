#include "relay/app/warm_start.h"

#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "relay/env/tool_prompt.h"
#include "relay/model/chat_template.h"

namespace relay::app {

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Appends `ids` to t's response: the model's (a demonstration's, so forced)
// or the environment's.
void append(rollout::Trajectory& t, const std::vector<int64_t>& ids, int64_t version, bool env) {
  for (int64_t id : ids) {
    t.response_tokens.push_back(id);
    t.behavior_logprobs.push_back(kNaN);
    t.token_versions.push_back(version);
    t.proximal_logprobs.push_back(kNaN);
    t.proximal_versions.push_back(-1);
    t.offpolicy_mask.push_back(env ? 0 : 1);
    t.env_mask.push_back(env ? 1 : 0);
  }
}

// An episode's demonstration: the target is the model's first turn; the
// environment answers it exactly as it answers a sampled turn (made and
// reset for the task instance, its messages rendered in the chat template
// and tokenized once); then the reference, as the template writes a reply,
// is the model's next turn. A target the environment takes for the final
// answer is the whole episode. The environment's tokens stay out of the
// loss (env_mask), as in RL.
Status episode_demonstration(const RolloutSetup& s, const rollout::TaskPrompt& p, int64_t version,
                             rollout::Trajectory& t) {
  const std::string eot = model::end_of_turn(s.chat_template);
  std::string turn = *p.target;  // the chat wrapper ended it with the end-of-turn token
  if (!eot.empty() && turn.size() >= eot.size() &&
      turn.compare(turn.size() - eot.size(), eot.size(), eot) == 0) {
    turn.resize(turn.size() - eot.size());
  }
  RELAY_ASSIGN_OR_RETURN(std::vector<int64_t> first, s.tokenizer->encode(*p.target));
  RELAY_ASSIGN_OR_RETURN(std::unique_ptr<env::Environment> environment, s.environment->make());
  RELAY_RETURN_IF_ERROR(environment->reset(episode_start(p)));
  StatusOr<env::EnvStep> step = environment->step({0, turn});
  if (!step.ok()) {
    return Status(step.status().code(), absl::StrCat(p.id,
                                                     ": the environment's answer to the "
                                                     "demonstration: ",
                                                     step.status().message()));
  }
  append(t, first, version, /*env=*/false);
  const auto model_end = static_cast<int64_t>(t.response_tokens.size());
  rollout::EpisodeTurn head{model_end, model_end, step->reward, step->tool_calls,
                            step->tool_errors};
  if (step->next != env::EnvStep::Next::kContinue) {
    t.turns.push_back(head);
    return OkStatus();
  }
  RELAY_ASSIGN_OR_RETURN(std::string observation,
                         env::render_observation(s.chat_template, step->messages));
  RELAY_ASSIGN_OR_RETURN(std::vector<int64_t> obs, s.tokenizer->encode(observation));
  append(t, obs, version, /*env=*/true);
  head.env_end = static_cast<int64_t>(t.response_tokens.size());
  t.turns.push_back(head);
  const std::string answer = s.chat_template == model::ChatTemplate::kNone
                                 ? p.reference
                                 : model::chat_response(s.chat_template, p.reference);
  RELAY_ASSIGN_OR_RETURN(std::vector<int64_t> last, s.tokenizer->encode(answer));
  append(t, last, version, /*env=*/false);
  const auto R = static_cast<int64_t>(t.response_tokens.size());
  t.turns.push_back({R, R, std::numeric_limits<double>::quiet_NaN()});
  return OkStatus();
}

}  // namespace

// A demonstration: the task's target solution as the response (an episode:
// the target's turn, the environment's answer, the reference).
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
  if (s.environment) {
    RELAY_RETURN_IF_ERROR(episode_demonstration(s, p, version, t));
  } else {
    RELAY_ASSIGN_OR_RETURN(std::vector<int64_t> ids, s.tokenizer->encode(*p.target));
    append(t, ids, version, /*env=*/false);
    t.env_mask.clear();  // a single response has none
  }
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
  // sft_step reads no advantages: no critic for the warm start.
  if (sft.advantage.estimator == trainer::AdvantageEstimator::kGae) {
    sft.advantage.estimator = trainer::AdvantageEstimator::kGrpo;
  }
  return sft;
}

}  // namespace relay::app
