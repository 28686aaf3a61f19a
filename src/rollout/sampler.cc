#include "relay/rollout/sampler.h"

#include <torch/types.h>
#include <torch/utils.h>

#include <limits>

namespace relay::rollout {

at::Tensor sampling_logprobs(const at::Tensor& logits, const SamplingOptions& o) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  at::Tensor z = logits.to(torch::kFloat32);
  if (o.temperature != 1.0) z = z / o.temperature;
  const int64_t V = z.size(-1);
  if (o.top_k > 0 && o.top_k < V) {
    at::Tensor keep =
        torch::zeros_like(z, torch::kBool).scatter(1, std::get<1>(z.topk(o.top_k, -1)), true);
    z = z.masked_fill(keep.logical_not(), kNegInf);
  }
  if (o.top_p < 1.0) {
    // Drop a token when the tokens more likely than it already hold >= top_p
    // of the mass; the most likely token is always kept.
    auto sorted = z.sort(-1, /*descending=*/true);
    at::Tensor p = torch::softmax(std::get<0>(sorted), -1);
    at::Tensor mass_before = p.cumsum(-1) - p;
    at::Tensor drop_sorted = mass_before.ge(o.top_p);
    at::Tensor drop = torch::zeros_like(drop_sorted).scatter(1, std::get<1>(sorted), drop_sorted);
    z = z.masked_fill(drop, kNegInf);
  }
  return torch::log_softmax(z, -1);
}

SampleResult sample(const at::Tensor& logits, const at::Tensor& uniforms,
                    const SamplingOptions& o) {
  TORCH_CHECK(logits.dim() == 2, "sample: logits must be [B, V], got ", logits.sizes());
  TORCH_CHECK(uniforms.numel() == logits.size(0), "sample: need one uniform per row");
  SampleResult r;
  if (o.greedy || o.record_raw_logprobs) {
    r.raw_logprobs = torch::log_softmax(logits.to(torch::kFloat32), -1);
  }
  if (o.greedy) {
    r.tokens = logits.argmax(-1);
    r.raw_logprobs = r.raw_logprobs.gather(1, r.tokens.unsqueeze(1)).squeeze(1);
    r.logprobs = r.raw_logprobs;
    return r;
  }
  at::Tensor logp = sampling_logprobs(logits, o);
  // Inverse CDF on exp(logp): the first index whose cumulative mass reaches
  // u * total. Zero-probability tokens add no mass, so they are never chosen.
  at::Tensor cdf = logp.exp().to(torch::kFloat64).cumsum(-1);
  at::Tensor target =
      uniforms.to(cdf.device(), torch::kFloat64).view({-1, 1}) * cdf.narrow(1, cdf.size(1) - 1, 1);
  r.tokens = torch::searchsorted(cdf, target).squeeze(1).clamp_max(logits.size(1) - 1);
  r.logprobs = logp.gather(1, r.tokens.unsqueeze(1)).squeeze(1);
  if (o.record_raw_logprobs) {
    r.raw_logprobs = r.raw_logprobs.gather(1, r.tokens.unsqueeze(1)).squeeze(1);
  }
  return r;
}

at::Tensor tempered_logprobs(const at::Tensor& logits, const at::Tensor& tokens,
                             double temperature) {
  at::Tensor z = logits.to(torch::kFloat32);
  if (temperature != 1.0) z = z / temperature;
  at::Tensor index = tokens.to(z.device(), torch::kInt64).view({-1, 1});
  return (z.gather(1, index) - z.logsumexp(-1, /*keepdim=*/true)).squeeze(1);
}

uint64_t sequence_seed(uint64_t seed, uint64_t index) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (index + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace relay::rollout
