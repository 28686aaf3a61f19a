#include "relay/trainer/advantages.h"

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "testing/tensor_testing.h"

namespace relay::trainer {
namespace {

using ::relay::testing::AllClose;

// Expected numbers below are computed by hand (or with a few lines of plain
// Python, statistics.stdev = unbiased std), never by the code under test.
// GRPO's epsilon is the default 1e-6 throughout.

at::Tensor f32(std::vector<float> v) { return torch::tensor(v, torch::kFloat32); }
at::Tensor i64(std::vector<int64_t> v) { return torch::tensor(v, torch::kInt64); }

// Row b of the mask has lengths[b] ones, then padding.
at::Tensor mask_from_lengths(const std::vector<int64_t>& lengths, int64_t len) {
  at::Tensor m = torch::zeros({static_cast<int64_t>(lengths.size()), len}, torch::kBool);
  for (size_t b = 0; b < lengths.size(); ++b) m[b].narrow(0, 0, lengths[b]).fill_(true);
  return m;
}

// [B] expected per trajectory -> [B, L] over the mask.
at::Tensor spread(const std::vector<float>& per_row, const at::Tensor& mask) {
  return f32(per_row).unsqueeze(1) * mask.to(torch::kFloat32);
}

// The shared batch: three groups with non-contiguous, interleaved ids.
//   group 7:  rows 0, 2, 4, 6, rewards {1, 0, 0, 3}: mean 1, unbiased std sqrt(2)
//   group 3:  rows 1, 3, 5,    rewards {.5, .5, .5}: all equal, std 0
//   group 42: row 7, reward 2: a group of one
// Response lengths 4, 3, 2, 4, 1, 4, 3, 2 in L = 4.
AdvantageInputs shared_batch() {
  AdvantageInputs in;
  in.rewards = f32({1, .5, 0, .5, 0, .5, 3, 2});
  in.group_index = i64({7, 3, 7, 3, 7, 3, 7, 42});
  in.response_mask = mask_from_lengths({4, 3, 2, 4, 1, 4, 3, 2}, 4);
  return in;
}

AdvantageOutputs run(const AdvantageInputs& in, AdvantageOptions options) {
  StatusOr<AdvantageOutputs> out = compute_advantages(in, options);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : AdvantageOutputs{};
}

AdvantageOptions with(AdvantageEstimator e) {
  AdvantageOptions o;
  o.estimator = e;
  return o;
}

TEST(AdvantagesTest, Grpo) {
  const AdvantageInputs in = shared_batch();
  const AdvantageOutputs out = run(in, with(AdvantageEstimator::kGrpo));
  // A = (r - mean_g) / (std_g + eps). Group 7: (r - 1) / (sqrt 2 + 1e-6):
  // 0, -0.70710628, -0.70710628, 1.41421256. Group 3: 0 / (0 + eps) = 0.
  // Group 42 (size 1): mean 0, std 1 -> 2 / (1 + 1e-6) = 1.999998.
  const at::Tensor want =
      spread({0, 0, -0.70710628f, 0, -0.70710628f, 0, 1.41421256f, 1.999998f}, in.response_mask);
  EXPECT_TRUE(AllClose(out.advantages, want, 1e-6));
  EXPECT_TRUE(AllClose(out.returns, want, 1e-6));
  EXPECT_EQ(out.advantages.scalar_type(), torch::kFloat32);
}

TEST(AdvantagesTest, GrpoWithoutStdAndDrGrpo) {
  const AdvantageInputs in = shared_batch();
  // A = r - mean_g; group 42 has mean 0.
  const at::Tensor want = spread({0, 0, -1, 0, -1, 0, 2, 2}, in.response_mask);
  AdvantageOptions no_std = with(AdvantageEstimator::kGrpo);
  no_std.norm_by_std = false;
  EXPECT_TRUE(AllClose(run(in, no_std).advantages, want, 1e-7));
  // Dr. GRPO ignores norm_by_std = true.
  EXPECT_TRUE(AllClose(run(in, with(AdvantageEstimator::kDrGrpo)).advantages, want, 1e-7));
  AdvantageOptions none = with(AdvantageEstimator::kGrpo);
  none.std_scale = StdScale::kNone;
  EXPECT_TRUE(AllClose(run(in, none).advantages, want, 1e-7));
}

TEST(AdvantagesTest, GrpoBatchStdScale) {
  const AdvantageInputs in = shared_batch();
  AdvantageOptions o = with(AdvantageEstimator::kGrpo);
  o.std_scale = StdScale::kBatch;
  // One divisor for all: unbiased std of the 8 rewards {1,.5,0,.5,0,.5,3,2}
  // (mean 0.9375) = 1.05008503. A = (r - mean_g) / (1.05008503 + 1e-6):
  // group 7: 0, -0.95230293, -0.95230293, 1.90460585; group 3: 0; group 42: 2 / ... = 1.90460585.
  const at::Tensor want =
      spread({0, 0, -0.95230293f, 0, -0.95230293f, 0, 1.90460585f, 1.90460585f}, in.response_mask);
  EXPECT_TRUE(AllClose(run(in, o).advantages, want, 1e-6));
}

TEST(AdvantagesTest, Rloo) {
  const AdvantageInputs in = shared_batch();
  // A_i = r_i - mean_{j != i} r_j. Group 7: row 0: 1 - (0+0+3)/3 = 0; rows 2, 4:
  // 0 - (1+0+3)/3 = -4/3; row 6: 3 - (1+0+0)/3 = 8/3. Group 3: 0. Group 42
  // (size 1, no other sample): 0.
  const at::Tensor want = spread({0, 0, -4.f / 3, 0, -4.f / 3, 0, 8.f / 3, 0}, in.response_mask);
  EXPECT_TRUE(AllClose(run(in, with(AdvantageEstimator::kRloo)).advantages, want, 1e-6));
}

TEST(AdvantagesTest, Opo) {
  const AdvantageInputs in = shared_batch();
  // b_g = sum len_i r_i / sum len_i. Group 7: lengths 4, 2, 1, 3:
  // (4*1 + 2*0 + 1*0 + 3*3) / 10 = 1.3 -> -0.3, -1.3, -1.3, 1.7. Group 3: b = .5
  // -> 0. Group 42 (size 1): b = 0 -> 2.
  const at::Tensor want = spread({-0.3f, 0, -1.3f, 0, -1.3f, 0, 1.7f, 2}, in.response_mask);
  EXPECT_TRUE(AllClose(run(in, with(AdvantageEstimator::kOpo)).advantages, want, 1e-6));
}

TEST(AdvantagesTest, GrpoPassK) {
  AdvantageInputs in = shared_batch();
  // Without the size-1 group (pass@k needs two samples per group).
  in.rewards = in.rewards.narrow(0, 0, 7);
  in.group_index = in.group_index.narrow(0, 0, 7);
  in.response_mask = in.response_mask.narrow(0, 0, 7);
  // Group 7: best is row 6 (3), second best 1: (3 - 1) / (sqrt 2 + 1e-6) =
  // 1.41421256; the others 0. Group 3: a tie, 0.5 - 0.5 = 0 for the first row.
  at::Tensor want = spread({0, 0, 0, 0, 0, 0, 1.41421256f}, in.response_mask);
  EXPECT_TRUE(AllClose(run(in, with(AdvantageEstimator::kGrpoPassK)).advantages, want, 1e-6));

  AdvantageOptions no_std = with(AdvantageEstimator::kGrpoPassK);
  no_std.norm_by_std = false;
  want = spread({0, 0, 0, 0, 0, 0, 2}, in.response_mask);
  EXPECT_TRUE(AllClose(run(in, no_std).advantages, want, 1e-7));
}

TEST(AdvantagesTest, GrpoPassKTieGoesToFirstRow) {
  // Rewards {1, 3, 3}: rows 1 and 2 tie for best; row 1 gets 3 - 3 = 0, so
  // nobody moves; with {1, 3, 2}: row 1 gets 3 - 2 = 1.
  AdvantageInputs in;
  in.group_index = i64({0, 0, 0});
  in.response_mask = mask_from_lengths({1, 1, 1}, 1);
  AdvantageOptions o = with(AdvantageEstimator::kGrpoPassK);
  o.norm_by_std = false;
  in.rewards = f32({1, 3, 3});
  EXPECT_TRUE(AllClose(run(in, o).advantages, spread({0, 0, 0}, in.response_mask), 0));
  in.rewards = f32({1, 3, 2});
  EXPECT_TRUE(AllClose(run(in, o).advantages, spread({0, 1, 0}, in.response_mask), 1e-7));
}

// GRPO-split batch, three groups:
//   group 5: rows 0-3, rewards {1, 0, 1, 1}, row 0 off-policy; on-policy {0, 1, 1}
//            -> mean 2/3, unbiased std sqrt(1/3) = 0.57735027.
//   group 9: rows 4-6, rewards {1, 0, 0}, row 4 off-policy; on-policy {0, 0}
//            -> mean 0, std 0 -> 1.
//   group 2: rows 7-8, rewards {1, 1}, row 8 off-policy; one on-policy sample
//            -> mean 0, std 1.
AdvantageInputs split_batch() {
  AdvantageInputs in;
  in.rewards = f32({1, 0, 1, 1, 1, 0, 0, 1, 1});
  in.group_index = i64({5, 5, 5, 5, 9, 9, 9, 2, 2});
  in.offpolicy = torch::tensor({1, 0, 0, 0, 1, 0, 0, 0, 1}, torch::kBool);
  in.response_mask = mask_from_lengths({3, 2, 3, 1, 3, 3, 2, 1, 3}, 3);
  return in;
}

TEST(AdvantagesTest, GrpoSplitBaselineFromOnPolicyOnly) {
  const AdvantageInputs in = split_batch();
  // Group 5: (r - 2/3) / (0.57735027 + 1e-6): r = 1 -> 0.57734927, r = 0 -> -1.15469854.
  // Group 9: (r - 0) / (1 + 1e-6): 0.999999, 0, 0.
  // Group 2: (r - 0) / (1 + 1e-6): 0.999999 for both.
  const at::Tensor want = spread(
      {0.57734927f, -1.15469854f, 0.57734927f, 0.57734927f, 0.999999f, 0, 0, 0.999999f, 0.999999f},
      in.response_mask);
  const AdvantageOutputs out = run(in, with(AdvantageEstimator::kGrpoSplit));
  EXPECT_TRUE(AllClose(out.advantages, want, 1e-6));

  // Plain GRPO would put the off-policy sample into the baseline: group 5 mean
  // 3/4 instead of 2/3, so the on-policy rows differ.
  const AdvantageOutputs grpo = run(in, with(AdvantageEstimator::kGrpo));
  EXPECT_FALSE(AllClose(grpo.advantages, want, 1e-3));
}

TEST(AdvantagesTest, GrpoSplitOffPolicyRewardChangesOnlyItsOwnAdvantage) {
  AdvantageInputs in = split_batch();
  const AdvantageOutputs before = run(in, with(AdvantageEstimator::kGrpoSplit));
  in.rewards = in.rewards.clone();
  in.rewards[0] = 0.f;  // off-policy row of group 5: 1 -> 0
  const AdvantageOutputs after = run(in, with(AdvantageEstimator::kGrpoSplit));
  // Row 0: (0 - 2/3) / (0.57735027 + 1e-6) = -1.15469854; every other row unchanged.
  at::Tensor want = before.advantages.clone();
  want[0] = spread({-1.15469854f}, in.response_mask.narrow(0, 0, 1))[0];
  EXPECT_TRUE(AllClose(after.advantages, want, 1e-6));
  EXPECT_TRUE(AllClose(after.advantages.narrow(0, 1, 8), before.advantages.narrow(0, 1, 8), 0));
}

TEST(AdvantagesTest, GrpoSplitAlphaBetaWeights) {
  AdvantageInputs in = split_batch();
  AdvantageOptions o = with(AdvantageEstimator::kGrpoSplit);
  o.prefix_reward_weight_alpha = 0.5;  // off-policy
  o.prefix_reward_weight_beta = 2.0;   // on-policy
  // Per trajectory: off-policy rows x 0.5, on-policy rows x 2.
  at::Tensor want = spread({0.5f * 0.57734927f, 2 * -1.15469854f, 2 * 0.57734927f, 2 * 0.57734927f,
                            0.5f * 0.999999f, 0, 0, 2 * 0.999999f, 0.5f * 0.999999f},
                           in.response_mask);
  EXPECT_TRUE(AllClose(run(in, o).advantages, want, 1e-6));

  // Token-level, as LUFFY's prefix_mask: only the forced tokens of row 0
  // (positions 0 and 1 of 3) get alpha; its generated token 2 gets beta.
  in.offpolicy_mask = torch::zeros({9, 3}, torch::kBool);
  in.offpolicy_mask[0][0] = true;
  in.offpolicy_mask[0][1] = true;
  in.offpolicy = at::Tensor();  // derived from the mask: row 0 only
  want = spread({0.57734927f, 2 * -1.15469854f, 2 * 0.57734927f, 2 * 0.57734927f, 2 * 0.999999f, 0,
                 0, 2 * 0.999999f, 2 * 0.999999f},
                in.response_mask);
  // Rows 4 and 8 are on-policy now: group 9 on-policy {1, 0, 0}, mean 1/3,
  // std 0.57735027 -> (1 - 1/3) / 0.57735127 = 1.15469854, (0 - 1/3) / ... = -0.57734927;
  // group 2 on-policy {1, 1}: std 0 -> 1, mean 1 -> 0.
  want[4] = f32({2 * 1.15469854f, 2 * 1.15469854f, 2 * 1.15469854f});
  want[5] = f32({2 * -0.57734927f, 2 * -0.57734927f, 2 * -0.57734927f});
  want[6] = f32({2 * -0.57734927f, 2 * -0.57734927f, 0});
  want[7] = f32({0, 0, 0});
  want[8] = f32({0, 0, 0});
  want[0] = f32({0.5f * 0.57734927f, 0.5f * 0.57734927f, 2 * 0.57734927f});
  EXPECT_TRUE(AllClose(run(in, o).advantages, want, 1e-6));
}

TEST(AdvantagesTest, Remax) {
  AdvantageInputs in;
  in.rewards = f32({1, 0, 0.5});
  in.baseline_rewards = f32({0.5, 0.5, 0.5});  // reward of each prompt's greedy response
  in.response_mask = mask_from_lengths({2, 3, 1}, 3);
  const AdvantageOutputs out = run(in, with(AdvantageEstimator::kRemax));
  // A = r - r_greedy: 0.5, -0.5, 0; returns = r on every response token.
  EXPECT_TRUE(AllClose(out.advantages, spread({0.5, -0.5, 0}, in.response_mask), 1e-7));
  EXPECT_TRUE(AllClose(out.returns, spread({1, 0, 0.5}, in.response_mask), 1e-7));
}

// Dense ReMax (verl compute_remax_outcome_advantage): returns are the reverse
// cumulative sum of the token rewards, advantages returns - baseline.
//   row 0 rewards {0.1, -0.2, 1.0}, mask 3: G = {0.9, 0.8, 1.0}, b 0.5: A = {0.4, 0.3, 0.5}
//   row 1 rewards {0.3, 0.7, 9.0}, mask 2: G = {1.0, 0.7, 0} (the unmasked 9 never counts),
//         b 1: A = {0, -0.3, 0}
//   row 2 a hole: rewards {0.2, 5.0, 0.4}, mask {1, 0, 1}: G = {0.6, 0, 0.4}, b 0: A = G
TEST(AdvantagesTest, RemaxDenseRewardsAreSummedFromEachTokenOn) {
  AdvantageInputs in;
  in.token_rewards =
      torch::tensor({0.1f, -0.2f, 1.0f, 0.3f, 0.7f, 9.0f, 0.2f, 5.0f, 0.4f}).reshape({3, 3});
  in.baseline_rewards = f32({0.5, 1.0, 0.0});
  in.response_mask = torch::tensor({1, 1, 1, 1, 1, 0, 1, 0, 1}, torch::kBool).reshape({3, 3});
  const AdvantageOutputs out = run(in, with(AdvantageEstimator::kRemax));
  const at::Tensor returns =
      torch::tensor({0.9f, 0.8f, 1.0f, 1.0f, 0.7f, 0.0f, 0.6f, 0.0f, 0.4f}).reshape({3, 3});
  const at::Tensor advantages =
      torch::tensor({0.4f, 0.3f, 0.5f, 0.0f, -0.3f, 0.0f, 0.6f, 0.0f, 0.4f}).reshape({3, 3});
  EXPECT_TRUE(AllClose(out.returns, returns, 1e-6)) << out.returns;
  EXPECT_TRUE(AllClose(out.advantages, advantages, 1e-6)) << out.advantages;
  // The outcome form is the same function with the reward on the last token.
  AdvantageInputs outcome;
  outcome.rewards = f32({1, 0.25});
  outcome.baseline_rewards = f32({0.5, 0.5});
  outcome.response_mask = mask_from_lengths({3, 2}, 3);
  AdvantageInputs dense = outcome;
  dense.rewards = at::Tensor();
  dense.token_rewards = outcome_to_token_rewards(outcome.rewards, outcome.response_mask);
  EXPECT_TRUE(AllClose(run(outcome, with(AdvantageEstimator::kRemax)).advantages,
                       run(dense, with(AdvantageEstimator::kRemax)).advantages, 0));
}

TEST(AdvantagesTest, ReinforcePlusPlusOutcomeReward) {
  AdvantageInputs in;
  in.rewards = f32({1, 0});
  in.response_mask = mask_from_lengths({3, 2}, 3);
  const AdvantageOutputs out = run(in, with(AdvantageEstimator::kReinforcePlusPlus));
  // Reward on the last token, gamma 1: returns row 0 {1, 1, 1}, row 1 {0, 0, pad}.
  EXPECT_TRUE(AllClose(out.returns, spread({1, 0}, in.response_mask), 1e-7));
  // Whitened over the 5 tokens {1,1,1,0,0}: mean .6, unbiased var 1.2 / 4 = .3:
  // .4 / sqrt(.3 + 1e-8) = 0.73029673, -.6 / sqrt(.3 + 1e-8) = -1.09544510.
  EXPECT_TRUE(
      AllClose(out.advantages, spread({0.73029673f, -1.09544510f}, in.response_mask), 1e-6));
}

TEST(AdvantagesTest, ReinforcePlusPlusTokenRewardsWithDiscount) {
  AdvantageInputs in;
  in.response_mask = mask_from_lengths({3, 2}, 3);
  in.token_rewards = torch::tensor({{0.f, 0.f, 1.f}, {1.f, 0.f, 5.f}});  // 5 sits on padding
  AdvantageOptions o = with(AdvantageEstimator::kReinforcePlusPlus);
  o.gamma = 0.5;
  const AdvantageOutputs out = run(in, o);
  // G_t = r_t + .5 G_{t+1}: row 0 {.25, .5, 1}; row 1 {1, 0} (padding's 5 ignored).
  const at::Tensor returns = torch::tensor({{0.25f, 0.5f, 1.f}, {1.f, 0.f, 0.f}});
  EXPECT_TRUE(AllClose(out.returns, returns, 1e-7));
  // Whitened over {.25, .5, 1, 1, 0}: mean .55, unbiased var .8 / 4 = .2.
  const at::Tensor want =
      torch::tensor({{-0.67082038f, -0.11180340f, 1.00623056f}, {1.00623056f, -1.22983736f, 0.f}});
  EXPECT_TRUE(AllClose(out.advantages, want, 1e-6));
}

TEST(AdvantagesTest, DiscountedReturnsPassThroughMaskedTokens) {
  // A tool-output token (mask 0) inside the response: its reward 7 is not
  // counted and it does not discount. gamma .5: G_2 = 1, G_0 = 0 + .5 * 1.
  const at::Tensor mask = torch::tensor({{1, 0, 1}}, torch::kBool);
  const at::Tensor rewards = torch::tensor({{0.f, 7.f, 1.f}});
  EXPECT_TRUE(
      AllClose(discounted_returns(rewards, mask, 0.5), torch::tensor({{0.5f, 0.f, 1.f}}), 1e-7));
}

TEST(AdvantagesTest, ReinforcePlusPlusBaseline) {
  AdvantageInputs in;
  in.rewards = f32({1, 0, 5});
  in.group_index = i64({1, 1, 2});
  in.response_mask = mask_from_lengths({2, 1, 2}, 2);
  const AdvantageOutputs out = run(in, with(AdvantageEstimator::kReinforcePlusPlusBaseline));
  // r - mean_g: .5, -.5, and 5 (size-1 group, mean 0); over the 5 tokens
  // {.5, .5, -.5, 5, 5}: mean 2.1, unbiased var 28.7 / 4 = 7.175.
  // (x - 2.1) / sqrt(7.175 + 1e-8): -0.59732271, -0.97064941, 1.08264742.
  const at::Tensor want = torch::tensor(
      {{-0.59732271f, -0.59732271f}, {-0.97064941f, 0.f}, {1.08264742f, 1.08264742f}});
  EXPECT_TRUE(AllClose(out.advantages, want, 1e-6));
}

TEST(AdvantagesTest, Gae) {
  AdvantageInputs in;
  in.response_mask = mask_from_lengths({3, 2}, 3);
  in.token_rewards = torch::tensor({{0.f, 0.f, 1.f}, {0.f, 1.f, 9.f}});  // 9 on padding
  in.values = torch::tensor({{0.5f, 0.6f, 0.7f}, {0.2f, 0.4f, 3.f}});    // 3 on padding
  in.values.requires_grad_(true);  // a critic's output: the results must not carry grad
  AdvantageOptions o = with(AdvantageEstimator::kGae);
  o.gamma = 0.9;
  o.lambda = 0.8;
  const AdvantageOutputs out = run(in, o);
  // delta_t = r_t + .9 V_{t+1} - V_t, A_t = delta_t + .72 A_{t+1}.
  // Row 0: delta = {.04, .03, .3}: A_2 = .3, A_1 = .03 + .216 = .246,
  //        A_0 = .04 + .72 * .246 = .21712.
  // Row 1: delta = {.16, .6}: A_1 = .6, A_0 = .16 + .432 = .592.
  // Returns = A + V: {.71712, .846, 1.0}, {.792, 1.0, pad 0}.
  EXPECT_TRUE(
      AllClose(out.returns, torch::tensor({{0.71712f, 0.846f, 1.f}, {0.792f, 1.f, 0.f}}), 1e-6));
  // Whitened over {.21712, .246, .3, .592, .6} (mean .391024, unbiased var .0359056).
  const at::Tensor want =
      torch::tensor({{-0.91775898f, -0.76534800f, -0.48036901f}, {1.06062844f, 1.10284755f, 0.f}});
  EXPECT_TRUE(AllClose(out.advantages, want, 1e-5));
  EXPECT_FALSE(out.advantages.requires_grad());
  EXPECT_FALSE(out.returns.requires_grad());
}

TEST(AdvantagesTest, GaeSkipsMaskedTokens) {
  // Mask {1, 0, 1}: the middle token's value and reward are skipped, so token
  // 0 bootstraps from token 2: delta_2 = 1 - .7 = .3, A_2 = .3;
  // delta_0 = 0 + .9 * .7 - .5 = .13, A_0 = .13 + .72 * .3 = .346.
  const GaeResult g =
      gae_advantages_returns(torch::tensor({{0.f, 5.f, 1.f}}), torch::tensor({{0.5f, 9.f, 0.7f}}),
                             torch::tensor({{1, 0, 1}}, torch::kBool), 0.9, 0.8);
  EXPECT_TRUE(AllClose(g.advantages, torch::tensor({{0.346f, 0.f, 0.3f}}), 1e-6));
  EXPECT_TRUE(AllClose(g.returns, torch::tensor({{0.846f, 0.f, 1.f}}), 1e-6));
}

TEST(AdvantagesTest, OutcomeToTokenRewardsUsesLastMaskedToken) {
  const at::Tensor mask = torch::tensor({{1, 1, 0}, {1, 0, 1}, {0, 0, 0}}, torch::kBool);
  const at::Tensor want = torch::tensor({{0.f, 2.f, 0.f}, {0.f, 0.f, 3.f}, {0.f, 0.f, 0.f}});
  EXPECT_TRUE(AllClose(outcome_to_token_rewards(f32({2, 3, 4}), mask), want, 0));
}

// Every estimator leaves padding at exactly 0, in advantages and returns,
// and reads a float or integer mask as it reads a bool one.
TEST(AdvantagesTest, PaddingIsExactlyZeroForEveryEstimator) {
  AdvantageInputs in = shared_batch();
  // Pass@k needs groups of >= 2: put row 7 into group 7.
  in.group_index = i64({7, 3, 7, 3, 7, 3, 7, 7});
  in.offpolicy = torch::tensor({1, 0, 0, 0, 0, 1, 0, 0}, torch::kBool);
  in.values = torch::full({8, 4}, 0.25f);
  in.baseline_rewards = torch::full({8}, 0.5f);
  const at::Tensor padding = in.response_mask.logical_not();
  for (const char* name :
       {"grpo", "dr_grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "opo",
        "grpo_passk", "grpo_split", "remax", "gae"}) {
    SCOPED_TRACE(name);
    StatusOr<AdvantageEstimator> e = kAdvantageEstimatorNames.parse(name);
    ASSERT_TRUE(e.ok()) << e.status();
    const AdvantageOutputs out = run(in, with(*e));
    ASSERT_TRUE(out.advantages.defined());
    EXPECT_EQ(out.advantages.sizes(), in.response_mask.sizes());
    EXPECT_EQ(out.advantages.masked_select(padding).abs().max().item<float>(), 0.f);
    EXPECT_EQ(out.returns.masked_select(padding).abs().max().item<float>(), 0.f);
    EXPECT_TRUE(out.advantages.isfinite().all().item<bool>());

    AdvantageInputs float_mask = in;
    float_mask.response_mask = in.response_mask.to(torch::kFloat32);
    EXPECT_TRUE(AllClose(run(float_mask, with(*e)).advantages, out.advantages, 0));
    AdvantageInputs int_mask = in;
    int_mask.response_mask = in.response_mask.to(torch::kInt64);
    EXPECT_TRUE(AllClose(run(int_mask, with(*e)).advantages, out.advantages, 0));
  }
}

TEST(AdvantagesTest, GroupIdsNeedNotBeContiguous) {
  // The same batch with groups relabelled 7 -> -5, 3 -> 1000000, 42 -> 0 and
  // rows permuted gives the same advantages, row for row.
  const AdvantageInputs in = shared_batch();
  const AdvantageOutputs base = run(in, with(AdvantageEstimator::kGrpo));
  const at::Tensor perm = i64({7, 6, 5, 4, 3, 2, 1, 0});
  AdvantageInputs moved;
  moved.rewards = in.rewards.index_select(0, perm);
  moved.group_index = i64({0, -5, 1000000, -5, 1000000, -5, 1000000, -5});
  moved.response_mask = in.response_mask.index_select(0, perm);
  const AdvantageOutputs out = run(moved, with(AdvantageEstimator::kGrpo));
  EXPECT_TRUE(AllClose(out.advantages, base.advantages.index_select(0, perm), 1e-7));
}

TEST(AdvantagesTest, EstimatorNames) {
  for (const char* name :
       {"grpo", "dr_grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "opo",
        "grpo_passk", "grpo_split", "remax", "gae"}) {
    StatusOr<AdvantageEstimator> e = kAdvantageEstimatorNames.parse(name);
    ASSERT_TRUE(e.ok()) << name;
    EXPECT_EQ(std::string(kAdvantageEstimatorNames.name(*e)), name);
  }
  StatusOr<AdvantageEstimator> bad = kAdvantageEstimatorNames.parse("ppo");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("unknown advantage estimator 'ppo'"),
            absl::string_view::npos);
  EXPECT_NE(bad.status().message().find("grpo_split"), absl::string_view::npos);

