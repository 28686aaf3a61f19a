#include "relay/rollout/engine.h"

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <thread>

#include "relay/rollout/generate.h"
#include "relay/rollout/options.h"
#include "testing/tensor_testing.h"

namespace relay::rollout {
namespace {

using relay::testing::TinyConfig;

// A random policy with peaked enough distributions that stop tokens and
// top-k/top-p truncation both matter.
model::Policy make_policy(uint64_t seed) {
  model::Policy p(TinyConfig());
  model::init_weights(*p, seed, 0.3);
  p->eval();
  return p;
}

std::unordered_map<std::string, at::Tensor> weights_of(model::Policy& p) {
  return model::parameter_tensors(*p);
}

// A version the engine alone holds: the test can see when it lets go.
std::unordered_map<std::string, at::Tensor> cloned_weights(model::Policy p) {
  std::unordered_map<std::string, at::Tensor> m;
  for (auto& [name, t] : weights_of(p)) m[name] = t.detach().clone();
  return m;
}

EngineOptions base_options() {
  EngineOptions o;
  o.num_slots = 4;
  o.max_new_tokens = 8;
  return o;
}

std::unique_ptr<Engine> make_engine(uint64_t weights_seed, const EngineOptions& options,
                                    int64_t version = 0, uint64_t digest = 100) {
  auto engine = Engine::create(make_policy(weights_seed), options, version, digest);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return std::move(engine).value();
}

PromptGroup group(const std::string& id, std::vector<int64_t> prompt, int k, uint64_t seed) {
  PromptGroup g;
  g.group_id = id;
  g.prompt = std::move(prompt);
  g.k = k;
  g.seed = seed;
  return g;
}

std::map<std::string, TrajectoryGroup> by_id(std::vector<TrajectoryGroup> groups) {
  std::map<std::string, TrajectoryGroup> out;
  for (TrajectoryGroup& g : groups) out[g.group_id] = std::move(g);
  return out;
}

std::vector<TrajectoryGroup> run_all(Engine& engine) {
  auto r = engine.run();
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? std::move(r).value() : std::vector<TrajectoryGroup>{};
}

// Scoring-path log-probs of the response tokens (temperature, untruncated),
// from a separate policy object: position P - 1 + j scores response token j.
std::vector<float> score_response(model::Policy& policy, const Trajectory& t, double temperature) {
  torch::NoGradGuard g;
  std::vector<int64_t> ids = t.prompt_tokens;
  ids.insert(ids.end(), t.response_tokens.begin(), t.response_tokens.end());
  at::Tensor x = torch::tensor(ids).view({1, -1});
  model::ScoreOptions so;
  so.temperature = temperature;
  at::Tensor lp = policy->score(x, {}, so)[0];
  const int64_t P = static_cast<int64_t>(t.prompt_tokens.size());
  std::vector<float> out;
  for (size_t j = 0; j < t.response_tokens.size(); ++j) out.push_back(lp[P - 1 + j].item<float>());
  return out;
}

// The truncated sampling distribution, written out independently of the
// sampler: temperature, then top-k (ties at the k-th value kept), then top-p
// (smallest prefix of the sorted distribution with mass >= p), renormalised.
// Returns log p(token), -inf if the token was removed.
double reference_logprob(const at::Tensor& logits_row, int64_t token, const SamplingOptions& o) {
  at::Tensor z = logits_row.to(torch::kFloat64) / o.temperature;
  const int64_t V = z.size(0);
  std::vector<double> v(z.data_ptr<double>(), z.data_ptr<double>() + V);
  std::vector<bool> keep(V, true);
  if (o.top_k > 0 && o.top_k < V) {
    std::vector<double> sorted = v;
    std::sort(sorted.begin(), sorted.end(), std::greater<double>());
    const double kth = sorted[o.top_k - 1];
    for (int64_t i = 0; i < V; ++i) keep[i] = v[i] >= kth;
  }
  if (o.top_p < 1.0) {
    double mx = -INFINITY;
    for (int64_t i = 0; i < V; ++i) {
      if (keep[i]) mx = std::max(mx, v[i]);
    }
    std::vector<std::pair<double, int64_t>> probs;
    double total = 0;
    for (int64_t i = 0; i < V; ++i) {
      if (keep[i]) {
        probs.push_back({std::exp(v[i] - mx), i});
        total += probs.back().first;
      }
    }
    std::sort(probs.begin(), probs.end(), std::greater<>());
    double before = 0;
    for (auto& [p, i] : probs) {
      if (before / total >= o.top_p) keep[i] = false;
      before += p;
    }
  }
  double mx = -INFINITY;
  for (int64_t i = 0; i < V; ++i) {
    if (keep[i]) mx = std::max(mx, v[i]);
  }
  double total = 0;
  for (int64_t i = 0; i < V; ++i) {
    if (keep[i]) total += std::exp(v[i] - mx);
  }
  if (!keep[token]) return -INFINITY;
  return v[token] - mx - std::log(total);
}

// Invariant 1: the recorded behavior log-prob is the log-prob under the
// distribution the token was sampled from, truncation included.
TEST(EngineTest, BehaviorLogprobsEqualIndependentRecomputation) {
  struct Case {
    double temperature;
    int64_t top_k;
    double top_p;
  };
  const Case cases[] = {{1.0, 0, 1.0}, {0.6, 0, 1.0}, {1.4, 0, 1.0}, {1.0, 5, 1.0},
                        {0.8, 0, 0.7}, {1.2, 8, 0.9}, {0.7, 3, 0.5}};
  model::Policy scorer = make_policy(7);
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message()
                 << "T=" << c.temperature << " top_k=" << c.top_k << " top_p=" << c.top_p);
    EngineOptions o = base_options();
    o.sampling.temperature = c.temperature;
    o.sampling.top_k = c.top_k;
    o.sampling.top_p = c.top_p;
    o.sampling.record_raw_logprobs = true;
    auto engine = make_engine(7, o);
    ASSERT_TRUE(engine->submit(group("a", {3, 7, 1}, 3, 11)).ok());
    ASSERT_TRUE(engine->submit(group("b", {9, 2, 2, 5, 30, 6}, 2, 12)).ok());
    int checked = 0;
    for (const TrajectoryGroup& g : run_all(*engine)) {
      for (const Trajectory& t : g.trajectories) {
        ASSERT_TRUE(check_trajectory(t).ok()) << check_trajectory(t);
        torch::NoGradGuard ng;
        std::vector<int64_t> ids = t.prompt_tokens;
        ids.insert(ids.end(), t.response_tokens.begin(), t.response_tokens.end());
        at::Tensor logits = scorer->forward(torch::tensor(ids).view({1, -1}))[0];
        const size_t P = t.prompt_tokens.size();
        for (size_t j = 0; j < t.response_tokens.size(); ++j) {
          at::Tensor row = logits[P - 1 + j];
          const double want = reference_logprob(row, t.response_tokens[j], o.sampling);
          ASSERT_TRUE(std::isfinite(want)) << "sampled a token outside the truncated set";
          EXPECT_NEAR(t.behavior_logprobs[j], want, 1e-5) << "token " << j;
          const double raw =
              torch::log_softmax(row.to(torch::kFloat64), -1)[t.response_tokens[j]].item<double>();
          EXPECT_NEAR(t.raw_logprobs[j], raw, 1e-5) << "token " << j;
          ++checked;
        }
      }
    }
    EXPECT_GT(checked, 20);
  }
}

// Continuous batching: with fewer slots than sequences, slots are refilled as
// sequences finish, and every sequence gets the tokens it gets alone.
TEST(EngineTest, ContinuousBatchingMatchesGeneratingEachGroupAlone) {
  EngineOptions o = base_options();
  o.num_slots = 3;
  o.max_new_tokens = 12;
  o.stop_tokens = {4, 5};
  const std::vector<PromptGroup> groups = {
      group("g0", {3, 7, 1}, 2, 1), group("g1", {9, 2, 2, 5, 30, 6, 8, 8, 1}, 3, 2),
      group("g2", {11}, 1, 3), group("g3", {6, 6, 6, 6, 6}, 2, 4)};
  auto batched = make_engine(21, o);
  for (const PromptGroup& g : groups) ASSERT_TRUE(batched->submit(g).ok());
  auto together = by_id(run_all(*batched));
  ASSERT_EQ(together.size(), groups.size());
  EXPECT_EQ(batched->stats().sampled_tokens, [&] {
    int64_t n = 0;
    for (auto& [id, g] : together)
      for (auto& t : g.trajectories) n += t.response_tokens.size();
    return n;
  }());

  bool mixed_lengths = false;
  for (const PromptGroup& g : groups) {
    EngineOptions alone_options = o;
    alone_options.num_slots = 1;
    auto alone = make_engine(21, alone_options);
    ASSERT_TRUE(alone->submit(g).ok());
    auto result = run_all(*alone);
    ASSERT_EQ(result.size(), 1u);
    const TrajectoryGroup& want = result[0];
    const TrajectoryGroup& got = together[g.group_id];
    ASSERT_EQ(got.trajectories.size(), want.trajectories.size());
    for (size_t j = 0; j < want.trajectories.size(); ++j) {
      SCOPED_TRACE(g.group_id + " sample " + std::to_string(j));
      const Trajectory& a = got.trajectories[j];
      const Trajectory& b = want.trajectories[j];
      EXPECT_EQ(a.response_tokens, b.response_tokens);
      EXPECT_EQ(a.finish_reason, b.finish_reason);
      ASSERT_EQ(a.behavior_logprobs.size(), b.behavior_logprobs.size());
      for (size_t i = 0; i < a.behavior_logprobs.size(); ++i) {
        EXPECT_NEAR(a.behavior_logprobs[i], b.behavior_logprobs[i], 1e-5);
      }
      if (a.response_tokens.size() != got.trajectories[0].response_tokens.size()) {
        mixed_lengths = true;
      }
    }
  }
  // The case is only interesting if sequences finished at different times.
  EXPECT_TRUE(mixed_lengths);
}

