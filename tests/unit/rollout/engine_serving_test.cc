// The rollout engine as a server uses it (engine.h, "Serving"): a group's own
// sampling and limits, tokens streamed as they are drawn, and samples ended
// from outside.

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <map>
#include <mutex>

#include "relay/rollout/engine.h"
#include "testing/tensor_testing.h"

namespace relay::rollout {
namespace {

using relay::testing::TinyConfig;

std::unique_ptr<Engine> make_engine(const EngineOptions& o, uint64_t weights_seed = 3) {
  model::Policy p(TinyConfig());
  model::init_weights(*p, weights_seed, 0.3);
  auto engine = Engine::create(p, o, 0, 100);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return std::move(engine).value();
}

EngineOptions options() {
  EngineOptions o;
  o.num_slots = 4;
  o.max_new_tokens = 8;
  return o;
}

PromptGroup group(const std::string& id, std::vector<int64_t> prompt, int k, uint64_t seed) {
  PromptGroup g;
  g.group_id = id;
  g.prompt = std::move(prompt);
  g.k = k;
  g.seed = seed;
  return g;
}

std::map<std::string, TrajectoryGroup> run_all(Engine& engine) {
  auto r = engine.run();
  EXPECT_TRUE(r.ok()) << r.status();
  std::map<std::string, TrajectoryGroup> out;
  if (r.ok()) {
    for (TrajectoryGroup& g : *r) out[g.group_id] = std::move(g);
  }
  return out;
}

void expect_same(const Trajectory& a, const Trajectory& b) {
  EXPECT_EQ(a.response_tokens, b.response_tokens);
  ASSERT_EQ(a.behavior_logprobs.size(), b.behavior_logprobs.size());
  for (size_t j = 0; j < a.behavior_logprobs.size(); ++j) {
    EXPECT_NEAR(a.behavior_logprobs[j], b.behavior_logprobs[j], 1e-5) << j;
    EXPECT_NEAR(a.proximal_logprobs[j], b.proximal_logprobs[j], 1e-5) << j;
  }
  EXPECT_EQ(a.finish_reason, b.finish_reason);
}

// A group with its own temperature, top_p and length, batched with a group on
// the engine's options, samples exactly what an engine configured that way
// samples for it alone; the other group is untouched too.
TEST(EngineServingTest, AGroupsOwnSamplingEqualsAnEngineConfiguredSo) {
  EngineOptions mixed_o = options();
  auto mixed = make_engine(mixed_o);
  PromptGroup own = group("own", {1, 2, 3}, 3, 7);
  own.sampling.temperature = 0.6;
  own.sampling.top_p = 0.9;
  own.sampling.max_new_tokens = 12;  // more than the engine's 8
  ASSERT_TRUE(mixed->submit(group("plain", {4, 5}, 3, 8)).ok());
  ASSERT_TRUE(mixed->submit(own).ok());
  auto got = run_all(*mixed);

  EngineOptions alone_o = options();
  alone_o.sampling.temperature = 0.6;
  alone_o.sampling.top_p = 0.9;
  alone_o.max_new_tokens = 12;
  auto alone = make_engine(alone_o);
  PromptGroup own_plain = own;
  own_plain.sampling = {};
  ASSERT_TRUE(alone->submit(own_plain).ok());
  auto want = run_all(*alone);

  auto plain_engine = make_engine(options());
  ASSERT_TRUE(plain_engine->submit(group("plain", {4, 5}, 3, 8)).ok());
  auto plain = run_all(*plain_engine);

  bool longer = false;
  for (int j = 0; j < 3; ++j) {
    SCOPED_TRACE(j);
    expect_same(got["own"].trajectories[j], want["own"].trajectories[j]);
    expect_same(got["plain"].trajectories[j], plain["plain"].trajectories[j]);
    EXPECT_LE(got["own"].trajectories[j].response_tokens.size(), 12u);
    longer |= got["own"].trajectories[j].response_tokens.size() > 8;
  }
  EXPECT_TRUE(longer) << "no sample used the group's longer limit; pick another seed";
}

TEST(EngineServingTest, AGroupsStopTokensEndOnlyItsSamples) {
  auto engine = make_engine(options());
  // Every id but 11 stops group "a"; "b" runs to its length.
  PromptGroup a = group("a", {1, 2, 3}, 4, 5);
  for (int64_t t = 0; t < 37; ++t) {
    if (t != 11) a.sampling.stop_tokens.push_back(t);
  }
  ASSERT_TRUE(engine->submit(a).ok());
  ASSERT_TRUE(engine->submit(group("b", {1, 2, 3}, 4, 5)).ok());
  auto done = run_all(*engine);
  for (const Trajectory& t : done["a"].trajectories) {
    EXPECT_EQ(t.finish_reason, FinishReason::kStop);
    EXPECT_LE(t.response_tokens.size(), 2u);
  }
  for (const Trajectory& t : done["b"].trajectories) {
    EXPECT_EQ(t.finish_reason, FinishReason::kLength);
    EXPECT_EQ(t.response_tokens.size(), 8u);
  }
}

TEST(EngineServingTest, BadGroupSamplingIsRejectedWithTheField) {
  auto engine = make_engine(options());
  struct Case {
    std::function<void(GroupSampling&)> spoil;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](GroupSampling& s) { s.temperature = 0; },
       "group 'g': sampling.temperature: must be > 0, got 0"},
      {[](GroupSampling& s) { s.top_p = 1.5; },
       "group 'g': sampling.top_p: must be in (0, 1], got 1.5"},
      {[](GroupSampling& s) { s.top_k = -1; },
       "group 'g': sampling.top_k: must be >= 0 (0 = off), got -1"},
      {[](GroupSampling& s) { s.max_new_tokens = -2; },
       "group 'g': sampling.max_new_tokens: must be >= 0 (0 = the engine's), got -2"},
      {[](GroupSampling& s) { s.stop_tokens = {1000}; },
       "group 'g': sampling.stop_tokens[0]: token id 1000 outside the vocabulary [0, 37)"},
  };
  for (const Case& c : cases) {
    PromptGroup g = group("g", {1, 2}, 1, 0);
    c.spoil(g.sampling);
    Status s = engine->submit(g);
    EXPECT_EQ(std::string(s.message()), c.message);
  }
  PromptGroup streamed = group("s", {1, 2}, 1, 0);
  streamed.stream_tokens = true;
  EXPECT_EQ(std::string(engine->submit(streamed).message()),
            "group 's': stream_tokens needs a token handler (set_token_handler) first");
}

