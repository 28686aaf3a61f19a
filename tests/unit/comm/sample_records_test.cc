#include "relay/comm/host/sample_records.h"

#include <gtest/gtest.h>

#include "absl/strings/str_join.h"

namespace relay::comm {
namespace {

// Group `name` with `k` samples; sample j answers "j#" to the prompt "<1+1>".
rollout::TrajectoryGroup group(const model::Tokenizer& tok, const std::string& name, int k) {
  rollout::TrajectoryGroup g;
  g.group_id = name;
  for (int j = 0; j < k; ++j) {
    rollout::Trajectory t;
    t.prompt_tokens = *tok.encode("<1+1>");
    t.response_tokens = *tok.encode(std::to_string(j) + "#");
    t.behavior_logprobs = {-0.5f * (j + 1), -0.125f};
    t.token_versions = {3, 4};
    t.reward = j == 2 ? 1.0 : 0.0;
    t.finish_reason = rollout::FinishReason::kStop;
    g.trajectories.push_back(t);
  }
  return g;
}

TEST(SampleRecordsTest, TakesSamplesRoundRobinAcrossGroups) {
  const model::CharTokenizer tok = *model::CharTokenizer::create();
  const std::vector<rollout::TrajectoryGroup> groups = {group(tok, "a", 3), group(tok, "b", 1),
                                                        group(tok, "c", 3)};
  std::vector<SampleRecord> r = sample_records(groups, tok, 4);
  ASSERT_EQ(r.size(), 4u);
  // Sample 0 of a, b, c, then sample 1 of a (b has no sample 1).
  EXPECT_EQ(r[0].group_id, "a");
  EXPECT_EQ(r[1].group_id, "b");
  EXPECT_EQ(r[2].group_id, "c");
  EXPECT_EQ(r[3].group_id, "a");
  EXPECT_EQ(r[3].pieces, (std::vector<std::string>{"1", "#"}));
  EXPECT_EQ(r[3].prompt, "<1+1>");
  EXPECT_EQ(r[3].token_ids, *tok.encode("1#"));
  EXPECT_EQ(r[3].logprobs, (std::vector<float>{-1.0f, -0.125f}));
  EXPECT_EQ(r[3].versions, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(r[3].reward, 0.0);
  EXPECT_EQ(r[3].finish_reason, "stop");

  EXPECT_EQ(sample_records(groups, tok, 100).size(), 7u);  // every sample, once
  EXPECT_TRUE(sample_records(groups, tok, 0).empty());
  EXPECT_TRUE(sample_records({}, tok, 4).empty());
}

TEST(SampleRecordsTest, TokensTheTokenizerCannotDecodeShowTheirIds) {
  const model::CharTokenizer tok = *model::CharTokenizer::create();
  rollout::TrajectoryGroup g = group(tok, "a", 1);
  // A model vocabulary padded past the tokenizer's can sample such ids.
  g.trajectories[0].response_tokens[1] = 999;
  g.trajectories[0].prompt_tokens.push_back(1000);
  std::vector<SampleRecord> r = sample_records({g}, tok, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].pieces, (std::vector<std::string>{"0", "<id 999>"}));
  // The prompt cannot be decoded: its ids show instead.
  EXPECT_EQ(r[0].prompt, "<ids " + absl::StrJoin(g.trajectories[0].prompt_tokens, ",") + ">");
  EXPECT_NE(r[0].prompt.find(",1000>"), std::string::npos);
}

}  // namespace
}  // namespace relay::comm
