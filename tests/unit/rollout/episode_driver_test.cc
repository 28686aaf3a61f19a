#include "relay/rollout/episode_driver.h"

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <set>
#include <stdexcept>
#include <thread>

#include "relay/common/file_io.h"
#include "relay/env/tool_prompt.h"
#include "relay/model/bpe_tokenizer.h"
#include "testing/tensor_testing.h"

namespace relay::rollout {
namespace {

using relay::testing::TinyConfig;

// 34 characters + 3 specials = TinyConfig's 37 ids, so every id decodes.
constexpr std::string_view kAlphabet = "0123456789+-*/=<>()#., ?:abcdefghi";

std::shared_ptr<const model::Tokenizer> tokenizer() {
  return std::make_shared<model::CharTokenizer>(model::CharTokenizer::create(kAlphabet).value());
}

// Answers turns 0 and 1 with "=<turn>" as a tool message, and takes turn 2
// as the answer; records what it was given.
class ScriptedEnv : public env::Environment {
 public:
  struct Log {
    std::mutex mu;
    std::vector<std::string> starts;
    std::vector<std::string> turns;
  };
  explicit ScriptedEnv(std::shared_ptr<Log> log, int fail_at) : log_(log), fail_at_(fail_at) {}
  Status reset(const env::EpisodeStart& start) override {
    std::lock_guard<std::mutex> lock(log_->mu);
    log_->starts.push_back(start.task_id);
    return OkStatus();
  }
  StatusOr<env::EnvStep> step(const env::ModelTurn& turn) override {
    {
      std::lock_guard<std::mutex> lock(log_->mu);
      log_->turns.push_back(turn.text);
    }
    if (turn.turn == fail_at_) {
      if (fail_at_ % 2 == 0) return UnavailableError("the sandbox went away");
      throw std::runtime_error("segfault in the tool, politely");
    }
    env::EnvStep out;
    out.reward = 0.5;
    if (turn.turn == 2) {
      out.next = env::EnvStep::Next::kAnswered;
      return out;
    }
    out.messages = {{"tool", "=" + std::to_string(turn.turn)}};
    out.tool_calls = 1;
    return out;
  }

 private:
  std::shared_ptr<Log> log_;
  int fail_at_;
};

class ScriptedFactory : public env::EnvironmentFactory {
 public:
  ScriptedFactory(std::shared_ptr<ScriptedEnv::Log> log, int fail_at)
      : log_(std::move(log)), fail_at_(fail_at) {}
  StatusOr<std::unique_ptr<env::Environment>> make() const override {
    return std::unique_ptr<env::Environment>(new ScriptedEnv(log_, fail_at_));
  }