// Every sampled token reaches the token handler in the step that drew it,
// with the log-prob and version the trajectory records; groups without
// stream_tokens send nothing.
TEST(EngineServingTest, StreamedTokensAreTheTrajectorysTokens) {
  auto engine = make_engine(options());
  std::map<std::pair<std::string, int>, std::vector<SampledToken>> seen;
  int calls = 0;
  engine->set_token_handler([&](std::vector<SampledToken> tokens) {
    ++calls;
    for (SampledToken& t : tokens) seen[{t.group_id, t.sample}].push_back(t);
  });
  PromptGroup g = group("g", {1, 2, 3}, 2, 4);
  g.stream_tokens = true;
  ASSERT_TRUE(engine->submit(g).ok());
  ASSERT_TRUE(engine->submit(group("quiet", {1, 2}, 1, 4)).ok());
  int steps = 0;
  std::map<std::string, TrajectoryGroup> done;
  while (!engine->idle()) {
    auto r = engine->step();
    ASSERT_TRUE(r.ok());
    ++steps;
    for (TrajectoryGroup& d : *r) done[d.group_id] = std::move(d);
  }
  EXPECT_LE(calls, steps);
  EXPECT_EQ(seen.count({"quiet", 0}), 0u);
  for (int j = 0; j < 2; ++j) {
    const Trajectory& t = done["g"].trajectories[j];
    const std::vector<SampledToken>& s = seen[{"g", j}];
    ASSERT_EQ(s.size(), t.response_tokens.size());
    for (size_t i = 0; i < s.size(); ++i) {
      EXPECT_EQ(s[i].token, t.response_tokens[i]);
      EXPECT_EQ(s[i].logprob, t.behavior_logprobs[i]);
      EXPECT_EQ(s[i].version, t.token_versions[i]);
    }
  }
}

// A caller's own stop rule, applied from the token handler: the sample ends
// at the token that matched, as if it were a stop token, and draws nothing
// more; the other sample goes on.
TEST(EngineServingTest, EndingASampleFromTheTokenHandlerStopsItAtThatToken) {
  auto engine = make_engine(options());
  std::vector<int64_t> seen;
  engine->set_token_handler([&](std::vector<SampledToken> tokens) {
    for (const SampledToken& t : tokens) {
      if (t.sample != 0) continue;
      seen.push_back(t.token);
      if (seen.size() == 3) {
        EXPECT_TRUE(engine->end_sample(t.group_id, 0, FinishReason::kStop).ok());
      }
    }
  });
  PromptGroup g = group("g", {1, 2, 3}, 2, 9);
  g.stream_tokens = true;
  ASSERT_TRUE(engine->submit(g).ok());
  auto done = run_all(*engine);
  const Trajectory& stopped = done["g"].trajectories[0];
  EXPECT_EQ(stopped.finish_reason, FinishReason::kStop);
  EXPECT_EQ(stopped.response_tokens, seen);
  EXPECT_TRUE(check_trajectory(stopped).ok()) << check_trajectory(stopped);
  EXPECT_EQ(done["g"].trajectories[1].response_tokens.size(), 8u);
}

// A client that goes away: its group ends as aborted, waiting samples
// included, and the slots go to the next group.
TEST(EngineServingTest, EndingAGroupAbortsItsWaitingAndRunningSamples) {
  EngineOptions o = options();
  o.num_slots = 2;
  auto engine = make_engine(o);
  ASSERT_TRUE(engine->submit(group("gone", {1, 2, 3}, 3, 1)).ok());
  ASSERT_TRUE(engine->submit(group("next", {4, 5}, 1, 2)).ok());
  ASSERT_TRUE(engine->step().ok());  // two samples of "gone" run, one waits
  ASSERT_TRUE(engine->end_sample("gone", -1, FinishReason::kAborted).ok());
  ASSERT_TRUE(engine->end_sample("unknown", -1, FinishReason::kAborted).ok());
  auto done = run_all(*engine);
  ASSERT_EQ(done.size(), 2u);
  for (int j = 0; j < 3; ++j) {
    const Trajectory& t = done["gone"].trajectories[j];
    EXPECT_EQ(t.finish_reason, FinishReason::kAborted);
    EXPECT_EQ(t.response_tokens.size(), j < 2 ? 1u : 0u) << j;
    EXPECT_TRUE(check_trajectory(t).ok()) << check_trajectory(t);
  }
  EXPECT_EQ(done["next"].trajectories[0].response_tokens.size(), 8u);
  EXPECT_EQ(std::string(engine->end_sample("x", 0, FinishReason::kLength).message()),
            "end_sample: group 'x': reason: must be stop or aborted, got length");
}

}  // namespace
}  // namespace relay::rollout
