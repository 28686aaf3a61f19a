#include "relay/rollout/generate.h"

#include <algorithm>

#include "relay/rollout/engine.h"

namespace relay::rollout {

namespace {

Status validate_prompts(const std::vector<std::vector<int64_t>>& prompts, int64_t vocab,
                        int64_t max_positions) {
  if (prompts.empty()) return InvalidArgumentError("prompts: empty");
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto& p = prompts[i];
    if (p.empty()) return InvalidArgumentError(absl::StrCat("prompts[", i, "]: empty"));
    if (static_cast<int64_t>(p.size()) >= max_positions) {
      return InvalidArgumentError(absl::StrCat("prompts[", i, "]: length ", p.size(),
                                               " leaves no room in max_position_embeddings ",
                                               max_positions));
    }
    for (size_t t = 0; t < p.size(); ++t) {
      if (p[t] < 0 || p[t] >= vocab) {
        return InvalidArgumentError(absl::StrCat("prompts[", i, "][", t, "]: token id ", p[t],
                                                 " outside the vocabulary [0, ", vocab, ")"));
      }
    }
  }
  return OkStatus();
}

}  // namespace

StatusOr<std::vector<Generation>> generate(model::Policy policy,
                                           const std::vector<std::vector<int64_t>>& prompts,
                                           const GenerateOptions& options) {
  RELAY_RETURN_IF_ERROR(check_options(options.sampling, ""));
  if (options.max_new_tokens < 1) {
    return InvalidArgumentError(
        absl::StrCat("max_new_tokens: must be >= 1, got ", options.max_new_tokens));
  }
  const model::PolicyConfig& config = policy->config();
  RELAY_RETURN_IF_ERROR(
      validate_prompts(prompts, config.vocab_size, config.max_position_embeddings));

  // One slot per prompt, each just long enough.
  int64_t longest = 0;
  for (const auto& p : prompts) longest = std::max<int64_t>(longest, p.size());
  EngineOptions eo;
  eo.num_slots = static_cast<int64_t>(prompts.size());
  eo.max_seq_len = std::min(config.max_position_embeddings, longest + options.max_new_tokens);
  eo.max_new_tokens = options.max_new_tokens;
  eo.sampling = options.sampling;
  eo.stop_tokens = options.stop_tokens;
  RELAY_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                         Engine::create(std::move(policy), eo, /*version=*/0, /*digest=*/0));
  for (size_t i = 0; i < prompts.size(); ++i) {
    PromptGroup group;
    group.group_id = std::to_string(i);
    group.prompt = prompts[i];
    group.k = 1;
    group.seed = sequence_seed(options.seed, i);
    RELAY_RETURN_IF_ERROR(engine->submit(std::move(group)));
  }
  RELAY_ASSIGN_OR_RETURN(std::vector<TrajectoryGroup> groups, engine->run());
  std::vector<Generation> out(prompts.size());
  for (TrajectoryGroup& g : groups) {
    Trajectory& t = g.trajectories.at(0);
    Generation& gen = out.at(std::stoul(g.group_id));
    gen.tokens = std::move(t.response_tokens);
    gen.logprobs = std::move(t.behavior_logprobs);
    gen.raw_logprobs = std::move(t.raw_logprobs);
    gen.finish_reason = t.finish_reason;
  }
  return out;
}

}  // namespace relay::rollout
