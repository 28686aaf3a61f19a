// Multi-turn episodes in the rollout engine (engine.h, "Episodes"): turns
// parked while the environment answers, observations appended token-in /
// token-out, the episode's limits, and weight updates between and within
// turns.

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <mutex>
#include <thread>

#include "relay/rollout/engine.h"
#include "testing/tensor_testing.h"

namespace relay::rollout {
namespace {

using relay::testing::TinyConfig;

model::Policy make_policy(uint64_t seed) {
  model::Policy p(TinyConfig());
  model::init_weights(*p, seed, 0.3);
  p->eval();
  return p;
}

// Many stop tokens, so that turns end by themselves within a few tokens.
EngineOptions episode_options() {
  EngineOptions o;
  o.num_slots = 4;
  o.max_new_tokens = 6;
  o.stop_tokens = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13};
  o.episode.max_turns = 3;
  o.episode.max_tokens = 40;
  return o;
}

PromptGroup episode_group(const std::string& id, std::vector<int64_t> prompt, int k,
                          uint64_t seed) {
  PromptGroup g;
  g.group_id = id;
  g.prompt = std::move(prompt);
  g.k = k;
  g.seed = seed;
  g.episode = true;
  return g;
}

std::unique_ptr<Engine> make_engine(uint64_t weights_seed, const EngineOptions& o) {
  auto engine = Engine::create(make_policy(weights_seed), o, 0, 100);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return std::move(engine).value();
}

// log p(token) at temperature 1 of every response token, from one forward
// pass over prompt + response under `policy`.
std::vector<float> score_response(model::Policy& policy, const Trajectory& t) {
  torch::NoGradGuard g;
  std::vector<int64_t> ids = t.prompt_tokens;
  ids.insert(ids.end(), t.response_tokens.begin(), t.response_tokens.end());
  at::Tensor lp = policy->score(torch::tensor(ids).view({1, -1}), {}, {})[0];
  const size_t P = t.prompt_tokens.size();
  std::vector<float> out;
  for (size_t j = 0; j < t.response_tokens.size(); ++j) out.push_back(lp[P - 1 + j].item<float>());
  return out;
}

// Turn ends as the handler saw them, for a test to answer later.
struct TurnLog {
  std::mutex mu;
  std::vector<TurnEnd> ends;
  void add(TurnEnd e) {
    std::lock_guard<std::mutex> lock(mu);
    ends.push_back(std::move(e));
  }
  size_t size() {
    std::lock_guard<std::mutex> lock(mu);
    return ends.size();
  }
};

std::vector<TrajectoryGroup> run_all(Engine& engine) {
  auto r = engine.run();
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? std::move(r).value() : std::vector<TrajectoryGroup>{};
}

// The model's tokens keep the exact log-probs they were sampled with, read
// over the whole episode (prompt, turns, observations) in one pass: the
// observation went into the cache token-in/token-out. Environment tokens are
// the observation as given, with no log-prob, and the turns tile the response.
TEST(EngineEpisodeTest, ModelTokensKeepExactLogprobsAcrossObservations) {
  EngineOptions o = episode_options();
  o.sampling.record_raw_logprobs = true;
  auto engine = make_engine(7, o);
  const std::vector<int64_t> observation = {20, 21, 22, 23};
  std::vector<TurnEnd> seen;
  Engine* e = engine.get();
  engine->set_turn_handler([&](TurnEnd end) {
    TurnReply r;
    r.reward = 0.25 * (end.turn + 1);
    if (end.turn < 2) {
      r.observation = observation;
    } else {
      r.end = FinishReason::kStop;
    }
    const std::string id = end.group_id;
    const int sample = end.sample;
    seen.push_back(std::move(end));
    ASSERT_TRUE(e->reply(id, sample, std::move(r)).ok());
  });
  ASSERT_TRUE(engine->submit(episode_group("a", {30, 31, 32}, 3, 11)).ok());
  ASSERT_TRUE(engine->submit(episode_group("b", {33, 34}, 2, 12)).ok());
  model::Policy scorer = make_policy(7);
  int model_tokens = 0, multi_turn = 0;
  for (const TrajectoryGroup& g : run_all(*engine)) {
    for (size_t k = 0; k < g.trajectories.size(); ++k) {
      const Trajectory& t = g.trajectories[k];
      SCOPED_TRACE(g.group_id + "/" + std::to_string(k));
      ASSERT_TRUE(check_trajectory(t).ok()) << check_trajectory(t);
      ASSERT_FALSE(t.turns.empty());
      ASSERT_EQ(t.env_mask.size(), t.response_tokens.size());
      const std::vector<float> want = score_response(scorer, t);
      for (size_t j = 0; j < t.response_tokens.size(); ++j) {
        if (t.is_env_token(j)) {
          EXPECT_TRUE(std::isnan(t.behavior_logprobs[j]));
          EXPECT_TRUE(std::isnan(t.raw_logprobs[j]));
          EXPECT_EQ(t.proximal_versions[j], -1);
        } else {
          EXPECT_NEAR(t.behavior_logprobs[j], want[j], 1e-5) << "token " << j;
          ++model_tokens;
        }
      }
      int64_t start = 0;
      for (size_t i = 0; i < t.turns.size(); ++i) {
        const EpisodeTurn& turn = t.turns[i];
        if (turn.env_end > turn.model_end) {
          // A turn the environment answered ended in a stop token, and the
          // observation follows it verbatim.
          EXPECT_TRUE(std::count(o.stop_tokens.begin(), o.stop_tokens.end(),
                                 t.response_tokens[turn.model_end - 1]));
          EXPECT_EQ(std::vector<int64_t>(t.response_tokens.begin() + turn.model_end,
                                         t.response_tokens.begin() + turn.env_end),
                    observation);
          EXPECT_DOUBLE_EQ(turn.reward, 0.25 * (i + 1));
        }
        start = turn.env_end;
      }
      EXPECT_EQ(start, static_cast<int64_t>(t.response_tokens.size()));
      if (t.turns.size() == 3 && t.finish_reason == FinishReason::kStop) {
        EXPECT_DOUBLE_EQ(t.turns[2].reward, 0.75);
        ++multi_turn;
      }
      EXPECT_TRUE(t.finish_reason == FinishReason::kStop ||
                  t.finish_reason == FinishReason::kLength)
          << finish_reason_name(t.finish_reason);
    }
  }
  EXPECT_GT(model_tokens, 15);
  EXPECT_GE(multi_turn, 2) << "too few episodes went the full three turns to test anything";
  // What the handler was given is the sequence as it stood: context + tokens
  // is a prefix of prompt + response of its trajectory.
  ASSERT_FALSE(seen.empty());
  for (const TurnEnd& end : seen) {
    EXPECT_FALSE(end.tokens.empty());
    EXPECT_TRUE(std::count(o.stop_tokens.begin(), o.stop_tokens.end(), end.tokens.back()));
    EXPECT_GE(end.context.size(), 2u);
  }
  EXPECT_EQ(engine->stats().turns_ended, static_cast<int64_t>(seen.size()));
}

// While one episode waits on its environment, the others keep decoding; and
// with every sequence parked, step() waits for an answer instead of spinning.
TEST(EngineEpisodeTest, OthersKeepDecodingWhileOneWaitsAndStepWaitsForAnswers) {
  EngineOptions o = episode_options();
  o.stop_tokens = {4};
  o.max_new_tokens = 30;
  o.episode.max_tokens = 60;
  auto engine = make_engine(3, o);
  TurnLog log;
  engine->set_turn_handler([&](TurnEnd end) { log.add(std::move(end)); });
  // Episode "ep" and plain group "plain" side by side; find seeds where the
  // episode's first turn ends before the plain response does.
  PromptGroup plain;
  plain.group_id = "plain";
  plain.prompt = {30, 31};
  plain.k = 1;
  plain.seed = 5;
  ASSERT_TRUE(engine->submit(episode_group("ep", {30, 32}, 1, 9)).ok());
  ASSERT_TRUE(engine->submit(plain).ok());
  std::vector<TrajectoryGroup> done;
  for (int i = 0; i < 100 && log.size() == 0; ++i) {
    auto step = engine->step();
    ASSERT_TRUE(step.ok()) << step.status();
    for (auto& g : *step) done.push_back(std::move(g));
    ASSERT_TRUE(done.empty()) << "the plain response ended before the episode's first turn; "
                                 "pick other seeds";
  }
  // Parked: each step samples for the plain sequence only.
  for (int i = 0; i < 3 && done.empty(); ++i) {
    const EngineStats before = engine->stats();
    auto step = engine->step();
    ASSERT_TRUE(step.ok());
    for (auto& g : *step) done.push_back(std::move(g));
    const EngineStats after = engine->stats();
    EXPECT_EQ(after.sampled_tokens - before.sampled_tokens, 1);
    EXPECT_EQ(after.parked_sequence_steps - before.parked_sequence_steps, 1);
  }
  // Let the plain group finish; then only the parked episode is left, and
  // the engine waits for its answer, which comes from another thread.
  while (done.empty()) {
    auto step = engine->step();
    ASSERT_TRUE(step.ok());
    for (auto& g : *step) done.push_back(std::move(g));
  }
  const int64_t steps_before = engine->stats().steps;
  std::thread answer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    TurnReply r;
    r.end = FinishReason::kEnvDone;
    r.reward = 1.0;
    EXPECT_TRUE(engine->reply("ep", 0, r).ok());
  });
  std::vector<TrajectoryGroup> rest = run_all(*engine);
  answer.join();
  ASSERT_EQ(rest.size(), 1u);
  const Trajectory& t = rest[0].trajectories.at(0);
  ASSERT_TRUE(check_trajectory(t).ok()) << check_trajectory(t);
  EXPECT_EQ(t.finish_reason, FinishReason::kEnvDone);
  ASSERT_EQ(t.turns.size(), 1u);
  EXPECT_DOUBLE_EQ(t.turns[0].reward, 1.0);
  // 300 ms of waiting took a handful of bounded waits, not a busy loop.
  EXPECT_LT(engine->stats().steps - steps_before, 10);
}