// The K samples of one prompt share its prefill: the context (P - 1
// positions) is computed once and copied into the other K - 1 slots.
TEST(EngineTest, SamplesOfOneGroupShareThePromptPrefill) {
  const std::vector<int64_t> prompt = {9, 2, 2, 5, 30, 6, 8, 8, 1, 17};
  EngineOptions o = base_options();
  o.num_slots = 4;
  auto shared = make_engine(3, o);
  ASSERT_TRUE(shared->submit(group("g", prompt, 4, 9)).ok());
  auto a = run_all(*shared);
  EXPECT_EQ(shared->stats().context_tokens, static_cast<int64_t>(prompt.size()) - 1);
  EXPECT_EQ(shared->stats().shared_prefills, 3);

  o.num_slots = 1;  // one at a time: nothing live to copy from
  auto serial = make_engine(3, o);
  ASSERT_TRUE(serial->submit(group("g", prompt, 4, 9)).ok());
  auto b = run_all(*serial);
  EXPECT_EQ(serial->stats().context_tokens, 4 * (static_cast<int64_t>(prompt.size()) - 1));
  EXPECT_EQ(serial->stats().shared_prefills, 0);
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  for (int j = 0; j < 4; ++j) {
    EXPECT_EQ(a[0].trajectories[j].response_tokens, b[0].trajectories[j].response_tokens);
  }
}

TEST(EngineTest, SameSeedSameTokensDifferentSeedDifferentTokens) {
  EngineOptions o = base_options();
  auto run_seed = [&](uint64_t seed) {
    auto e = make_engine(5, o);
    EXPECT_TRUE(e->submit(group("g", {1, 2, 3}, 2, seed)).ok());
    auto r = run_all(*e);
    return r.at(0).trajectories.at(1).response_tokens;
  };
  EXPECT_EQ(run_seed(42), run_seed(42));
  EXPECT_NE(run_seed(42), run_seed(43));
}

// Seed 001's timeline: token 0 at v0; update to v1; tokens 1-2 at v1; update
// to v2; token 3 at v2. Versions [0, 1, 1, 2]; proximal values are the
// log-probs under v1, v2, v2, v2, checked against the scoring path of
// separately built policies holding those weights.
TEST(EngineTest, Seed001TimelineVersionsAndProximalLogprobs) {
  EngineOptions o = base_options();
  o.max_new_tokens = 4;
  o.sampling.temperature = 0.9;
  o.sampling.top_k = 20;  // behavior (truncated) and proximal (untruncated) differ
  model::Policy w0 = make_policy(100), w1 = make_policy(101), w2 = make_policy(102);
  auto engine = Engine::create(make_policy(100), o, 0, 0xA0).value();
  ASSERT_TRUE(engine->submit(group("g", {3, 8, 13, 21}, 1, 77)).ok());

  ASSERT_TRUE(engine->step().ok());  // token 0 at v0
  ASSERT_TRUE(engine->update_weights(1, 0xA1, weights_of(w1)).ok());
  ASSERT_TRUE(engine->step().ok());  // update lands, re-prefill, token 1 at v1
  ASSERT_TRUE(engine->step().ok());  // token 2 at v1
  ASSERT_TRUE(engine->update_weights(2, 0xA2, weights_of(w2)).ok());
  auto last = engine->step();  // update lands, token 3 at v2, length reached
  ASSERT_TRUE(last.ok()) << last.status();
  ASSERT_EQ(last->size(), 1u);
  const Trajectory& t = (*last)[0].trajectories[0];
  ASSERT_TRUE(check_trajectory(t).ok()) << check_trajectory(t);

  EXPECT_EQ(t.token_versions, (std::vector<int64_t>{0, 1, 1, 2}));
  EXPECT_EQ(t.proximal_versions, (std::vector<int64_t>{1, 2, 2, 2}));
  const std::vector<float> under_v1 = score_response(w1, t, o.sampling.temperature);
  const std::vector<float> under_v2 = score_response(w2, t, o.sampling.temperature);
  EXPECT_NEAR(t.proximal_logprobs[0], under_v1[0], 1e-5);
  EXPECT_NEAR(t.proximal_logprobs[1], under_v2[1], 1e-5);
  EXPECT_NEAR(t.proximal_logprobs[2], under_v2[2], 1e-5);
  EXPECT_NEAR(t.proximal_logprobs[3], under_v2[3], 1e-5);
  // And the proximal values are not just the old ones carried over.
  const std::vector<float> under_v0 = score_response(w0, t, o.sampling.temperature);
  EXPECT_GT(std::abs(t.proximal_logprobs[0] - under_v0[0]), 1e-3);
  EXPECT_GT(std::abs(t.proximal_logprobs[1] - under_v1[1]), 1e-3);

  // Behavior values come from the truncated distribution of each token's own
  // version.
  SamplingOptions so = o.sampling;
  model::Policy* by_version[] = {&w0, &w1, &w1, &w2};
  for (int j = 0; j < 4; ++j) {
    torch::NoGradGuard ng;
    std::vector<int64_t> ids = t.prompt_tokens;
    ids.insert(ids.end(), t.response_tokens.begin(), t.response_tokens.end());
    at::Tensor logits = (*by_version[j])->forward(torch::tensor(ids).view({1, -1}))[0];
    EXPECT_NEAR(t.behavior_logprobs[j],
                reference_logprob(logits[t.prompt_tokens.size() - 1 + j], t.response_tokens[j], so),
                1e-5);
  }
  EXPECT_EQ(t.version_digests,
            (std::vector<std::pair<int64_t, uint64_t>>{{0, 0xA0}, {1, 0xA1}, {2, 0xA2}}));
  EXPECT_EQ(t.interruptions, 2);
  EXPECT_EQ(t.interrupt_policy, InterruptPolicy::kRecompute);
  EXPECT_FALSE(t.stale_kv);
  EXPECT_EQ(engine->version(), 2);
}

// Updates from another thread at any time: each lands between steps, tokens
// sampled after it carry its version, versions never go down.
TEST(EngineTest, ConcurrentUpdatesLandBetweenStepsWithNonDecreasingVersions) {
  EngineOptions o = base_options();
  o.num_slots = 6;
  o.max_new_tokens = 16;
  auto engine = make_engine(1, o);
  for (int g = 0; g < 12; ++g) {
    ASSERT_TRUE(engine->submit(group("g" + std::to_string(g), {1 + g, 2, 3}, 2, g)).ok());
  }
  std::vector<std::unordered_map<std::string, at::Tensor>> weights;
  for (int v = 1; v <= 6; ++v) {
    model::Policy p = make_policy(200 + v);
    weights.push_back(weights_of(p));
  }
  std::atomic<bool> stop{false};
  std::thread updater([&] {
    for (int v = 1; v <= 6 && !stop; ++v) {
      std::this_thread::sleep_for(std::chrono::milliseconds(3));
      Status s = engine->update_weights(v, 1000 + v, weights[v - 1]);
      EXPECT_TRUE(s.ok()) << s;
    }
  });
  auto groups = run_all(*engine);
  stop = true;
  updater.join();
  ASSERT_EQ(groups.size(), 12u);
  int64_t max_version = 0;
  for (const TrajectoryGroup& g : groups) {
    for (const Trajectory& t : g.trajectories) {
      ASSERT_TRUE(check_trajectory(t).ok()) << check_trajectory(t);
      for (size_t j = 0; j < t.token_versions.size(); ++j) {
        max_version = std::max(max_version, t.token_versions[j]);
        // recompute: a token followed by a newer one has its proximal value
        // under version + 1 unless a newer token skips a version.
        if (j + 1 < t.token_versions.size() && t.token_versions[j + 1] == t.token_versions[j] + 1) {
          EXPECT_EQ(t.proximal_versions[j], t.token_versions[j] + 1);
        }
      }
      for (const auto& [v, d] : t.version_digests) EXPECT_EQ(d, v == 0 ? 100u : 1000u + v);
    }
  }
  EXPECT_GT(max_version, 0) << "no update landed while generating";
}

// `finish`: sequences in flight complete on the old weights; the update
// lands only then, and nothing new starts meanwhile.
TEST(EngineTest, FinishPolicyKeepsInFlightSequencesOnTheOldVersion) {
  EngineOptions o = base_options();
  o.interrupt = InterruptPolicy::kFinish;
  o.num_slots = 2;
  auto engine = make_engine(1, o);
  ASSERT_TRUE(engine->submit(group("first", {1, 2, 3}, 2, 1)).ok());
  ASSERT_TRUE(engine->step().ok());
  model::Policy w1 = make_policy(55);
  ASSERT_TRUE(engine->update_weights(1, 7, weights_of(w1)).ok());
  ASSERT_TRUE(engine->submit(group("second", {4, 5, 6}, 2, 2)).ok());
  auto groups = by_id(run_all(*engine));
  for (const Trajectory& t : groups["first"].trajectories) {
    EXPECT_EQ(t.token_versions, std::vector<int64_t>(t.response_tokens.size(), 0));
    EXPECT_EQ(t.interruptions, 0);
    EXPECT_EQ(t.interrupt_policy, InterruptPolicy::kFinish);
  }
  for (const Trajectory& t : groups["second"].trajectories) {
    EXPECT_EQ(t.token_versions, std::vector<int64_t>(t.response_tokens.size(), 1));
  }
}

