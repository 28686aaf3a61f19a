#pragma once

// Prefix-guided sampling (LUFFY; seeds/003): for a prompt with a target
// solution, some of its K samples start from a forced prefix of the target
// and the policy continues from there. This file is the schedule: which
// samples get a prefix and how long it is. Pure functions of their inputs.
//
// Strategies, for training step s over `steps` steps, ratios in [lo, hi]
// (min_ratio, max_ratio):
//   random          uniform in [lo, hi]
//   linear          hi - (hi - lo) * min(s / steps, 1), the same for every sample
//   linear_max      uniform in [lo, lo + (hi - lo) * (10 - w) / 10], w = window
//                   min(floor(10 s / steps), 9): the upper bound falls in ten
//                   steps from hi to lo + (hi - lo) / 10
//   reverse_linear  uniform in [lo, lo + (hi - lo) * (w + 1) / 10]: the upper
//                   bound rises in ten steps to hi
//   fixed           the n prefixed samples take n evenly spaced ratios
//                   lo, lo + (hi - lo) / (n - 1), ..., hi (lo alone when n = 1)
// share_across_group: one draw per group, used by all its prefixed samples.
// The first n_prefix samples of a group get the prefix (-1 = all), the rest
// ratio 0. A prefix is floor(ratio x target length) tokens, at most max_len.

#include <cstdint>
#include <vector>

#include "relay/rollout/engine_options.h"

namespace relay::rollout {

// PrefixOptions and PrefixStrategy are declared with the engine's options
// (relay/rollout/engine_options.h), and check(PrefixOptions) states their rules.

// Ratios for the k samples of one group at training step `step`, drawn from a
// stream seeded by `seed` (the same inputs give the same ratios). Samples
// without a prefix get 0.
std::vector<double> prefix_ratios(const PrefixOptions& options, int k, int64_t step, uint64_t seed);

// floor(ratio x target_len), capped at max_len.
int64_t prefix_length(double ratio, int64_t target_len, int64_t max_len);

}  // namespace relay::rollout