// Every slot held by a parked episode and more samples queued behind them:
// the engine waits for an answer instead of spinning on an admission that
// cannot happen.
TEST(EngineEpisodeTest, StepWaitsWhenParkedEpisodesHoldEverySlot) {
  EngineOptions o = episode_options();
  o.num_slots = 1;
  auto engine = make_engine(7, o);
  TurnLog log;
  engine->set_turn_handler([&](TurnEnd end) { log.add(std::move(end)); });
  ASSERT_TRUE(engine->submit(episode_group("a", {30, 31, 32}, 1, 11)).ok());
  ASSERT_TRUE(engine->submit(episode_group("b", {30, 31, 33}, 1, 12)).ok());
  for (int i = 0; i < 100 && log.size() == 0; ++i) ASSERT_TRUE(engine->step().ok());
  ASSERT_EQ(log.size(), 1u) << "the first turn ended by length; pick another seed";
  const int64_t steps_before = engine->stats().steps;
  std::thread answer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    TurnReply r;
    r.end = FinishReason::kStop;
    EXPECT_TRUE(engine->reply(log.ends[0].group_id, 0, r).ok());
  });
  // Step until "a" is back: "b" cannot start before it leaves its slot.
  std::vector<TrajectoryGroup> done;
  while (done.empty()) {
    auto step = engine->step();
    ASSERT_TRUE(step.ok());
    for (auto& g : *step) done.push_back(std::move(g));
  }
  answer.join();
  EXPECT_EQ(done.at(0).group_id, "a");
  EXPECT_LT(engine->stats().steps - steps_before, 10);
  engine->abort();
  run_all(*engine);
}