// `finish` while a response is decoded: versions staged meanwhile would land
// on no sequence (nothing is sampled before the newest is in), so only the
// newest is held; the older copies are released when they are superseded.
TEST(EngineTest, FinishPolicyHoldsOnlyTheNewestVersionStagedDuringADrain) {
  EngineOptions o = base_options();
  o.interrupt = InterruptPolicy::kFinish;
  o.max_new_tokens = 12;
  auto engine = make_engine(1, o);
  ASSERT_TRUE(engine->submit(group("first", {1, 2, 3}, 2, 1)).ok());
  ASSERT_TRUE(engine->step().ok());
  auto w1 = cloned_weights(make_policy(55));
  const at::Tensor held = w1.at("model.norm.weight");
  ASSERT_TRUE(engine->update_weights(1, 7, std::move(w1)).ok());
  ASSERT_TRUE(engine->step().ok());
  EXPECT_EQ(engine->version(), 0) << "the update waits for the response in flight";
  EXPECT_EQ(held.use_count(), 2);
  ASSERT_TRUE(engine->update_weights(2, 8, cloned_weights(make_policy(56))).ok());
  EXPECT_EQ(held.use_count(), 1) << "version 1 is still held after version 2 replaced it";
  ASSERT_TRUE(engine->update_weights(3, 9, cloned_weights(make_policy(57))).ok());
  EXPECT_EQ(engine->stats().updates_superseded, 2);
  ASSERT_TRUE(engine->submit(group("second", {4, 5, 6}, 2, 2)).ok());
  auto groups = by_id(run_all(*engine));
  EXPECT_EQ(engine->stats().updates_applied, 1);
  EXPECT_EQ(engine->version(), 3);
  for (const Trajectory& t : groups["first"].trajectories) {
    EXPECT_EQ(t.token_versions, std::vector<int64_t>(t.response_tokens.size(), 0));
    EXPECT_EQ(t.interruptions, 0);
  }
  for (const Trajectory& t : groups["second"].trajectories) {
    EXPECT_EQ(t.token_versions, std::vector<int64_t>(t.response_tokens.size(), 3));
    EXPECT_EQ(t.version_digests, (std::vector<std::pair<int64_t, uint64_t>>{{3, 9}}));
  }
}

// Two versions staged before a group arrives (a worker that learned of
// them together): the engine applies one per step, and holds the group back
// until the newest is in, so no group starts on superseded weights.
TEST(EngineTest, NewGroupsWaitForTheNewestStagedVersion) {
  auto engine = make_engine(1, base_options());
  model::Policy w1 = make_policy(55), w2 = make_policy(56);
  ASSERT_TRUE(engine->update_weights(1, 7, weights_of(w1)).ok());
  ASSERT_TRUE(engine->update_weights(2, 8, weights_of(w2)).ok());
  ASSERT_TRUE(engine->submit(group("late", {4, 5, 6}, 2, 2)).ok());
  auto groups = by_id(run_all(*engine));
  for (const Trajectory& t : groups["late"].trajectories) {
    EXPECT_EQ(t.token_versions, std::vector<int64_t>(t.response_tokens.size(), 2));
    EXPECT_EQ(t.interruptions, 0);
  }
}

// A worker without leases stages every version the trainer publishes into
// an engine that steps on none of them. Only the newest is kept: the older
// ones are released at once (each is a whole copy of the weights), and the
// next group starts on the newest after one step.
TEST(EngineTest, AnIdleEngineKeepsOnlyTheNewestStagedVersion) {
  auto engine = make_engine(1, base_options());
  auto w1 = cloned_weights(make_policy(55));
  const at::Tensor held = w1.at("model.norm.weight");
  ASSERT_TRUE(engine->update_weights(1, 7, std::move(w1)).ok());
  EXPECT_EQ(held.use_count(), 2) << "the engine holds version 1 while it is the newest";
  ASSERT_TRUE(engine->update_weights(2, 8, cloned_weights(make_policy(56))).ok());
  EXPECT_EQ(held.use_count(), 1) << "version 1 is still held after version 2 replaced it";
  ASSERT_TRUE(engine->update_weights(3, 9, cloned_weights(make_policy(57))).ok());
  EXPECT_EQ(engine->stats().updates_superseded, 2);
  // Still refused: a version at or below the newest staged one.
  EXPECT_EQ(engine->update_weights(2, 8, cloned_weights(make_policy(56))).code(),
            absl::StatusCode::kFailedPrecondition);

  ASSERT_TRUE(engine->submit(group("late", {4, 5, 6}, 2, 2)).ok());
  ASSERT_TRUE(engine->step().ok());
  EXPECT_EQ(engine->version(), 3);
  auto groups = by_id(run_all(*engine));
  EXPECT_EQ(engine->stats().updates_applied, 1);
  for (const Trajectory& t : groups["late"].trajectories) {
    EXPECT_EQ(t.token_versions, std::vector<int64_t>(t.response_tokens.size(), 3));
    EXPECT_EQ(t.interruptions, 0);
    EXPECT_EQ(t.version_digests, (std::vector<std::pair<int64_t, uint64_t>>{{3, 9}}));
  }
}

// With a group in flight every staged version is applied in turn (each
// one's tokens get their proximal values from the next): none is dropped.
TEST(EngineTest, AnEngineWithGroupsInFlightAppliesEveryStagedVersion) {
  EngineOptions o = base_options();
  o.max_new_tokens = 16;
  auto engine = make_engine(1, o);
  ASSERT_TRUE(engine->submit(group("first", {1, 2, 3}, 2, 1)).ok());
  ASSERT_TRUE(engine->step().ok());
  model::Policy w1 = make_policy(55), w2 = make_policy(56);
  ASSERT_TRUE(engine->update_weights(1, 7, weights_of(w1)).ok());
  ASSERT_TRUE(engine->update_weights(2, 8, weights_of(w2)).ok());
  EXPECT_EQ(engine->stats().updates_superseded, 0);
  run_all(*engine);
  EXPECT_EQ(engine->stats().updates_applied, 2);
  EXPECT_EQ(engine->version(), 2);
}

// `keep`: decoding continues on the old cache with the new weights; tokens
// after the update carry the new version, and the trajectory says so.
TEST(EngineTest, KeepPolicyFlagsStaleCacheAndLeavesProximalUnknown) {
  EngineOptions o = base_options();
  o.interrupt = InterruptPolicy::kKeep;
  o.max_new_tokens = 5;
  auto engine = make_engine(1, o);
  ASSERT_TRUE(engine->submit(group("g", {1, 2, 3}, 1, 1)).ok());
  ASSERT_TRUE(engine->step().ok());
  ASSERT_TRUE(engine->step().ok());
  model::Policy w1 = make_policy(56);
  ASSERT_TRUE(engine->update_weights(1, 7, weights_of(w1)).ok());
  auto groups = run_all(*engine);
  ASSERT_EQ(groups.size(), 1u);
  const Trajectory& t = groups[0].trajectories[0];
  ASSERT_TRUE(check_trajectory(t).ok()) << check_trajectory(t);
  EXPECT_EQ(t.token_versions, (std::vector<int64_t>{0, 0, 1, 1, 1}));
  EXPECT_TRUE(t.stale_kv);
  for (float p : t.proximal_logprobs) EXPECT_TRUE(std::isnan(p));
  EXPECT_EQ(engine->stats().recomputed_tokens, 0);
}

// `restart`: the partial response is dropped and sampled again under the
// new weights.
TEST(EngineTest, RestartPolicyResamplesTheWholeResponse) {
  EngineOptions o = base_options();
  o.interrupt = InterruptPolicy::kRestart;
  o.max_new_tokens = 5;
  auto engine = make_engine(1, o);
  ASSERT_TRUE(engine->submit(group("g", {1, 2, 3}, 1, 1)).ok());
  ASSERT_TRUE(engine->step().ok());
  ASSERT_TRUE(engine->step().ok());
  model::Policy w1 = make_policy(57);
  ASSERT_TRUE(engine->update_weights(1, 7, weights_of(w1)).ok());
  auto groups = run_all(*engine);
  const Trajectory& t = groups.at(0).trajectories.at(0);
  ASSERT_TRUE(check_trajectory(t).ok()) << check_trajectory(t);
  EXPECT_EQ(t.token_versions, std::vector<int64_t>(5, 1));
  EXPECT_EQ(t.restarts, 1);
  const std::vector<float> under_v1 = score_response(w1, t, 1.0);
  for (int j = 0; j < 5; ++j) EXPECT_NEAR(t.behavior_logprobs[j], under_v1[j], 1e-5);
}

// Prefix-guided sampling: the prefixed samples start with the target's
// prefix (mask 1, scored by the current policy), then sample freely.
TEST(EngineTest, PrefixSamplesForceTargetTokensAndScoreThem) {
  EngineOptions o = base_options();
  o.max_new_tokens = 10;
  o.sampling.temperature = 0.8;
  o.prefix.n_prefix = 2;
  o.prefix.strategy = PrefixStrategy::kFixed;
  o.prefix.min_ratio = 0.5;
  o.prefix.max_ratio = 1.0;
  auto engine = make_engine(8, o);
  PromptGroup g = group("g", {3, 1, 4, 1, 5}, 4, 3);
  g.target = {9, 2, 6, 5, 3, 5};
  ASSERT_TRUE(engine->submit(g).ok());
  auto groups = run_all(*engine);
  ASSERT_EQ(groups.size(), 1u);
  model::Policy scorer = make_policy(8);
  const std::vector<size_t> forced = {3, 6, 0, 0};
  const std::vector<double> ratios = {0.5, 1.0, 0.0, 0.0};
  for (int j = 0; j < 4; ++j) {
    SCOPED_TRACE(j);
    const Trajectory& t = groups[0].trajectories[j];
    ASSERT_TRUE(check_trajectory(t).ok()) << check_trajectory(t);
    EXPECT_EQ(t.num_forced(), static_cast<int64_t>(forced[j]));
    EXPECT_DOUBLE_EQ(t.prefix_ratio, ratios[j]);
    ASSERT_GT(t.response_tokens.size(), forced[j]);
    for (size_t i = 0; i < t.response_tokens.size(); ++i) {
      EXPECT_EQ(t.offpolicy_mask[i], i < forced[j] ? 1 : 0);
      if (i < forced[j]) {
        EXPECT_EQ(t.response_tokens[i], g.target[i]);
      }
    }
    const std::vector<float> want = score_response(scorer, t, 0.8);
    for (size_t i = 0; i < forced[j]; ++i) EXPECT_NEAR(t.behavior_logprobs[i], want[i], 1e-5);
  }
  EXPECT_EQ(engine->stats().forced_tokens, 9);
}

