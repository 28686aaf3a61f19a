#pragma once

// What the dashboard shows of a trainer step's data (docs/dashboard.md): a few
// of the sampled responses the step trained on, decoded token by token, with
// the behavior log-prob each token was drawn with.

#include <cstddef>
#include <vector>

#include "relay/common/dashboard.h"
#include "relay/model/tokenizer.h"
#include "relay/rollout/trajectory.h"

namespace relay::comm {

// Up to `max_samples` responses of `groups`, taken round-robin across groups
// (sample 0 of each group, then sample 1 of each, ...) so that a few records
// still show several prompts. Each token is decoded on its own; one the
// tokenizer cannot decode (a model vocabulary padded past the tokenizer's)
// shows as "<id N>", and an undecodable prompt as its ids, so the records
// always say what was sampled.
std::vector<SampleRecord> sample_records(const std::vector<rollout::TrajectoryGroup>& groups,
                                         const model::Tokenizer& tokenizer, size_t max_samples);

}  // namespace relay::comm
