// The trainer's gRPC services end to end on loopback: a real server with a
// RocksDB store, the prompt dispenser and the weight publisher, and the
// worker-side client.

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <xxhash.h>

#include "relay/comm/host/trainer_host.h"
#include "relay/comm/rpc/grpc_trainer_client.h"
#include "relay/comm/rpc/manifest_proto.h"
#include "relay/comm/service/trainer_service.h"
#include "relay/comm/weight_sync/weight_broadcaster.h"
#include "relay/comm/worker/rollout_worker.h"
#include "relay/comm/worker/weight_fetcher.h"
#include "relay/config/config.h"
#include "relay/model/policy.h"
#include "relay/model/tokenizer.h"
#include "relay/rollout/task.h"
#include "relay/store/convert.h"
#include "relay/v1/admin.pb.h"
#include "relay/v1/worker.grpc.pb.h"
#include "relay/v1/worker.pb.h"
#include "testing/tensor_testing.h"

namespace relay::comm {
namespace {

// A scored group of k one-token samples of `version`, as a worker sends it.
rollout::TrajectoryGroup make_group(const std::string& id, int k, int64_t version,
                                    const std::vector<int64_t>& prompt) {
  rollout::TrajectoryGroup g;
  g.group_id = id;
  for (int j = 0; j < k; ++j) {
    rollout::Trajectory t;
    t.prompt_tokens = prompt;
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

class ServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/relay_service_" +
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
    policy_ = model::Policy(testing::TinyConfig());
    model::init_weights(*policy_, 5);
    ASSERT_TRUE(publisher_.publish(0, model::parameter_tensors(*policy_)).ok());
    TrainerServiceOptions o;
    o.auth_token = "secret";
    o.limits.vocab_size = 37;
    o.limits.max_response_tokens = 8;
    o.limits.max_context = 64;
    o.limits.require_behavior_logprobs = true;
    o.watch_poll_ms = 20;
    service_ = std::make_unique<TrainerService>(
        o, store_.get(), dispenser_.get(), &publisher_,
        [](const store::Lease& l) -> StatusOr<PromptContent> {
          PromptContent p;
          p.group_id = "prompt/" + std::to_string(l.occurrence);
          p.prompt_tokens = {1, 2, 3 + l.prompt_index % 10};
          p.seed = 1000 * l.occurrence + l.attempt;
          return p;
        },
        [this] { return version_.load(); });
    server_ =
        RpcServer::start(ServerOptions{}, {service_->worker_service(), service_->admin_service()})
            .value();
    client_ = connect("secret");
  }
  void TearDown() override { server_->shutdown(); }

  std::unique_ptr<TrainerClient> connect(const std::string& token) {
    ClientOptions c;
    c.address = "127.0.0.1:" + std::to_string(server_->port());
    c.auth_token = token;
    c.timeout_ms = 5000;
    return GrpcTrainerClient::connect(c).value();
  }

  std::string register_worker() {
    v1::WorkerCapabilities caps;
    caps.set_device("cpu");
    caps.set_num_slots(8);
    auto r = client_->register_worker("test", caps);
    EXPECT_TRUE(r.ok()) << r.status();
    return r->worker_id();
  }

  // A host stepping every 2 groups, and what it asks for workers with: the
  // first call starts a thread that appends groups "a" and "b" after
  // `delay` (join `appender` after the step).
  TrainerHostOptions two_group_host_options() const {
    TrainerHostOptions ho;
    ho.groups_per_step = 2;
    ho.group_wait_ms = 60000;  // only a lost wake-up waits this long
    ho.limits.vocab_size = 37;
    return ho;
  }
  std::function<Status()> groups_arrive(std::thread& appender,
                                        std::chrono::milliseconds delay = {}) {
    return [this, &appender, delay]() -> Status {
      if (!appender.joinable()) {
        appender = std::thread([this, delay] {
          std::this_thread::sleep_for(delay);
          for (const char* id : {"a", "b"}) {
            EXPECT_TRUE(store_->append(make_group(id, 2, 0, {1, 2, 3}), 0).ok());
          }
        });
      }
      return OkStatus();
    };
  }

  std::string dir_;
  std::unique_ptr<store::RolloutStore> store_;
  std::unique_ptr<store::PromptDispenser> dispenser_;
  WeightPublisher publisher_;
  model::Policy policy_{nullptr};
  std::atomic<int64_t> version_{0};
  std::unique_ptr<TrainerService> service_;
  std::unique_ptr<RpcServer> server_;
  std::unique_ptr<TrainerClient> client_;
};

TEST_F(ServiceTest, RegisterLeaseSubmitAndStats) {
  v1::WorkerCapabilities caps;
  auto reg = client_->register_worker("gpu-node-3", caps);
  ASSERT_TRUE(reg.ok()) << reg.status();
  EXPECT_EQ(reg->version(), 0);
  EXPECT_EQ(reg->k(), 2);
  EXPECT_EQ(reg->manifest().digest(), model::weight_manifest(*policy_, 0).value().digest);
  const std::string id = reg->worker_id();

  auto lease = client_->lease_prompts(id, 5);
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_EQ(lease->leases_size(), 2) << "staleness capacity: (0 + 0 + 1) x 2";
  const v1::PromptLease& l0 = lease->leases(0);
  EXPECT_EQ(l0.group_id(), "prompt/0");
  EXPECT_EQ(l0.k(), 2);
  EXPECT_EQ(l0.prompt_tokens_size(), 3);
  auto none = client_->lease_prompts(id, 1);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->leases_size(), 0);
  EXPECT_EQ(none->wait_for_version(), 1);

  std::vector<int64_t> prompt(l0.prompt_tokens().begin(), l0.prompt_tokens().end());
  std::vector<int64_t> prompt1(lease->leases(1).prompt_tokens().begin(),
                               lease->leases(1).prompt_tokens().end());
  // One stream: a group with a bad log-prob is refused by name, the good one
  // after it is accepted, and a made-up lease is refused as a precondition.
  rollout::TrajectoryGroup bad = make_group("prompt/0", 2, 0, prompt);
  bad.trajectories[1].behavior_logprobs[0] = INFINITY;
  // Rounding within the tolerance (another sampler's log_softmax) passes and
  // is stored clamped to 0.
  rollout::TrajectoryGroup rounded = make_group("prompt/1", 2, 0, prompt1);
  rounded.trajectories[0].behavior_logprobs[1] = 2e-7f;
  auto acks = client_->submit_groups(id, {{l0.lease_id(), bad},
                                          {lease->leases(1).lease_id(), rounded},
                                          {999, make_group("prompt/9", 2, 0, prompt)}});
  ASSERT_TRUE(acks.ok()) << acks.status();
  ASSERT_EQ(acks->size(), 3u);
  EXPECT_FALSE((*acks)[0].accepted());
  EXPECT_EQ((*acks)[0].error_code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ((*acks)[0].error_message(),
            "group 'prompt/0' trajectories[1].behavior_logprobs[0]: +inf is not a log-prob "
            "(send NaN if missing)");
  EXPECT_TRUE((*acks)[1].accepted());
  EXPECT_EQ((*acks)[1].store_seq(), 1u);
  EXPECT_FALSE((*acks)[2].accepted());
  EXPECT_EQ((*acks)[2].error_code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));

