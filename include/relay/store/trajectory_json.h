#pragma once

// Pieces of a trajectory as JSON, shared by what writes them for people
// (`relay rollout --out`, `relay store inspect --json`), so both spell them
// the same way.

#include <nlohmann/json.hpp>

#include <vector>

#include "relay/rollout/trajectory.h"

namespace relay::store {

// Per-token floats with the unknown ones (NaN: a missing log-prob, an
// environment token's) as null.
nlohmann::json nullable_floats(const std::vector<float>& values);

// An episode's turns: model_end, env_end, reward (null when none),
// tool_calls, tool_errors.
nlohmann::json episode_turns_json(const std::vector<rollout::EpisodeTurn>& turns);

}  // namespace relay::store
