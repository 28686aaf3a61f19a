#pragma once

// One-shot generation for people and tools (`relay generate`): each prompt
// sampled once, by the rollout engine (engine.h) with one slot per prompt and
// no weight updates.

#include <cstdint>
#include <string>
#include <vector>

#include "relay/common/status.h"
#include "relay/model/policy.h"
#include "relay/rollout/sampler.h"
#include "relay/rollout/trajectory.h"

namespace relay::rollout {

struct GenerateOptions {
  int64_t max_new_tokens = 16;  // >= 1
  SamplingOptions sampling;
  std::vector<int64_t> stop_tokens;  // a sampled stop token ends its sequence (and is kept)
  // Prompt i is a group of one sample with seed sequence_seed(seed, i).
  uint64_t seed = 0;
};

struct Generation {
  std::vector<int64_t> tokens;      // new tokens only
  std::vector<float> logprobs;      // behavior log-prob of each new token
  std::vector<float> raw_logprobs;  // temperature-1 untruncated, when requested
  FinishReason finish_reason = FinishReason::kLength;
};

// Fails with InvalidArgument (naming the prompt and position) on an empty
// prompt, a token id outside the vocabulary, or a prompt that leaves no room
// in max_position_embeddings; and on invalid sampling options. A sequence
// also stops ("length") when it reaches max_position_embeddings.
StatusOr<std::vector<Generation>> generate(model::Policy policy,
                                           const std::vector<std::vector<int64_t>>& prompts,
                                           const GenerateOptions& options);

}  // namespace relay::rollout
