#include "relay/trainer/batch.h"

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <numeric>
#include <set>

#include "relay/model/policy.h"
#include "testing/tensor_testing.h"

namespace relay::trainer {
namespace {

using relay::testing::AllClose;
using relay::testing::TinyConfig;

rollout::Trajectory traj(std::vector<int64_t> prompt, std::vector<int64_t> response,
                         std::vector<int64_t> versions, double reward) {
  rollout::Trajectory t;
  t.prompt_tokens = std::move(prompt);
  t.response_tokens = std::move(response);
  const size_t n = t.response_tokens.size();
  for (size_t j = 0; j < n; ++j) t.behavior_logprobs.push_back(-0.5f - 0.25f * j);
  t.token_versions = std::move(versions);
  t.proximal_logprobs.assign(n, NAN);
  t.proximal_versions.assign(n, -1);
  t.offpolicy_mask.assign(n, 0);
  std::set<int64_t> used(t.token_versions.begin(), t.token_versions.end());
  for (int64_t v : used) t.version_digests.emplace_back(v, 100 + v);
  t.reward = reward;
  t.finish_reason = rollout::FinishReason::kStop;
  return t;
}

std::vector<rollout::TrajectoryGroup> two_groups() {
  rollout::TrajectoryGroup a;
  a.group_id = "a";
  a.trajectories.push_back(traj({1, 2, 3}, {7, 8}, {4, 4}, 1.0));
  a.trajectories.push_back(traj({1, 2, 3}, {9, 10, 11, 12}, {3, 4, 4, 5}, 0.0));
  a.trajectories[1].finish_reason = rollout::FinishReason::kLength;
  rollout::TrajectoryGroup b;
  b.group_id = "b";
  b.trajectories.push_back(traj({5}, {6}, {5}, 0.5));
  b.trajectories[0].offpolicy_mask = {1};
  return {a, b};
}

TEST(BatchTest, BuildsBothLayoutsWithPaddingAndAlignment) {
  BatchStats stats;
  auto batch = build_batch(two_groups(), BatchOptions{}, &stats);
  ASSERT_TRUE(batch.ok()) << batch.status();
  const TrainBatch& tb = *batch;
  ASSERT_EQ(tb.size(), 3);
  EXPECT_TRUE(torch::equal(tb.input_ids, torch::tensor({1, 2, 3, 7, 8,  0,  0,   //
                                                        1, 2, 3, 9, 10, 11, 12,  //
                                                        5, 6, 0, 0, 0,  0,  0})
                                             .view({3, 7})));
  EXPECT_TRUE(torch::equal(tb.lengths, torch::tensor({5, 7, 2})));
  EXPECT_TRUE(torch::equal(tb.prompt_lengths, torch::tensor({3, 3, 1})));
  EXPECT_TRUE(torch::equal(
      tb.response_mask,
      torch::tensor({1, 1, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0}).view({3, 4}).to(torch::kBool)));
  // Behavior log-probs in the response layout; padding is 0, not NaN.
  EXPECT_TRUE(AllClose(tb.behavior_logprobs, torch::tensor({-0.5f, -0.75f, 0.f, 0.f, -0.5f, -0.75f,
                                                            -1.f, -1.25f, -0.5f, 0.f, 0.f, 0.f})
                                                 .view({3, 4})));
  // Proximal values missing inside the mask are NaN; padding is 0.
  EXPECT_TRUE(std::isnan(tb.proximal_logprobs[0][0].item<float>()));
  EXPECT_EQ(tb.proximal_logprobs[0][3].item<float>(), 0.f);
  EXPECT_TRUE(torch::equal(tb.token_versions[1], torch::tensor({3, 4, 4, 5})));
  EXPECT_EQ(tb.token_versions[2][1].item<int64_t>(), -1);
  EXPECT_TRUE(torch::equal(tb.rewards, torch::tensor({1.f, 0.f, 0.5f})));
  EXPECT_TRUE(torch::equal(tb.group_index, torch::tensor({0, 0, 1})));
  EXPECT_EQ(tb.group_ids, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(torch::equal(tb.truncated, torch::tensor({0, 1, 0}).to(torch::kBool)));
  EXPECT_TRUE(torch::equal(tb.has_offpolicy, torch::tensor({0, 0, 1}).to(torch::kBool)));
  EXPECT_TRUE(tb.offpolicy_mask[2][0].item<bool>());
  EXPECT_EQ(tb.num_tokens(), 7);
  EXPECT_EQ(stats.trajectories, 3);
  EXPECT_EQ(stats.dropped_stale, 0);
}

// Invariant 4: the trainer's log-prob of response token j comes from position
// P - 1 + j of the scoring path, for every row whatever its prompt length.
TEST(BatchTest, GatherResponseReadsPositionPMinusOnePlusJ) {
  auto batch = build_batch(two_groups(), BatchOptions{});
  ASSERT_TRUE(batch.ok());
  model::Policy policy(TinyConfig());
  model::init_weights(*policy, 3, 0.3);
  torch::NoGradGuard ng;
  at::Tensor per_position = policy->score(batch->input_ids, batch->lengths);
  at::Tensor response = gather_response(per_position, *batch);
  ASSERT_EQ(response.sizes(), (at::IntArrayRef{3, 4}));
  auto groups = two_groups();
  const rollout::Trajectory* rows[] = {&groups[0].trajectories[0], &groups[0].trajectories[1],
                                       &groups[1].trajectories[0]};
  for (int b = 0; b < 3; ++b) {
    std::vector<int64_t> ids = rows[b]->prompt_tokens;
    ids.insert(ids.end(), rows[b]->response_tokens.begin(), rows[b]->response_tokens.end());
    // Independently: log_softmax of the logits one position before the token.
    at::Tensor logits = policy->forward(torch::tensor(ids).view({1, -1}))[0];
    const size_t P = rows[b]->prompt_tokens.size();
    for (size_t j = 0; j < 4; ++j) {
      const float got = response[b][j].item<float>();
      if (j >= rows[b]->response_tokens.size()) {
        EXPECT_EQ(got, 0.f) << "padding";
        continue;
      }
      const float want =
          torch::log_softmax(logits[P - 1 + j], -1)[rows[b]->response_tokens[j]].item<float>();
      EXPECT_NEAR(got, want, 1e-5) << b << "," << j;
    }
  }
}

TEST(BatchTest, StalenessFilterDropsAndCountsOldTrajectories) {
  BatchOptions o;
  o.trainer_version = 6;
  o.max_staleness = 2;  // keep tokens of version >= 4
  BatchStats stats;
  auto batch = build_batch(two_groups(), o, &stats);
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->size(), 2);  // the trajectory with a version-3 token is dropped
  EXPECT_EQ(stats.dropped_stale, 1);
  EXPECT_TRUE(torch::equal(batch->rewards, torch::tensor({1.f, 0.5f})));
  EXPECT_EQ(batch->source_rows, (std::vector<int64_t>{0, 2}));

  o.max_staleness = 0;  // synchronous: only version 6
  auto none = build_batch(two_groups(), o, &stats);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(stats.dropped_stale, 3);
  EXPECT_EQ(stats.dropped_groups, 2);
}

TEST(BatchTest, RejectsUnscoredAndMalformedTrajectories) {
  auto groups = two_groups();
  groups[1].trajectories[0].reward = NAN;
  EXPECT_EQ(build_batch(groups, {}).status().message(),
            "group 'b' trajectory 0: reward: nan (the trajectory was not scored)");
  groups = two_groups();
  groups[0].trajectories[1].token_versions.pop_back();
  EXPECT_EQ(build_batch(groups, {}).status().message(),
            "group 'a' trajectory 1: token_versions: 3 entries for 4 response tokens");
  groups = two_groups();
  groups[0].trajectories[1].prompt_tokens = {1, 2, 4};
  EXPECT_EQ(build_batch(groups, {}).status().message(),
            "group 'a' trajectory 1: prompt_tokens: differ from trajectory 0's; a group shares one "
            "prompt");
}

// The refusals no other test reaches: nothing left after the staleness bound,
// and rows whose expert routing has different shapes.
TEST(BatchTest, RefusalMessagesNameTheCause) {
  BatchOptions o;
  o.trainer_version = 9;
  o.max_staleness = 1;
  EXPECT_EQ(build_batch(two_groups(), o).status().message(),
            "build_batch: no trajectory left of 3 (3 dropped as older than version 8 for trainer "
            "version 9 with max_staleness 1)");
  auto groups = two_groups();
  groups[0].trajectories[0].routing_layers = 1;  // 4 positions x 1 layer x 2 experts
  groups[0].trajectories[0].routing_top_k = 2;
  groups[0].trajectories[0].routed_experts.assign(8, 0);
  groups[1].trajectories[0].routing_layers = 2;  // 1 position x 2 layers x 1 expert
  groups[1].trajectories[0].routing_top_k = 1;
  groups[1].trajectories[0].routed_experts.assign(2, 0);
  EXPECT_EQ(build_batch(groups, {}).status().message(),
            "trajectory 2: routed_experts: 2 layers x 1 experts, where the batch has 1 x 2");
  auto routed = build_batch({groups[0]}, {});
  ASSERT_TRUE(routed.ok()) << routed.status();
  EXPECT_EQ(routed->routed_experts.sizes(), (at::IntArrayRef{2, 7, 1, 2}));
  EXPECT_EQ(routed->routed_experts[1][0][0][0].item<int64_t>(), -1);  // a row without routing
  EXPECT_EQ(routed->routed_experts[0][4][0][0].item<int64_t>(), -1);  // past P + R - 1
}

TEST(BatchTest, SelectRowsTrimsToTheRowsOwnWidth) {
  auto batch = build_batch(two_groups(), BatchOptions{});
  ASSERT_TRUE(batch.ok());
  TrainBatch sub = select_rows(*batch, {2, 0});
  EXPECT_EQ(sub.input_ids.sizes(), (at::IntArrayRef{2, 5}));
  EXPECT_EQ(sub.response_mask.sizes(), (at::IntArrayRef{2, 2}));
  EXPECT_TRUE(torch::equal(sub.rewards, torch::tensor({0.5f, 1.f})));
  EXPECT_TRUE(torch::equal(sub.group_index, torch::tensor({1, 0})));
  EXPECT_EQ(sub.source_rows, (std::vector<int64_t>{2, 0}));
}

TEST(BatchTest, TokenBudgetSplitCoversEveryRowOnceWithinBudget) {
  std::vector<rollout::TrajectoryGroup> groups(1);
  groups[0].group_id = "g";
  const int lens[] = {3, 12, 5, 9, 1, 7, 2, 30};
  for (int n : lens) {
    groups[0].trajectories.push_back(
        traj({1, 1}, std::vector<int64_t>(n, 4), std::vector<int64_t>(n, 0), 0.0));
  }
  auto batch = build_batch(groups, BatchOptions{});
  ASSERT_TRUE(batch.ok());
  const int64_t budget = 24;
  auto parts = split_by_token_budget(*batch, budget);
  std::vector<int> seen(8, 0);
  for (const auto& part : parts) {
    int64_t width = 0;
    for (int64_t r : part) {
      ++seen[r];
      width = std::max<int64_t>(width, 2 + lens[r]);
    }
    if (part.size() > 1) {
      EXPECT_LE(static_cast<int64_t>(part.size()) * width, budget);
    }
  }
  EXPECT_EQ(seen, std::vector<int>(8, 1));
  // The 32-token sequence exceeds the budget and goes alone.
  EXPECT_EQ(parts[0], std::vector<int64_t>{7});
  EXPECT_GT(parts.size(), 2u);
}

// Sequence packing's layout: rows of 9, 7, 5, 3 and 2 tokens (width 9) go
// first fit, longest first, into three rows: [9], [7, 2], [5, 3]; each
// sequence keeps its tokens and its start, and unpacking a per-position
// output gives every row back in place (0 past its length).
TEST(BatchTest, PackRowsFirstFitLongestFirstAndUnpackRestoresEveryRow) {
  const std::vector<int64_t> lens = {5, 9, 2, 7, 3};
  TrainBatch b;
  const int64_t B = 5, T = 9;
  b.input_ids = torch::zeros({B, T}, torch::kInt64);
  for (int64_t r = 0; r < B; ++r) {
    for (int64_t t = 0; t < lens[r]; ++t) b.input_ids[r][t] = 100 * (r + 1) + t;
  }
  b.lengths = torch::tensor(lens, torch::kInt64);
  b.routed_experts = (b.input_ids * 10).view({B, T, 1, 1}).expand({B, T, 2, 1}).contiguous();
  const PackedRows p = pack_rows(b, T, /*pad_token_id=*/-7);
  ASSERT_EQ(p.input_ids.sizes(), (at::IntArrayRef{3, T}));
  EXPECT_TRUE(torch::equal(p.lengths, torch::tensor({9, 9, 8}, torch::kInt64))) << p.lengths;
  EXPECT_TRUE(torch::equal(p.packed_row, torch::tensor({2, 0, 1, 1, 2}, torch::kInt64)));
  EXPECT_TRUE(torch::equal(p.offset, torch::tensor({0, 0, 7, 0, 5}, torch::kInt64)));
  // Row 2 holds rows 0 (5 tokens) and 4 (3 tokens), then one padding position.
  EXPECT_TRUE(torch::equal(p.sequence_starts[2],
                           torch::tensor({0, 0, 0, 0, 0, 5, 5, 5, 8}, torch::kInt64)));
  EXPECT_EQ(p.input_ids[2][5].item<int64_t>(), 500);
  EXPECT_EQ(p.input_ids[2][8].item<int64_t>(), -7);
  EXPECT_EQ(p.routed_experts[2][8][0][0].item<int64_t>(), -1);
  EXPECT_EQ(p.routed_experts[1][7][1][0].item<int64_t>(), 3000);
  // Per position [R, W] and Policy::score's [R, W - 1] layouts.
  const at::Tensor valid = torch::arange(T).view({1, T}).lt(b.lengths.view({B, 1}));
  const at::Tensor expected = b.input_ids.masked_fill(valid.logical_not(), 0).to(torch::kFloat32);
  EXPECT_TRUE(torch::equal(unpack_positions(p.input_ids.to(torch::kFloat32), p, b), expected));
  const at::Tensor shifted =
      unpack_positions(p.input_ids.narrow(1, 0, T - 1).to(torch::kFloat32), p, b);
  const at::Tensor valid_shifted =
      torch::arange(T - 1).view({1, T - 1}).lt((b.lengths - 1).view({B, 1}));
  EXPECT_TRUE(torch::equal(shifted, b.input_ids.narrow(1, 0, T - 1)
                                        .masked_fill(valid_shifted.logical_not(), 0)
                                        .to(torch::kFloat32)));
  // A budget of 17 tokens: padded, {9}, {7, 5} (2 x 7), {3, 2}; counting the
  // rows' own tokens, {9, 7} (16) and {5, 3, 2} (10).
  EXPECT_EQ(split_by_token_budget(b, 17, TokenBudget::kPadded),
            (std::vector<std::vector<int64_t>>{{1}, {3, 0}, {4, 2}}));
  EXPECT_EQ(split_by_token_budget(b, 17, TokenBudget::kReal),
            (std::vector<std::vector<int64_t>>{{1, 3}, {0, 4, 2}}));
}

// The positions the trainer scores (ScoreOptions::scored) are exactly those
// gather_response reads: masked response tokens, not prompts, padding or
// environment tokens; and they carry over to packed rows.
TEST(BatchTest, ResponsePositionsAreWhatGatherResponseReadsPackedOrNot) {
  auto groups = two_groups();
  groups[0].trajectories[1].env_mask = {0, 1, 0, 0};
  groups[0].trajectories[1].behavior_logprobs[1] = NAN;
  groups[0].trajectories[1].turns = {{1, 2, 0.0}, {4, 4, 1.0}};
  auto built = build_batch(groups, BatchOptions{});
  ASSERT_TRUE(built.ok()) << built.status();
  const TrainBatch& b = *built;  // prompts 3, 3, 1; responses 2, 4, 1; T = 7
  const at::Tensor scored = response_positions(b);
  const at::Tensor want = torch::tensor({{0, 0, 1, 1, 0, 0},   // P - 1 = 2, 3
                                         {0, 0, 1, 0, 1, 1},   // 2, (3 env), 4, 5
                                         {1, 0, 0, 0, 0, 0}})  // 0
                              .to(torch::kBool);
  EXPECT_TRUE(torch::equal(scored, want)) << scored;
  const at::Tensor per_position = torch::rand({3, 6}) + 1;
  EXPECT_TRUE(
      torch::equal(gather_response(per_position * scored, b), gather_response(per_position, b)));

  const PackedRows p = pack_rows(b, b.input_ids.size(1), /*pad_token_id=*/0);
  ASSERT_LT(p.input_ids.size(0), 3);  // rows 0 (5 tokens) and 2 (2 tokens) share one
  const at::Tensor packed = pack_positions(scored, p, b);
  ASSERT_EQ(packed.sizes(), (at::IntArrayRef{p.input_ids.size(0), p.input_ids.size(1) - 1}));
  EXPECT_EQ(packed.sum().item<int64_t>(), scored.sum().item<int64_t>());
  EXPECT_TRUE(torch::equal(unpack_positions(packed, p, b), scored));
  const at::Tensor values = torch::arange(21, torch::kFloat32).view({3, 7}) + 1;
  const at::Tensor valid = torch::arange(7).view({1, 7}).lt(b.lengths.view({3, 1}));
  EXPECT_TRUE(torch::equal(unpack_positions(pack_positions(values, p, b), p, b), values * valid));
  EXPECT_THROW(pack_positions(torch::zeros({3, 4}), p, b), c10::Error);
}

TEST(BatchTest, MissingBehaviorLogprobsAreCountedAndRefused) {
  auto groups = two_groups();
  auto ok = build_batch(groups, BatchOptions{});
  EXPECT_DOUBLE_EQ(frac_behavior_logprobs_valid(*ok), 1.0);
  EXPECT_TRUE(check_behavior_logprobs(*ok).ok());
  groups[0].trajectories[1].behavior_logprobs[2] = NAN;  // a worker that lost them
  groups[0].trajectories[1].behavior_logprobs[3] = NAN;
  auto built = build_batch(groups, BatchOptions{});
  ASSERT_TRUE(built.ok()) << built.status();
  const TrainBatch& batch = *built;
  EXPECT_TRUE(std::isnan(batch.behavior_logprobs[1][3].item<float>()));
  EXPECT_DOUBLE_EQ(frac_behavior_logprobs_valid(batch), 5.0 / 7.0);
  Status s = check_behavior_logprobs(batch);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(s.message())
                .find("behavior log-probs missing for 2 of 7 response tokens (first: group 'a', "
                      "batch row 1, response token 2)"),
            std::string::npos)
      << s;
}

// An episode's environment tokens are in the sequence but out of the loss:
// out of response_mask (so out of the missing-log-prob count, and of
// num_tokens), marked in env_mask, and carried through select_rows.
TEST(BatchTest, EnvironmentTokensAreContextOutOfTheMaskAndCountedApart) {
  auto groups = two_groups();
  rollout::Trajectory& t = groups[0].trajectories[1];  // response {9, 10, 11, 12}
  t.behavior_logprobs[1] = NAN;
  t.behavior_logprobs[2] = NAN;
  t.env_mask = {0, 1, 1, 0};
  t.turns = {{1, 3, 0.0}, {4, 4, 1.0}};
  ASSERT_TRUE(rollout::check_trajectory(t).ok()) << rollout::check_trajectory(t);
  auto built = build_batch(groups, BatchOptions{});
  ASSERT_TRUE(built.ok()) << built.status();
  const TrainBatch& batch = *built;
  EXPECT_TRUE(torch::equal(batch.response_mask[1], torch::tensor({true, false, false, true})));
  EXPECT_TRUE(torch::equal(batch.env_mask[1], torch::tensor({false, true, true, false})));
  EXPECT_EQ(batch.env_mask.sum().item<int64_t>(), 2);
  // The tokens stay in the sequence the trainer scores.
  EXPECT_EQ(batch.input_ids[1][4].item<int64_t>(), 10);
  EXPECT_EQ(batch.lengths[1].item<int64_t>(), 7);
  EXPECT_EQ(batch.num_tokens(), 5);
  EXPECT_DOUBLE_EQ(frac_behavior_logprobs_valid(batch), 1.0);
  EXPECT_TRUE(check_behavior_logprobs(batch).ok());
  // A model token without its log-prob is still missing.
  groups[0].trajectories[1].behavior_logprobs[3] = NAN;
  auto missing = build_batch(groups, BatchOptions{});
  EXPECT_DOUBLE_EQ(frac_behavior_logprobs_valid(*missing), 4.0 / 5.0);
  TrainBatch sub = select_rows(batch, {1});
  EXPECT_TRUE(torch::equal(sub.env_mask[0], batch.env_mask[1]));
}

}  // namespace
}  // namespace relay::trainer