  EXPECT_EQ(*kStdScaleNames.parse("none"), StdScale::kNone);
  EXPECT_EQ(*kStdScaleNames.parse("group"), StdScale::kGroup);
  EXPECT_EQ(*kStdScaleNames.parse("batch"), StdScale::kBatch);
  EXPECT_FALSE(kStdScaleNames.parse("token").ok());
}

// Table of bad inputs and the error each must name.
TEST(AdvantagesTest, InputValidation) {
  struct Case {
    std::string what;
    AdvantageEstimator estimator;
    std::function<void(AdvantageInputs&)> edit;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"short rewards", AdvantageEstimator::kGrpo,
       [](AdvantageInputs& in) {
         in.rewards = f32({1, 0, 1});
       },
       "rewards: 3 entries for 8 trajectories"},
      {"missing rewards", AdvantageEstimator::kRloo,
       [](AdvantageInputs& in) { in.rewards = at::Tensor(); }, "rewards: required by rloo"},
      {"2-D rewards", AdvantageEstimator::kGrpo,
       [](AdvantageInputs& in) {
         in.rewards = in.rewards.reshape({4, 2});
       },
       "rewards: must be 1-D [B], got shape [4, 2]"},
      {"NaN reward", AdvantageEstimator::kGrpo,
       [](AdvantageInputs& in) {
         in.rewards = in.rewards.clone();
         in.rewards[2] = NAN;
       },
       "rewards: not finite at flat index 2"},
      {"integer rewards", AdvantageEstimator::kGrpo,
       [](AdvantageInputs& in) { in.rewards = in.rewards.to(torch::kInt64); },
       "rewards: must be floating point, got Long"},
      {"missing group_index", AdvantageEstimator::kGrpo,
       [](AdvantageInputs& in) { in.group_index = at::Tensor(); }, "group_index: required by grpo"},
      {"float group_index", AdvantageEstimator::kOpo,
       [](AdvantageInputs& in) { in.group_index = in.group_index.to(torch::kFloat32); },
       "group_index: must be an integer type, got Float"},
      {"missing mask", AdvantageEstimator::kGrpo,
       [](AdvantageInputs& in) { in.response_mask = at::Tensor(); }, "response_mask: missing"},
      {"1-D mask", AdvantageEstimator::kGrpo,
       [](AdvantageInputs& in) { in.response_mask = in.response_mask.reshape({-1}); },
       "response_mask: must be 2-D [B, L], got shape [32]"},
      {"int offpolicy", AdvantageEstimator::kGrpoSplit,
       [](AdvantageInputs& in) { in.offpolicy = torch::zeros({8}, torch::kInt64); },
       "offpolicy: must be bool, got Long"},
      {"missing values", AdvantageEstimator::kGae, [](AdvantageInputs& in) {},
       "values: required by gae"},
      {"values shape", AdvantageEstimator::kGae,
       [](AdvantageInputs& in) {
         in.values = torch::zeros({8, 3});
       },
       "values: shape [8, 3] != response_mask's [8, 4]"},
      {"missing baseline", AdvantageEstimator::kRemax, [](AdvantageInputs& in) {},
       "baseline_rewards: required by remax"},
      {"pass@k group of one", AdvantageEstimator::kGrpoPassK, [](AdvantageInputs& in) {},
       "group_index: group 42 has 1 sample; grpo_passk needs >= 2 per group"},
      {"whitening one token", AdvantageEstimator::kReinforcePlusPlus,
       [](AdvantageInputs& in) {
         in.response_mask = torch::zeros({8, 4}, torch::kBool);
         in.response_mask[3][0] = true;
       },
       "response_mask: reinforce_plus_plus whitens over the batch and needs >= 2 response "
       "tokens, got 1"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    AdvantageInputs in = shared_batch();
    c.edit(in);
    StatusOr<AdvantageOutputs> out = compute_advantages(in, with(c.estimator));
    ASSERT_FALSE(out.ok());
    EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(out.status().message().find(c.message), absl::string_view::npos)
        << out.status().message();
  }
}

TEST(AdvantagesTest, OptionsValidation) {
  struct Case {
    std::function<void(AdvantageOptions&)> edit;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](AdvantageOptions& o) { o.epsilon = 0; }, "epsilon: must be > 0, got 0"},
      {[](AdvantageOptions& o) { o.gamma = 1.5; }, "gamma: must be in [0, 1], got 1.5"},
      {[](AdvantageOptions& o) { o.lambda = -0.1; }, "lambda: must be in [0, 1], got -0.1"},
      {[](AdvantageOptions& o) { o.prefix_reward_weight_alpha = NAN; },
       "prefix_reward_weight_alpha: must be finite"},
  };
  EXPECT_TRUE(check_options(AdvantageOptions{}, "advantage").ok());
  for (const Case& c : cases) {
    AdvantageOptions o;
    c.edit(o);
    const Status s = check_options(o, "advantage");
    ASSERT_FALSE(s.ok()) << c.message;
    EXPECT_NE(s.message().find(c.message), absl::string_view::npos) << s.message();
    EXPECT_FALSE(compute_advantages(shared_batch(), o).ok());
  }
}