  // The refused group's lease is still held: the corrected group is accepted
  // on it, and nothing was leased twice.
  auto again = client_->submit_groups(id, {{l0.lease_id(), make_group("prompt/0", 2, 0, prompt)}});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE((*again)[0].accepted()) << (*again)[0].error_message();
  EXPECT_EQ(client_->lease_prompts(id, 1).value().leases_size(), 0) << "bound still full";
  // Durable in the store, in arrival order.
  auto ready = store_->take_ready(10, -1, 0).value();
  ASSERT_EQ(ready.size(), 2u);
  EXPECT_EQ(ready[0].group.group_id, "prompt/1");
  EXPECT_EQ(ready[1].group.trajectories[0].prompt_tokens, prompt);
  EXPECT_EQ(ready[0].group.trajectories[0].behavior_logprobs[1], 0.0f);

  v1::HeartbeatRequest hb;
  hb.set_worker_id(id);
  hb.set_running_version(0);
  hb.set_running_digest(reg->manifest().digest());
  ASSERT_TRUE(client_->heartbeat(hb).ok());
  hb.set_worker_id("nobody");
  EXPECT_TRUE(client_->heartbeat(hb)->reregister());

  auto stats = client_->stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->accepted(), 2);
  EXPECT_EQ(stats->store_consumed(), 2);
  EXPECT_EQ(stats->in_flight(), 0);
  EXPECT_EQ(stats->retry_queue(), 0);
  ASSERT_EQ(stats->workers_size(), 1);
  EXPECT_EQ(stats->workers(0).running_digest(), reg->manifest().digest());
}

TEST_F(ServiceTest, FetchedWeightsAreBitIdenticalAtAnyChunkSize) {
  const std::string id = register_worker();
  for (uint64_t chunk : {uint64_t{1000}, uint64_t{1} << 20}) {
    auto w = client_->fetch_weights(id, -1, chunk);
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ(w->manifest.version, 0);
    auto mine = model::parameter_tensors(*policy_);
    ASSERT_EQ(w->tensors.size(), mine.size());
    for (const auto& [name, t] : mine) EXPECT_TRUE(torch::equal(t, w->tensors.at(name))) << name;
  }
  EXPECT_EQ(client_->fetch_weights(id, 5).status().code(), absl::StatusCode::kNotFound);
}

// A worker that loaded the trainer's model directory holds version 0: only
// the manifest travels. Different bytes (or shapes) are transferred in full.
TEST_F(ServiceTest, FetchSkipsTheTransferOfWeightsTheWorkerAlreadyHolds) {
  const std::string id = register_worker();
  const model::WeightManifest mine = model::weight_manifest(*policy_, 0).value();
  auto held = client_->fetch_weights(id, -1, 0, &mine);
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_TRUE(held->already_held);
  EXPECT_TRUE(held->tensors.empty());
  EXPECT_EQ(held->manifest.digest, mine.digest);

  model::WeightManifest other = mine;
  other.digest ^= 1;
  auto full = client_->fetch_weights(id, -1, 0, &other);
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_FALSE(full->already_held);
  EXPECT_EQ(full->tensors.size(), mine.tensors.size());
  other = mine;
  other.tensors[0].shape.push_back(1);
  EXPECT_FALSE(client_->fetch_weights(id, -1, 0, &other)->already_held);
}

TEST_F(ServiceTest, WatchAnnouncesANewVersion) {
  const std::string id = register_worker();
  auto nothing = client_->next_version(id, 0, 150);
  ASSERT_TRUE(nothing.ok()) << nothing.status();
  EXPECT_FALSE(nothing->has_value());
  std::thread publish([this] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    torch::NoGradGuard g;
    policy_->named_parameters()["model.norm.weight"].add_(0.5);
    ASSERT_TRUE(publisher_.publish(1, model::parameter_tensors(*policy_)).ok());
    version_ = 1;
  });
  auto next = client_->next_version(id, 0, 5000);
  publish.join();
  ASSERT_TRUE(next.ok()) << next.status();
  ASSERT_TRUE(next->has_value());
  EXPECT_EQ((*next)->version(), 1);
  EXPECT_EQ((*next)->manifest().digest(), model::weight_manifest(*policy_, 1).value().digest);
}

