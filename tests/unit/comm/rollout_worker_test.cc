// RolloutWorker against an in-memory trainer (testing/fake_trainer_client.h):
// what it submits for each lease, how it follows a new version, and what it
// does with a refused group, a trainer that is gone, and a stop request.

#include "relay/comm/worker/rollout_worker.h"

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "relay/model/policy.h"
#include "relay/model/tokenizer.h"
#include "relay/model/weight_manifest.h"
#include "relay/rollout/options.h"
#include "relay/rollout/task.h"
#include "testing/fake_trainer_client.h"
#include "testing/tensor_testing.h"

namespace relay::comm {
namespace {

using testing::FakeTrainer;
using testing::FakeTrainerClient;

// The trainer's weights as version `v`: the fake serves them as published.
FetchedWeights as_version(const model::Policy& policy, int64_t v) {
  FetchedWeights w;
  w.manifest = model::weight_manifest(*policy, v).value();
  w.tensors = model::parameter_tensors(*policy);
  for (auto& [name, t] : w.tensors) t = t.detach().clone();
  return w;
}

// A worker on the arithmetic task with the char tokenizer and a tiny model
// whose weights are the trainer's version 0, and a trainer that has `leases`
// prompts to hand out (k = 3 each).
struct Rig {
  explicit Rig(int leases)
      : tokenizer(
            std::make_shared<const model::CharTokenizer>(model::CharTokenizer::create().value())),
        task(rollout::make_task(TaskConfig{}, /*seed=*/3).value().release()),
        cfg(testing::TinyConfig()) {
    cfg.vocab_size = tokenizer->vocab_size();
    trainer_policy = model::Policy(cfg);
    model::init_weights(*trainer_policy, 11, 0.3);
    trainer.versions[0] = as_version(trainer_policy, 0);
    for (int i = 0; i < leases; ++i) trainer.to_lease.push_back(lease(i));
  }

  v1::PromptLease lease(int i) const {
    const rollout::TaskPrompt p = task->prompt(i).value();
    const std::vector<int64_t> ids = tokenizer->encode(p.prompt).value();
    v1::PromptLease l;
    l.set_lease_id(100 + i);
    l.set_group_id(p.id + "#0");
    l.set_prompt_index(i);
    l.mutable_prompt_tokens()->Add(ids.begin(), ids.end());
    l.set_k(3);
    l.set_seed(7 + i);
    return l;
  }

  // Publishes version v: the trainer's weights scaled, so versions differ.
  void publish(int64_t v) {
    torch::NoGradGuard no_grad;
    for (auto& p : trainer_policy->parameters()) p.mul_(0.9);
    FetchedWeights w = as_version(trainer_policy, v);
    std::lock_guard<std::mutex> lock(trainer.mu);  // the worker's fetch thread reads versions
    trainer.versions[v] = std::move(w);
    trainer.version = v;
  }

  std::unique_ptr<RolloutWorker> make_worker(RolloutWorkerOptions wo = {}) {
    rollout::EngineOptions eo;
    eo.num_slots = 8;
    eo.max_new_tokens = max_new_tokens;
    if (stop_tokens) eo.stop_tokens = {tokenizer->eos_id(), *tokenizer->token_id("#")};
    wo.heartbeat_ms = heartbeat_ms;
    wo.idle_wait_ms = 1;
    worker_policy = model::Policy(cfg);
    model::init_weights(*worker_policy, 11, 0.3);  // the trainer's version 0
    return std::make_unique<RolloutWorker>(std::make_unique<FakeTrainerClient>(&trainer),
                                           worker_policy, eo, task, tokenizer,
                                           std::chrono::milliseconds(1000), wo);
  }

  // Runs `worker` until `done` holds, or 20000 loop turns have passed.
  static Status run_until(RolloutWorker& worker, const std::function<bool()>& done) {
    int turns = 0;
    return worker.run([&] { return done() || ++turns > 20000; });
  }

  // The worker's settings make_worker() applies.
  int64_t heartbeat_ms = 0;  // every loop: the fake answers at once
  int64_t max_new_tokens = 6;
  bool stop_tokens = true;  // false: every sample runs max_new_tokens

