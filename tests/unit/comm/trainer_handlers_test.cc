// The trainer's call handlers without gRPC: registration, leases, group
// acceptance and its refusals (each with the status a worker sees), worker
// expiry on a fake clock, the end of the run and the admin stats. The same
// calls over a real server: tests/integration/service_test.cc.

#include "relay/comm/service/trainer_handlers.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "relay/model/policy.h"
#include "relay/store/convert.h"
#include "relay/v1/admin.pb.h"
#include "relay/v1/worker.pb.h"
#include "testing/tensor_testing.h"

namespace relay::comm {
namespace {

class TrainerHandlersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/relay_handlers_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name() + "_" +
           std::to_string(::getpid());
    std::filesystem::remove_all(dir_);
    store::StoreOptions so;
    so.path = dir_;
    store_ = store::RolloutStore::open(so).value();
    store::DispenserOptions d;
    d.groups_per_step = 2;
    d.k = 2;
    d.lease_timeout_ms = 60000;
    dispenser_ = store::PromptDispenser::open(store_.get(), d).value();
    model::Policy policy(testing::TinyConfig());
    model::init_weights(*policy, 5);
    ASSERT_TRUE(publisher_.publish(0, model::parameter_tensors(*policy)).ok());
    options_.heartbeat_interval_ms = 100;
    options_.worker_timeout_ms = 1000;
    options_.limits.vocab_size = 37;
    options_.limits.max_response_tokens = 8;
    options_.limits.max_context = 64;
    options_.limits.require_behavior_logprobs = true;
    options_.now_ms = [this] { return now_ms_; };
  }
  void TearDown() override {
    handlers_.reset();
    dispenser_.reset();
    store_.reset();
    std::filesystem::remove_all(dir_);
  }

  TrainerHandlers& handlers() {
    if (!handlers_) {
      handlers_ = std::make_unique<TrainerHandlers>(
          options_, store_.get(), dispenser_.get(), &publisher_,
          [](const store::Lease& l) -> StatusOr<PromptContent> {
            PromptContent p;
            p.group_id = "prompt/" + std::to_string(l.occurrence);
            p.prompt_tokens = {1, 2, 3 + l.prompt_index % 10};
            p.seed = 1000 * l.occurrence + l.attempt;
            return p;
          },
          [this] { return version_; });
    }
    return *handlers_;
  }

  std::string register_worker(const std::string& name = "test") {
    v1::RegisterWorkerRequest req;
    req.set_worker_name(name);
    req.mutable_capabilities()->set_device("cpu");
    StatusOr<v1::RegisterWorkerResponse> r = handlers().register_worker(req);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->worker_id() : "";
  }

  StatusOr<v1::LeasePromptsResponse> lease(const std::string& worker_id, int n) {
    v1::LeasePromptsRequest req;
    req.set_worker_id(worker_id);
    req.set_max_prompts(n);
    return handlers().lease_prompts(req);
  }

  // A group answering `l`: k two-token samples of `version`.
  static rollout::TrajectoryGroup group_for(const v1::PromptLease& l, int64_t version) {
    rollout::TrajectoryGroup g;
    g.group_id = l.group_id();
    for (int j = 0; j < l.k(); ++j) {
      rollout::Trajectory t;
      t.prompt_tokens.assign(l.prompt_tokens().begin(), l.prompt_tokens().end());
      t.response_tokens = {5 + j, 6};
      t.behavior_logprobs = {-0.5f, -0.25f};
      t.token_versions = {version, version};
      t.proximal_logprobs = {NAN, NAN};
      t.proximal_versions = {-1, -1};
      t.offpolicy_mask = {0, 0};
      t.version_digests = {{version, 77}};
      t.reward = j;
      g.trajectories.push_back(t);
    }
    return g;
  }

  v1::SubmitGroupAck submit(const std::string& worker_id, uint64_t lease_id,
                            const rollout::TrajectoryGroup& g) {
    v1::SubmitGroupRequest req;
    req.set_worker_id(worker_id);
    req.set_lease_id(lease_id);
    store::to_proto(g, req.mutable_group());
    return handlers().submit_group(req);
  }

  std::string dir_;
  std::unique_ptr<store::RolloutStore> store_;
  std::unique_ptr<store::PromptDispenser> dispenser_;
  WeightPublisher publisher_;
  TrainerServiceOptions options_;
  int64_t now_ms_ = 1'000'000;
  int64_t version_ = 0;
  std::unique_ptr<TrainerHandlers> handlers_;
};