TEST(EngineTest, ForcedPrefixEndingInAStopTokenFinishesThere) {
  EngineOptions o = base_options();
  o.stop_tokens = {2};
  o.prefix.n_prefix = -1;
  o.prefix.strategy = PrefixStrategy::kFixed;
  o.prefix.min_ratio = 1.0;
  o.prefix.max_ratio = 1.0;
  auto engine = make_engine(8, o);
  PromptGroup g = group("g", {3, 1}, 2, 3);
  g.target = {9, 2, 6};  // the stop token is its second token
  ASSERT_TRUE(engine->submit(g).ok());
  auto groups = run_all(*engine);
  for (const Trajectory& t : groups.at(0).trajectories) {
    EXPECT_EQ(t.response_tokens, (std::vector<int64_t>{9, 2}));
    EXPECT_EQ(t.finish_reason, FinishReason::kStop);
    EXPECT_EQ(t.offpolicy_mask, (std::vector<uint8_t>{1, 1}));
  }
}

TEST(EngineTest, StopTokensAndLengthEndSequences) {
  EngineOptions o = base_options();
  o.max_new_tokens = 30;
  o.num_slots = 8;
  // Every token is a stop token but one: responses are one or two tokens.
  for (int64_t t = 0; t < 37; ++t) {
    if (t != 11) o.stop_tokens.push_back(t);
  }
  auto engine = make_engine(2, o);
  ASSERT_TRUE(engine->submit(group("g", {1, 2, 3}, 8, 5)).ok());
  for (const Trajectory& t : run_all(*engine).at(0).trajectories) {
    ASSERT_FALSE(t.response_tokens.empty());
    EXPECT_EQ(t.finish_reason, FinishReason::kStop);
    EXPECT_NE(t.response_tokens.back(), 11);
  }
  // Capacity: a slot of 8 positions ends a 5-token prompt after 3 tokens.
  EngineOptions small = base_options();
  small.max_seq_len = 8;
  auto tight = make_engine(2, small);
  ASSERT_TRUE(tight->submit(group("g", {1, 2, 3, 4, 5}, 1, 5)).ok());
  const Trajectory t = run_all(*tight).at(0).trajectories.at(0);
  EXPECT_EQ(t.response_tokens.size(), 3u);
  EXPECT_EQ(t.finish_reason, FinishReason::kLength);
}

TEST(EngineTest, AbortReturnsEveryGroupWithPartialResponses) {
  EngineOptions o = base_options();
  o.num_slots = 2;
  auto engine = make_engine(2, o);
  ASSERT_TRUE(engine->submit(group("a", {1, 2, 3}, 2, 1)).ok());
  ASSERT_TRUE(engine->submit(group("b", {4, 5}, 2, 2)).ok());
  ASSERT_TRUE(engine->step().ok());
  ASSERT_TRUE(engine->step().ok());
  engine->abort();
  auto done = engine->step();
  ASSERT_TRUE(done.ok());
  auto groups = by_id(std::move(done).value());
  ASSERT_EQ(groups.size(), 2u);
  for (const Trajectory& t : groups["a"].trajectories) {
    EXPECT_EQ(t.finish_reason, FinishReason::kAborted);
    EXPECT_EQ(t.response_tokens.size(), 2u);
    EXPECT_TRUE(check_trajectory(t).ok()) << check_trajectory(t);
  }
  for (const Trajectory& t : groups["b"].trajectories) {
    EXPECT_EQ(t.finish_reason, FinishReason::kAborted);
    EXPECT_TRUE(t.response_tokens.empty());
  }
  EXPECT_TRUE(engine->idle());
}

// ---------------------------------------------------------------------------
// ReMax greedy baseline (PromptGroup::greedy_baseline).

PromptGroup with_baseline(PromptGroup g) {
  g.greedy_baseline = true;
  return g;
}

// Token j of `t` is the argmax of `policy`'s logits at position P - 1 + j.
void expect_greedy_under(model::Policy& policy, const Trajectory& t, size_t from, size_t to) {
  torch::NoGradGuard ng;
  std::vector<int64_t> ids = t.prompt_tokens;
  ids.insert(ids.end(), t.response_tokens.begin(), t.response_tokens.end());
  at::Tensor logits = policy->forward(torch::tensor(ids).view({1, -1}))[0];
  const size_t P = t.prompt_tokens.size();
  for (size_t j = from; j < to; ++j) {
    EXPECT_EQ(t.response_tokens[j], logits[P - 1 + j].argmax().item<int64_t>()) << "token " << j;
  }
}

// k = 2 with a baseline: two samples in `trajectories`, the greedy response
// apart in `baseline`, unscored, never forced, behavior log-probs at
// temperature 1 untruncated (the sampler's greedy record).
TEST(EngineTest, GreedyBaselineComesBackApartFromTheSamples) {
  EngineOptions o = base_options();
  o.sampling.temperature = 0.7;
  o.sampling.top_k = 5;
  o.sampling.record_raw_logprobs = true;
  o.prefix.n_prefix = -1;  // every sample is prefix-forced; the baseline must not be
  o.prefix.strategy = PrefixStrategy::kFixed;
  o.prefix.min_ratio = 0.5;
  o.prefix.max_ratio = 0.5;
  auto engine = make_engine(7, o);
  PromptGroup g = with_baseline(group("g", {3, 7, 1, 4}, 2, 11));
  g.target = {9, 2, 6, 5};
  ASSERT_TRUE(engine->submit(g).ok());
  ASSERT_TRUE(engine->submit(group("plain", {5, 5}, 2, 12)).ok());
  auto groups = by_id(run_all(*engine));
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_FALSE(groups["plain"].baseline.has_value());
  const TrajectoryGroup& out = groups["g"];
  ASSERT_EQ(out.trajectories.size(), 2u);
  for (const Trajectory& t : out.trajectories) {
    EXPECT_EQ(t.num_forced(), 2) << "the samples keep their prefix";
  }
  ASSERT_TRUE(out.baseline.has_value());
  const Trajectory& b = *out.baseline;
  ASSERT_TRUE(check_trajectory(b).ok()) << check_trajectory(b);
  EXPECT_TRUE(std::isnan(b.reward));
  EXPECT_EQ(b.prompt_tokens, g.prompt);
  ASSERT_EQ(b.response_tokens.size(), 8u);
  EXPECT_EQ(b.finish_reason, FinishReason::kLength);
  EXPECT_EQ(b.num_forced(), 0);
  EXPECT_EQ(b.prefix_ratio, 0.0);
  EXPECT_EQ(b.token_versions, std::vector<int64_t>(8, 0));
  EXPECT_EQ(b.version_digests, (std::vector<std::pair<int64_t, uint64_t>>{{0, 100}}));
  model::Policy scorer = make_policy(7);
  expect_greedy_under(scorer, b, 0, b.response_tokens.size());
  const std::vector<float> at_t1 = score_response(scorer, b, 1.0);
  const std::vector<float> at_t = score_response(scorer, b, o.sampling.temperature);
  for (size_t j = 0; j < b.response_tokens.size(); ++j) {
    EXPECT_NEAR(b.behavior_logprobs[j], at_t1[j], 1e-5) << "token " << j;
    EXPECT_EQ(b.raw_logprobs[j], b.behavior_logprobs[j]) << "token " << j;
    // Proximal values are at the sampling temperature, as for any sample.
    EXPECT_EQ(b.proximal_versions[j], 0);
    EXPECT_NEAR(b.proximal_logprobs[j], at_t[j], 1e-5) << "token " << j;
  }
  const EngineStats st = engine->stats();
  EXPECT_EQ(st.baseline_sequences, 1);
  EXPECT_EQ(st.baseline_tokens, 8);
  EXPECT_EQ(st.groups_completed, 2);
}

