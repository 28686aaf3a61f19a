#pragma once

// Advantage estimators: pure functions over tensors (DESIGN.md, module
// `trainer`). Each follows verl's trainer/ppo/core_algos.py (GRPO-split:
// LUFFY's mix_core_alg.py); where relay differs, the function says so.
//
// Shapes. A batch has B trajectories. Per trajectory, [B]: `rewards` (fp32
// outcome reward), `group_index` (int64 prompt-group id; ids are arbitrary,
// need not be contiguous or sorted). Per token, response-aligned [B, L]
// (token j of trajectory b's response at [b, j]) with `response_mask` (bool or
// numeric; non-zero = a real response token that is trained on).
//
// Results are [B, L] fp32 and exactly 0 wherever the mask is 0. Outcome-reward
// estimators broadcast one scalar per trajectory over its masked tokens.
// They are constants to the loss: computed without autograd (a critic's values
// may require grad; the results do not).
//
// Errors: compute_advantages() and the data controls validate their inputs
// and answer InvalidArgument naming the argument. The building blocks below
// them REQUIRE validated inputs (LibTorch throws c10::Error otherwise).

#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

#include "relay/common/status.h"
#include "relay/trainer/options.h"

namespace relay::trainer {

struct AdvantageInputs {
  at::Tensor rewards;        // [B] float: outcome reward (not needed by REINFORCE++ / GAE / ReMax
                             // when token_rewards are given)
  at::Tensor group_index;    // [B] int64: prompt group; required by group estimators
  at::Tensor response_mask;  // [B, L] bool or numeric; required
  // Optional, undefined = absent.
  at::Tensor offpolicy;       // [B] bool: trajectory has forced prefix tokens (GRPO-split)
  at::Tensor offpolicy_mask;  // [B, L] bool: which tokens were forced (GRPO-split weighting)
  at::Tensor
      token_rewards;  // [B, L] float: REINFORCE++ / GAE / ReMax; default: reward on last token
  at::Tensor values;  // [B, L] float: critic values V(s_t), GAE only
  at::Tensor baseline_rewards;  // [B] float: reward of the greedy response, ReMax only
};

struct AdvantageOutputs {
  at::Tensor advantages;  // [B, L] fp32, 0 outside the mask
  at::Tensor returns;     // [B, L] fp32, 0 outside the mask: value targets (GAE),
                          // discounted returns (REINFORCE++), reward-to-go (ReMax);
                          // else = advantages
};

// Validates `inputs` for `options.estimator` and runs it. InvalidArgument,
// e.g. "rewards: 3 entries for 4 trajectories", "values: required by gae",
// "group_index: group 7 has 1 sample; grpo_passk needs >= 2".
StatusOr<AdvantageOutputs> compute_advantages(const AdvantageInputs& inputs,
                                              const AdvantageOptions& options);

// ---- Building blocks. REQUIRE validated shapes; rewards/returns are [B] fp32
// per trajectory unless said otherwise. Groups of size 1 follow verl: baseline
// 0 (and std 1 where a std is used).

// GRPO (DeepSeekMath, verl compute_grpo_outcome_advantage):
//   A_i = (r_i - mean_g) / (s + eps), s = std_g (unbiased), batch std, or no
//   division (kNone; Dr. GRPO, arXiv 2503.20783). Size-1 group: mean 0, std 1.
at::Tensor grpo_outcome_advantages(const at::Tensor& rewards, const at::Tensor& group_index,
                                   StdScale std_scale, double epsilon);

// RLOO (arXiv 2402.14740): A_i = r_i - mean_{j != i} r_j = K/(K-1) (r_i - mean_g).
// A group of size 1 has no leave-one-out baseline: A = 0 (verl leaves r).
at::Tensor rloo_outcome_advantages(const at::Tensor& rewards, const at::Tensor& group_index);

// OPO (arXiv 2505.23585): A_i = r_i - b_g, b_g = sum_j len_j r_j / sum_j len_j,
// len = masked response length [B]. Size-1 group: b = 0.
at::Tensor opo_outcome_advantages(const at::Tensor& rewards, const at::Tensor& group_index,
                                  const at::Tensor& lengths);

// GRPO pass@k (arXiv 2503.19595, verl compute_grpo_passk_outcome_advantage):
// in each group only the best sample (lowest row among ties) is non-zero,
// A = (r_max - r_second_max) [/ (std_g + eps) when norm_by_std].
// REQUIRES every group to have >= 2 samples.
at::Tensor grpo_passk_outcome_advantages(const at::Tensor& rewards, const at::Tensor& group_index,
                                         bool norm_by_std, double epsilon);

// GRPO-split (LUFFY compute_grpo_outcome_advantage_split): mean_g and std_g
// (unbiased) over the group's ON-policy samples only (`offpolicy` [B] bool
// false); std 0 -> 1; one on-policy sample -> mean 0, std 1; none -> mean 0,
// std 1 as well (LUFFY raises). Every sample, on- or off-policy, gets
// A_i = (r_i - mean_g) [/ (std_g + eps)]. The alpha/beta weights are applied by
// compute_advantages (see prefix_reward_weight_*).
at::Tensor grpo_split_outcome_advantages(const at::Tensor& rewards, const at::Tensor& group_index,
                                         const at::Tensor& offpolicy, bool norm_by_std,
                                         double epsilon);

// REINFORCE++-baseline (arXiv 2501.03262): r_i - mean_g (size 1: mean 0),
// broadcast over the mask; compute_advantages then whitens it over the batch.
at::Tensor group_mean_baseline_advantages(const at::Tensor& rewards, const at::Tensor& group_index);

// [B] -> [B, L] fp32: the outcome reward on each trajectory's last masked
// token, 0 elsewhere (and all 0 for an empty mask).
at::Tensor outcome_to_token_rewards(const at::Tensor& rewards, const at::Tensor& response_mask);

// REINFORCE++ returns, [B, L]: G_t = r_t + gamma G_{t+1} over masked tokens.
// A masked-out token inside a response (tool output) neither adds its reward
// nor discounts: the return passes through it (verl resets there, which only
// differs from this for masks with holes). 0 outside the mask.
at::Tensor discounted_returns(const at::Tensor& token_rewards, const at::Tensor& response_mask,
                              double gamma);

// verl masked_whiten, then masked: (x - mean) * rsqrt(var + 1e-8) with the
// mean and the unbiased (Bessel) variance over masked entries; 0 outside the
// mask. REQUIRES >= 2 masked entries.
at::Tensor masked_whiten(const at::Tensor& values, const at::Tensor& response_mask);

struct ReturnsAndAdvantages {
  at::Tensor advantages;  // [B, L], 0 outside the mask
  at::Tensor returns;     // [B, L], 0 outside the mask
};

// ReMax (arXiv 2310.10505, verl compute_remax_outcome_advantage), dense form:
//   G_t = sum_{t' >= t} r_t' over the masked tokens (undiscounted reward-to-go)
//   A_t = G_t - b,  b = baseline_rewards [B] (the greedy response's reward)
// With the outcome reward on the last token (outcome_to_token_rewards), G_t = r
// on every token and A = r - b. Tokens outside the mask hold 0 (verl leaves
// the running sum there; no loss reads those entries).
ReturnsAndAdvantages remax_returns_advantages(const at::Tensor& token_rewards,
                                              const at::Tensor& baseline_rewards,
                                              const at::Tensor& response_mask);

struct GaeResult {
  at::Tensor advantages;  // [B, L] BEFORE whitening, 0 outside the mask
  at::Tensor returns;     // [B, L] = advantages + values, 0 outside the mask
};
// GAE (arXiv 1506.02438, verl compute_gae_advantage_return):
//   delta_t = r_t + gamma V_{t+1} - V_t,  A_t = delta_t + gamma lambda A_{t+1},
// where "t+1" is the next MASKED token (values and TD errors of masked-out
// tokens are skipped), V and A beyond the last token are 0.
GaeResult gae_advantages_returns(const at::Tensor& token_rewards, const at::Tensor& values,
                                 const at::Tensor& response_mask, double gamma, double lambda);

// ---- Data controls.

struct EqualRewardGroups {
  at::Tensor keep;                 // [B] bool: false for every sample of a dropped group
  int64_t num_groups = 0;          // distinct group ids
  int64_t num_dropped_groups = 0;  // groups whose rewards are all equal (size 1 included)
};
// DAPO dynamic sampling (arXiv 2503.14476): a group whose rewards are all
// exactly equal has zero GRPO advantage everywhere and only dilutes the batch;
// callers drop it (and may sample more). InvalidArgument for bad shapes.
StatusOr<EqualRewardGroups> groups_with_equal_rewards(const at::Tensor& rewards,
                                                      const at::Tensor& group_index);

// DAPO overlong filtering: the response mask with the rows of trajectories
// truncated by the length limit (`truncated` [B] bool) zeroed, so they are not
// trained on. Same dtype as `response_mask`. InvalidArgument for bad shapes.
StatusOr<at::Tensor> overlong_mask(const at::Tensor& response_mask, const at::Tensor& truncated);

// DAPO soft overlong punishment (OverlongBufferOptions): per trajectory, [B]
// fp32 <= 0, min(-(R - (max_length - buffer)) / buffer * penalty_factor, 0)
// for R = `response_lengths` [B] (int). Add it to the rewards.
// InvalidArgument for bad shapes or buffer outside [1, max_length).
StatusOr<at::Tensor> overlong_penalty(const at::Tensor& response_lengths, int64_t max_length,
                                      int64_t buffer, double penalty_factor);

// On-policy distillation's advantage (DistillMode::kAdvantage; Thinking
// Machines' on-policy distillation, tinker-cookbook's incorporate_kl_penalty):
// per token -coef * (student - teacher) on the mask, 0 elsewhere; with
// discount > 0 each position gets its own value plus discount times the
// next position's result (discounted_future_sum, over every position of the
// response, masked ones counting as 0). [B, L] fp32; log-probs [B, L], NaN
// allowed outside the mask. InvalidArgument for bad shapes.
StatusOr<at::Tensor> distill_advantages(const at::Tensor& student_logprobs,
                                        const at::Tensor& teacher_logprobs,
                                        const at::Tensor& response_mask, double coef,
                                        double discount);

}  // namespace relay::trainer