TEST(AdvantagesDataTest, GroupsWithEqualRewards) {
  const AdvantageInputs in = shared_batch();
  StatusOr<EqualRewardGroups> g = groups_with_equal_rewards(in.rewards, in.group_index);
  ASSERT_TRUE(g.ok()) << g.status();
  // Group 7 {1,0,0,3} is kept; group 3 {.5,.5,.5} and group 42 (one sample) are dropped.
  EXPECT_TRUE(torch::equal(g->keep, torch::tensor({1, 0, 1, 0, 1, 0, 1, 0}, torch::kBool)));
  EXPECT_EQ(g->num_groups, 3);
  EXPECT_EQ(g->num_dropped_groups, 2);

  StatusOr<EqualRewardGroups> bad = groups_with_equal_rewards(in.rewards, i64({7, 3}));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("group_index: 2 entries for 8 trajectories"),
            absl::string_view::npos);
}

TEST(AdvantagesDataTest, OverlongMask) {
  const at::Tensor mask = mask_from_lengths({2, 3, 1}, 3);
  const at::Tensor truncated = torch::tensor({0, 1, 0}, torch::kBool);
  StatusOr<at::Tensor> out = overlong_mask(mask, truncated);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->scalar_type(), torch::kBool);
  EXPECT_TRUE(torch::equal(*out, torch::tensor({{1, 1, 0}, {0, 0, 0}, {1, 0, 0}}, torch::kBool)));

  StatusOr<at::Tensor> as_float = overlong_mask(mask.to(torch::kFloat32), truncated);
  ASSERT_TRUE(as_float.ok());
  EXPECT_EQ(as_float->scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::equal(*as_float, out->to(torch::kFloat32)));

  // A filtered trajectory then gets no advantage at all.
  AdvantageInputs in;
  in.rewards = f32({1, 0, 0});
  in.group_index = i64({0, 0, 0});
  in.response_mask = *out;
  const AdvantageOutputs adv = run(in, with(AdvantageEstimator::kDrGrpo));
  EXPECT_EQ(adv.advantages[1].abs().max().item<float>(), 0.f);

  EXPECT_FALSE(overlong_mask(mask, torch::tensor({0, 1}, torch::kBool)).ok());
  EXPECT_FALSE(overlong_mask(mask, torch::tensor({0, 1, 0}, torch::kInt64)).ok());
}