TEST_F(ServiceTest, EveryCallNeedsTheToken) {
  auto wrong = connect("guess");
  v1::WorkerCapabilities caps;
  auto r = wrong->register_worker("x", caps);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(wrong->stats().status().code(), absl::StatusCode::kUnauthenticated);
  auto none = connect("");
  EXPECT_EQ(none->lease_prompts("w", 1).status().code(), absl::StatusCode::kUnauthenticated);
  // Unknown workers cannot lease.
  EXPECT_EQ(client_->lease_prompts("w999-ghost", 1).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// A rollout worker (real engine, arithmetic task, char tokenizer) against
// the real services: groups arrive durable and scored, and a version
// published mid-run reaches the worker, which samples with it and names it by
// its digest.
// Every kind of malformed group through the wire, each on its own lease in
// one SubmitGroups stream: each gets its own code and a message naming the
// field, the good group at the end of the stream is accepted, nothing bad is
// stored, and the server keeps serving.
// One stream of many groups: the client sends them all before reading an
// ack and the server reads ahead of its acks, so the groups share store
// writes. Every group still gets its own ack, in order, after it is
// durable: the accepted ones numbered in the order sent, the refused one
// (a made-up lease, in the middle) named. A client that waits for each
// ack before sending the next group, as relay's clients did before, is
// answered the same way.
TEST_F(ServiceTest, AStreamOfGroupsIsAckedInOrderWhetherOrNotTheClientWaits) {
  version_ = 20;  // capacity (0 + 20 + 1) x 2 = 42 leases
  const std::string id = register_worker();
  auto leased = client_->lease_prompts(id, 28);
  ASSERT_TRUE(leased.ok()) << leased.status();
  ASSERT_EQ(leased->leases_size(), 28);
  auto group_for = [&](const v1::PromptLease& l) {
    return make_group(l.group_id(), 2, 20,
                      std::vector<int64_t>(l.prompt_tokens().begin(), l.prompt_tokens().end()));
  };
  std::vector<std::pair<uint64_t, rollout::TrajectoryGroup>> batch;
  for (int i = 0; i < 24; ++i)
    batch.emplace_back(leased->leases(i).lease_id(), group_for(leased->leases(i)));
  batch[10].first = 999;  // no such lease
  auto acks = client_->submit_groups(id, batch);
  ASSERT_TRUE(acks.ok()) << acks.status();
  ASSERT_EQ(acks->size(), 24u);
  uint64_t seq = 0;
  for (size_t i = 0; i < acks->size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ((*acks)[i].lease_id(), batch[i].first);
    if (i == 10) {
      EXPECT_FALSE((*acks)[i].accepted());
      EXPECT_EQ((*acks)[i].error_code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
      EXPECT_NE((*acks)[i].error_message().find("lease 999"), std::string::npos);
      continue;
    }
    EXPECT_TRUE((*acks)[i].accepted()) << (*acks)[i].error_message();
    EXPECT_EQ((*acks)[i].store_seq(), ++seq);
  }
  EXPECT_EQ(store_->appended(), 23u);

  // One group at a time on the raw stream: write, wait for its ack, write.
  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(server_->port()),
                                     grpc::InsecureChannelCredentials());
  auto stub = v1::Worker::NewStub(channel);
  grpc::ClientContext c;
  c.AddMetadata("authorization", "Bearer secret");
  auto stream = stub->SubmitGroups(&c);
  for (int i = 24; i < 28; ++i) {
    SCOPED_TRACE(i);
    v1::SubmitGroupRequest req;
    req.set_worker_id(id);
    req.set_lease_id(leased->leases(i).lease_id());
    store::to_proto(group_for(leased->leases(i)), req.mutable_group());
    ASSERT_TRUE(stream->Write(req));
    v1::SubmitGroupAck ack;
    ASSERT_TRUE(stream->Read(&ack));
    EXPECT_TRUE(ack.accepted()) << ack.error_message();
    EXPECT_EQ(ack.store_seq(), ++seq);
    EXPECT_EQ(store_->appended(), seq) << "durable before its ack";
  }
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
  const auto ready = store_->take_ready(30, -1, 20).value();
  ASSERT_EQ(ready.size(), 27u);
  EXPECT_EQ(ready[0].group.group_id, leased->leases(0).group_id());
  EXPECT_EQ(ready[26].group.group_id, leased->leases(27).group_id());
}

TEST_F(ServiceTest, EachMalformedSubmissionGetsItsOwnErrorAndTheServerKeepsServing) {
  version_ = 20;  // capacity (0 + 20 + 1) x 2 = 42 leases
  const std::string id = register_worker();
  auto leased = client_->lease_prompts(id, 20);
  ASSERT_TRUE(leased.ok()) << leased.status();
  ASSERT_EQ(leased->leases_size(), 20);
  struct Case {
    const char* what;
    std::function<void(rollout::TrajectoryGroup&)> spoil;
    absl::StatusCode code;
    std::string message;  // a substring naming the field
  };
  const std::vector<Case> cases = {
      {"group size", [](rollout::TrajectoryGroup& g) { g.trajectories.pop_back(); },
       absl::StatusCode::kInvalidArgument, "1 trajectories for a lease of k = 2"},
      {"token id", [](rollout::TrajectoryGroup& g) { g.trajectories[0].response_tokens[1] = 99; },
       absl::StatusCode::kInvalidArgument, "response_tokens[1]: token id 99 is outside"},
      {"lengths",
       [](rollout::TrajectoryGroup& g) { g.trajectories[1].behavior_logprobs.pop_back(); },
       absl::StatusCode::kInvalidArgument, "trajectories[1]"},
      {"positive log-prob",
       [](rollout::TrajectoryGroup& g) { g.trajectories[0].behavior_logprobs[0] = 0.5f; },
       absl::StatusCode::kInvalidArgument, "behavior_logprobs[0]: 0.5 > 0 is not a log-prob"},
      {"-inf log-prob",
       [](rollout::TrajectoryGroup& g) { g.trajectories[0].behavior_logprobs[1] = -INFINITY; },
       absl::StatusCode::kInvalidArgument, "behavior_logprobs[1]: -inf is not a log-prob"},
      {"future version",
       [](rollout::TrajectoryGroup& g) {
         g.trajectories[0].token_versions = {20, 21};
         g.trajectories[0].version_digests = {{20, 77}, {21, 78}};
       },
       absl::StatusCode::kInvalidArgument, "token_versions[1]: version 21 is in the future"},
      {"stale version",
       [](rollout::TrajectoryGroup& g) {
         g.trajectories[1].token_versions = {19, 20};
         g.trajectories[1].version_digests = {{19, 76}, {20, 77}};
       },
       absl::StatusCode::kFailedPrecondition, "token_versions[0]: version 19"},
      {"not scored", [](rollout::TrajectoryGroup& g) { g.trajectories[0].reward = NAN; },
       absl::StatusCode::kInvalidArgument, "trajectories[0].reward"},
      {"two prompts",
       [](rollout::TrajectoryGroup& g) { g.trajectories[1].prompt_tokens.push_back(4); },
       absl::StatusCode::kInvalidArgument, "trajectories[1].prompt_tokens: differ from lease"},
      {"missing log-probs",
       [](rollout::TrajectoryGroup& g) {
         for (float& lp : g.trajectories[1].behavior_logprobs) lp = NAN;
       },
       absl::StatusCode::kInvalidArgument,
       "trajectories[1].behavior_logprobs[0]: NaN (missing), but trainer.allow_missing_logprobs "
       "is off"},
      {"reward beyond float", [](rollout::TrajectoryGroup& g) { g.trajectories[0].reward = 1e300; },
       absl::StatusCode::kInvalidArgument, "trajectories[0].reward: 1e+300: |reward| above"},
      {"absurd log-prob",
       [](rollout::TrajectoryGroup& g) { g.trajectories[0].behavior_logprobs[0] = -1e30f; },
       absl::StatusCode::kInvalidArgument, "behavior_logprobs[0]: -1e+30 is below -10000"},
      {"negative version",
       [](rollout::TrajectoryGroup& g) {
         g.trajectories[0].token_versions = {-3, -3};
         g.trajectories[0].version_digests = {{-3, 77}};
       },
       absl::StatusCode::kInvalidArgument, "token_versions[0]: -3 is negative"},
      {"longer than max_new_tokens",
       [](rollout::TrajectoryGroup& g) {
         rollout::Trajectory& t = g.trajectories[0];
         const size_t n = 9;
         t.response_tokens.assign(n, 6);
         t.behavior_logprobs.assign(n, -0.5f);
         t.token_versions.assign(n, 20);
         t.proximal_logprobs.assign(n, NAN);
         t.proximal_versions.assign(n, -1);
         t.offpolicy_mask.assign(n, 0);
       },
       absl::StatusCode::kInvalidArgument,
       "trajectories[0].response_tokens: 9 tokens exceed rollout.max_new_tokens = 8"},
      {"wrong group id", [](rollout::TrajectoryGroup& g) { g.group_id = "prompt/999"; },
       absl::StatusCode::kInvalidArgument, "group_id: 'prompt/999', but lease"},
      {"empty response",
       [](rollout::TrajectoryGroup& g) {
         for (auto* v : {&g.trajectories[0].response_tokens}) v->clear();
       },
       absl::StatusCode::kInvalidArgument, "response_tokens: empty"},
  };
  std::vector<std::pair<uint64_t, rollout::TrajectoryGroup>> batch;
  for (size_t i = 0; i < cases.size(); ++i) {
    const v1::PromptLease& l = leased->leases(static_cast<int>(i));
    rollout::TrajectoryGroup g =
        make_group(l.group_id(), 2, 20,
                   std::vector<int64_t>(l.prompt_tokens().begin(), l.prompt_tokens().end()));
    cases[i].spoil(g);
    batch.emplace_back(l.lease_id(), g);
  }
  const v1::PromptLease& good = leased->leases(static_cast<int>(cases.size()));
  batch.emplace_back(good.lease_id(), make_group(good.group_id(), 2, 20,
                                                 std::vector<int64_t>(good.prompt_tokens().begin(),
                                                                      good.prompt_tokens().end())));
  auto acks = client_->submit_groups(id, batch);
  ASSERT_TRUE(acks.ok()) << acks.status();
  ASSERT_EQ(acks->size(), cases.size() + 1);
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].what);
    const v1::SubmitGroupAck& ack = (*acks)[i];
    EXPECT_FALSE(ack.accepted());
    EXPECT_EQ(ack.lease_id(), batch[i].first);
    EXPECT_EQ(ack.error_code(), static_cast<int>(cases[i].code));
    EXPECT_NE(ack.error_message().find(cases[i].message), std::string::npos) << ack.error_message();
  }
  EXPECT_TRUE(acks->back().accepted()) << acks->back().error_message();
  EXPECT_EQ(store_->appended(), 1u) << "only the good group was stored";
  // Still serving, and every refused group kept its lease: a corrected
  // resubmission on the first is accepted.
  const v1::PromptLease& first = leased->leases(0);
  auto fixed = client_->submit_groups(
      id, {{first.lease_id(), make_group(first.group_id(), 2, 20,
                                         std::vector<int64_t>(first.prompt_tokens().begin(),
                                                              first.prompt_tokens().end()))}});
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  EXPECT_TRUE((*fixed)[0].accepted()) << (*fixed)[0].error_message();
  auto again = client_->lease_prompts(id, 3);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->leases_size(), 3);
}

