#pragma once

// Held-out evaluation arithmetic: when a scored response counts as correct,
// and the unbiased pass@k estimate from n samples per prompt (Chen et al.,
// 2021, "Evaluating Large Language Models Trained on Code").

#include <cstdint>
#include <map>
#include <vector>

#include "relay/rollout/task.h"

namespace relay::rollout {

// A response is correct when its verifier's "correct" sub-score is >= 0.5
// (every built-in task reports one; format rewards do not count), else when
// its reward is >= 1.
bool is_correct(const Score& score);

// 1 - C(n - c, k) / C(n, k): the chance that at least one of k samples drawn
// without replacement from n, c of them correct, is correct. Computed as a
// product, so large n does not overflow. Requires 0 <= c <= n, 1 <= k <= n.
double pass_at_k(int64_t n, int64_t c, int64_t k);

// The k reported for n samples per prompt: 1, 2, 4, ... and n itself.
std::vector<int64_t> pass_at_k_values(int64_t n);

// Mean pass@k over prompts, for each k of pass_at_k_values(n), from each
// prompt's correct count out of n.
std::map<int64_t, double> mean_pass_at_k(const std::vector<int64_t>& correct_per_prompt, int64_t n);

}  // namespace relay::rollout