TEST_F(TrainerHandlersTest, LeasesAPromptAndAcceptsItsGroup) {
  const std::string id = register_worker("gpu-3");
  EXPECT_EQ(id, "w1-gpu-3");
  StatusOr<v1::LeasePromptsResponse> r = lease(id, 1);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->leases_size(), 1);
  const v1::PromptLease& l = r->leases(0);
  EXPECT_EQ(l.group_id(), "prompt/0");
  EXPECT_EQ(std::vector<int64_t>(l.prompt_tokens().begin(), l.prompt_tokens().end()),
            std::vector<int64_t>({1, 2, 3}));
  EXPECT_EQ(l.k(), 2);
  EXPECT_EQ(r->latest_version(), 0);

  const v1::SubmitGroupAck ack = submit(id, l.lease_id(), group_for(l, 0));
  EXPECT_TRUE(ack.accepted()) << ack.error_message();
  EXPECT_EQ(ack.lease_id(), l.lease_id());
  EXPECT_EQ(store_->stats().value().ready, 1);
  EXPECT_FALSE(dispenser_->find_lease(l.lease_id()).ok()) << "the lease is retired";

  // The same group again: its lease is gone.
  const v1::SubmitGroupAck again = submit(id, l.lease_id(), group_for(l, 0));
  EXPECT_FALSE(again.accepted());
  EXPECT_EQ(again.error_code(), static_cast<int32_t>(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(store_->stats().value().ready, 1);

  StatusOr<v1::StatsResponse> stats = handlers().stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->store_ready(), 1);
  EXPECT_EQ(stats->accepted(), 1);
  ASSERT_EQ(stats->workers_size(), 1);
  EXPECT_EQ(stats->workers(0).worker_name(), "gpu-3");
  EXPECT_TRUE(handlers().health().serving());
}

TEST_F(TrainerHandlersTest, RefusesBadCallsWithTheStatusAWorkerSees) {
  v1::RegisterWorkerRequest nameless;
  EXPECT_EQ(handlers().register_worker(nameless).status(),
            InvalidArgumentError("worker_name: empty"));
  EXPECT_EQ(lease("nobody", 1).status(),
            FailedPreconditionError("worker_id 'nobody': unknown; register first"));
  const std::string id = register_worker();
  EXPECT_EQ(lease(id, 0).status(), InvalidArgumentError("max_prompts: must be >= 1, got 0"));
}