// The limits: max_turns (an environment that keeps asking ends it as
// tool_budget), the token budget (an observation that leaves no room ends it
// as length, unappended), a turn cut by max_new_tokens (no environment
// call), and an environment error with its reason.
TEST(EngineEpisodeTest, LimitsAndEndingsAreRecorded) {
  {  // max_turns
    EngineOptions o = episode_options();
    o.episode.max_turns = 2;
    o.episode.max_tokens = 60;
    auto engine = make_engine(7, o);
    Engine* e = engine.get();
    int calls = 0;
    engine->set_turn_handler([&](TurnEnd end) {
      ++calls;
      TurnReply r;
      r.observation = {20, 21};
      ASSERT_TRUE(e->reply(end.group_id, end.sample, r).ok());
    });
    ASSERT_TRUE(engine->submit(episode_group("a", {30, 31, 32}, 4, 11)).ok());
    int budget = 0;
    const std::vector<TrajectoryGroup> groups = run_all(*engine);
    ASSERT_EQ(groups.size(), 1u);
    for (const Trajectory& t : groups[0].trajectories) {
      ASSERT_TRUE(check_trajectory(t).ok()) << check_trajectory(t);
      if (t.finish_reason == FinishReason::kToolBudget) {
        ++budget;
        ASSERT_EQ(t.turns.size(), 2u);
        // The last answer was not appended: the response ends with the model.
        EXPECT_EQ(t.turns[1].env_end, t.turns[1].model_end);
        EXPECT_EQ(t.turns[1].env_end, static_cast<int64_t>(t.response_tokens.size()));
        EXPECT_EQ(t.num_env_tokens(), 2);
      } else {
        EXPECT_EQ(t.finish_reason, FinishReason::kLength);
      }
    }
    EXPECT_GE(budget, 2);
    EXPECT_GE(calls, 4);
  }
  {  // the token budget, and an error
    EngineOptions o = episode_options();
    o.episode.max_tokens = 12;
    auto engine = make_engine(7, o);
    Engine* e = engine.get();
    engine->set_turn_handler([&](TurnEnd end) {
      TurnReply r;
      if (end.sample == 0) {
        r.observation = std::vector<int64_t>(12, 20);  // never fits
      } else {
        r.end = FinishReason::kEnvError;
        r.detail = "tool 'calculator' timed out after 50 ms";
      }
      ASSERT_TRUE(e->reply(end.group_id, end.sample, r).ok());
    });
    ASSERT_TRUE(engine->submit(episode_group("a", {30, 31, 32}, 2, 11)).ok());
    const auto groups = run_all(*engine);
    const Trajectory& t0 = groups.at(0).trajectories.at(0);
    const Trajectory& t1 = groups.at(0).trajectories.at(1);
    for (const Trajectory* t : {&t0, &t1}) ASSERT_TRUE(check_trajectory(*t).ok());
    if (t0.turns.size() == 1 && t0.turns[0].model_end > 0 &&
        std::count(o.stop_tokens.begin(), o.stop_tokens.end(), t0.response_tokens.back())) {
      EXPECT_EQ(t0.finish_reason, FinishReason::kLength);
      EXPECT_EQ(t0.num_env_tokens(), 0);
    }
    if (t1.finish_reason != FinishReason::kLength) {
      EXPECT_EQ(t1.finish_reason, FinishReason::kEnvError);
      EXPECT_EQ(t1.finish_detail, "tool 'calculator' timed out after 50 ms");
    }
  }
  {  // a turn cut by max_new_tokens ends the episode without asking
    EngineOptions o = episode_options();
    o.stop_tokens = {36};
    o.max_new_tokens = 3;
    auto engine = make_engine(7, o);
    int calls = 0;
    engine->set_turn_handler([&](TurnEnd) { ++calls; });
    ASSERT_TRUE(engine->submit(episode_group("a", {30, 31}, 2, 11)).ok());
    const std::vector<TrajectoryGroup> groups = run_all(*engine);
    ASSERT_EQ(groups.size(), 1u);
    for (const Trajectory& t : groups[0].trajectories) {
      ASSERT_TRUE(check_trajectory(t).ok()) << check_trajectory(t);
      if (t.finish_reason != FinishReason::kLength) continue;  // sampled the stop token
      EXPECT_EQ(t.response_tokens.size(), 3u);
      ASSERT_EQ(t.turns.size(), 1u);
      EXPECT_EQ(t.turns[0].model_end, 3);
    }
    EXPECT_LE(calls, 2);
  }
}

