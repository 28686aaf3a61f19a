#include "relay/rollout/generate.h"

#include <torch/torch.h>

#include <algorithm>

#include "relay/model/kv_cache.h"

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

StatusOr<std::vector<Generation>> generate(model::PolicyImpl& policy,
                                           const std::vector<std::vector<int64_t>>& prompts,
                                           const GenerateOptions& options) {
  RELAY_RETURN_IF_ERROR(validate(options.sampling));
  if (options.max_new_tokens < 1) {
    return InvalidArgumentError(
        absl::StrCat("max_new_tokens: must be >= 1, got ", options.max_new_tokens));
  }
  const model::PolicyConfig& config = policy.config();
  RELAY_RETURN_IF_ERROR(
      validate_prompts(prompts, config.vocab_size, config.max_position_embeddings));

  torch::NoGradGuard no_grad;
  const int64_t B = static_cast<int64_t>(prompts.size());
  int64_t longest = 0;
  for (const auto& p : prompts) longest = std::max<int64_t>(longest, p.size());
  const int64_t capacity =
      std::min(config.max_position_embeddings, longest + options.max_new_tokens);
  const at::Tensor& weight = policy.model->embed_tokens->weight;
  model::KVCache cache(config, B, capacity, weight.scalar_type(), weight.device());

  std::vector<SequenceRng> rngs;
  for (int64_t i = 0; i < B; ++i) rngs.emplace_back(sequence_seed(options.seed, i));
  std::vector<Generation> out(B);

  try {
    // Prefill every prompt at once (right-padded).
    at::Tensor ids = torch::zeros({B, longest}, torch::kInt64);
    std::vector<int64_t> lens(B);
    for (int64_t b = 0; b < B; ++b) {
      lens[b] = static_cast<int64_t>(prompts[b].size());
      ids[b].narrow(0, 0, lens[b]).copy_(torch::tensor(prompts[b], torch::kInt64));
    }
    std::vector<int64_t> live(B);
    for (int64_t b = 0; b < B; ++b) live[b] = b;  // row -> slot (== prompt index)
    at::Tensor logits = policy.extend(ids, torch::tensor(lens), torch::tensor(live), cache);

    while (!live.empty()) {
      std::vector<double> u;
      for (int64_t slot : live) u.push_back(rngs[slot].uniform());
      SampleResult s = sample(logits, torch::tensor(u, torch::kFloat64), options.sampling);
      // One host round trip per step: the tokens decide who stops.
      at::Tensor tokens = s.tokens.to(torch::kCPU);
      at::Tensor logprobs = s.logprobs.to(torch::kCPU);
      at::Tensor raw = s.raw_logprobs.defined() ? s.raw_logprobs.to(torch::kCPU) : at::Tensor();

      std::vector<int64_t> next_live, next_tokens;
      for (size_t row = 0; row < live.size(); ++row) {
        const int64_t slot = live[row];
        const int64_t token = tokens[row].item<int64_t>();
        Generation& g = out[slot];
        g.tokens.push_back(token);
        g.logprobs.push_back(logprobs[row].item<float>());
        if (options.sampling.record_raw_logprobs) g.raw_logprobs.push_back(raw[row].item<float>());
        const bool stop = std::find(options.stop_tokens.begin(), options.stop_tokens.end(),
                                    token) != options.stop_tokens.end();
        if (stop) {
          g.finish_reason = FinishReason::kStop;
        } else if (static_cast<int64_t>(g.tokens.size()) < options.max_new_tokens &&
                   static_cast<int64_t>(prompts[slot].size() + g.tokens.size()) <
                       config.max_position_embeddings) {
          next_live.push_back(slot);
          next_tokens.push_back(token);
        }
      }
      live.swap(next_live);
      if (live.empty()) break;
      const int64_t n = static_cast<int64_t>(live.size());
      logits = policy.extend(torch::tensor(next_tokens).view({n, 1}),
                             torch::ones({n}, torch::kInt64), torch::tensor(live), cache);
    }
  } catch (const c10::Error& e) {
    return InternalError(absl::StrCat("generate: ", e.what_without_backtrace()));
  }
  return out;
}

}  // namespace relay::rollout
