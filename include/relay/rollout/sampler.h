#pragma once

// Next-token sampling that records the behavior log-prob (DESIGN.md
// invariant 1): the token is drawn from exp(logp), where logp is the
// temperature-scaled, top-k/top-p-truncated and renormalised log-softmax, and
// the recorded value is logp[token] read from that same tensor (the fused
// CPU path below: from the same maximum and sum it samples with). There is
// no second softmax that could disagree with the one sampled from.
//
// What is recorded when truncation is on: the log-prob under the truncated,
// renormalised distribution (the one actually sampled from). Trainers that
// want the model's own distribution ask for raw_logprobs as well: the
// log-prob at temperature 1 with no truncation.
//
// Randomness is per sequence: each row brings its own uniform draw, made by
// its request's SequenceRng, so a sequence samples the same tokens whatever
// else shares the batch (continuous batching reorders batches freely).

#include <cstdint>
#include <random>

#include <ATen/core/Tensor.h>

#include "relay/common/status.h"
#include "relay/rollout/engine_options.h"

namespace relay::rollout {

// SamplingOptions and its rules (check) are in relay/rollout/engine_options.h.

struct SampleResult {
  at::Tensor tokens;        // [B] int64
  at::Tensor logprobs;      // [B] fp32: behavior log-prob of each token (see above)
  at::Tensor raw_logprobs;  // [B] fp32 when requested (or greedy), else undefined
};

// logits [B, V] (any float dtype); uniforms [B] fp64 in (0, 1), one per row.
// Sampling is by inverse CDF on the truncated distribution; a token of zero
// probability is never chosen.
//
// On the CPU without truncation each row is sampled by a fused pass (the
// maximum, exp(z - max) with sums by block, the walk to u * total) on the
// kernel pool, with no [B, V] temporaries; the recorded log-prob is
// z - max - log(total) from the same sums. It agrees with the batched ops
// (sampling_logprobs, a cumulative sum, a sorted search) to fp32 rounding:
// a uniform within ~1e-7 of a bucket's edge may pick the neighbouring token.
// Truncation, greedy decoding and other devices take the batched ops.
SampleResult sample(const at::Tensor& logits, const at::Tensor& uniforms,
                    const SamplingOptions& options);

// Whether `options` change the distribution beyond the temperature over a
// vocabulary of `vocab` tokens: top-k below the vocabulary, or top-p below 1.
// Then the recorded log-prob is the truncated distribution's, not the
// model's own at the temperature.
bool truncates(const SamplingOptions& options, int64_t vocab);

// Off: sample() always takes the batched ops (tests and benchmarks compare
// the two). On by default; process-wide.
void set_fused_sampler(bool on);

// The sampling distribution itself: log-softmax of the temperature-scaled,
// truncated logits, [B, V] fp32 with -inf for removed tokens. sample() reads
// its recorded log-probs from this tensor.
at::Tensor sampling_logprobs(const at::Tensor& logits, const SamplingOptions& options);

// log softmax(logits / temperature)[token] for each row, fp32, no truncation:
// the policy's own log-prob of `tokens` [B] at that temperature, as score()
// computes it. Used for forced tokens and proximal values.
at::Tensor tempered_logprobs(const at::Tensor& logits, const at::Tensor& tokens,
                             double temperature);

// A sequence's own random stream: the same seed gives the same draws on every
// platform (mt19937_64 is fully specified; the conversion to (0, 1) is ours).
class SequenceRng {
 public:
  explicit SequenceRng(uint64_t seed) : engine_(seed) {}
  // Uniform in the open interval (0, 1).
  double uniform() { return (static_cast<double>(engine_() >> 11) + 0.5) * 0x1.0p-53; }

 private:
  std::mt19937_64 engine_;
};

// Seed for request `index` of a run seeded with `seed` (splitmix64 mixing, so
// neighbouring indices get unrelated streams).
uint64_t sequence_seed(uint64_t seed, uint64_t index);

}  // namespace relay::rollout