// Weights that change while an episode waits: under recompute the parked
// cache is rebuilt, the earlier turn's tokens get proximal values under the
// new weights, the observation carries the new version, and the next turn
// is sampled exactly from the new weights over the whole history.
TEST(EngineEpisodeTest, RecomputeRebuildsAParkedEpisodeUnderTheNewWeights) {
  EngineOptions o = episode_options();
  auto engine = make_engine(7, o);
  TurnLog log;
  engine->set_turn_handler([&](TurnEnd end) { log.add(std::move(end)); });
  ASSERT_TRUE(engine->submit(episode_group("a", {30, 31, 32}, 1, 11)).ok());
  for (int i = 0; i < 100 && log.size() == 0 && !engine->idle(); ++i) {
    ASSERT_TRUE(engine->step().ok());
  }
  ASSERT_EQ(log.size(), 1u) << "the first turn ended by length; pick another seed";
  model::Policy w0 = make_policy(7), w1 = make_policy(8);
  ASSERT_TRUE(engine->update_weights(1, 101, model::parameter_tensors(*w1)).ok());
  ASSERT_TRUE(engine->step().ok());  // lands while parked
  TurnReply r;
  r.observation = {20, 21, 22};
  ASSERT_TRUE(engine->reply("a", 0, r).ok());
  // The second turn ends (or runs out), and the episode stops there.
  Engine* e = engine.get();
  engine->set_turn_handler([&](TurnEnd end) {
    TurnReply stop;
    stop.end = FinishReason::kStop;
    ASSERT_TRUE(e->reply(end.group_id, end.sample, stop).ok());
  });
  const Trajectory t = run_all(*engine).at(0).trajectories.at(0);
  ASSERT_TRUE(check_trajectory(t).ok()) << check_trajectory(t);
  ASSERT_EQ(t.turns.size(), 2u);
  const int64_t m0 = t.turns[0].model_end, e0 = t.turns[0].env_end;
  const std::vector<float> under_v0 = score_response(w0, t), under_v1 = score_response(w1, t);
  for (int64_t j = 0; j < static_cast<int64_t>(t.response_tokens.size()); ++j) {
    SCOPED_TRACE("token " + std::to_string(j));
    if (j < m0) {
      EXPECT_EQ(t.token_versions[j], 0);
      EXPECT_NEAR(t.behavior_logprobs[j], under_v0[j], 1e-5);
      EXPECT_EQ(t.proximal_versions[j], 1);
      EXPECT_NEAR(t.proximal_logprobs[j], under_v1[j], 1e-5);
    } else if (j < e0) {
      EXPECT_EQ(t.token_versions[j], 1);
      EXPECT_TRUE(t.is_env_token(j));
    } else {
      EXPECT_EQ(t.token_versions[j], 1);
      EXPECT_NEAR(t.behavior_logprobs[j], under_v1[j], 1e-5);
    }
  }
  EXPECT_EQ(t.interruptions, 1);
}

