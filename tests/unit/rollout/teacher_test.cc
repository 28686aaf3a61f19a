#include "relay/rollout/teacher.h"

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>

#include "relay/model/policy.h"
#include "relay/model/tokenizer.h"
#include "testing/tensor_testing.h"

namespace relay::rollout {
namespace {

using relay::testing::TinyConfig;

const std::string kParityDir = RELAY_SOURCE_DIR "/../shared/testdata/tokenizer_parity";

Trajectory response(std::vector<int64_t> prompt, std::vector<int64_t> tokens) {
  Trajectory t;
  t.prompt_tokens = std::move(prompt);
  t.response_tokens = std::move(tokens);
  return t;
}

class TeacherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    teacher_ = model::Policy(TinyConfig());
    model::init_weights(*teacher_, 29);
  }
  // The teacher's log-prob of response token j, by the scoring path alone.
  float expected(const Trajectory& t, size_t j, int64_t vocab_limit = 0) {
    torch::NoGradGuard g;
    std::vector<int64_t> seq = t.prompt_tokens;
    seq.insert(seq.end(), t.response_tokens.begin(), t.response_tokens.end());
    model::ScoreOptions so;
    so.vocab_limit = vocab_limit;
    at::Tensor lp = teacher_->score(torch::tensor(seq).view({1, -1}), {}, so)[0];
    return lp[static_cast<int64_t>(t.prompt_tokens.size() + j) - 1].item<float>();
  }
  model::Policy teacher_{nullptr};
};

// Each response token gets the teacher's log-prob at temperature 1 from
// position P - 1 + j, whether the pass holds one sequence or several of
// other lengths; environment tokens get NaN; the greedy baseline is left
// alone; the digest is stamped.
TEST_F(TeacherTest, ScoresEveryResponseTokenAtItsShiftedPosition) {
  TrajectoryGroup g;
  g.group_id = "g";
  g.trajectories.push_back(response({3, 7, 1}, {4, 9, 2, 2}));
  g.trajectories.push_back(response({5}, {8, 8, 30, 6, 1, 12, 11}));
  Trajectory episode = response({2, 4}, {7, 7, 9, 10});
  episode.env_mask = {0, 1, 1, 0};
  g.trajectories.push_back(episode);
  g.baseline = response({3, 7, 1}, {5});
  TeacherOptions o;
  o.batch_tokens = 12;  // at most one or two sequences per pass
  Teacher teacher(teacher_.ptr(), 0xabc, o);
  std::vector<TrajectoryGroup> groups{g};
  ASSERT_TRUE(teacher.score(groups).ok());
  const TrajectoryGroup& out = groups[0];
  for (size_t i = 0; i < out.trajectories.size(); ++i) {
    const Trajectory& t = out.trajectories[i];
    ASSERT_EQ(t.teacher_logprobs.size(), t.response_tokens.size()) << i;
    EXPECT_EQ(t.teacher_digest, 0xabcu);
    for (size_t j = 0; j < t.response_tokens.size(); ++j) {
      if (t.is_env_token(j)) {
        EXPECT_TRUE(std::isnan(t.teacher_logprobs[j])) << i << "," << j;
      } else {
        EXPECT_NEAR(t.teacher_logprobs[j], expected(t, j), 1e-5) << i << "," << j;
        EXPECT_LT(t.teacher_logprobs[j], 0) << i << "," << j;
      }
    }
  }
  EXPECT_TRUE(out.baseline->teacher_logprobs.empty());
  EXPECT_EQ(teacher.stats().responses, 3);
  EXPECT_EQ(teacher.stats().tokens, 7 + 8 + 6);
  EXPECT_GE(teacher.stats().passes, 2);
  // The teacher is frozen.
  for (const at::Tensor& p : teacher_->parameters()) EXPECT_FALSE(p.requires_grad());
}

// Without a prompt nothing predicts the first response token: it gets NaN
// (no teacher score, as an environment token) and the others their scores,
// also beside a row with a prompt in the same pass.
TEST_F(TeacherTest, AResponseWithoutAPromptHasNoScoreForItsFirstToken) {
  std::vector<TrajectoryGroup> groups(1);
  groups[0].group_id = "g";
  groups[0].trajectories.push_back(response({3, 7, 1}, {4, 9}));
  groups[0].trajectories.push_back(response({}, {4, 9, 2}));
  Teacher teacher(teacher_.ptr(), 1, {});
  ASSERT_TRUE(teacher.score(groups).ok());
  const Trajectory& t = groups[0].trajectories[1];
  ASSERT_EQ(t.teacher_logprobs.size(), 3u);
  EXPECT_TRUE(std::isnan(t.teacher_logprobs[0]));
  for (size_t j = 1; j < 3; ++j) EXPECT_NEAR(t.teacher_logprobs[j], expected(t, j), 1e-5) << j;
  const Trajectory& first = groups[0].trajectories[0];
  for (size_t j = 0; j < 2; ++j) {
    EXPECT_NEAR(first.teacher_logprobs[j], expected(first, j), 1e-5) << j;
  }
}