 private:
  std::shared_ptr<ScriptedEnv::Log> log_;
  int fail_at_;
};

std::unique_ptr<Engine> make_engine() {
  model::Policy p(TinyConfig());
  model::init_weights(*p, 7, 0.3);
  EngineOptions o;
  o.num_slots = 4;
  o.max_new_tokens = 8;
  // '#' and the letters end a turn, so turns end within a few tokens.
  for (char c : std::string("#abcdefghi")) {
    o.stop_tokens.push_back(3 + static_cast<int64_t>(kAlphabet.find(c)));
  }
  o.episode.max_turns = 4;
  o.episode.max_tokens = 48;
  return Engine::create(p, o, 0, 1).value();
}

PromptGroup group(const std::string& id, int k, uint64_t seed) {
  PromptGroup g;
  g.group_id = id;
  g.prompt = {4, 5, 6};
  g.k = k;
  g.seed = seed;
  g.episode = true;
  return g;
}

// The environment sees each turn's text without its stop token, and its
// answers are appended as the tokenizer encodes them; every episode that
// reaches turn 2 ends there as the model's answer.
TEST(EpisodeDriverTest, EnvironmentsAnswerTurnsOnTheirOwnThreads) {
  auto engine = make_engine();
  auto log = std::make_shared<ScriptedEnv::Log>();
  auto tok = tokenizer();
  EpisodeDriver driver(*engine, std::make_shared<ScriptedFactory>(log, -1), tok, {});
  driver.begin_group("g", {"task/1", "345", ""});
  ASSERT_TRUE(engine->submit(group("g", 4, 3)).ok());
  auto groups = engine->run();
  ASSERT_TRUE(groups.ok()) << groups.status();
  driver.end_group("g");
  int answered = 0;
  for (const Trajectory& t : groups->at(0).trajectories) {
    ASSERT_TRUE(check_trajectory(t).ok()) << check_trajectory(t);
    for (size_t i = 0; i + 1 < t.turns.size(); ++i) {
      const EpisodeTurn& turn = t.turns[i];
      const std::vector<int64_t> obs(t.response_tokens.begin() + turn.model_end,
                                     t.response_tokens.begin() + turn.env_end);
      EXPECT_EQ(obs, tok->encode("=" + std::to_string(i)).value());
      EXPECT_DOUBLE_EQ(turn.reward, 0.5);
      EXPECT_EQ(turn.tool_calls, 1) << "the environment's count, kept per turn";
      EXPECT_EQ(turn.tool_errors, 0);
    }
    if (t.turns.size() == 3 && t.finish_reason == FinishReason::kStop) ++answered;
  }
  EXPECT_GE(answered, 1);
  const EpisodeDriverStats stats = driver.stats();
  EXPECT_EQ(stats.episodes, static_cast<int64_t>(log->starts.size()));
  EXPECT_EQ(log->starts, std::vector<std::string>(log->starts.size(), "task/1"));
  EXPECT_EQ(stats.env_steps, static_cast<int64_t>(log->turns.size()));
  EXPECT_EQ(stats.env_errors, 0);
  // A turn's text as the environment saw it is the decoded model tokens of
  // that turn without the stop token that ended it.
  std::multiset<std::string> want;
  for (const Trajectory& t : groups->at(0).trajectories) {
    int64_t start = 0;
    for (const EpisodeTurn& turn : t.turns) {
      const bool ended_by_stop =
          turn.env_end > turn.model_end || t.finish_reason == FinishReason::kStop;
      if (ended_by_stop) {
        want.insert(
            tok->decode(std::vector<int64_t>(t.response_tokens.begin() + start,
                                             t.response_tokens.begin() + turn.model_end - 1))
                .value());
      }
      start = turn.env_end;
    }
  }
  EXPECT_EQ(std::multiset<std::string>(log->turns.begin(), log->turns.end()), want);
}

// A failing environment (an error status, a throw) ends its episode as
// env_error with the reason; the engine and the other episodes go on.
TEST(EpisodeDriverTest, AFailingEnvironmentEndsOnlyItsEpisode) {
  for (int fail_at : {0, 1}) {
    SCOPED_TRACE(fail_at);
    auto engine = make_engine();
    auto log = std::make_shared<ScriptedEnv::Log>();
    EpisodeDriver driver(*engine, std::make_shared<ScriptedFactory>(log, fail_at), tokenizer(), {});
    ASSERT_TRUE(engine->submit(group("g", 4, 5)).ok());
    auto groups = engine->run();
    ASSERT_TRUE(groups.ok()) << groups.status();
    int errors = 0;
    for (const Trajectory& t : groups->at(0).trajectories) {
      ASSERT_TRUE(check_trajectory(t).ok()) << check_trajectory(t);
      if (t.finish_reason != FinishReason::kEnvError) continue;
      ++errors;
      EXPECT_EQ(static_cast<int>(t.turns.size()), fail_at + 1);
      EXPECT_EQ(t.finish_detail, fail_at == 0
                                     ? "step: the sandbox went away"
                                     : "the environment threw: segfault in the tool, politely");
    }
    EXPECT_GE(errors, 1);
    EXPECT_EQ(driver.stats().env_errors, errors);
    EXPECT_TRUE(engine->idle());
  }
}

// An environment that does not answer within the deadline ends its episode
// (the call is abandoned on its own thread); the others finish.
class StuckEnv : public env::Environment {
 public:
  Status reset(const env::EpisodeStart&) override { return OkStatus(); }
  StatusOr<env::EnvStep> step(const env::ModelTurn&) override {
    if (calls_++ == 0 && first_.exchange(false)) {
      std::this_thread::sleep_for(std::chrono::seconds(2));
    }
    env::EnvStep out;
    out.next = env::EnvStep::Next::kAnswered;
    return out;
  }
  static std::atomic<bool> first_;