// `finish` and `restart` apply per turn: finish waits only for sequences in
// the middle of a turn (a parked episode does not hold an update back), and
// restart drops only the turn in progress.
TEST(EngineEpisodeTest, FinishAndRestartApplyPerTurn) {
  for (InterruptPolicy policy : {InterruptPolicy::kFinish, InterruptPolicy::kRestart}) {
    SCOPED_TRACE(kInterruptPolicyNames.name(policy));
    EngineOptions o = episode_options();
    o.interrupt = policy;
    o.stop_tokens = {4, 5};
    o.max_new_tokens = 12;
    // The first seed whose episode ends turn 0 with a stop token and is in
    // the middle of turn 1 one step after the observation went in.
    std::unique_ptr<Engine> engine;
    for (uint64_t seed = 1; seed < 40 && !engine; ++seed) {
      auto candidate = make_engine(7, o);
      TurnLog log;
      candidate->set_turn_handler([&](TurnEnd end) { log.add(std::move(end)); });
      ASSERT_TRUE(candidate->submit(episode_group("a", {30, 31, 32}, 1, seed)).ok());
      for (int i = 0; i < 100 && log.size() == 0 && !candidate->idle(); ++i) {
        ASSERT_TRUE(candidate->step().ok());
      }
      if (log.size() != 1) continue;  // the first turn ended by length
      TurnReply r;
      r.observation = {20, 21, 22};
      ASSERT_TRUE(candidate->reply("a", 0, r).ok());
      ASSERT_TRUE(candidate->step().ok());  // the observation in, turn 1's first token
      if (log.size() == 1)
        engine = std::move(candidate);
      else
        candidate->set_turn_handler([](TurnEnd) {});  // log dies here
    }
    ASSERT_NE(engine, nullptr);
    model::Policy w1 = make_policy(8);
    ASSERT_TRUE(engine->update_weights(1, 101, model::parameter_tensors(*w1)).ok());
    Engine* e = engine.get();
    engine->set_turn_handler([&](TurnEnd end) {
      TurnReply stop;
      stop.end = FinishReason::kStop;
      ASSERT_TRUE(e->reply(end.group_id, end.sample, stop).ok());
    });
    const Trajectory t = run_all(*engine).at(0).trajectories.at(0);
    ASSERT_TRUE(check_trajectory(t).ok()) << check_trajectory(t);
    ASSERT_GE(t.turns.size(), 2u);
    const int64_t m0 = t.turns[0].model_end, e0 = t.turns[0].env_end;
    EXPECT_EQ(std::vector<int64_t>(t.token_versions.begin(), t.token_versions.begin() + m0),
              std::vector<int64_t>(m0, 0));
    // Turn 1: one version throughout, 0 under finish (the turn in progress
    // finished first), 1 under restart (dropped and sampled again).
    const int64_t want = policy == InterruptPolicy::kFinish ? 0 : 1;
    for (int64_t j = e0; j < t.turns[1].model_end; ++j) EXPECT_EQ(t.token_versions[j], want);
    EXPECT_EQ(t.restarts, policy == InterruptPolicy::kRestart ? 1 : 0);
    model::Policy scorer = make_policy(policy == InterruptPolicy::kFinish ? 7 : 8);
    const std::vector<float> want_lp = score_response(scorer, t);
    for (int64_t j = e0; j < t.turns[1].model_end; ++j) {
      EXPECT_NEAR(t.behavior_logprobs[j], want_lp[j], 1e-5) << "token " << j;
    }
  }
}