// vocab_limit renormalises over the student's ids only, as the student
// samples them: every log-prob is higher than over the whole vocabulary.
TEST_F(TeacherTest, VocabLimitIsTheSoftmaxSupport) {
  std::vector<TrajectoryGroup> groups(1);
  groups[0].group_id = "g";
  groups[0].trajectories.push_back(response({3, 7}, {4, 9, 2}));
  TeacherOptions o;
  o.vocab_limit = 20;
  Teacher teacher(teacher_.ptr(), 1, o);
  ASSERT_TRUE(teacher.score(groups).ok());
  const Trajectory& t = groups[0].trajectories[0];
  for (size_t j = 0; j < 3; ++j) {
    EXPECT_NEAR(t.teacher_logprobs[j], expected(t, j, 20), 1e-5);
    EXPECT_GT(t.teacher_logprobs[j], expected(t, j));
  }
}

// A sequence past the teacher's context, or an id outside its vocabulary,
// is refused naming the group, and no trajectory is half-scored.
TEST_F(TeacherTest, RefusesWhatItCannotScoreAndWritesNothing) {
  Teacher teacher(teacher_.ptr(), 1, {});
  std::vector<TrajectoryGroup> groups(1);
  groups[0].group_id = "long";
  groups[0].trajectories.push_back(response({1, 2}, {3, 4}));
  groups[0].trajectories.push_back(response({1}, std::vector<int64_t>(70, 5)));
  Status s = teacher.score(groups);
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("trainer.distill.teacher"), std::string::npos) << s;
  EXPECT_NE(s.message().find("group 'long' trajectories[1]"), std::string::npos) << s;
  EXPECT_NE(s.message().find("max_position_embeddings 64"), std::string::npos) << s;
  EXPECT_TRUE(groups[0].trajectories[0].teacher_logprobs.empty());

  groups[0].group_id = "ids";
  groups[0].trajectories[1] = response({1}, {37});
  s = teacher.score(groups);
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("token id 37"), std::string::npos) << s;
  EXPECT_TRUE(groups[0].trajectories[0].teacher_logprobs.empty());
}

TEST(TokenizerDifferenceTest, TheSameTokenizerPassesAndAnotherIsNamed) {
  auto chars = model::CharTokenizer::create();
  auto chars_again = model::CharTokenizer::create();
  auto digits = model::CharTokenizer::create("0123456789+=abcdefghijklmnopqrstuvwxyz ");
  ASSERT_TRUE(chars.ok() && chars_again.ok() && digits.ok());
  EXPECT_EQ(tokenizer_difference(*chars, *chars_again), std::nullopt);
  std::optional<std::string> d = tokenizer_difference(*chars, *digits);
  ASSERT_TRUE(d.has_value());
  // The same size, the characters in another order: ids mean other text.
  std::string reversed(chars->alphabet().rbegin(), chars->alphabet().rend());
  auto permuted = model::CharTokenizer::create(reversed);
  ASSERT_TRUE(permuted.ok());
  ASSERT_EQ(permuted->vocab_size(), chars->vocab_size());
  d = tokenizer_difference(*chars, *permuted);
  ASSERT_TRUE(d.has_value());
  EXPECT_NE(d->find("for the student"), std::string::npos) << *d;

  auto qwen = model::load_tokenizer_file(kParityDir + "/qwen2/tokenizer.json");
  auto qwen_again = model::load_tokenizer_file(kParityDir + "/qwen2/tokenizer.json");
  auto llama = model::load_tokenizer_file(kParityDir + "/llama-bpe/tokenizer.json");
  ASSERT_TRUE(qwen.ok() && qwen_again.ok() && llama.ok());
  // Every one of Qwen2's ids compared, and its probe text.
  EXPECT_EQ(tokenizer_difference(**qwen, **qwen_again), std::nullopt);
  d = tokenizer_difference(**qwen, **llama);
  ASSERT_TRUE(d.has_value());
  EXPECT_NE(d->find(std::to_string((*qwen)->vocab_size())), std::string::npos) << *d;
  EXPECT_NE(d->find(std::to_string((*llama)->vocab_size())), std::string::npos) << *d;
  d = tokenizer_difference(**qwen, *chars);
  ASSERT_TRUE(d.has_value());
}

}  // namespace
}  // namespace relay::rollout