TEST_F(TrainerHandlersTest, RefusesAMalformedAForeignAndAStaleGroup) {
  const std::string a = register_worker("a"), b = register_worker("b");
  StatusOr<v1::LeasePromptsResponse> r = lease(a, 2);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->leases_size(), 2);
  const v1::PromptLease& l0 = r->leases(0);
  const v1::PromptLease& l1 = r->leases(1);

  // Another group id than the lease's: malformed, the lease is kept.
  rollout::TrajectoryGroup wrong = group_for(l0, 0);
  wrong.group_id = "prompt/9";
  v1::SubmitGroupAck ack = submit(a, l0.lease_id(), wrong);
  EXPECT_FALSE(ack.accepted());
  EXPECT_EQ(ack.error_code(), static_cast<int32_t>(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(ack.error_message(), "group_id: 'prompt/9', but lease " +
                                     std::to_string(l0.lease_id()) + " is for group 'prompt/0'");
  EXPECT_TRUE(dispenser_->find_lease(l0.lease_id()).ok());

  // Worker b on a's lease.
  ack = submit(b, l0.lease_id(), group_for(l0, 0));
  EXPECT_EQ(ack.error_code(), static_cast<int32_t>(absl::StatusCode::kPermissionDenied));
  EXPECT_EQ(ack.error_message(), "lease " + std::to_string(l0.lease_id()) + ": held by worker '" +
                                     a + "', not '" + b + "'; group 'prompt/0' was not accepted");

  // Sampled with version 0 while the trainer is at 1 (max_staleness 0):
  // stale, and the lease is released so the prompt is leased again.
  version_ = 1;
  ack = submit(a, l1.lease_id(), group_for(l1, 0));
  EXPECT_EQ(ack.error_code(), static_cast<int32_t>(absl::StatusCode::kFailedPrecondition))
      << ack.error_message();
  EXPECT_FALSE(dispenser_->find_lease(l1.lease_id()).ok());
  EXPECT_EQ(store_->stats().value().ready, 0);
}

// rollout.agent: agents choose the system prompt and tools, so a group need
// not carry the leased prompt; it still answers its lease's group id and
// shares one prompt.
TEST_F(TrainerHandlersTest, AgentGroupsMayStartFromTheirOwnPrompt) {
  store::DispenserOptions d;  // room for four leases at version 0
  d.groups_per_step = 4;
  d.k = 2;
  d.lease_timeout_ms = 60000;
  dispenser_ = store::PromptDispenser::open(store_.get(), d).value();
  for (bool agents : {false, true}) {
    SCOPED_TRACE(agents ? "agent prompts" : "leased prompts");
    options_.agent_prompts = agents;
    handlers_.reset();
    const std::string id = register_worker(agents ? "a" : "b");
    StatusOr<v1::LeasePromptsResponse> r = lease(id, 2);
    ASSERT_TRUE(r.ok() && r->leases_size() == 2) << r.status();
    const v1::PromptLease& l = r->leases(0);
    rollout::TrajectoryGroup g = group_for(l, 0);
    for (rollout::Trajectory& t : g.trajectories) t.prompt_tokens = {9, 9, 1, 2};
    v1::SubmitGroupAck ack = submit(id, l.lease_id(), g);
    EXPECT_EQ(ack.accepted(), agents) << ack.error_message();
    if (!agents) {
      EXPECT_NE(ack.error_message().find("differ from lease"), std::string::npos)
          << ack.error_message();
      continue;
    }
    // One prompt per group, still.
    rollout::TrajectoryGroup g2 = group_for(r->leases(1), 0);
    g2.trajectories[0].prompt_tokens = {9, 9, 1, 2};
    ack = submit(id, r->leases(1).lease_id(), g2);
    EXPECT_FALSE(ack.accepted());
    EXPECT_NE(ack.error_message().find("a group shares one prompt"), std::string::npos)
        << ack.error_message();
  }
}

TEST_F(TrainerHandlersTest, ASilentWorkerIsForgottenAndItsLeasesReleased) {
  const std::string id = register_worker();
  ASSERT_TRUE(lease(id, 2).ok());
  EXPECT_EQ(dispenser_->leases().size(), 2u);
  now_ms_ += 1000;  // silent for exactly the timeout: still alive
  EXPECT_EQ(handlers().reap_silent_workers(), 0);
  EXPECT_TRUE(handlers().check_workers_present().ok());
  now_ms_ += 1;
  v1::HeartbeatRequest hb;
  hb.set_worker_id(id);
  StatusOr<v1::HeartbeatResponse> r = handlers().heartbeat(hb);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->reregister()) << "the heartbeat reaped its own worker first";
  EXPECT_TRUE(dispenser_->leases().empty());
  EXPECT_TRUE(handlers().workers().empty());
  EXPECT_EQ(handlers().presence().registrations, 1);
  now_ms_ += 1000;  // 2 x timeout since the last call: nobody is left
  EXPECT_EQ(handlers().check_workers_present().code(), absl::StatusCode::kUnavailable);
}

TEST_F(TrainerHandlersTest, AfterFinishWorkersAreToldTheRunIsOver) {
  const std::string id = register_worker();
  handlers().finish();
  EXPECT_FALSE(handlers().all_workers_told());
  EXPECT_EQ(lease(id, 1).status(), OutOfRangeError("the run is finished"));
  EXPECT_TRUE(handlers().all_workers_told());
}

// The trainer's wait before it stops serving ends when the last worker is
// told, not at its deadline; a worker that never calls again holds it to the
// deadline until it has been silent for two heartbeat intervals.
TEST_F(TrainerHandlersTest, WaitingForWorkersToldEndsWhenTheLastOneCalls) {
  const std::string a = register_worker("a");
  const std::string b = register_worker("b");
  handlers().finish();
  EXPECT_EQ(lease(a, 1).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_FALSE(handlers().wait_for_workers_told(std::chrono::milliseconds(50)));
  const auto t0 = std::chrono::steady_clock::now();
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_EQ(lease(b, 1).status().code(), absl::StatusCode::kOutOfRange);
  });
  EXPECT_TRUE(handlers().wait_for_workers_told(std::chrono::seconds(60)));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30))
      << "woken by the call, not by the deadline";
  late.join();
}

TEST_F(TrainerHandlersTest, WaitingForWorkersToldSkipsASilentWorker) {
  register_worker("silent");
  handlers().finish();
  EXPECT_FALSE(handlers().wait_for_workers_told(std::chrono::milliseconds(20)));
  // Two heartbeat intervals (100 ms each) and a second of silence, on the
  // handlers' clock.
  now_ms_ += 2 * 100 + 1001;
  EXPECT_TRUE(handlers().wait_for_workers_told(std::chrono::milliseconds(0)));
}

}  // namespace
}  // namespace relay::comm