// A forced prefix that ends in a stop token is a whole first turn (a warm
// start's tool call, say): the turn ends there and the environment answers.
TEST(EngineEpisodeTest, AForcedFirstTurnEndsAtItsStopToken) {
  EngineOptions o = episode_options();
  o.stop_tokens = {4};
  o.prefix.n_prefix = -1;
  o.prefix.strategy = PrefixStrategy::kFixed;
  o.prefix.min_ratio = 1.0;
  o.prefix.max_ratio = 1.0;
  auto engine = make_engine(7, o);
  TurnLog log;
  Engine* e = engine.get();
  engine->set_turn_handler([&](TurnEnd end) {
    const std::string id = end.group_id;
    const int sample = end.sample, turn = end.turn;
    log.add(std::move(end));
    TurnReply r;
    if (turn == 0) {
      r.observation = {20, 21};
    } else {
      r.end = FinishReason::kStop;
    }
    ASSERT_TRUE(e->reply(id, sample, r).ok());
  });
  PromptGroup g = episode_group("a", {30, 31}, 2, 11);
  g.target = {25, 26, 4};
  ASSERT_TRUE(engine->submit(g).ok());
  const std::vector<TrajectoryGroup> groups = run_all(*engine);
  ASSERT_EQ(groups.size(), 1u);
  for (const Trajectory& t : groups[0].trajectories) {
    ASSERT_TRUE(check_trajectory(t).ok()) << check_trajectory(t);
    ASSERT_GE(t.turns.size(), 1u);
    EXPECT_EQ(t.turns[0].model_end, 3);
    EXPECT_EQ(std::vector<int64_t>(t.response_tokens.begin(), t.response_tokens.begin() + 3),
              (std::vector<int64_t>{25, 26, 4}));
    EXPECT_EQ(t.num_forced(), 3);
    EXPECT_EQ(t.turns[0].env_end, 5);  // the observation followed
  }
  ASSERT_GE(log.size(), 2u);
  EXPECT_EQ(log.ends[0].tokens, (std::vector<int64_t>{25, 26, 4}));
}