// A worker that goes silent (crashed, partitioned) past worker_timeout_ms is
// forgotten at the next lease or heartbeat of anyone, and its leases go back
// to the queue at once: the staleness bound it held is free again without
// waiting for the lease deadline (60 s here). The service's clock is a fake
// one that the test moves, so that which worker counts as silent does not
// depend on how fast this machine answers calls.
TEST_F(ServiceTest, SilentWorkersAreForgottenAndTheirLeasesReleased) {
  std::atomic<int64_t> now_ms{1'000'000};
  TrainerServiceOptions o;
  o.limits.vocab_size = 37;
  o.worker_timeout_ms = 300;
  o.now_ms = [&now_ms] { return now_ms.load(); };
  TrainerService service(
      o, store_.get(), dispenser_.get(), &publisher_,
      [](const store::Lease& l) -> StatusOr<PromptContent> {
        PromptContent p;
        p.group_id = "prompt/" + std::to_string(l.occurrence);
        p.prompt_tokens = {1, 2, 3};
        p.seed = 1000 * l.occurrence + l.attempt;
        return p;
      },
      [this] { return version_.load(); });
  auto server = RpcServer::start(ServerOptions{}, {service.worker_service()}).value();
  ClientOptions c;
  c.address = "127.0.0.1:" + std::to_string(server->port());
  auto client = GrpcTrainerClient::connect(c).value();
  v1::WorkerCapabilities caps;
  const std::string silent = client->register_worker("silent", caps).value().worker_id();
  const std::string alive = client->register_worker("alive", caps).value().worker_id();
  ASSERT_EQ(client->lease_prompts(silent, 5).value().leases_size(), 2);
  EXPECT_EQ(client->lease_prompts(alive, 5).value().leases_size(), 0) << "bound held by silent";
  // `alive` keeps calling; `silent` does not.
  for (int i = 0; i < 5; ++i) {
    now_ms += 100;
    v1::HeartbeatRequest hb;
    hb.set_worker_id(alive);
    auto beat = client->heartbeat(hb);
    ASSERT_TRUE(beat.ok()) << beat.status();
    EXPECT_FALSE(beat->reregister());
  }
  auto leased = client->lease_prompts(alive, 5);
  ASSERT_TRUE(leased.ok()) << leased.status();
  ASSERT_EQ(leased->leases_size(), 2) << "the silent worker's leases went back";
  EXPECT_EQ(leased->leases(0).prompt_index(), 0) << "the same prompts, leased again";
  v1::HeartbeatRequest hb;
  hb.set_worker_id(silent);
  EXPECT_TRUE(client->heartbeat(hb).value().reregister()) << "forgotten: register again";
  server->shutdown();
}