#include "relay/trainer/advantages.h"
#include "relay/trainer/policy_loss.h"

namespace relay::trainer {
namespace {

// Gradients of one PPO step over the whole batch, and accumulated over the
// token-budget micro-batches with the global normalizer: the same update.
TEST(BatchTest, GradientAccumulationOverMicroBatchesEqualsTheFullBatch) {
  std::vector<rollout::TrajectoryGroup> groups(2);
  const int lens[2][3] = {{3, 9, 5}, {1, 7, 4}};
  for (int g = 0; g < 2; ++g) {
    groups[g].group_id = std::to_string(g);
    for (int j = 0; j < 3; ++j) {
      std::vector<int64_t> response;
      for (int i = 0; i < lens[g][j]; ++i) response.push_back((5 * g + 3 * j + i) % 30 + 3);
      groups[g].trajectories.push_back(
          traj({1, 2 + g, 4}, response, std::vector<int64_t>(lens[g][j], 0), 0.3 * j + g));
    }
  }
  auto built = build_batch(groups, BatchOptions{});
  ASSERT_TRUE(built.ok()) << built.status();
  const TrainBatch& batch = *built;
  AdvantageInputs ai;
  ai.rewards = batch.rewards;
  ai.group_index = batch.group_index;
  ai.response_mask = batch.response_mask;
  auto adv = compute_advantages(ai, AdvantageOptions{});
  ASSERT_TRUE(adv.ok()) << adv.status();

  model::Policy policy(TinyConfig());
  model::init_weights(*policy, 4, 0.3);
  // Behavior log-probs away from the current ones, so clipping is active.
  at::Tensor old_full;
  {
    torch::NoGradGuard ng;
    at::Tensor now = gather_response(policy->score(batch.input_ids, batch.lengths), batch);
    old_full =
        now + 0.3 * torch::sin(torch::arange(now.numel(), torch::kFloat32)).view(now.sizes());
  }
  auto grads = [&](const std::vector<std::vector<int64_t>>& parts, LossAggMode mode) {
    policy->zero_grad();
    std::vector<TrainBatch> micro;
    std::vector<at::Tensor> masks;
    for (const auto& rows : parts) {
      micro.push_back(select_rows(batch, rows));
      masks.push_back(micro.back().response_mask);
    }
    const GlobalNormalizer norm = make_global_normalizer(masks, /*loss_scale_factor=*/16);
    PpoClipOptions ppo;
    ppo.agg_mode = mode;
    double total = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      const TrainBatch& mb = micro[i];
      PolicyLossInputs in;
      in.logprobs = gather_response(policy->score(mb.input_ids, mb.lengths), mb);
      at::Tensor rows = torch::tensor(parts[i], torch::kInt64);
      const int64_t L = in.logprobs.size(1);
      in.old_logprobs = old_full.index_select(0, rows).narrow(1, 0, L);
      in.advantages = adv->advantages.index_select(0, rows).narrow(1, 0, L);
      in.response_mask = mb.response_mask;
      PolicyLossResult r = ppo_clip_loss(in, ppo, norm);
      r.loss.backward();
      total += r.loss.item<double>();
    }
    std::vector<at::Tensor> out;
    for (const auto& p : policy->parameters()) out.push_back(p.grad().clone());
    return std::make_pair(total, out);
  };
  std::vector<int64_t> all(batch.size());
  std::iota(all.begin(), all.end(), 0);
  const auto parts = split_by_token_budget(batch, 24);
  ASSERT_GT(parts.size(), 2u);
  for (LossAggMode mode : {LossAggMode::kTokenMean, LossAggMode::kSeqMeanTokenMean,
                           LossAggMode::kSeqMeanTokenSum, LossAggMode::kSeqMeanTokenSumNorm}) {
    SCOPED_TRACE(kLossAggModeNames.name(mode));
    auto [whole_loss, whole] = grads({all}, mode);
    auto [split_loss, split] = grads(parts, mode);
    EXPECT_NEAR(split_loss, whole_loss, 1e-5);
    ASSERT_EQ(whole.size(), split.size());
    for (size_t i = 0; i < whole.size(); ++i) {
      EXPECT_TRUE(AllClose(split[i], whole[i], 1e-6, 1e-4)) << "parameter " << i;
    }
  }
}

}  // namespace
}  // namespace relay::trainer