  std::shared_ptr<const model::CharTokenizer> tokenizer;
  std::shared_ptr<const rollout::Task> task;
  model::PolicyConfig cfg;
  model::Policy trainer_policy{nullptr};
  model::Policy worker_policy{nullptr};
  FakeTrainer trainer;
};

// Each response token's log-prob under `weights` at temperature 1, as the
// engine's sampler records it.
void expect_logprobs_under(const rollout::Trajectory& t, const FetchedWeights& weights,
                           const model::PolicyConfig& cfg) {
  model::Policy scorer(cfg);
  {
    torch::NoGradGuard no_grad;
    auto params = scorer->named_parameters();
    for (const auto& [name, w] : weights.tensors) params.find(name)->copy_(w);
  }
  torch::NoGradGuard no_grad;
  std::vector<int64_t> ids = t.prompt_tokens;
  ids.insert(ids.end(), t.response_tokens.begin(), t.response_tokens.end());
  at::Tensor logits = scorer->forward(torch::tensor(ids).view({1, -1}))[0];
  const size_t P = t.prompt_tokens.size();
  for (size_t j = 0; j < t.response_tokens.size(); ++j) {
    const double want =
        torch::log_softmax(logits[P - 1 + j].to(torch::kFloat64), -1)[t.response_tokens[j]]
            .item<double>();
    EXPECT_NEAR(t.behavior_logprobs[j], want, 1e-4) << "token " << j;
  }
}

TEST(RolloutWorkerTest, SubmitsEachLeaseWithItsPromptVersionAndLogProbs) {
  Rig rig(2);
  std::unique_ptr<RolloutWorker> worker = rig.make_worker();
  ASSERT_TRUE(worker->start().ok());
  EXPECT_EQ(rig.trainer.registrations, 1);
  EXPECT_EQ(rig.trainer.fetched, std::vector<int64_t>({-1}));
  EXPECT_EQ(worker->version(), 0);

  Status st = Rig::run_until(*worker, [&] { return rig.trainer.submitted.size() >= 2; });
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(rig.trainer.submitted.size(), 2u);
  const uint64_t digest0 = rig.trainer.versions[0].manifest.digest;
  for (const auto& [lease_id, g] : rig.trainer.submitted) {
    const v1::PromptLease l = rig.lease(static_cast<int>(lease_id) - 100);
    EXPECT_EQ(g.group_id, l.group_id());
    ASSERT_EQ(g.trajectories.size(), 3u) << g.group_id;
    for (const rollout::Trajectory& t : g.trajectories) {
      EXPECT_EQ(t.prompt_tokens,
                std::vector<int64_t>(l.prompt_tokens().begin(), l.prompt_tokens().end()));
      ASSERT_FALSE(t.response_tokens.empty());
      ASSERT_EQ(t.behavior_logprobs.size(), t.response_tokens.size());
      EXPECT_EQ(t.token_versions, std::vector<int64_t>(t.response_tokens.size(), 0));
      EXPECT_EQ(t.version_digests, (std::vector<std::pair<int64_t, uint64_t>>{{0, digest0}}));
      EXPECT_TRUE(t.reward == 0.0 || t.reward == 1.0);
      expect_logprobs_under(t, rig.trainer.versions[0], rig.cfg);
    }
  }
  EXPECT_EQ(worker->stats().groups_submitted, 2);
  EXPECT_EQ(worker->stats().groups_accepted, 2);
  EXPECT_EQ(worker->stats().groups_refused, 0);
  EXPECT_TRUE(rig.trainer.released.empty());
}

// Both ways of fetching: on the fetch thread (the default) and in the loop.
TEST(RolloutWorkerTest, FetchesANewVersionAndSamplesTheNextLeasesWithIt) {
  for (bool background : {true, false}) {
    SCOPED_TRACE(background ? "fetched in the background" : "fetched by the loop");
    Rig rig(1);
    RolloutWorkerOptions wo;
    wo.fetch_in_background = background;
    std::unique_ptr<RolloutWorker> worker = rig.make_worker(wo);
    ASSERT_TRUE(worker->start().ok());
    ASSERT_TRUE(Rig::run_until(*worker, [&] { return rig.trainer.submitted.size() >= 1; }).ok());
    rig.publish(1);
    rig.trainer.to_lease.push_back(rig.lease(1));
    Status st = Rig::run_until(*worker, [&] { return rig.trainer.submitted.size() >= 2; });
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_EQ(worker->version(), 1);
    EXPECT_EQ(worker->stats().versions_applied, 1);
    EXPECT_EQ(rig.trainer.fetched.back(), 1);
    ASSERT_EQ(rig.trainer.submitted.size(), 2u);
    const uint64_t digest1 = rig.trainer.versions[1].manifest.digest;
    for (const rollout::Trajectory& t : rig.trainer.submitted[1].second.trajectories) {
      EXPECT_EQ(t.token_versions, std::vector<int64_t>(t.response_tokens.size(), 1));
      EXPECT_EQ(t.version_digests, (std::vector<std::pair<int64_t, uint64_t>>{{1, digest1}}));
      expect_logprobs_under(t, rig.trainer.versions[1], rig.cfg);
    }
  }
}

// A worker the trainer gives no lease still follows every version, and its
// engine applies each one as it is staged: an idle engine steps on nothing,
// so a staged version would otherwise stay beside the weights it replaces
// (and the next download beside both) until the next lease.
TEST(RolloutWorkerTest, AnIdleWorkerAppliesEachVersionItStages) {
  for (bool background : {true, false}) {
    SCOPED_TRACE(background ? "fetched in the background" : "fetched by the loop");
    Rig rig(0);
    RolloutWorkerOptions wo;
    wo.fetch_in_background = background;
    std::unique_ptr<RolloutWorker> worker = rig.make_worker(wo);
    ASSERT_TRUE(worker->start().ok());
    for (int64_t v = 1; v <= 3; ++v) {
      rig.publish(v);
      Status st = Rig::run_until(*worker, [&] { return worker->version() == v; });
      ASSERT_TRUE(st.ok()) << st;
      EXPECT_EQ(worker->version(), v) << "version " << v << " staged but not applied";
    }
    EXPECT_EQ(worker->stats().versions_applied, 3);
    EXPECT_TRUE(rig.trainer.submitted.empty());
  }
}

// Holds the fake trainer's downloads of one version until opened (or for at
// most 10 s, so that a worker that fetches in its loop fails the test
// instead of hanging it).
class FetchGate {
 public:
  // `others` sees the downloads of every other version as they begin.
  FetchGate(FakeTrainer& trainer, int64_t version, std::function<void(int64_t)> others = nullptr) {
    trainer.on_fetch = [this, version, others](int64_t v) {
      if (v != version) {
        if (others) others(v);
        return;
      }
      ++held_;
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::seconds(10), [&] { return open_; });
    };
  }
  ~FetchGate() { open(); }
  void open() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  int held() const { return held_.load(); }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
  std::atomic<int> held_{0};
};

// A version downloads on the fetch thread: the group in flight finishes on
// the version it started with while the download is held, and the next
// lease is sampled with the new version once it is staged.
TEST(RolloutWorkerTest, KeepsDecodingWhileANewVersionDownloads) {
  Rig rig(1);
  FetchGate gate(rig.trainer, 1);
  std::unique_ptr<RolloutWorker> worker = rig.make_worker();
  ASSERT_TRUE(worker->start().ok());
  ASSERT_TRUE(Rig::run_until(*worker, [&] { return worker->stats().engine_steps >= 1; }).ok());
  ASSERT_TRUE(rig.trainer.submitted.empty()) << "the group is still decoding";
  const int64_t steps_before = worker->stats().engine_steps;
  rig.publish(1);
  Status st =
      Rig::run_until(*worker, [&] { return rig.trainer.submitted.size() >= 1 && gate.held() > 0; });
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(rig.trainer.submitted.size(), 1u);
  EXPECT_EQ(gate.held(), 1) << "the download of version 1 began and is still held";
  EXPECT_GT(worker->stats().engine_steps, steps_before) << "decoding went on meanwhile";
  EXPECT_EQ(worker->version(), 0);
  EXPECT_EQ(worker->stats().versions_applied, 0);
  for (const rollout::Trajectory& t : rig.trainer.submitted[0].second.trajectories) {
    EXPECT_EQ(t.token_versions, std::vector<int64_t>(t.response_tokens.size(), 0));
  }
  gate.open();
  rig.trainer.to_lease.push_back(rig.lease(1));
  st = Rig::run_until(*worker, [&] { return rig.trainer.submitted.size() >= 2; });
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(worker->version(), 1);
  ASSERT_EQ(rig.trainer.submitted.size(), 2u);
  for (const rollout::Trajectory& t : rig.trainer.submitted[1].second.trajectories) {
    EXPECT_EQ(t.token_versions, std::vector<int64_t>(t.response_tokens.size(), 1));
    expect_logprobs_under(t, rig.trainer.versions[1], rig.cfg);
  }
}

// A lease taken while a newer version downloads waits for it: nothing of it
// is sampled with the old version (which would only make it staler).
TEST(RolloutWorkerTest, GroupsLeasedWhileAVersionDownloadsWaitForIt) {
  Rig rig(0);
  FetchGate gate(rig.trainer, 1);
  // One lease at a time: the waiting group fills the worker, which must
  // still start it once the version is staged.
  RolloutWorkerOptions wo;
  wo.max_groups_in_flight = 1;
  std::unique_ptr<RolloutWorker> worker = rig.make_worker(wo);
  ASSERT_TRUE(worker->start().ok());
  rig.publish(1);
  rig.trainer.to_lease.push_back(rig.lease(0));
  int turns = 0, heartbeats_held = 0;
  Status st = worker->run([&] {
    if (gate.held() == 0) return false;
    if (heartbeats_held == 0) heartbeats_held = rig.trainer.heartbeats;
    return ++turns > 200;
  });
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_TRUE(rig.trainer.to_lease.empty()) << "leased";
  EXPECT_EQ(worker->stats().engine_steps, 0) << "but not started on version 0";
  // The loop goes on meanwhile: heartbeats (its running version, its groups
  // in flight) still reach the trainer during the download.
  EXPECT_GT(rig.trainer.heartbeats, heartbeats_held + 100);
  gate.open();
  st = Rig::run_until(*worker, [&] { return rig.trainer.submitted.size() >= 1; });
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(rig.trainer.submitted.size(), 1u);
  EXPECT_EQ(rig.trainer.submitted[0].first, 100u);
  for (const rollout::Trajectory& t : rig.trainer.submitted[0].second.trajectories) {
    EXPECT_EQ(t.token_versions, std::vector<int64_t>(t.response_tokens.size(), 1));
    expect_logprobs_under(t, rig.trainer.versions[1], rig.cfg);
  }
}

// A download that ends while the worker is full (no lease to ask for, no
// heartbeat due) is staged at the loop's next turn: the group in flight
// takes the new version from its next token on (recompute), and the group
// waiting for it starts. Staged only at a lease or a heartbeat, as before,
// it waited until the group in flight had finished on the old version.
TEST(RolloutWorkerTest, AVersionDownloadedWhileTheWorkerIsFullIsStagedAtTheNextTurn) {
  Rig rig(1);
  rig.heartbeat_ms = 600000;  // at most the first turn's
  rig.max_new_tokens = 40;
  rig.stop_tokens = false;
  FetchGate gate(rig.trainer, 1);
  RolloutWorkerOptions wo;
  wo.max_groups_in_flight = 2;
  std::unique_ptr<RolloutWorker> worker = rig.make_worker(wo);
  ASSERT_TRUE(worker->start().ok());
  bool published = false, opened = false;
  int turns = 0, heartbeats_at_open = -1, heartbeats_at_v1 = -1;
  Status st = worker->run([&] {
    if (opened && heartbeats_at_v1 < 0 && worker->version() == 1) {
      heartbeats_at_v1 = rig.trainer.heartbeats;
    }
    if (!published && worker->stats().engine_steps >= 1) {
      // The first group decodes on version 0; the next lease learns of 1.
      rig.publish(1);
      rig.trainer.to_lease.push_back(rig.lease(1));
      published = true;
    }
    if (published && !opened && gate.held() == 1) {
      // Full now: the first group in flight, the second waiting for the
      // download. Let it finish, and wait until the fake has answered.
      gate.open();
      for (int i = 0; i < 10000; ++i) {
        {
          std::lock_guard<std::mutex> lock(rig.trainer.mu);
          if (rig.trainer.fetched.back() == 1) break;
        }
        std::this_thread::yield();
      }
      opened = true;
      heartbeats_at_open = rig.trainer.heartbeats;
    }
    return rig.trainer.submitted.size() >= 2 || ++turns > 20000;
  });
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_TRUE(opened);
  ASSERT_EQ(rig.trainer.submitted.size(), 2u);
  EXPECT_EQ(heartbeats_at_v1, heartbeats_at_open) << "staged by a heartbeat, not by the turn";
  for (const auto& [lease_id, g] : rig.trainer.submitted) {
    for (const rollout::Trajectory& t : g.trajectories) {
      ASSERT_EQ(t.response_tokens.size(), 40u);
      const auto on_v1 = std::count(t.token_versions.begin(), t.token_versions.end(), 1);
      if (lease_id == 100) {
        EXPECT_EQ(t.token_versions.front(), 0) << "the first group started on version 0";
        EXPECT_GT(on_v1, 0) << "version 1 was staged only after the first group's decoding";
      } else {
        EXPECT_EQ(on_v1, 40) << "the second group started on version 1";
      }
    }
  }
}

// The next download waits until the engine has applied the version staged
// before it: until its next step the host holds the engine's weights and the
// staged copy, and a download meanwhile would be a third copy. Version 2 is
// published while version 1's download is held; when 1 lands, 2's download
// begins only after the engine holds 1, in a worker decoding a group and in
// an idle one.
TEST(RolloutWorkerTest, TheNextDownloadWaitsUntilTheStagedVersionIsApplied) {
  for (int leases : {1, 0}) {
    SCOPED_TRACE(leases == 1 ? "decoding" : "idle");
    Rig rig(leases);
    rig.max_new_tokens = 40;
    rig.stop_tokens = false;
    std::atomic<RolloutWorker*> seen{nullptr};
    std::atomic<int64_t> engine_at_second{-2};
    FetchGate gate(rig.trainer, 1, [&](int64_t v) {
      if (v == 2 && seen.load() != nullptr) engine_at_second = seen.load()->version();
    });
    std::unique_ptr<RolloutWorker> worker = rig.make_worker();
    ASSERT_TRUE(worker->start().ok());
    seen = worker.get();
    rig.publish(1);
    int turns = 0, turns_after_second = 0;
    bool published = false;
    Status st = worker->run([&] {
      if (!published && gate.held() == 1) {
        rig.publish(2);
        published = true;
      }
      // A few turns for a heartbeat to name version 2, then let 1 land.
      if (published && ++turns_after_second == 5) gate.open();
      return worker->version() == 2 || ++turns > 20000;
    });
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_EQ(worker->version(), 2);
    EXPECT_EQ(engine_at_second.load(), 1)
        << "version 2's download began while the engine still held version "
        << engine_at_second.load() << " and version 1 was staged beside it";
    EXPECT_EQ(worker->stats().versions_applied, 2);
  }
}

// A version that fails its digest is fetched once more; failing twice ends
// run() with the error (and nothing of it is staged).
TEST(RolloutWorkerTest, AVersionThatFailsItsDigestTwiceEndsRun) {
  Rig rig(0);
  std::unique_ptr<RolloutWorker> worker = rig.make_worker();
  ASSERT_TRUE(worker->start().ok());
  {
    std::lock_guard<std::mutex> lock(rig.trainer.mu);
    rig.trainer.fetch_errors.push_back(DataLossError("chunk at offset 0 fails its digest"));
  }
  rig.publish(1);
  Status st = Rig::run_until(*worker, [&] { return worker->stats().versions_applied >= 1; });
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(rig.trainer.fetched, (std::vector<int64_t>{-1, 1, 1}));
  {
    std::lock_guard<std::mutex> lock(rig.trainer.mu);
    rig.trainer.fetch_errors.push_back(DataLossError("chunk at offset 0 fails its digest"));
    rig.trainer.fetch_errors.push_back(DataLossError("chunk at offset 64 fails its digest"));
  }
  rig.publish(2);
  st = Rig::run_until(*worker, [] { return false; });
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_NE(std::string(st.message()).find("offset 64"), std::string::npos) << st;
  EXPECT_EQ(rig.trainer.fetched, (std::vector<int64_t>{-1, 1, 1, 2, 2}));
  EXPECT_EQ(worker->stats().versions_applied, 1);
}

// A malformed group (InvalidArgument) keeps its lease on the trainer: the
// worker gives it back. A stale one (FailedPrecondition) was released by the
// trainer already.
TEST(RolloutWorkerTest, RefusedGroupsAreCountedAndMalformedOnesGiveTheirLeaseBack) {
  Rig rig(2);
  rig.trainer.judge = [](uint64_t lease_id, const rollout::TrajectoryGroup&) {
    v1::SubmitGroupAck ack;
    ack.set_accepted(false);
    const absl::StatusCode code = lease_id == 100 ? absl::StatusCode::kInvalidArgument
                                                  : absl::StatusCode::kFailedPrecondition;
    ack.set_error_code(static_cast<int32_t>(code));
    ack.set_error_message("refused by the test");
    return ack;
  };
  std::unique_ptr<RolloutWorker> worker = rig.make_worker();
  ASSERT_TRUE(worker->start().ok());
  Status st = Rig::run_until(*worker, [&] { return rig.trainer.submitted.size() >= 2; });
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(worker->stats().groups_submitted, 2);
  EXPECT_EQ(worker->stats().groups_accepted, 0);
  EXPECT_EQ(worker->stats().groups_refused, 2);
  EXPECT_EQ(rig.trainer.released, std::vector<uint64_t>({100}));
}

TEST(RolloutWorkerTest, ATrainerThatIsGoneEndsRunWithItsError) {
  Rig rig(1);
  std::unique_ptr<RolloutWorker> worker = rig.make_worker();
  ASSERT_TRUE(worker->start().ok());
  rig.trainer.down = UnavailableError("LeasePrompts: connection refused");
  Status st = Rig::run_until(*worker, [] { return false; });
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_EQ(std::string(st.message()), "LeasePrompts: connection refused");
  EXPECT_TRUE(rig.trainer.submitted.empty());

  // Nor can a worker start against it.
  Rig down(1);
  down.trainer.down = UnavailableError("RegisterWorker: connection refused");
  EXPECT_EQ(down.make_worker()->start().code(), absl::StatusCode::kUnavailable);
}

// A trainer that restarted answers heartbeats with "register again": run()
// returns Unavailable so that relay-rollout calls start() anew.
TEST(RolloutWorkerTest, ATrainerThatForgotTheWorkerEndsRun) {
  Rig rig(1);
  std::unique_ptr<RolloutWorker> worker = rig.make_worker();
  ASSERT_TRUE(worker->start().ok());
  rig.trainer.forgot_worker = true;
  Status st = Rig::run_until(*worker, [] { return false; });
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_NE(std::string(st.message()).find("no longer knows this worker"), std::string::npos) << st;
  rig.trainer.forgot_worker = false;
  ASSERT_TRUE(worker->start().ok());
  EXPECT_EQ(rig.trainer.registrations, 2);
}

TEST(RolloutWorkerTest, StopIsHonouredAndDrainGivesOpenLeasesBack) {
  Rig rig(3);
  std::unique_ptr<RolloutWorker> worker = rig.make_worker();
  EXPECT_EQ(worker->run([] { return false; }).code(), absl::StatusCode::kFailedPrecondition)
      << "run() before start()";
  ASSERT_TRUE(worker->start().ok());
  // Stopped before the first turn: nothing is leased.
  ASSERT_TRUE(worker->run([] { return true; }).ok());
  EXPECT_EQ(rig.trainer.to_lease.size(), 3u);
  // Stopped after one turn (one engine step): the leases are open, and drain
  // gives back every one whose group was not submitted.
  int turns = 0;
  ASSERT_TRUE(worker->run([&] { return ++turns > 1; }).ok());
  EXPECT_TRUE(rig.trainer.to_lease.empty());
  StatusOr<int32_t> drained = worker->drain();
  ASSERT_TRUE(drained.ok()) << drained.status();
  EXPECT_EQ(*drained + rig.trainer.submitted.size(), 3u);
  std::vector<uint64_t> ids = rig.trainer.released;
  for (const auto& [lease_id, g] : rig.trainer.submitted) ids.push_back(lease_id);
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(ids, std::vector<uint64_t>({100, 101, 102}));
}

}  // namespace
}  // namespace relay::comm