// DAPO's soft overlong punishment (eq. 13), L_max 20, buffer 4: no penalty up
// to 16 tokens, then -(R - 16) / 4 * factor down to -factor at 20.
TEST(AdvantagesDataTest, OverlongPenaltyFallsLinearlyOverTheBuffer) {
  const at::Tensor lengths = i64({10, 16, 17, 18, 20});
  StatusOr<at::Tensor> p = overlong_penalty(lengths, 20, 4, 1.0);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(AllClose(*p, f32({0, 0, -0.25, -0.5, -1}), 1e-7)) << *p;
  StatusOr<at::Tensor> half = overlong_penalty(lengths, 20, 4, 0.5);
  ASSERT_TRUE(half.ok());
  EXPECT_TRUE(AllClose(*half, f32({0, 0, -0.125, -0.25, -0.5}), 1e-7));
  EXPECT_EQ(overlong_penalty(lengths, 20, 0, 1.0).status().message(),
            "overlong_buffer.length: must be in [1, 20), got 0");
  EXPECT_EQ(overlong_penalty(lengths, 20, 20, 1.0).status().message(),
            "overlong_buffer.length: must be in [1, 20), got 20");
  EXPECT_FALSE(overlong_penalty(f32({1, 2}), 20, 4, 1.0).ok());
  EXPECT_FALSE(overlong_penalty(lengths.reshape({5, 1}), 20, 4, 1.0).ok());
}