namespace relay::trainer {
namespace {

// ---- ReMax baseline rewards.

TEST(BatchTest, BaselineRewardsComeFromEachGroupsGreedyBaseline) {
  auto groups = two_groups();
  // Group 'a' (rows 0, 1) has a scored greedy baseline; group 'b' (row 2) has none.
  groups[0].baseline = traj({1, 2, 3}, {7}, {4}, 0.75);
  auto batch = build_batch(groups, BatchOptions{});
  ASSERT_TRUE(batch.ok()) << batch.status();
  ASSERT_EQ(batch->baseline_rewards.sizes(), (at::IntArrayRef{3}));
  EXPECT_EQ(batch->baseline_rewards.scalar_type(), torch::kFloat32);
  // Row b gets group_index[b]'s baseline reward: [0.75, 0.75, NaN].
  EXPECT_FLOAT_EQ(batch->baseline_rewards[0].item<float>(), 0.75f);
  EXPECT_FLOAT_EQ(batch->baseline_rewards[1].item<float>(), 0.75f);
  EXPECT_TRUE(std::isnan(batch->baseline_rewards[2].item<float>()));

  // The other way round: only 'b' has one.
  groups = two_groups();
  groups[1].baseline = traj({5}, {6, 6}, {5, 5}, -0.5);
  auto other = build_batch(groups, BatchOptions{});
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_TRUE(std::isnan(other->baseline_rewards[0].item<float>()));
  EXPECT_TRUE(std::isnan(other->baseline_rewards[1].item<float>()));
  EXPECT_FLOAT_EQ(other->baseline_rewards[2].item<float>(), -0.5f);
}

TEST(BatchTest, BaselineRewardsStayAlignedWhenAGroupIsDroppedAsStale) {
  // Three groups; 'old' has only version-1 tokens and is dropped whole by the
  // staleness bound (trainer 6, max_staleness 2 -> keep versions >= 4).
  std::vector<rollout::TrajectoryGroup> groups(3);
  groups[0].group_id = "old";
  groups[0].trajectories.push_back(traj({1}, {2}, {1}, 1.0));
  groups[0].baseline = traj({1}, {2}, {1}, 0.1);
  groups[1].group_id = "mid";
  groups[1].trajectories.push_back(traj({3}, {4}, {5}, 0.0));
  groups[2].group_id = "new";
  groups[2].trajectories.push_back(traj({5}, {6}, {6}, 1.0));
  groups[2].baseline = traj({5}, {6}, {6}, 0.3);
  BatchOptions o;
  o.trainer_version = 6;
  o.max_staleness = 2;
  BatchStats stats;
  auto batch = build_batch(groups, o, &stats);
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(stats.dropped_groups, 1);
  EXPECT_EQ(batch->group_ids, (std::vector<std::string>{"mid", "new"}));
  // Row 0 is 'mid' (no baseline), row 1 is 'new' (0.3), not 'old''s 0.1.
  EXPECT_TRUE(std::isnan(batch->baseline_rewards[0].item<float>()));
  EXPECT_FLOAT_EQ(batch->baseline_rewards[1].item<float>(), 0.3f);
}

TEST(BatchTest, SelectRowsCarriesBaselineRewards) {
  auto groups = two_groups();
  groups[0].baseline = traj({1, 2, 3}, {7}, {4}, 0.25);
  auto batch = build_batch(groups, BatchOptions{});
  ASSERT_TRUE(batch.ok()) << batch.status();
  // Full batch: [0.25, 0.25, NaN]; rows {2, 1} -> [NaN, 0.25].
  TrainBatch sub = select_rows(*batch, {2, 1});
  ASSERT_EQ(sub.baseline_rewards.sizes(), (at::IntArrayRef{2}));
  EXPECT_TRUE(std::isnan(sub.baseline_rewards[0].item<float>()));
  EXPECT_FLOAT_EQ(sub.baseline_rewards[1].item<float>(), 0.25f);
}

// ---- Reuse cap.

TEST(TrajectoryKeyTest, EqualForIdenticalInputsAndDifferentWhenAnyPartChanges) {
  const rollout::Trajectory t = traj({1, 2, 3}, {9, 10, 11}, {3, 4, 4}, 1.0);
  const uint64_t key = trajectory_key("g", 1, t);
  // Deterministic, and a copy of the trajectory is the same data.
  rollout::Trajectory copy = t;
  EXPECT_EQ(trajectory_key("g", 1, t), key);
  EXPECT_EQ(trajectory_key("g", 1, copy), key);
  // The reward and metadata are not part of the data the key names.
  copy.reward = 0.0;
  copy.finished_s = 12.5;
  EXPECT_EQ(trajectory_key("g", 1, copy), key);

  EXPECT_NE(trajectory_key("h", 1, t), key);   // group id
  EXPECT_NE(trajectory_key("g", 0, t), key);   // index in the group
  EXPECT_NE(trajectory_key("g2", 1, t), key);  // group id, longer
  rollout::Trajectory tok = t;
  tok.response_tokens[1] = 12;  // one response token
  EXPECT_NE(trajectory_key("g", 1, tok), key);
  rollout::Trajectory ver = t;
  ver.token_versions[2] = 5;  // one token version
  EXPECT_NE(trajectory_key("g", 1, ver), key);
  rollout::Trajectory lp = t;
  lp.behavior_logprobs[0] = std::nextafter(lp.behavior_logprobs[0], 0.0f);  // one bit
  EXPECT_NE(trajectory_key("g", 1, lp), key);
  rollout::Trajectory longer = t;
  longer.response_tokens.push_back(13);  // one more token (other fields unchanged)
  EXPECT_NE(trajectory_key("g", 1, longer), key);
}

TEST(ReuseCounterTest, CountsUsesPerKeyAndForgetsStaleOnes) {
  ReuseCounter c;
  EXPECT_EQ(c.size(), 0u);
  EXPECT_EQ(c.uses(42), 0);  // never recorded

  c.record({1, 2}, /*version=*/3);
  EXPECT_EQ(c.uses(1), 1);
  EXPECT_EQ(c.uses(2), 1);
  EXPECT_EQ(c.uses(3), 0);
  EXPECT_EQ(c.size(), 2u);

  c.record({1, 3}, /*version=*/5);  // key 1 used again: 2 uses, last at version 5
  EXPECT_EQ(c.uses(1), 2);
  EXPECT_EQ(c.uses(2), 1);
  EXPECT_EQ(c.uses(3), 1);
  EXPECT_EQ(c.size(), 3u);

  // Last uses: 1 -> 5, 2 -> 3, 3 -> 5. forget_before(4) drops key 2 only.
  c.forget_before(4);
  EXPECT_EQ(c.size(), 2u);
  EXPECT_EQ(c.uses(2), 0);
  EXPECT_EQ(c.uses(1), 2);
  EXPECT_EQ(c.uses(3), 1);

  // "Before" is strict: last_version 5 survives forget_before(5).
  c.forget_before(5);
  EXPECT_EQ(c.size(), 2u);
  c.forget_before(6);
  EXPECT_EQ(c.size(), 0u);
  EXPECT_EQ(c.uses(1), 0);

  // A key recorded twice in one call counts twice.
  c.record({7, 7}, 8);
  EXPECT_EQ(c.uses(7), 2);
  EXPECT_EQ(c.size(), 1u);
}

TEST(ReuseCounterTest, KeysOfARebuiltGroupMatchTheFirstUse) {
  // The same group handed over twice: the second time every key has a use.
  auto groups = two_groups();
  std::vector<uint64_t> keys;
  for (const auto& g : groups) {
    for (size_t j = 0; j < g.trajectories.size(); ++j) {
      keys.push_back(trajectory_key(g.group_id, j, g.trajectories[j]));
    }
  }
  ASSERT_EQ(keys.size(), 3u);
  EXPECT_EQ(std::set<uint64_t>(keys.begin(), keys.end()).size(), 3u);  // all distinct
  ReuseCounter c;
  c.record(keys, 1);
  auto again = two_groups();
  for (const auto& g : again) {
    for (size_t j = 0; j < g.trajectories.size(); ++j) {
      EXPECT_EQ(c.uses(trajectory_key(g.group_id, j, g.trajectories[j])), 1);
    }
  }
}

}  // namespace
}  // namespace relay::trainer