// The samples do not depend on whether a baseline is decoded beside them:
// same seeds, same tokens and log-probs, even with few slots (the baseline
// takes one and shifts admissions).
TEST(EngineTest, GreedyBaselineDoesNotChangeTheSamples) {
  EngineOptions o = base_options();
  o.num_slots = 3;
  o.max_new_tokens = 10;
  o.stop_tokens = {4, 5};
  o.sampling.temperature = 0.9;
  o.sampling.top_p = 0.9;
  const std::vector<PromptGroup> groups = {
      group("g0", {3, 7, 1}, 2, 1), group("g1", {9, 2, 2, 5, 30, 6, 8, 8, 1}, 3, 2),
      group("g2", {11}, 1, 3), group("g3", {6, 6, 6, 6, 6}, 4, 4)};
  auto without = make_engine(21, o);
  auto with = make_engine(21, o);
  for (const PromptGroup& g : groups) {
    ASSERT_TRUE(without->submit(g).ok());
    ASSERT_TRUE(with->submit(with_baseline(g)).ok());
  }
  auto a = by_id(run_all(*without));
  auto b = by_id(run_all(*with));
  ASSERT_EQ(a.size(), groups.size());
  ASSERT_EQ(b.size(), groups.size());
  for (const PromptGroup& g : groups) {
    const TrajectoryGroup& x = a[g.group_id];
    const TrajectoryGroup& y = b[g.group_id];
    EXPECT_FALSE(x.baseline.has_value());
    EXPECT_TRUE(y.baseline.has_value());
    ASSERT_EQ(x.trajectories.size(), static_cast<size_t>(g.k));
    ASSERT_EQ(y.trajectories.size(), static_cast<size_t>(g.k));
    for (int j = 0; j < g.k; ++j) {
      SCOPED_TRACE(g.group_id + " sample " + std::to_string(j));
      const Trajectory& s = x.trajectories[j];
      const Trajectory& t = y.trajectories[j];
      EXPECT_EQ(s.response_tokens, t.response_tokens);
      EXPECT_EQ(s.finish_reason, t.finish_reason);
      ASSERT_EQ(s.behavior_logprobs.size(), t.behavior_logprobs.size());
      for (size_t i = 0; i < s.behavior_logprobs.size(); ++i) {
        EXPECT_NEAR(s.behavior_logprobs[i], t.behavior_logprobs[i], 1e-5);
      }
    }
  }
  EXPECT_EQ(with->stats().baseline_sequences, static_cast<int64_t>(groups.size()));
  EXPECT_EQ(with->stats().sampled_tokens - with->stats().baseline_tokens,
            without->stats().sampled_tokens);
}

// The baseline is what one-shot greedy generation gives for the prompt.
TEST(EngineTest, GreedyBaselineEqualsGreedyGenerate) {
  EngineOptions o = base_options();
  o.max_new_tokens = 12;
  o.sampling.temperature = 0.8;
  o.sampling.record_raw_logprobs = true;
  const std::vector<std::vector<int64_t>> prompts = {{3, 7, 1}, {9, 2, 2, 5, 30, 6}, {11}};
  auto engine = make_engine(13, o);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(
        engine->submit(with_baseline(group("p" + std::to_string(i), prompts[i], 3, i))).ok());
  }
  auto groups = by_id(run_all(*engine));
  GenerateOptions go;
  go.max_new_tokens = o.max_new_tokens;
  go.sampling = o.sampling;
  go.sampling.greedy = true;
  auto gens = generate(make_policy(13), prompts, go);
  ASSERT_TRUE(gens.ok()) << gens.status();
  for (size_t i = 0; i < prompts.size(); ++i) {
    SCOPED_TRACE(i);
    const Generation& want = (*gens)[i];
    ASSERT_TRUE(groups["p" + std::to_string(i)].baseline.has_value());
    const Trajectory& got = *groups["p" + std::to_string(i)].baseline;
    EXPECT_EQ(got.response_tokens, want.tokens);
    EXPECT_EQ(got.finish_reason, want.finish_reason);
    ASSERT_EQ(got.behavior_logprobs.size(), want.logprobs.size());
    for (size_t j = 0; j < want.logprobs.size(); ++j) {
      EXPECT_NEAR(got.behavior_logprobs[j], want.logprobs[j], 1e-5);
      EXPECT_NEAR(got.raw_logprobs[j], want.raw_logprobs[j], 1e-5);
    }
  }
}

// The baseline shares the group's prompt prefill like a sample does.
TEST(EngineTest, GreedyBaselineSharesThePromptPrefill) {
  const std::vector<int64_t> prompt = {9, 2, 2, 5, 30, 6, 8, 8, 1, 17};
  EngineOptions o = base_options();
  o.num_slots = 4;
  auto engine = make_engine(3, o);
  ASSERT_TRUE(engine->submit(with_baseline(group("g", prompt, 3, 9))).ok());
  auto out = run_all(*engine);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(engine->stats().context_tokens, static_cast<int64_t>(prompt.size()) - 1);
  EXPECT_EQ(engine->stats().shared_prefills, 3);

  // One slot short: the baseline waits for a slot, which frees when the
  // samples (all of one length) finish, so nothing live is left to copy
  // from: it prefills on its own and decodes the same.
  o.num_slots = 3;
  auto late = make_engine(3, o);
  ASSERT_TRUE(late->submit(with_baseline(group("g", prompt, 3, 9))).ok());
  auto out_late = run_all(*late);
  ASSERT_EQ(out_late.size(), 1u);
  EXPECT_EQ(late->stats().context_tokens, 2 * (static_cast<int64_t>(prompt.size()) - 1));
  EXPECT_EQ(late->stats().shared_prefills, 2);
  EXPECT_EQ(out_late[0].baseline->response_tokens, out[0].baseline->response_tokens);
}

// Greedy decoding stops at a stop token like sampling does (and keeps it).
TEST(EngineTest, GreedyBaselineRespectsStopTokens) {
  EngineOptions o = base_options();
  o.max_new_tokens = 10;
  const std::vector<int64_t> prompt = {3, 1, 4, 1, 5};
  auto free_run = make_engine(4, o);
  ASSERT_TRUE(free_run->submit(with_baseline(group("g", prompt, 1, 1))).ok());
  const std::vector<int64_t> full = run_all(*free_run).at(0).baseline->response_tokens;
  ASSERT_EQ(full.size(), 10u);
  // Stop at the third token's value: the response ends at its first
  // occurrence.
  const int64_t stop = full[2];
  const size_t first = std::find(full.begin(), full.end(), stop) - full.begin();
  o.stop_tokens = {stop};
  auto engine = make_engine(4, o);
  ASSERT_TRUE(engine->submit(with_baseline(group("g", prompt, 1, 1))).ok());
  const Trajectory b = *run_all(*engine).at(0).baseline;
  ASSERT_TRUE(check_trajectory(b).ok()) << check_trajectory(b);
  EXPECT_EQ(b.finish_reason, FinishReason::kStop);
  EXPECT_EQ(b.response_tokens, std::vector<int64_t>(full.begin(), full.begin() + first + 1));
}

// recompute with an update mid-generation: the baseline is re-prefilled like
// the samples, completes, records both versions and the proximal values of
// the old version's tokens, and decodes greedily under each version.
TEST(EngineTest, GreedyBaselineSurvivesAWeightUpdateUnderRecompute) {
  EngineOptions o = base_options();
  o.max_new_tokens = 6;
  o.interrupt = InterruptPolicy::kRecompute;
  model::Policy w0 = make_policy(1), w1 = make_policy(58);
  auto engine = make_engine(1, o);
  ASSERT_TRUE(engine->submit(with_baseline(group("g", {1, 2, 3}, 2, 1))).ok());
  ASSERT_TRUE(engine->step().ok());  // token 0 at v0
  ASSERT_TRUE(engine->step().ok());  // token 1 at v0
  ASSERT_TRUE(engine->update_weights(1, 7, weights_of(w1)).ok());
  auto groups = run_all(*engine);
  ASSERT_EQ(groups.size(), 1u);
  ASSERT_EQ(groups[0].trajectories.size(), 2u);
  ASSERT_TRUE(groups[0].baseline.has_value());
  const Trajectory& b = *groups[0].baseline;
  ASSERT_TRUE(check_trajectory(b).ok()) << check_trajectory(b);
  EXPECT_EQ(b.finish_reason, FinishReason::kLength);
  EXPECT_EQ(b.token_versions, (std::vector<int64_t>{0, 0, 1, 1, 1, 1}));
  EXPECT_EQ(b.proximal_versions, std::vector<int64_t>(6, 1));
  EXPECT_EQ(b.version_digests, (std::vector<std::pair<int64_t, uint64_t>>{{0, 100}, {1, 7}}));
  EXPECT_EQ(b.interruptions, 1);
  EXPECT_EQ(b.interrupt_policy, InterruptPolicy::kRecompute);
  EXPECT_FALSE(b.stale_kv);
  expect_greedy_under(w0, b, 0, 2);
  expect_greedy_under(w1, b, 2, 6);
  const std::vector<float> under_v1 = score_response(w1, b, 1.0);
  for (int j = 0; j < 6; ++j) EXPECT_NEAR(b.proximal_logprobs[j], under_v1[j], 1e-5);
  for (const Trajectory& t : groups[0].trajectories) {
    EXPECT_EQ(t.token_versions, b.token_versions);
  }
  EXPECT_GT(engine->stats().recomputed_tokens, 0);
  EXPECT_EQ(engine->stats().baseline_sequences, 1);
}

// The other policies treat the baseline like a sample too, and abort returns
// it.
TEST(EngineTest, GreedyBaselineFollowsTheOtherInterruptPoliciesAndAbort) {
  for (InterruptPolicy policy :
       {InterruptPolicy::kKeep, InterruptPolicy::kFinish, InterruptPolicy::kRestart}) {
    SCOPED_TRACE(kInterruptPolicyNames.name(policy));
    EngineOptions o = base_options();
    o.max_new_tokens = 5;
    o.interrupt = policy;
    auto engine = make_engine(1, o);
    ASSERT_TRUE(engine->submit(with_baseline(group("g", {1, 2, 3}, 1, 1))).ok());
    ASSERT_TRUE(engine->step().ok());
    ASSERT_TRUE(engine->step().ok());
    model::Policy w1 = make_policy(57);
    ASSERT_TRUE(engine->update_weights(1, 7, weights_of(w1)).ok());
    auto groups = run_all(*engine);
    ASSERT_EQ(groups.size(), 1u);
    ASSERT_TRUE(groups[0].baseline.has_value());
    const Trajectory& b = *groups[0].baseline;
    const Trajectory& s = groups[0].trajectories.at(0);
    ASSERT_TRUE(check_trajectory(b).ok()) << check_trajectory(b);
    EXPECT_EQ(b.response_tokens.size(), 5u);
    EXPECT_EQ(b.token_versions, s.token_versions);
    EXPECT_EQ(b.stale_kv, s.stale_kv);
    EXPECT_EQ(b.restarts, s.restarts);
    EXPECT_EQ(b.interruptions, s.interruptions);
    if (policy == InterruptPolicy::kRestart) {
      EXPECT_EQ(b.restarts, 1);
      expect_greedy_under(w1, b, 0, 5);
    }
  }

  EngineOptions o = base_options();
  o.num_slots = 2;
  auto engine = make_engine(2, o);
  ASSERT_TRUE(engine->submit(with_baseline(group("a", {1, 2, 3}, 2, 1))).ok());
  ASSERT_TRUE(engine->step().ok());
  ASSERT_TRUE(engine->step().ok());
  engine->abort();
  auto done = engine->step();
  ASSERT_TRUE(done.ok());
  ASSERT_EQ(done->size(), 1u);
  ASSERT_TRUE((*done)[0].baseline.has_value());
  EXPECT_EQ((*done)[0].baseline->finish_reason, FinishReason::kAborted);
  EXPECT_TRUE((*done)[0].baseline->response_tokens.empty()) << "it was still waiting for a slot";
  EXPECT_EQ((*done)[0].trajectories.size(), 2u);
  EXPECT_TRUE(engine->idle());
}