TEST(EngineEpisodeTest, BadRepliesAndSubmissionsAreRefusedWithTheField) {
  EngineOptions o = episode_options();
  auto engine = make_engine(7, o);
  // No handler yet.
  Status s = engine->submit(episode_group("a", {30, 31}, 1, 1));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  TurnLog log;
  engine->set_turn_handler([&](TurnEnd end) { log.add(std::move(end)); });
  PromptGroup with_baseline = episode_group("b", {30, 31}, 1, 1);
  with_baseline.greedy_baseline = true;
  s = engine->submit(with_baseline);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("greedy_baseline"), std::string::npos) << s;

  ASSERT_TRUE(engine->submit(episode_group("a", {30, 31}, 1, 1)).ok());
  TurnReply empty, valid;
  valid.observation = {20};
  s = engine->reply("a", 0, valid);  // not parked yet
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  for (int i = 0; i < 100 && log.size() == 0 && !engine->idle(); ++i) {
    ASSERT_TRUE(engine->step().ok());
  }
  ASSERT_EQ(log.size(), 1u) << "the first turn ended by length; pick another seed";
  s = engine->reply("a", 0, empty);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("observation: empty"), std::string::npos) << s;
  TurnReply outside;
  outside.observation = {20, 37};
  s = engine->reply("a", 0, outside);
  EXPECT_NE(s.message().find("observation[1]: token id 37"), std::string::npos) << s;
  TurnReply length;
  length.end = FinishReason::kLength;
  s = engine->reply("a", 0, length);
  EXPECT_NE(s.message().find("end: must be stop, env_done or env_error"), std::string::npos) << s;
  s = engine->reply("a", 1, valid);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;

  // Abort with the episode parked: it comes back whole, and a late answer is
  // refused.
  engine->abort();
  auto groups = run_all(*engine);
  ASSERT_EQ(groups.size(), 1u);
  const Trajectory& t = groups[0].trajectories.at(0);
  ASSERT_TRUE(check_trajectory(t).ok()) << check_trajectory(t);
  EXPECT_EQ(t.finish_reason, FinishReason::kAborted);
  TurnReply late;
  late.end = FinishReason::kStop;
  EXPECT_EQ(engine->reply("a", 0, late).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(engine->idle());
}

}  // namespace
}  // namespace relay::rollout