// On-policy distillation (tinker-cookbook's incorporate_kl_penalty):
// -coef (student - teacher) on the mask; with a discount, each position
// adds discount x the next position's result, masked ones counting as 0.
TEST(AdvantagesDataTest, DistillAdvantagesAreTheNegativeReverseKlPerToken) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const at::Tensor student = f32({-1, -2, -0.5, -3, nan, 0}).view({2, 3});
  const at::Tensor teacher = f32({-1.5, -1, -0.5, -2, nan, 0}).view({2, 3});
  const at::Tensor mask = f32({1, 1, 1, 1, 0, 0}).view({2, 3}).to(torch::kBool);
  StatusOr<at::Tensor> a = distill_advantages(student, teacher, mask, 2.0, 0.0);
  ASSERT_TRUE(a.ok()) << a.status();
  // Row 0: -2 (-1 + 1.5) = -1, -2 (-2 + 1) = 2, 0; row 1: -2 (-3 + 2) = 2.
  EXPECT_TRUE(AllClose(*a, f32({-1, 2, 0, 2, 0, 0}).view({2, 3}), 1e-7)) << *a;
  StatusOr<at::Tensor> d = distill_advantages(student, teacher, mask, 2.0, 0.5);
  ASSERT_TRUE(d.ok()) << d.status();
  // Row 0 back to front: 0; 2 + 0.5 x 0 = 2; -1 + 0.5 x 2 = 0.
  EXPECT_TRUE(AllClose(*d, f32({0, 2, 0, 2, 0, 0}).view({2, 3}), 1e-7)) << *d;
  // Pure distillation's estimator: nothing from the rewards.
  AdvantageInputs in;
  in.rewards = f32({1, 0});
  in.group_index = i64({0, 0});
  in.response_mask = mask;
  AdvantageOptions none;
  none.estimator = AdvantageEstimator::kNone;
  StatusOr<AdvantageOutputs> zero = compute_advantages(in, none);
  ASSERT_TRUE(zero.ok()) << zero.status();
  EXPECT_TRUE(torch::equal(zero->advantages, torch::zeros({2, 3}))) << zero->advantages;
  StatusOr<at::Tensor> bad = distill_advantages(student.narrow(1, 0, 2), teacher, mask, 1, 0);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("student_logprobs"), std::string::npos)
      << bad.status();
}

}  // namespace
}  // namespace relay::trainer