TEST(EngineTest, BadSubmissionsAreRejectedWithTheField) {
  auto engine = make_engine(2, base_options());
  auto message = [&](PromptGroup g) { return std::string(engine->submit(g).message()); };
  EXPECT_EQ(message(group("x", {}, 1, 0)), "group 'x': prompt: empty");
  EXPECT_EQ(message(group("x", {1}, 0, 0)), "group 'x': k: must be >= 1, got 0");
  EXPECT_EQ(message(group("x", {1, 37}, 1, 0)),
            "group 'x': prompt[1]: token id 37 outside the vocabulary [0, 37)");
  EXPECT_EQ(message(group("x", std::vector<int64_t>(64, 1), 1, 0)),
            "group 'x': prompt: length 64 leaves no room in a sequence of 64 positions");
  PromptGroup bad_target = group("x", {1}, 1, 0);
  bad_target.target = {-1};
  EXPECT_EQ(message(bad_target),
            "group 'x': target[0]: token id -1 outside the vocabulary [0, 37)");
  ASSERT_TRUE(engine->submit(group("x", {1}, 1, 0)).ok());
  EXPECT_EQ(message(group("x", {2}, 1, 0)), "group 'x': group_id: already queued or in flight");
  EXPECT_EQ(run_all(*engine).size(), 1u);
  EXPECT_TRUE(engine->submit(group("x", {2}, 1, 0)).ok()) << "a returned id may be reused";
}

TEST(EngineTest, BadUpdatesFailAtTheCallAndChangeNothing) {
  auto engine = make_engine(2, base_options(), /*version=*/3);
  model::Policy other = make_policy(9);
  auto good = weights_of(other);

  auto missing = good;
  missing.erase("model.norm.weight");
  EXPECT_EQ(engine->update_weights(4, 1, missing).message(),
            "update_weights: version 4 is missing parameter 'model.norm.weight'");
  auto wrong_shape = good;
  wrong_shape["model.norm.weight"] = torch::ones({31});
  EXPECT_EQ(engine->update_weights(4, 1, wrong_shape).message(),
            "update_weights: version 4: parameter 'model.norm.weight' has shape [31], expected "
            "[32]");
  auto extra = good;
  extra["model.extra.weight"] = torch::ones({1});
  EXPECT_EQ(engine->update_weights(4, 1, extra).message(),
            "update_weights: version 4: unknown parameter 'model.extra.weight'");
  EXPECT_EQ(engine->update_weights(3, 1, good).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(engine->version(), 3);

  ASSERT_TRUE(engine->update_weights(5, 1, good).ok());
  EXPECT_EQ(engine->update_weights(4, 1, good).code(), absl::StatusCode::kFailedPrecondition)
      << "a version older than one already staged";
}

// The rollout section binds onto EngineOptions, and one check() serves the
// config (under "rollout") and Engine::create: the same rule, the same words.
TEST(EngineTest, TheEngineAndTheConfigStateEachRuleOnce) {
  EngineOptions o = base_options();
  o.sampling.top_p = 0;
  o.kv_cache_gb = std::numeric_limits<double>::infinity();
  auto e = Engine::create(make_policy(1), o, 0, 0);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().message(),
            "top_p: must be in (0, 1], got 0\n"
            "kv_cache_gb: must be >= 0 (0 = kv_cache_fraction of free memory), got inf");
  RolloutConfig c;
  c.engine = o;
  EXPECT_EQ(check_options(c, "rollout").message(),
            "rollout.top_p: must be in (0, 1], got 0\n"
            "rollout.kv_cache_gb: must be >= 0 (0 = kv_cache_fraction of free memory), got inf");
  c.engine.prefix.n_prefix = c.n + 1;  // a rule across the section: n_prefix <= n
  c.engine.sampling.top_p = 1;
  c.engine.kv_cache_gb = 0;
  EXPECT_EQ(check_options(c, "rollout").message(),
            "rollout.prefix.n_prefix: must be <= rollout.n (8), got 9");
  c.engine.prefix.n_prefix = 0;
  EXPECT_TRUE(check_options(c, "rollout").ok());
}

// ---- rollout.dtype: the engine's own precision.

// Mean and largest |a - b| over the response tokens' raw log-probs against
// a model's full-sequence forward.
struct Distance {
  double mean = 0, max = 0;
};
Distance raw_logprob_distance(model::Policy& scorer, const std::vector<TrajectoryGroup>& groups) {
  torch::NoGradGuard ng;
  Distance d;
  int n = 0;
  for (const TrajectoryGroup& g : groups) {
    for (const Trajectory& t : g.trajectories) {
      std::vector<int64_t> ids = t.prompt_tokens;
      ids.insert(ids.end(), t.response_tokens.begin(), t.response_tokens.end());
      const at::Tensor logp = torch::log_softmax(
          scorer->forward(torch::tensor(ids).view({1, -1}))[0].to(torch::kFloat64), -1);
      const size_t P = t.prompt_tokens.size();
      for (size_t j = 0; j < t.response_tokens.size(); ++j) {
        const double e =
            std::abs(t.raw_logprobs[j] - logp[P - 1 + j][t.response_tokens[j]].item<double>());
        d.mean += e;
        d.max = std::max(d.max, e);
        ++n;
      }
    }
  }
  if (n > 0) d.mean /= n;
  return d;
}

// A trainer in fp32 feeding an engine in bf16: the engine converts its copy
// when it is created and every version as it lands, and records the
// log-probs of the bf16 model it samples from.
TEST(EngineDtypeTest, ABf16EngineHoldsSamplesFromAndUpdatesBf16Weights) {
  EngineOptions o = base_options();
  o.dtype = EngineDtype::kBFloat16;
  o.sampling.record_raw_logprobs = true;
  model::Policy held = make_policy(7);
  const auto fp32_weights = weights_of(held);
  auto created = Engine::create(held, o, 0, 100);
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<Engine> engine = std::move(created).value();
  for (const auto& [name, p] : weights_of(held)) {
    ASSERT_EQ(p.scalar_type(), torch::kBFloat16) << name;
    EXPECT_TRUE(torch::equal(p, fp32_weights.at(name).to(torch::kBFloat16))) << name;
  }

  ASSERT_TRUE(engine->submit(group("a", {3, 7, 1}, 3, 11)).ok());
  ASSERT_TRUE(engine->submit(group("b", {9, 2, 2, 5, 30, 6}, 2, 12)).ok());
  const std::vector<TrajectoryGroup> groups = run_all(*engine);
  for (const TrajectoryGroup& g : groups) {
    for (const Trajectory& t : g.trajectories) ASSERT_TRUE(check_trajectory(t).ok());
  }
  model::Policy fp32 = make_policy(7);
  model::Policy bf16 = make_policy(7);
  bf16->to(torch::kBFloat16);
  const Distance to_fp32 = raw_logprob_distance(fp32, groups);
  const Distance to_bf16 = raw_logprob_distance(bf16, groups);
  std::printf(
      "raw log-probs of the bf16 engine: from the fp32 model mean %.2e max %.2e, from "
      "the bf16 model's forward mean %.2e max %.2e\n",
      to_fp32.mean, to_fp32.max, to_bf16.mean, to_bf16.max);
  // Not the fp32 model's (an fp32 engine is within 1e-5 of it:
  // BehaviorLogprobsEqualIndependentRecomputation), and near either. This
  // tiny model's logits reach ~20, where a bf16 rounding step is 0.125: 2-3e-2
  // on average here, up to 0.12.
  EXPECT_GT(to_fp32.mean, 1e-4);
  EXPECT_LT(to_fp32.max, 0.5);
  EXPECT_LT(to_bf16.max, 0.5);

  // An fp32 version lands converted, between steps.
  model::Policy next = make_policy(8);
  const auto next_weights = weights_of(next);
  ASSERT_TRUE(engine->update_weights(1, 101, next_weights).ok());
  ASSERT_TRUE(engine->submit(group("c", {4, 4}, 1, 13)).ok());
  for (const TrajectoryGroup& g : run_all(*engine)) {
    for (const Trajectory& t : g.trajectories) {
      for (int64_t v : t.token_versions) EXPECT_EQ(v, 1);
    }
  }
  for (const auto& [name, p] : weights_of(held)) {
    ASSERT_EQ(p.scalar_type(), torch::kBFloat16) << name;
    EXPECT_TRUE(torch::equal(p, next_weights.at(name).to(torch::kBFloat16))) << name;
  }
}