 private:
  int calls_ = 0;
};
std::atomic<bool> StuckEnv::first_{true};

class StuckFactory : public env::EnvironmentFactory {
 public:
  StatusOr<std::unique_ptr<env::Environment>> make() const override {
    return std::unique_ptr<env::Environment>(new StuckEnv());
  }
};

TEST(EpisodeDriverTest, AnEnvironmentPastItsDeadlineFailsOnlyItsEpisode) {
  auto engine = make_engine();
  EpisodeDriverOptions o;
  o.step_timeout = std::chrono::milliseconds(200);
  EpisodeDriver driver(*engine, std::make_shared<StuckFactory>(), tokenizer(), o);
  ASSERT_TRUE(engine->submit(group("g", 4, 3)).ok());
  const auto t0 = std::chrono::steady_clock::now();
  auto groups = engine->run();
  ASSERT_TRUE(groups.ok()) << groups.status();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2))
      << "the stuck call held the episode up past its deadline";
  int timed_out = 0, answered = 0;
  for (const Trajectory& t : groups->at(0).trajectories) {
    ASSERT_TRUE(check_trajectory(t).ok()) << check_trajectory(t);
    if (t.finish_reason == FinishReason::kEnvError) {
      ++timed_out;
      EXPECT_EQ(t.finish_detail, "no answer within 200 ms (the call is abandoned)");
    } else if (t.finish_reason == FinishReason::kStop) {
      ++answered;
    }
  }
  EXPECT_EQ(timed_out, 1);
  EXPECT_GE(answered, 1);
  EXPECT_EQ(driver.stats().env_timeouts, 1);
}

// With the real Qwen2 vocabulary, a tool observation tokenizes with the chat
// tokens as single ids and decodes back to itself, so what is appended is
// exactly what the template renders.
TEST(EpisodeDriverTest, QwenToolObservationsTokenizeWithSingleChatTokens) {
  const std::string path =
      RELAY_SOURCE_DIR "/../shared/testdata/tokenizer_parity/qwen2/tokenizer.json";
  if (!std::filesystem::exists(path)) {
    GTEST_SKIP() << path << " is absent: the Qwen2 observation ids are not checked";
  }
  auto t = model::BpeTokenizer::from_json(read_file(path).value(), path);
  ASSERT_TRUE(t.ok()) << t.status();
  const std::string text =
      env::render_observation(model::ChatTemplate::kChatml, {{"tool", "105"}, {"tool", "-7"}})
          .value();
  auto ids = t->encode(text);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(t->decode(*ids).value(), text);
  // "\n", <|im_start|>, "user", ..., <|im_end|>, "\n", <|im_start|>, "assistant", "\n".
  EXPECT_EQ(ids->front(), 198);
  EXPECT_EQ((*ids)[1], 151644);
  EXPECT_EQ(std::count(ids->begin(), ids->end(), 151644), 2);
  EXPECT_EQ(std::count(ids->begin(), ids->end(), 151645), 1);
  EXPECT_EQ(std::vector<int64_t>(ids->end() - 3, ids->end()),
            (std::vector<int64_t>{151644, 77091, 198}));
}

}  // namespace
}  // namespace relay::rollout