// Groups the trainer cannot train on that reached the store anyway (stored by
// an older build, or READY when a checkpoint was written): the host
// quarantines them and steps on good ones, whether its own checks catch them
// (a reward beyond float) or the step blames them (missing log-probs the
// host's limits let through). A rewind to the checkpoint, as --resume does,
// does not bring them back.
TEST_F(ServiceTest, PoisonGroupsAreQuarantinedAndAResumedRunDoesNotMeetThemAgain) {
  const std::vector<int64_t> prompt = {1, 2, 3};
  rollout::TrajectoryGroup missing = make_group("missing", 2, 0, prompt);
  for (float& lp : missing.trajectories[1].behavior_logprobs) lp = NAN;
  rollout::TrajectoryGroup huge = make_group("huge", 2, 0, prompt);
  huge.trajectories[0].reward = 1e300;
  for (const auto* g : {&missing, &huge}) ASSERT_TRUE(store_->append(*g, 0).ok());
  for (const char* id : {"a", "b", "c"}) {
    ASSERT_TRUE(store_->append(make_group(id, 2, 0, prompt), 0).ok());
  }
  const store::StorePosition checkpoint = store_->position().value();

  TrainerHostOptions ho;
  ho.groups_per_step = 2;
  ho.group_wait_ms = 2000;
  ho.limits.vocab_size = 37;  // require_behavior_logprobs off: the step must catch it
  {
    auto trainer = trainer::Trainer::create(policy_, trainer::TrainerOptions{}).value();
    TrainerHost host(trainer.get(), store_.get(), &publisher_, ho);
    auto m = host.step(nullptr);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->at("store/rejected"), 2.0);
    EXPECT_EQ(trainer->version(), 1);
    std::vector<std::string> trained;
    for (const auto& g : host.last_groups()) trained.push_back(g.group_id);
    EXPECT_EQ(trained, (std::vector<std::string>{"a", "b"}));
  }
  const store::StoredGroup m1 = store_->get(1).value(), m2 = store_->get(2).value();
  EXPECT_EQ(m1.state, store::GroupState::kRejected);
  EXPECT_NE(m1.reject_reason.find("behavior log-prob of response token 0 is nan"),
            std::string::npos)
      << m1.reject_reason;
  EXPECT_EQ(m2.state, store::GroupState::kRejected);
  EXPECT_NE(m2.reject_reason.find("reward: 1e+300"), std::string::npos) << m2.reject_reason;
  EXPECT_EQ(store_->rejected_total(), 2u);

  // --resume from the checkpoint: the good groups are READY again, the
  // quarantined ones are not, and a fresh trainer steps without meeting them.
  ASSERT_TRUE(store_->rewind(checkpoint, 0).ok());
  auto trainer = trainer::Trainer::create(policy_, trainer::TrainerOptions{}).value();
  WeightPublisher restarted;  // the resumed process publishes from version 0 again
  TrainerHost host(trainer.get(), store_.get(), &restarted, ho);
  auto m = host.step(nullptr);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->at("store/rejected"), 0.0);
  EXPECT_EQ(m->at("store/rejected_total"), 2.0);
}

// A standalone trainer whose workers all died: it waits for groups no one
// will make. Once every worker that registered has been silent for
// worker_timeout_ms and none registered for another one, the wait fails
// saying so, long before group_wait_ms; before any worker registered, the
// wait is group_wait_ms as always (a trainer may start before its workers).
// The service's clock is a fake one that each look of the waiting trainer at
// its workers moves 100 ms: how many looks it takes is exact, however busy
// the machine.
TEST_F(ServiceTest, WaitingForGroupsFailsSoonOnceEveryWorkerIsGone) {
  std::atomic<int64_t> now_ms{1'000'000};
  TrainerServiceOptions o;
  o.limits.vocab_size = 37;
  o.worker_timeout_ms = 300;
  o.now_ms = [&now_ms] { return now_ms.load(); };
  TrainerService service(
      o, store_.get(), dispenser_.get(), &publisher_,
      [](const store::Lease& l) -> StatusOr<PromptContent> {
        PromptContent p;
        p.group_id = "prompt/" + std::to_string(l.occurrence);
        p.prompt_tokens = {1, 2, 3};
        return p;
      },
      [this] { return version_.load(); });
  auto server = RpcServer::start(ServerOptions{}, {service.worker_service()}).value();
  auto trainer = trainer::Trainer::create(policy_, trainer::TrainerOptions{}).value();
  TrainerHostOptions ho;
  ho.groups_per_step = 2;
  ho.group_wait_ms = 500;
  TrainerHost host(trainer.get(), store_.get(), &publisher_, ho);
  int looks = 0;
  auto workers_present = [&] {
    ++looks;
    now_ms += 100;
    return service.check_workers_present();
  };

  // No worker yet: today's deadline, whatever worker_timeout_ms says.
  auto t0 = std::chrono::steady_clock::now();
  StatusOr<trainer::StepMetrics> m = host.step(nullptr, workers_present);
  ASSERT_EQ(m.status().code(), absl::StatusCode::kDeadlineExceeded) << m.status();
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(500));

  // A worker registers, leases, and dies (it never calls again).
  ClientOptions c;
  c.address = "127.0.0.1:" + std::to_string(server->port());
  auto client = GrpcTrainerClient::connect(c).value();
  const std::string id =
      client->register_worker("doomed", v1::WorkerCapabilities{}).value().worker_id();
  ASSERT_EQ(client->lease_prompts(id, 5).value().leases_size(), 2);
  // 20 s stands for group_wait_s: without the check the wait would end
  // there with DeadlineExceeded.
  TrainerHostOptions patient = ho;
  patient.group_wait_ms = 20000;
  TrainerHost waiting(trainer.get(), store_.get(), &publisher_, patient);
  looks = 0;
  t0 = std::chrono::steady_clock::now();
  m = waiting.step(nullptr, workers_present);
  const auto waited = std::chrono::steady_clock::now() - t0;
  ASSERT_EQ(m.status().code(), absl::StatusCode::kUnavailable) << m.status();
  const std::string msg(m.status().message());
  EXPECT_NE(msg.find("every rollout worker is gone (last seen"), std::string::npos) << msg;
  EXPECT_NE(msg.find("0 of 2 groups ready"), std::string::npos) << msg;
  // Silent for over two timeouts (600 ms of the service's clock) from the
  // last call: at the 7th look.
  EXPECT_EQ(looks, 7);
  EXPECT_LT(waited, std::chrono::seconds(10));
  server->shutdown();
}

// The host waits on the store's signal (RolloutStore::wait_for_ready), not a
// fixed sleep: groups appended while it waits end the wait, long before
// group_wait_ms. The groups are appended from another thread once the host
// has looked at the store, found too few, and asked after its workers.
TEST_F(ServiceTest, StepReturnsAsSoonAsEnoughGroupsArrive) {
  auto trainer = trainer::Trainer::create(policy_, trainer::TrainerOptions{}).value();
  TrainerHost host(trainer.get(), store_.get(), &publisher_, two_group_host_options());
  std::thread appender;
  const auto t0 = std::chrono::steady_clock::now();
  StatusOr<trainer::StepMetrics> m = host.step(nullptr, groups_arrive(appender));
  const auto waited = std::chrono::steady_clock::now() - t0;
  if (appender.joinable()) appender.join();
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(trainer->version(), 1);
  std::vector<std::string> trained;
  for (const auto& g : host.last_groups()) trained.push_back(g.group_id);
  EXPECT_EQ(trained, (std::vector<std::string>{"a", "b"}));
  EXPECT_LT(waited, std::chrono::seconds(30));

  // A stop set by another thread, with the store's waiters woken, ends the
  // next wait at once: Cancelled, not DeadlineExceeded a minute later.
  std::atomic<bool> stop{false};
  std::thread stopper;
  auto stop_later = [&]() -> Status {
    if (!stopper.joinable()) {
      stopper = std::thread([&] {
        stop = true;
        store_->wake_waiters();
      });
    }
    return OkStatus();
  };
  const auto t1 = std::chrono::steady_clock::now();
  m = host.step([&] { return stop.load(); }, stop_later);
  if (stopper.joinable()) stopper.join();
  EXPECT_EQ(m.status().code(), absl::StatusCode::kCancelled) << m.status();
  EXPECT_LT(std::chrono::steady_clock::now() - t1, std::chrono::seconds(30));
}