// rollout.fp32_lm_head: a bf16 engine whose logits come from the fp32 head
// it was given, and from each fp32 version's head: bf16 hidden states,
// widened, times that head, on the decode and the scoring path alike.
TEST(EngineDtypeTest, Fp32LmHeadTakesLogitsFromTheFp32HeadOfEachVersion) {
  auto run = [](bool fp32_head, model::Policy& held) {
    EngineOptions o = base_options();
    o.dtype = EngineDtype::kBFloat16;
    o.fp32_lm_head = fp32_head;
    o.sampling.record_raw_logprobs = true;
    auto engine = Engine::create(held, o, 0, 100);
    EXPECT_TRUE(engine.ok()) << engine.status();
    for (int g = 0; g < 6; ++g) {
      EXPECT_TRUE((*engine)->submit(group("g" + std::to_string(g), {3 + g, 7, 1}, 3, 20 + g)).ok());
    }
    return std::make_pair(std::move(*engine), run_all(**engine));
  };
  model::Policy plain_policy = make_policy(7), head_policy = make_policy(7);
  auto [plain_engine, plain] = run(false, plain_policy);
  auto [head_engine, with_head] = run(true, head_policy);
  EXPECT_FALSE(plain_policy->has_fp32_lm_head());
  ASSERT_TRUE(head_policy->has_fp32_lm_head());
  model::Policy fp32 = make_policy(7);
  const Distance d_plain = raw_logprob_distance(fp32, plain);
  const Distance d_head = raw_logprob_distance(fp32, with_head);
  std::printf(
      "bf16 engine's raw log-probs from the fp32 model's: mean %.2e max %.2e; with the "
      "fp32 LM head mean %.2e max %.2e\n",
      d_plain.mean, d_plain.max, d_head.mean, d_head.max);
  // Both near the fp32 model; on this tiny model (weights drawn at 0.3) most
  // of the distance is the bf16 hidden states', so the distances are printed,
  // not compared: the test holds what the engine computes (below), and
  // docs/rollout.md has the figure on a real run.
  EXPECT_LT(d_head.max, 0.5);

  // The head is the fp32 one, not the bf16 parameter widened.
  const std::string head_name = head_policy->lm_head_parameter_name();
  const at::Tensor hidden = torch::randn({3, TinyConfig().hidden_size}).to(torch::kBFloat16);
  auto expect_head = [&](const at::Tensor& head32) {
    torch::NoGradGuard no_grad;
    const at::Tensor got = head_policy->logits(hidden);
    EXPECT_EQ(got.scalar_type(), torch::kFloat32);
    const at::Tensor want = torch::matmul(hidden.to(torch::kFloat32), head32.t());
    EXPECT_LT((got - want).abs().max().item<double>(), 1e-4);
    const at::Tensor rounded = torch::matmul(hidden.to(torch::kFloat32),
                                             head32.to(torch::kBFloat16).to(torch::kFloat32).t());
    EXPECT_GT((got - rounded).abs().max().item<double>(), 1e-3) << "the bf16 head's products";
  };
  expect_head(weights_of(fp32).at(head_name));
  {
    // The scoring path (a recompute's proximal log-probs) takes the same head.
    torch::NoGradGuard no_grad;
    const at::Tensor ids = torch::tensor({{3, 7, 1, 9, 2}});
    const at::Tensor got = head_policy->score(ids);
    const at::Tensor h = head_policy->hidden_states(ids).to(torch::kFloat32);
    const at::Tensor logp = torch::log_softmax(
        torch::matmul(h, weights_of(fp32).at(head_name).t()).to(torch::kFloat64), -1);
    for (int64_t t = 0; t + 1 < ids.size(1); ++t) {
      EXPECT_NEAR(got[0][t].item<double>(), logp[0][t][ids[0][t + 1]].item<double>(), 1e-4) << t;
    }
  }
  // An fp32 version: its own head, not its bf16 rounding.
  model::Policy next = make_policy(8);
  ASSERT_TRUE(head_engine->update_weights(1, 101, weights_of(next)).ok());
  ASSERT_TRUE(head_engine->submit(group("c", {4, 4}, 1, 13)).ok());
  ASSERT_EQ(run_all(*head_engine).size(), 1u);
  expect_head(weights_of(next).at(head_name));
  EXPECT_EQ(weights_of(head_policy).at(head_name).scalar_type(), torch::kBFloat16);

  // Under autocast the head's product would not be fp32: refused.
  EngineOptions o = base_options();
  o.dtype = EngineDtype::kBFloat16;
  o.fp32_lm_head = true;
  o.autocast = model::Autocast::kBFloat16;
  model::Policy p = make_policy(3);
  auto refused = Engine::create(p, o, 0, 0);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(std::string(refused.status().message()).find("rollout.fp32_lm_head"),
            std::string::npos);
}

// A precision LibTorch cannot multiply in on the policy's device is refused
// when the engine is created, naming the key, not at its first prefill.
TEST(EngineDtypeTest, APrecisionWithoutMatrixProductsHereIsRefusedAtCreate) {
  bool fp16_products = true;
  try {
    torch::NoGradGuard ng;
    const at::Tensor a = torch::ones({2, 2}, torch::kHalf);
    (void)torch::mm(a, a);
  } catch (const c10::Error&) {
    fp16_products = false;
  }
  EngineOptions o = base_options();
  o.dtype = EngineDtype::kFloat16;
  model::Policy p = make_policy(3);
  auto engine = Engine::create(p, o, 0, 0);
  if (fp16_products) {
    // A LibTorch with fp16 products on the CPU (2.x): it runs.
    ASSERT_TRUE(engine.ok()) << engine.status();
    ASSERT_TRUE((*engine)->submit(group("a", {1, 2}, 1, 5)).ok());
    EXPECT_EQ(run_all(**engine).size(), 1u);
    return;
  }
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(engine.status().message()).find("dtype: float16 matrix products"),
            std::string::npos)
      << engine.status();
  EXPECT_EQ(p->parameters().front().scalar_type(), torch::kFloat32) << "the policy was changed";
}

// `model` (the default) keeps the policy's precision; float32 converts a
// bf16 policy up.
TEST(EngineDtypeTest, ModelKeepsThePolicysPrecisionAndFloat32ConvertsUp) {
  model::Policy kept = make_policy(3);
  ASSERT_TRUE(Engine::create(kept, base_options(), 0, 0).ok());
  EXPECT_EQ(kept->parameters().front().scalar_type(), torch::kFloat32);
  model::Policy low = make_policy(3);
  low->to(torch::kBFloat16);
  EngineOptions o = base_options();
  o.dtype = EngineDtype::kFloat32;
  auto engine = Engine::create(low, o, 0, 0);
  ASSERT_TRUE(engine.ok()) << engine.status();
  for (const at::Tensor& p : low->parameters()) EXPECT_EQ(p.scalar_type(), torch::kFloat32);
  ASSERT_TRUE((*engine)->submit(group("a", {1, 2}, 2, 5)).ok());
  EXPECT_EQ(run_all(**engine).size(), 1u);
}

// ---- Memory: the KV budget.

// A budget for two sequences at a time: four groups still all finish (the
// others wait for room), each exactly as with room for all.
TEST(EngineKvBudgetTest, AdmissionWaitsForRoomAndChangesNoResult) {
  EngineOptions roomy = base_options();
  EngineOptions tight = base_options();
  // Prompt 3 + max_new_tokens 8 = 11 positions: one block of 16 each.
  tight.kv_block_size = 16;
  const model::PolicyConfig pc = TinyConfig();
  const int64_t position_bytes =
      2 * pc.num_hidden_layers * pc.num_key_value_heads * pc.resolved_head_dim() * 4;
  tight.kv_cache_gb = static_cast<double>(2 * 16 * position_bytes) / (1 << 30);
  auto a = make_engine(5, roomy), b = make_engine(5, tight);
  for (Engine* e : {a.get(), b.get()}) {
    for (int i = 0; i < 4; ++i) {
      ASSERT_TRUE(e->submit(group("g" + std::to_string(i), {1, 7 + i, 3}, 1, 40 + i)).ok());
    }
  }
  auto ra = by_id(run_all(*a)), rb = by_id(run_all(*b));
  ASSERT_EQ(rb.size(), 4u);
  for (const auto& [id, g] : ra) {
    // Batched differently, so equal up to the BLAS's rounding.
    const Trajectory& t = rb.at(id).trajectories[0];
    EXPECT_EQ(t.response_tokens, g.trajectories[0].response_tokens) << id;
    for (size_t j = 0; j < t.behavior_logprobs.size(); ++j) {
      EXPECT_NEAR(t.behavior_logprobs[j], g.trajectories[0].behavior_logprobs[j], 1e-4) << id;
    }
  }
  const EngineStats st = b->stats();
  EXPECT_EQ(st.kv_capacity_positions, 32);
  EXPECT_LE(st.kv_peak_positions, 32);
  EXPECT_GT(st.admission_waits, 0);
  EXPECT_EQ(a->stats().admission_waits, 0);
}

TEST(EngineKvBudgetTest, ABudgetBelowOneSequenceIsAConfigErrorWithTheMinimum) {
  EngineOptions o = base_options();
  o.kv_cache_gb = 1000.0 / (1 << 30);
  auto e = Engine::create(make_policy(1), o, 0, 0);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string msg(e.status().message());
  EXPECT_NE(msg.find("rollout.kv_cache_gb"), std::string::npos) << msg;
  EXPECT_NE(msg.find("needs 9"), std::string::npos) << msg;  // 1 + max_new_tokens 8
  EXPECT_NE(msg.find("set at least"), std::string::npos) << msg;
}

