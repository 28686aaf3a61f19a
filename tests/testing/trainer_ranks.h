#pragma once

// Trainer ranks as threads of the test process, over a real c10d Gloo group
// on loopback: the tiny policy, engine-sampled groups with a learning
// signal, and runs of a list of calls on one rank or on several.

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "relay/comm/dist/trainer_group.h"
#include "relay/comm/dist/trainer_ranks.h"
#include "relay/model/policy.h"
#include "relay/rollout/engine.h"
#include "relay/trainer/data_parallel.h"
#include "relay/trainer/trainer.h"
#include "testing/ports.h"
#include "testing/tensor_testing.h"

namespace relay::testing {

inline model::Policy make_policy(uint64_t seed) {
  model::Policy p(TinyConfig());
  model::init_weights(*p, seed, 0.3);
  p->eval();
  return p;
}

// Engine-sampled groups with rewards that give every group a learning signal.
inline std::vector<rollout::TrajectoryGroup> sample_groups(const model::Policy& policy,
                                                           int num_groups, int k) {
  model::Policy copy = model::clone_policy(*policy);
  rollout::EngineOptions eo;
  eo.num_slots = 8;
  eo.max_new_tokens = 7;
  auto engine = rollout::Engine::create(copy, eo, 0, 1).value();
  for (int g = 0; g < num_groups; ++g) {
    rollout::PromptGroup pg;
    pg.group_id = std::to_string(g);
    pg.prompt = {1, 3 + g, 7, 2 + g};
    pg.k = k;
    pg.seed = 10 + g;
    EXPECT_TRUE(engine->submit(pg).ok());
  }
  auto groups = engine->run().value();
  for (auto& g : groups) {
    for (size_t i = 0; i < g.trajectories.size(); ++i) {
      auto& t = g.trajectories[i];
      t.reward = std::count(t.response_tokens.begin(), t.response_tokens.end(), 5) > 0 ? 1.0 : 0.0;
      if (g.trajectories.size() > 1 && i < 2) t.reward = static_cast<double>(i == 0);
    }
  }
  return groups;
}

inline trainer::TrainerOptions dp_options() {
  trainer::TrainerOptions o;
  o.optimizer.lr = 1e-2;
  o.max_staleness = -1;  // the same groups are trained on at every step
  // AdamW's step is lr * m / (sqrt(v) + eps): with eps 1e-8 a gradient near
  // 1e-8 turns an fp32 rounding difference of the summation order into a
  // visible difference of the step. A larger eps keeps the update a smooth
  // function of the gradient, so single- and two-rank updates can be
  // compared at fp32 tolerance.
  o.optimizer.eps = 1e-3;
  o.micro_batch_tokens = 40;  // several micro-batches per rank
  o.mini_batches = 2;
  o.ppo_epochs = 2;
  o.entropy.coef = 0.01;
  return o;
}

struct RankResult {
  Status status = OkStatus();
  std::vector<trainer::StepMetrics> metrics;
  std::vector<at::Tensor> params;
  std::string saved;  // what the last "save" call returned
};

// Rank `rank` of `world` joining at 127.0.0.1:port.
inline StatusOr<std::shared_ptr<trainer::Collectives>> join_loopback(int rank, int world,
                                                                     int port) {
  comm::TrainerGroupOptions go;
  go.rank.rank = rank;
  go.rank.world_size = world;
  go.rank.host = "127.0.0.1";
  go.rank.port = port;
  go.timeout = std::chrono::seconds(60);
  return comm::join_trainer_group(go);
}

// Rank 1 of a two-rank group at 127.0.0.1:port on a thread of its own,
// following rank 0's commands (comm/dist/trainer_ranks.h) over a model of
// the tiny architecture with `options` for every role; what
// follow_rank_leader returns goes to `status`.
inline std::thread follow_on_thread(int port, const trainer::TrainerOptions& options,
                                    Status& status) {
  return std::thread([port, options, &status] {
    StatusOr<std::shared_ptr<trainer::Collectives>> group = join_loopback(1, 2, port);
    if (!group.ok()) {
      status = group.status();
      return;
    }
    comm::FollowerOptions fo;
    fo.bucket_bytes = 4096;
    fo.options = [options](const std::string&) -> StatusOr<trainer::TrainerOptions> {
      return options;
    };
    status = comm::follow_rank_leader(*group, make_policy(99), fo);
  });
}

// Runs `calls` on trainer `t`: "step", "sft" (sft_step) or "save"
// (save_state, kept in out.saved); stops at the first failure.
inline void run_calls(trainer::Trainer& t, const std::vector<rollout::TrajectoryGroup>& groups,
                      const std::vector<std::string>& calls, RankResult& out) {
  for (const std::string& call : calls) {
    if (call == "save") {
      StatusOr<std::string> saved = t.save_state();
      if (!saved.ok()) {
        out.status = saved.status();
        return;
      }
      out.saved = *saved;
      continue;
    }
    StatusOr<trainer::StepMetrics> m = call == "sft" ? t.sft_step(groups) : t.step(groups);
    if (!m.ok()) {
      out.status = m.status();
      return;
    }
    out.metrics.push_back(*m);
  }
  for (const at::Tensor& p : t.policy()->parameters()) out.params.push_back(p.detach().clone());
  // PPO's critic (advantage.estimator gae) after the policy's.
  if (model::ValueModel critic = t.critic()) {
    for (const at::Tensor& p : critic->parameters()) out.params.push_back(p.detach().clone());
  }
}

// Runs `calls` on `world` ranks as threads, each over a copy of `initial`
// at `version` with `state` (save_state bytes) restored first unless empty.
inline std::vector<RankResult> run_ranks(int world, const model::Policy& initial,
                                         const trainer::TrainerOptions& options,
                                         const std::vector<rollout::TrajectoryGroup>& groups,
                                         const std::vector<std::string>& calls,
                                         int64_t bucket_bytes, const std::string& state = "",
                                         int64_t version = 0) {
  const int port = free_port();
  std::vector<RankResult> results(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      RankResult& out = results[static_cast<size_t>(rank)];
      StatusOr<std::shared_ptr<trainer::Collectives>> group = join_loopback(rank, world, port);
      if (!group.ok()) {
        out.status = group.status();
        return;
      }
      trainer::DataParallel dp;
      dp.group = *group;
      dp.bucket_bytes = bucket_bytes;
      model::Policy policy = model::clone_policy(*initial);
      auto t = trainer::Trainer::create(policy, options, version, nullptr, dp);
      if (!t.ok()) {
        out.status = t.status();
        return;
      }
      if (!state.empty()) {
        if (Status s = (*t)->restore_state(state, "test state"); !s.ok()) {
          out.status = s;
          return;
        }
      }
      run_calls(**t, groups, calls, out);
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

inline RankResult run_single(const model::Policy& initial, const trainer::TrainerOptions& options,
                             const std::vector<rollout::TrajectoryGroup>& groups,
                             const std::vector<std::string>& calls, const std::string& state = "",
                             int64_t version = 0) {
  RankResult out;
  model::Policy policy = model::clone_policy(*initial);
  auto t = trainer::Trainer::create(policy, options, version).value();
  if (!state.empty()) out.status = t->restore_state(state, "test state");
  if (out.status.ok()) run_calls(*t, groups, calls, out);
  EXPECT_TRUE(out.status.ok()) << out.status;
  return out;
}

inline at::Tensor flat(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> parts;
  for (const at::Tensor& t : params) parts.push_back(t.detach().reshape({-1}).to(torch::kFloat32));
  return torch::cat(parts);
}

inline at::Tensor flat(const model::Policy& p) { return flat(p->parameters()); }

inline trainer::TrainerOptions with_sharding(trainer::TrainerOptions o,
                                             trainer::Sharding sharding) {
  o.sharding = sharding;
  return o;
}

// A copy of `like` holding `params`.
inline model::Policy policy_with(const model::Policy& like, const std::vector<at::Tensor>& params) {
  model::Policy p = model::clone_policy(*like);
  torch::NoGradGuard no_grad;
  const auto mine = p->parameters();
  for (size_t i = 0; i < mine.size(); ++i) mine[i].copy_(params[i]);
  return p;
}

// The largest difference of two runs' weights, relative to the largest
// change `reference` made from `before` (undefined: relative to the largest
// of `reference`'s weights).
inline double relative_difference(const RankResult& run, const RankResult& reference,
                                  const at::Tensor& before) {
  const at::Tensor change =
      before.defined() ? flat(reference.params) - before : flat(reference.params);
  const double scale = change.abs().max().item<double>();
  EXPECT_GT(scale, 0) << "the weights did not change";
  return (flat(run.params) - flat(reference.params)).abs().max().item<double>() / scale;
}

// Every rank ends with the same weights and metrics, and the update equals
// `single`'s: the change of the flattened weights from `before_flat` within
// `tolerance` of its largest element (the metrics likewise). A rank that
// failed (its status) is a fatal failure here: wrap the call in
// ASSERT_NO_FATAL_FAILURE, so that the test stops instead of reading the
// failed rank's empty results.
inline void expect_same_training(const RankResult& single, const std::vector<RankResult>& ranks,
                                 const at::Tensor& before_flat, double tolerance = 1e-4) {
  for (const RankResult& r : ranks) ASSERT_TRUE(r.status.ok()) << r.status;
  // Bit-identical weights on every rank.
  for (size_t i = 1; i < ranks.size(); ++i) {
    ASSERT_EQ(ranks[i].params.size(), ranks[0].params.size());
    for (size_t p = 0; p < ranks[0].params.size(); ++p) {
      EXPECT_TRUE(torch::equal(ranks[i].params[p], ranks[0].params[p]))
          << "rank " << i << " parameter " << p << " differs from rank 0";
    }
    // Every metric is computed from summed or identical data.
    for (size_t s = 0; s < ranks[0].metrics.size(); ++s) {
      for (const auto& [k, v] : ranks[0].metrics[s]) {
        if (std::isnan(v) || k.rfind("memory/", 0) == 0) continue;  // each rank's own process
        EXPECT_EQ(ranks[i].metrics[s].at(k), v) << "call " << s << " metric " << k;
      }
    }
  }
  // The update equals the single-rank update: compared as the change of
  // the flattened weights, relative to its size.
  const at::Tensor d_single = flat(single.params) - before_flat;
  const at::Tensor d_dp = flat(ranks[0].params) - before_flat;
  const double scale = d_single.abs().max().item<double>();
  ASSERT_GT(scale, 0) << "the weights did not change";
  EXPECT_LE((d_dp - d_single).abs().max().item<double>(), tolerance * scale);
  // And so do the metrics (sums over different partitions of the same rows).
  ASSERT_EQ(single.metrics.size(), ranks[0].metrics.size());
  for (size_t s = 0; s < single.metrics.size(); ++s) {
    for (const auto& [k, v] : single.metrics[s]) {
      // Timings and the process's memory are facts of the process, not of the step.
      if (std::isnan(v) || k.rfind("time", 0) == 0 || k.rfind("memory/", 0) == 0) continue;
      ASSERT_TRUE(ranks[0].metrics[s].count(k)) << "call " << s << " lacks metric " << k;
      EXPECT_NEAR(ranks[0].metrics[s].at(k), v, tolerance * std::max(1.0, std::abs(v)))
          << "call " << s << " metric " << k;
    }
  }
}

}  // namespace relay::testing