// store/wait_s is the time the step waited for its batch, time/train_s the
// time Trainer::step took; they do not overlap. (store/wait_s used to run
// to the end of the training, so a run bound by its trainer read as one
// waiting for its workers.)
TEST_F(ServiceTest, AStepSaysHowLongItWaitedForGroupsAndHowLongItTrained) {
  auto trainer = trainer::Trainer::create(policy_, trainer::TrainerOptions{}).value();
  TrainerHost host(trainer.get(), store_.get(), &publisher_, two_group_host_options());
  std::thread appender;
  const auto t0 = std::chrono::steady_clock::now();
  // Late enough that the wait is measurable.
  StatusOr<trainer::StepMetrics> m =
      host.step(nullptr, groups_arrive(appender, std::chrono::milliseconds(200)));
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (appender.joinable()) appender.join();
  ASSERT_TRUE(m.ok()) << m.status();
  const double wait_s = m->at("store/wait_s"), train_s = m->at("time/train_s");
  EXPECT_GE(wait_s, 0.15);
  EXPECT_GT(train_s, 0.0);
  EXPECT_LE(wait_s + train_s, total) << "the training counted in the wait";
}

// What the rollout-worker tests share: a trainer side (tokenizer, task,
// trainer policy, publisher, store, dispenser, service on a loopback server)
// and a worker built against it, starting from other weights than the
// trainer's. Prompts are the arithmetic task's; k = 3, 4 groups per step,
// max_staleness 1.
struct WorkerRig {
  explicit WorkerRig(const std::string& name)
      : dir(::testing::TempDir() + "/relay_" + name + "_" + std::to_string(::getpid())),
        tokenizer(
            std::make_shared<const model::CharTokenizer>(model::CharTokenizer::create().value())),
        task(rollout::make_task(TaskConfig{}, /*seed=*/3).value().release()),
        cfg(testing::TinyConfig()) {
    std::filesystem::remove_all(dir);
    cfg.vocab_size = tokenizer->vocab_size();
    trainer_policy = model::Policy(cfg);
    model::init_weights(*trainer_policy, 11, 0.3);
    store::StoreOptions so;
    so.path = dir;
    store = store::RolloutStore::open(so).value();
    store::DispenserOptions d;
    d.groups_per_step = 4;
    d.max_staleness = 1;
    d.k = 3;
    dispenser = store::PromptDispenser::open(store.get(), d).value();
  }
  ~WorkerRig() {
    if (server) server->shutdown();
  }

  // Publishes the trainer policy as version v (scaled first, so versions differ).
  void publish(int64_t v) {
    if (v > 0) {
      torch::NoGradGuard g;
      for (auto& p : trainer_policy->parameters()) p.mul_(0.97);
    }
    ASSERT_TRUE(publisher.publish(v, model::parameter_tensors(*trainer_policy)).ok());
    version = v;
  }

  void serve(TrainerServiceOptions o = {}) {
    o.max_staleness = 1;
    o.limits.vocab_size = tokenizer->vocab_size();
    service = std::make_unique<TrainerService>(
        o, store.get(), dispenser.get(), &publisher,
        [this](const store::Lease& l) -> StatusOr<PromptContent> {
          RELAY_ASSIGN_OR_RETURN(rollout::TaskPrompt p, task->prompt(l.prompt_index));
          PromptContent c;
          c.group_id = p.id + "#" + std::to_string(l.occurrence);
          RELAY_ASSIGN_OR_RETURN(c.prompt_tokens, tokenizer->encode(p.prompt));
          c.seed = static_cast<uint64_t>(l.occurrence * 1000 + l.attempt);
          return c;
        },
        [this] { return version.load(); });
    server = RpcServer::start(ServerOptions{}, {service->worker_service()}).value();
  }

  ClientOptions client_options() const {
    ClientOptions c;
    c.address = "127.0.0.1:" + std::to_string(server->port());
    return c;
  }

  std::unique_ptr<RolloutWorker> make_worker(RolloutWorkerOptions wo) {
    rollout::EngineOptions eo;
    eo.num_slots = 8;
    eo.max_new_tokens = 6;
    eo.stop_tokens = {tokenizer->eos_id(), *tokenizer->token_id("#")};
    wo.heartbeat_ms = 20;
    wo.idle_wait_ms = 20;
    worker_policy = model::Policy(cfg);
    model::init_weights(*worker_policy, 99);
    return std::make_unique<RolloutWorker>(GrpcTrainerClient::connect(client_options()).value(),
                                           worker_policy, eo, task, tokenizer,
                                           std::chrono::milliseconds(1000), wo);
  }

  // Every stored group's trajectories, with a check on each.
  void for_each_trajectory(const std::function<void(const rollout::Trajectory&)>& f) const {
    const std::vector<store::StoredGroup> all = store->scan().value();
    for (const store::StoredGroup& g : all) {
      for (const rollout::Trajectory& t : g.group.trajectories) f(t);
    }
  }

  std::string dir;
  std::shared_ptr<const model::CharTokenizer> tokenizer;
  std::shared_ptr<const rollout::Task> task;
  model::PolicyConfig cfg;
  model::Policy trainer_policy{nullptr};
  model::Policy worker_policy{nullptr};
  WeightPublisher publisher;
  std::atomic<int64_t> version{0};
  std::unique_ptr<store::RolloutStore> store;
  std::unique_ptr<store::PromptDispenser> dispenser;
  std::unique_ptr<TrainerService> service;
  std::unique_ptr<RpcServer> server;
};