TEST(EngineKvBudgetTest, APromptThatCouldNeverFitIsRefusedAtSubmit) {
  EngineOptions o = base_options();
  o.kv_block_size = 4;
  const model::PolicyConfig pc = TinyConfig();
  o.kv_cache_gb = static_cast<double>(4 * 4 * 2 * pc.num_hidden_layers * pc.num_key_value_heads *
                                      pc.resolved_head_dim() * 4) /
                  (1 << 30);  // 16 positions
  auto e = make_engine(1, o);
  Status s = e->submit(group("long", std::vector<int64_t>(12, 5), 1, 1));  // 12 + 8 > 16
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("group 'long'"), std::string::npos) << s;
  EXPECT_NE(std::string(s.message()).find("rollout.kv_cache_gb"), std::string::npos) << s;
  EXPECT_TRUE(e->submit(group("short", {1, 2}, 2, 1)).ok());
  EXPECT_EQ(run_all(*e).size(), 1u);
}

// ---- The sampling support: ids past the tokenizer's vocabulary.

TEST(EngineVocabTest, IdsPastTheSupportAreNeverSampledAndLogProbsMatchTheTrainer) {
  model::Policy policy = make_policy(3);
  {
    // Make the padded rows (ids 30..36) the most likely by far.
    torch::NoGradGuard g;
    policy->lm_head->weight.narrow(0, 30, 7).mul_(40.0);
  }
  model::Policy scorer = model::clone_policy(*policy);
  EngineOptions o = base_options();
  o.vocab_limit = 30;
  auto e = Engine::create(policy, o, 0, 0);
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE((*e)->submit(group("g", {1, 2, 3}, 4, 9)).ok());
  auto out = run_all(**e);
  ASSERT_EQ(out.size(), 1u);
  model::ScoreOptions so;
  so.vocab_limit = 30;
  for (const Trajectory& t : out[0].trajectories) {
    for (int64_t id : t.response_tokens) EXPECT_LT(id, 30);
    std::vector<int64_t> ids = t.prompt_tokens;
    ids.insert(ids.end(), t.response_tokens.begin(), t.response_tokens.end());
    torch::NoGradGuard g;
    at::Tensor lp = scorer->score(torch::tensor(ids).view({1, -1}), {}, so)[0];
    for (size_t j = 0; j < t.response_tokens.size(); ++j) {
      EXPECT_NEAR(t.behavior_logprobs[j], lp[t.prompt_tokens.size() - 1 + j].item<float>(), 1e-5);
    }
  }
  // Without the limit the padded ids dominate: the test has teeth.
  o.vocab_limit = 0;
  model::Policy p2 = make_policy(3);
  {
    torch::NoGradGuard g;
    p2->lm_head->weight.narrow(0, 30, 7).mul_(40.0);
  }
  auto e2 = Engine::create(p2, o, 0, 0);
  ASSERT_TRUE(e2.ok()) << e2.status();
  ASSERT_TRUE((*e2)->submit(group("g", {1, 2, 3}, 4, 9)).ok());
  int64_t padded = 0;
  const std::vector<TrajectoryGroup> unlimited = run_all(**e2);
  ASSERT_EQ(unlimited.size(), 1u);
  for (const Trajectory& t : unlimited[0].trajectories) {
    for (int64_t id : t.response_tokens) padded += id >= 30 ? 1 : 0;
  }
  EXPECT_GT(padded, 0);
  // A stop token outside the support could never end a sequence.
  o.vocab_limit = 30;
  o.stop_tokens = {33};
  EXPECT_EQ(Engine::create(make_policy(3), o, 0, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// ---- MoE routing, recorded like behavior log-probs.

model::PolicyConfig MoeConfig() {
  model::PolicyConfig c = TinyConfig("qwen3_moe");
  c.head_dim = 8;
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 16;
  c.norm_topk_prob = true;
  return c;
}

TEST(EngineRoutingTest, TrajectoriesCarryTheRoutingOfEveryPositionRun) {
  model::Policy policy(MoeConfig());
  model::init_weights(*policy, 4, 0.3);
  model::Policy scorer = model::clone_policy(*policy);
  EngineOptions o = base_options();
  auto e = Engine::create(policy, o, 0, 0);
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE((*e)->submit(group("g", {1, 5, 2, 9}, 3, 2)).ok());
  auto out = run_all(**e);
  ASSERT_EQ(out.size(), 1u);
  for (const Trajectory& t : out[0].trajectories) {
    ASSERT_TRUE(check_trajectory(t).ok()) << check_trajectory(t);
    EXPECT_EQ(t.routing_layers, 2);
    EXPECT_EQ(t.routing_top_k, 2);
    const int64_t positions = t.prompt_tokens.size() + t.response_tokens.size() - 1;
    ASSERT_EQ(static_cast<int64_t>(t.routed_experts.size()), positions * 2 * 2);
    // The routing a full forward over the same tokens takes, position by
    // position (the engine ran them incrementally, sharing the prompt).
    std::vector<int64_t> ids = t.prompt_tokens;
    ids.insert(ids.end(), t.response_tokens.begin(), t.response_tokens.end());
    model::MoeRouting r;
    r.record = true;
    torch::NoGradGuard g;
    scorer->hidden_states(torch::tensor(ids).view({1, -1}), {}, &r);
    at::Tensor full = std::get<0>(torch::stack(r.chosen, 1).narrow(0, 0, positions).sort(-1));
    at::Tensor recorded = std::get<0>(torch::tensor(t.routed_experts, torch::kInt32)
                                          .view({positions, 2, 2})
                                          .to(torch::kInt64)
                                          .sort(-1));
    EXPECT_TRUE(torch::equal(full, recorded));
  }
}

TEST(EngineRoutingTest, DenseModelsRecordNoRouting) {
  auto e = make_engine(1, base_options());
  ASSERT_TRUE(e->submit(group("g", {1, 2}, 1, 1)).ok());
  auto out = run_all(*e);
  EXPECT_TRUE(out.at(0).trajectories.at(0).routed_experts.empty());
  EXPECT_EQ(out.at(0).trajectories.at(0).routing_layers, 0);
}

// rollout.decode_graphs: on runs every decode step in fixed shapes (on the
// CPU eagerly, without a graph). The same groups, sampled from the same
// seeds, through a version that lands mid-decode (recompute), give the same
// tokens and the same behaviour log-probs as the usual path.
TEST(EngineDecodeGraphsTest, FixedShapeDecodeSamplesWhatTheUsualPathSamples) {
  auto run = [](DecodeGraphMode mode, EngineStats* stats) {
    EngineOptions o = base_options();
    o.max_new_tokens = 12;
    o.decode_graphs = mode;
    std::unique_ptr<Engine> engine = make_engine(7, o);
    EXPECT_TRUE(engine->submit(group("a", {3, 7, 1}, 3, 11)).ok());
    EXPECT_TRUE(engine->submit(group("b", {9, 2, 2, 5, 30, 6}, 2, 12)).ok());
    std::vector<TrajectoryGroup> all;
    for (int step = 0; step < 4; ++step) {  // a few tokens under version 0
      auto done = engine->step();
      EXPECT_TRUE(done.ok()) << done.status();
      for (TrajectoryGroup& g : *done) all.push_back(std::move(g));
    }
    model::Policy next = make_policy(8);
    EXPECT_TRUE(engine->update_weights(1, 101, weights_of(next)).ok());
    EXPECT_TRUE(engine->submit(group("c", {4, 4}, 2, 13)).ok());
    for (TrajectoryGroup& g : run_all(*engine)) all.push_back(std::move(g));
    *stats = engine->stats();
    return by_id(std::move(all));
  };
  EngineStats fixed_stats, usual_stats;
  const auto fixed = run(DecodeGraphMode::kOn, &fixed_stats);
  const auto usual = run(DecodeGraphMode::kAuto, &usual_stats);  // auto: not on the CPU
  EXPECT_GT(fixed_stats.graph_steps, 10);
  EXPECT_EQ(fixed_stats.graph_replays, 0);
  EXPECT_EQ(usual_stats.graph_steps, 0);
  ASSERT_EQ(fixed.size(), 3u);
  ASSERT_EQ(usual.size(), 3u);
  for (const auto& [id, g] : fixed) {
    const TrajectoryGroup& u = usual.at(id);
    ASSERT_EQ(g.trajectories.size(), u.trajectories.size()) << id;
    for (size_t i = 0; i < g.trajectories.size(); ++i) {
      const Trajectory& a = g.trajectories[i];
      const Trajectory& b = u.trajectories[i];
      ASSERT_EQ(a.response_tokens, b.response_tokens) << id << " sample " << i;
      EXPECT_EQ(a.token_versions, b.token_versions) << id << " sample " << i;
      for (size_t j = 0; j < a.behavior_logprobs.size(); ++j) {
        EXPECT_NEAR(a.behavior_logprobs[j], b.behavior_logprobs[j], 1e-5)
            << id << " sample " << i << " token " << j;
      }
    }
  }
}

TEST(EngineDecodeGraphsTest, OnIsRefusedForAModelItCannotRun) {
  model::PolicyConfig c = TinyConfig("qwen3_moe");
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 16;
  model::Policy moe(c);
  model::init_weights(*moe, 3);
  EngineOptions o = base_options();
  o.decode_graphs = DecodeGraphMode::kOn;
  auto refused = Engine::create(moe, o, 0, 100);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(std::string(refused.status().message()).find("decode_graphs"), std::string::npos)
      << refused.status();
  EXPECT_NE(std::string(refused.status().message()).find("MoE"), std::string::npos)
      << refused.status();
  // auto decodes such a model the usual way.
  o.decode_graphs = DecodeGraphMode::kAuto;
  EXPECT_TRUE(Engine::create(moe, o, 0, 100).ok());
}

}  // namespace
}  // namespace relay::rollout
