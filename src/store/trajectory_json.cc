#include "relay/store/trajectory_json.h"

#include <cmath>

namespace relay::store {

nlohmann::json nullable_floats(const std::vector<float>& values) {
  nlohmann::json out = nlohmann::json::array();
  for (float v : values) out.push_back(std::isfinite(v) ? nlohmann::json(v) : nlohmann::json());
  return out;
}

nlohmann::json episode_turns_json(const std::vector<rollout::EpisodeTurn>& turns) {
  nlohmann::json out = nlohmann::json::array();
  for (const rollout::EpisodeTurn& turn : turns) {
    out.push_back(
        {{"model_end", turn.model_end},
         {"env_end", turn.env_end},
         {"reward", std::isfinite(turn.reward) ? nlohmann::json(turn.reward) : nlohmann::json()},
         {"tool_calls", turn.tool_calls},
         {"tool_errors", turn.tool_errors}});
  }
  return out;
}

}  // namespace relay::store