// Waits until `done` holds, looking again each time a group reaches the
// store (its signal, not a poll); false after 60 s. For tests where nothing
// takes groups out of the store, so that READY only grows.
bool wait_for_groups(const store::RolloutStore& store, const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (;;) {
    const int64_t ready = store.count_ready(-1);  // before `done`: no arrival is missed
    if (done()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    store.wait_for_ready(ready + 1, -1, deadline);
  }
}

// Runs the worker on a thread until stop() is called; run()'s status after.
class WorkerThread {
 public:
  explicit WorkerThread(RolloutWorker& w)
      : thread_([this, &w] { result_ = w.run([this] { return stop_.load(); }); }) {}
  Status stop() {
    stop_ = true;
    thread_.join();
    return result_;
  }
  ~WorkerThread() {
    if (thread_.joinable()) stop().IgnoreError();
  }

 private:
  std::atomic<bool> stop_{false};
  Status result_;
  std::thread thread_;
};

TEST(RolloutWorkerTest, GeneratesScoresSubmitsAndFollowsNewVersions) {
  WorkerRig rig("worker");
  rig.publish(0);
  rig.serve();
  std::unique_ptr<RolloutWorker> worker = rig.make_worker({});
  ASSERT_TRUE(worker->start().ok());
  // The worker started from other weights: it must have taken the trainer's.
  EXPECT_TRUE(
      torch::equal(rig.worker_policy->lm_head->weight, rig.trainer_policy->lm_head->weight));

  WorkerThread running(*worker);
  // Capacity at version 0: (1 + 0 + 1) x 4 = 8 groups, then the worker waits:
  // with no room left and no lease open, nothing more can arrive.
  EXPECT_TRUE(wait_for_groups(*rig.store, [&] { return rig.store->appended() >= 8; }));
  EXPECT_EQ(rig.dispenser->capacity(0), 0) << "the staleness bound holds the worker back";
  EXPECT_TRUE(rig.dispenser->leases().empty());
  EXPECT_EQ(rig.store->appended(), 8u);
  rig.publish(1);
  const uint64_t digest1 = rig.publisher.snapshot(1).value()->manifest.digest;
  EXPECT_TRUE(wait_for_groups(*rig.store, [&] { return rig.store->appended() >= 12; }));
  Status result = running.stop();
  ASSERT_TRUE(result.ok()) << result;
  EXPECT_GE(worker->stats().versions_applied, 1);
  EXPECT_EQ(worker->stats().groups_refused, 0);
  EXPECT_EQ(worker->stats().decode_errors, 0);

  bool saw_version1 = false;
  const std::vector<store::StoredGroup> all = rig.store->scan().value();
  for (const store::StoredGroup& g : all) {
    ASSERT_EQ(g.group.trajectories.size(), 3u);
    for (const rollout::Trajectory& tr : g.group.trajectories) {
      EXPECT_TRUE(tr.reward == 0.0 || tr.reward == 1.0) << g.group.group_id;
      for (const auto& [v, dg] : tr.version_digests) {
        if (v == 1) {
          EXPECT_EQ(dg, digest1);
          saw_version1 = true;
        }
      }
    }
  }
  EXPECT_TRUE(saw_version1) << "no group was sampled with the published version 1";
}

// services.weight_sync: broadcast. A worker that joins at version 5 starts
// on version 5 (fetched: it was not in the group yet), then receives
// version 6 by c10d broadcast: bit-identical to the trainer's tensors and
// to what FetchWeights serves, sampled with under the published digest.
TEST(RolloutWorkerTest, JoinsAtVersionFiveAndFollowsByBroadcast) {
  WorkerRig rig("bcast");
  for (int v = 0; v <= 5; ++v) rig.publish(v);
  WeightSyncServerOptions bo;
  bo.timeout = std::chrono::milliseconds(5000);
  bo.bucket_bytes = 4096;  // several buckets even for the tiny model
  auto broadcaster = WeightBroadcaster::start(&rig.publisher, bo).value();
  TrainerServiceOptions o;
  o.weight_sync_endpoint = broadcaster->endpoint();
  rig.serve(o);
  RolloutWorkerOptions wo;
  wo.weight_sync = comm::WeightSyncMode::kBroadcast;
  wo.weight_sync_timeout_ms = 5000;
  wo.broadcast_grace_ms = 60000;  // never fall back to fetching in this test
  std::unique_ptr<RolloutWorker> worker = rig.make_worker(wo);
  ASSERT_TRUE(worker->start().ok());
  EXPECT_EQ(worker->version(), 5);
  EXPECT_TRUE(
      torch::equal(rig.worker_policy->lm_head->weight, rig.trainer_policy->lm_head->weight));

  WorkerThread running(*worker);
  EXPECT_TRUE(wait_for_groups(*rig.store, [&] { return rig.store->appended() >= 4; }));
  // The worker's receiver asked to join; the next broadcast places it.
  rig.publish(6);
  const uint64_t digest6 = rig.publisher.snapshot(6).value()->manifest.digest;
  EXPECT_TRUE(wait_for_groups(*rig.store, [&] {
    bool seen = false;
    rig.for_each_trajectory([&](const rollout::Trajectory& t) {
      for (const auto& [v, dg] : t.version_digests) seen = seen || v == 6;
    });
    return seen;
  }));
  Status result = running.stop();
  ASSERT_TRUE(result.ok()) << result;
  EXPECT_EQ(worker->stats().versions_broadcast, 1) << "version 6 came by broadcast";
  EXPECT_EQ(worker->stats().versions_applied, 1);
  EXPECT_GE(broadcaster->stats().versions_sent, 1);
  rig.for_each_trajectory([&](const rollout::Trajectory& t) {
    for (const auto& [v, dg] : t.version_digests) {
      if (v == 6) {
        EXPECT_EQ(dg, digest6);
      }
    }
  });
  // What the worker samples with now is bit-identical to the trainer's
  // version 6 and to the gRPC fetch of it.
  auto fetched =
      GrpcTrainerClient::connect(rig.client_options()).value()->fetch_weights("anyone", 6).value();
  EXPECT_EQ(fetched.manifest.digest, digest6);
  auto mine = rig.worker_policy->named_parameters();
  auto theirs = rig.trainer_policy->named_parameters();
  for (const auto& p : mine) {
    SCOPED_TRACE(p.key());
    EXPECT_TRUE(torch::equal(p.value(), theirs[p.key()]));
    EXPECT_TRUE(torch::equal(p.value(), fetched.tensors.at(p.key())));
  }
}

// TLS: a CA and a server certificate for 127.0.0.1 made here with openssl;
// a client that trusts the CA connects, a plaintext client does not.
TEST(ServiceTlsTest, ClientsThatTrustTheCaConnectPlaintextOnesDoNot) {
  const std::string dir = ::testing::TempDir() + "/relay_tls_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string cmd =
      "cd " + dir +
      " && openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=relay-test-ca"
      " -keyout ca.key -out ca.pem"
      " && openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout server.key"
      " -out server.csr"
      " && printf 'subjectAltName=IP:127.0.0.1,DNS:localhost' > san.ext"
      " && openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1"
      " -extfile san.ext -out server.pem) > " +
      dir + "/openssl.log 2>&1";
  ASSERT_EQ(std::system(("(" + cmd).c_str()), 0) << "openssl failed; see " << dir << "/openssl.log";

  WeightPublisher publisher;
  std::unordered_map<std::string, at::Tensor> w = {{"x", torch::ones({2})}};
  ASSERT_TRUE(publisher.publish(0, w).ok());
  store::StoreOptions so;
  so.path = dir + "/store";
  auto store = store::RolloutStore::open(so).value();
  auto dispenser = store::PromptDispenser::open(store.get(), store::DispenserOptions{}).value();
  TrainerService service(
      TrainerServiceOptions{}, store.get(), dispenser.get(), &publisher,
      [](const store::Lease&) -> StatusOr<PromptContent> { return PromptContent{}; },
      [] { return 0; });
  ServerOptions o;
  o.tls.cert_file = dir + "/server.pem";
  o.tls.key_file = dir + "/server.key";
  auto server = RpcServer::start(o, {service.worker_service(), service.admin_service()}).value();

  ClientOptions c;
  c.address = "127.0.0.1:" + std::to_string(server->port());
  c.timeout_ms = 5000;
  c.tls.root_ca_file = dir + "/ca.pem";
  auto tls = GrpcTrainerClient::connect(c).value();
  auto fetched = tls->fetch_weights("anyone", -1);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_TRUE(torch::equal(fetched->tensors.at("x"), torch::ones({2})));

  c.tls.root_ca_file.clear();
  c.timeout_ms = 1000;
  auto plain = GrpcTrainerClient::connect(c).value();
  EXPECT_FALSE(plain->stats().ok()) << "a plaintext client must not get through";

  ServerOptions missing;
  missing.tls.cert_file = dir + "/nope.pem";
  auto bad = RpcServer::start(missing, {});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("tls cert_file " + dir + "/nope.pem"),
            std::string::npos)
      << bad.status();
  server->shutdown();
}

