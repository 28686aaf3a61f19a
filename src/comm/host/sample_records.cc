#include "relay/comm/host/sample_records.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace relay::comm {
namespace {

std::string piece(const model::Tokenizer& tokenizer, int64_t id) {
  StatusOr<std::string> text = tokenizer.decode({id});
  return text.ok() ? *std::move(text) : absl::StrCat("<id ", id, ">");
}

std::string prompt_text(const model::Tokenizer& tokenizer, const std::vector<int64_t>& ids) {
  StatusOr<std::string> text = tokenizer.decode(ids);
  return text.ok() ? *std::move(text) : absl::StrCat("<ids ", absl::StrJoin(ids, ","), ">");
}

}  // namespace

std::vector<SampleRecord> sample_records(const std::vector<rollout::TrajectoryGroup>& groups,
                                         const model::Tokenizer& tokenizer, size_t max_samples) {
  std::vector<SampleRecord> out;
  for (size_t j = 0; out.size() < max_samples; ++j) {
    bool any = false;  // does some group have a sample j?
    for (const rollout::TrajectoryGroup& g : groups) {
      if (j >= g.trajectories.size()) continue;
      any = true;
      if (out.size() == max_samples) break;
      const rollout::Trajectory& t = g.trajectories[j];
      SampleRecord r;
      r.group_id = g.group_id;
      r.prompt = prompt_text(tokenizer, t.prompt_tokens);
      r.token_ids = t.response_tokens;
      for (int64_t id : t.response_tokens) r.pieces.push_back(piece(tokenizer, id));
      r.logprobs = t.behavior_logprobs;
      r.versions = t.token_versions;
      r.reward = t.reward;
      r.finish_reason = rollout::finish_reason_name(t.finish_reason);
      r.env_mask = t.env_mask;
      if (!t.routed_experts.empty()) {
        // Response token j came from position P - 1 + j's routing.
        const size_t P = t.prompt_tokens.size(), L = t.routing_layers, k = t.routing_top_k;
        for (size_t j = 0; j < t.response_tokens.size(); ++j) {
          std::vector<std::vector<int32_t>> layers;
          for (size_t l = 0; l < L; ++l) {
            const auto at = t.routed_experts.begin() + ((P - 1 + j) * L + l) * k;
            layers.emplace_back(at, at + k);
          }
          r.routing.push_back(std::move(layers));
        }
      }
      out.push_back(std::move(r));
    }
    if (!any) break;
  }
  return out;
}

}  // namespace relay::comm