// A Worker service whose FetchWeights streams a real snapshot in small
// chunks `pause` apart, or (stall) sends the first chunk and then nothing
// until the client gives up.
class PacedWeights final : public v1::Worker::Service {
 public:
  PacedWeights(std::shared_ptr<const WeightSnapshot> snap, std::chrono::milliseconds pause,
               bool stall)
      : snap_(std::move(snap)), pause_(pause), stall_(stall) {}

  grpc::Status FetchWeights(grpc::ServerContext* context, const v1::FetchWeightsRequest*,
                            grpc::ServerWriter<v1::WeightChunk>* writer) override {
    const uint64_t chunk = snap_->total_bytes / 8 + 1;
    bool first = true;
    for_each_chunk(*snap_, chunk, [&](uint64_t offset, const char* data, uint64_t size) {
      if (!first) std::this_thread::sleep_for(pause_);
      v1::WeightChunk c;
      if (first) to_proto(snap_->manifest, c.mutable_manifest());
      c.set_offset(offset);
      c.set_data(data, size);
      c.set_chunk_digest(XXH3_64bits(data, size));
      const bool ok = writer->Write(c);
      if (first && stall_) {
        while (!context->IsCancelled()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        return false;
      }
      first = false;
      return ok && !context->IsCancelled();
    });
    return grpc::Status::OK;
  }

 private:
  std::shared_ptr<const WeightSnapshot> snap_;
  std::chrono::milliseconds pause_;
  bool stall_;
};

// The fetch is bounded by silence, not by its length: a stream that takes
// 3x timeout_ms but never pauses for timeout_ms completes; one that stops
// sending fails with DeadlineExceeded about timeout_ms later.
TEST(FetchWeightsTimeoutTest, SlowStreamsCompleteAndStalledOnesFailFast) {
  torch::manual_seed(3);
  model::Policy policy(relay::testing::TinyConfig());
  WeightPublisher publisher;
  ASSERT_TRUE(publisher.publish(0, model::parameter_tensors(*policy)).ok());
  auto snap = publisher.snapshot(0).value();
  for (bool stall : {false, true}) {
    SCOPED_TRACE(stall ? "stalled" : "slow");
    PacedWeights service(snap, std::chrono::milliseconds(120), stall);
    auto server = RpcServer::start(ServerOptions{}, {&service}).value();
    ClientOptions c;
    c.address = "127.0.0.1:" + std::to_string(server->port());
    c.timeout_ms = 400;
    auto client = GrpcTrainerClient::connect(c).value();
    const auto t0 = std::chrono::steady_clock::now();
    auto w = client->fetch_weights("w", -1);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!stall) {
      ASSERT_TRUE(w.ok()) << w.status();
      EXPECT_GT(s, 0.4 * 2);  // 8 pauses of 120 ms: well past one timeout
      for (const auto& [name, t] : model::parameter_tensors(*policy)) {
        EXPECT_TRUE(torch::equal(t, w->tensors.at(name))) << name;
      }
    } else {
      EXPECT_EQ(w.status().code(), absl::StatusCode::kDeadlineExceeded) << w.status();
      EXPECT_NE(std::string(w.status().message()).find("services.rpc_timeout_s"), std::string::npos)
          << w.status();
      EXPECT_LT(s, 3.0);
    }
    server->shutdown(0);
  }
}

// A download nobody will stage is cancelled, not waited for: FetchCancel
// ends a stalled stream at once (and a later call right away), and a
// WeightFetcher destroyed mid-download returns without waiting for the
// stream's timeout.
TEST(FetchWeightsTimeoutTest, ACancelledDownloadEndsAtOnce) {
  torch::manual_seed(3);
  model::Policy policy(relay::testing::TinyConfig());
  WeightPublisher publisher;
  ASSERT_TRUE(publisher.publish(0, model::parameter_tensors(*policy)).ok());
  PacedWeights service(publisher.snapshot(0).value(), std::chrono::milliseconds(0),
                       /*stall=*/true);
  auto server = RpcServer::start(ServerOptions{}, {&service}).value();
  ClientOptions c;
  c.address = "127.0.0.1:" + std::to_string(server->port());
  c.timeout_ms = 20000;  // the stall would fail only after this
  auto client = GrpcTrainerClient::connect(c).value();
  auto seconds_since = [](std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };

  FetchCancel cancel;
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    cancel.cancel();
  });
  auto t0 = std::chrono::steady_clock::now();
  auto w = client->fetch_weights("w", -1, 0, nullptr, &cancel);
  canceller.join();
  EXPECT_EQ(w.status().code(), absl::StatusCode::kCancelled) << w.status();
  EXPECT_LT(seconds_since(t0), 5.0);
  w = client->fetch_weights("w", -1, 0, nullptr, &cancel);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kCancelled) << w.status();

  // Without a cancel the same client still downloads (the stall is the
  // server's): a fresh server that does not stall.
  PacedWeights fine(publisher.snapshot(0).value(), std::chrono::milliseconds(0), false);
  auto server2 = RpcServer::start(ServerOptions{}, {&fine}).value();
  c.address = "127.0.0.1:" + std::to_string(server2->port());
  auto client2 = GrpcTrainerClient::connect(c).value();
  ASSERT_TRUE(client2->fetch_weights("w", -1).ok());

  t0 = std::chrono::steady_clock::now();
  {
    WeightFetcher fetcher(client.get(), "w", 0);
    fetcher.want(0);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_TRUE(fetcher.pending());
  }
  EXPECT_LT(seconds_since(t0), 5.0) << "the fetcher's destructor waited for the stalled stream";
  server->shutdown(0);
  server2->shutdown(0);
}

}  // namespace
}  // namespace relay::comm
