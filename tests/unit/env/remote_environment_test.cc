// The environment protocol's client (env/remote_environment.h) against an
// in-process server on loopback: what it sends, how it reads answers, and
// how a server that is slow, wrong or gone fails the call with its address.

#include "relay/env/remote_environment.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "relay/v1/environment.grpc.pb.h"

namespace relay::env {
namespace {

using relay::v1::StepEnvironmentResponse;

// Records every call; Step answers with `answer` (after `delay`).
class FakeEnvironmentService final : public relay::v1::Environment::Service {
 public:
  std::vector<std::string> tools{R"({"type": "function", "function": {"name": "echo"}})"};
  std::function<StepEnvironmentResponse(const relay::v1::StepEnvironmentRequest&)> answer;
  std::chrono::milliseconds delay{0};

  grpc::Status Describe(grpc::ServerContext*, const relay::v1::DescribeEnvironmentRequest*,
                        relay::v1::DescribeEnvironmentResponse* out) override {
    for (const std::string& t : tools) out->add_tool_schemas_json(t);
    return grpc::Status::OK;
  }
  grpc::Status Reset(grpc::ServerContext*, const relay::v1::ResetEnvironmentRequest* in,
                     relay::v1::ResetEnvironmentResponse*) override {
    std::lock_guard<std::mutex> lock(mu);
    resets.push_back(*in);
    return grpc::Status::OK;
  }
  grpc::Status Step(grpc::ServerContext*, const relay::v1::StepEnvironmentRequest* in,
                    StepEnvironmentResponse* out) override {
    std::this_thread::sleep_for(delay);
    {
      std::lock_guard<std::mutex> lock(mu);
      steps.push_back(*in);
    }
    *out = answer(*in);
    return grpc::Status::OK;
  }
  grpc::Status Close(grpc::ServerContext*, const relay::v1::CloseEnvironmentRequest* in,
                     relay::v1::CloseEnvironmentResponse*) override {
    std::lock_guard<std::mutex> lock(mu);
    closes.push_back(in->episode_id());
    cv.notify_all();
    return grpc::Status::OK;
  }

  std::mutex mu;
  std::condition_variable cv;
  std::vector<relay::v1::ResetEnvironmentRequest> resets;
  std::vector<relay::v1::StepEnvironmentRequest> steps;
  std::vector<std::string> closes;
};

class RemoteEnvironmentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    service_.answer = [](const relay::v1::StepEnvironmentRequest& in) {
      StepEnvironmentResponse r;
      r.set_next(StepEnvironmentResponse::CONTINUE);
      auto* m = r.add_messages();
      m->set_role("tool");
      m->set_content("echo: " + in.text());
      r.set_has_reward(true);
      r.set_reward(0.25);
      r.set_tool_calls(1);
      return r;
    };
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(&service_);
    server_ = b.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    address_ = "127.0.0.1:" + std::to_string(port_);
  }
  void TearDown() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now());
  }

  std::shared_ptr<const EnvironmentFactory> connect(
      std::chrono::milliseconds deadline = std::chrono::seconds(10)) {
    RemoteEnvironmentOptions o;
    o.address = address_;
    o.deadline = deadline;
    auto f = connect_remote_environment(o);
    EXPECT_TRUE(f.ok()) << f.status();
    return f.ok() ? *f : nullptr;
  }

  FakeEnvironmentService service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string address_;
};

TEST_F(RemoteEnvironmentTest, AnEpisodeIsResetSteppedAndClosedUnderItsOwnId) {
  auto factory = connect();
  ASSERT_NE(factory, nullptr);
  EXPECT_EQ(factory->tool_schemas(), service_.tools);
  std::string first_id;
  for (int episode = 0; episode < 2; ++episode) {
    auto env = factory->make();
    ASSERT_TRUE(env.ok()) << env.status();
    ASSERT_TRUE((*env)->reset({"arithmetic/3", "What is 6*7?", "42"}).ok());
    StatusOr<EnvStep> step = (*env)->step({0, "6*7"});
    ASSERT_TRUE(step.ok()) << step.status();
    EXPECT_EQ(step->next, EnvStep::Next::kContinue);
    ASSERT_EQ(step->messages.size(), 1u);
    EXPECT_EQ(step->messages[0].role, "tool");
    EXPECT_EQ(step->messages[0].content, "echo: 6*7");
    EXPECT_EQ(step->reward, 0.25);
    EXPECT_EQ(step->tool_calls, 1);
    EXPECT_EQ(step->tool_errors, 0);
  }
  {
    std::unique_lock<std::mutex> lock(service_.mu);
    ASSERT_TRUE(service_.cv.wait_for(lock, std::chrono::seconds(10), [&] {
      return service_.closes.size() == 2;
    })) << "the environments' destructors send Close";
    ASSERT_EQ(service_.resets.size(), 2u);
    EXPECT_EQ(service_.resets[0].task_id(), "arithmetic/3");
    EXPECT_EQ(service_.resets[0].prompt(), "What is 6*7?");
    EXPECT_EQ(service_.resets[0].reference(), "42");
    EXPECT_NE(service_.resets[0].episode_id(), service_.resets[1].episode_id());
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(service_.steps[i].episode_id(), service_.resets[i].episode_id());
      EXPECT_EQ(service_.steps[i].turn(), 0);
    }
    EXPECT_EQ(service_.closes[0], service_.resets[0].episode_id());
  }
}

TEST_F(RemoteEnvironmentTest, NoRewardIsNaNAndTheEndsAreRead) {
  auto factory = connect();
  ASSERT_NE(factory, nullptr);
  service_.answer = [](const relay::v1::StepEnvironmentRequest& in) {
    StepEnvironmentResponse r;
    r.set_next(in.turn() == 0 ? StepEnvironmentResponse::ANSWERED : StepEnvironmentResponse::DONE);
    return r;
  };
  auto env = *factory->make();
  ASSERT_TRUE(env->reset({}).ok());
  StatusOr<EnvStep> answered = env->step({0, "42"});
  ASSERT_TRUE(answered.ok()) << answered.status();
  EXPECT_EQ(answered->next, EnvStep::Next::kAnswered);
  EXPECT_TRUE(std::isnan(answered->reward));
  // A turn cut inside a character: a proto3 string must be UTF-8.
  StatusOr<EnvStep> done = env->step({1, "x\xe2\x82"});
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->next, EnvStep::Next::kDone);
  std::lock_guard<std::mutex> lock(service_.mu);
  EXPECT_EQ(service_.steps.back().text(), "x\xef\xbf\xbd");
}

TEST_F(RemoteEnvironmentTest, AWrongAnswerIsTheServersErrorNamed) {
  auto factory = connect();
  ASSERT_NE(factory, nullptr);
  struct Case {
    std::function<void(StepEnvironmentResponse&)> spoil;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](StepEnvironmentResponse& r) { r.clear_messages(); },
       "Step: answer: messages: empty, but next is CONTINUE"},
      {[](StepEnvironmentResponse& r) { r.set_reward(std::nan("")); },
       "Step: answer: reward: must be finite, got nan"},
      {[](StepEnvironmentResponse& r) {
         r.set_next(static_cast<StepEnvironmentResponse::Next>(7));
       },
       "Step: answer: next: unknown value 7"},
      {[](StepEnvironmentResponse& r) { r.set_tool_errors(-1); },
       "Step: answer: tool_calls and tool_errors: must be >= 0"},
  };
  for (const Case& c : cases) {
    service_.answer = [&](const relay::v1::StepEnvironmentRequest&) {
      StepEnvironmentResponse r;
      r.set_next(StepEnvironmentResponse::CONTINUE);
      auto* m = r.add_messages();
      m->set_role("tool");
      m->set_content("x");
      r.set_has_reward(true);
      r.set_reward(1);
      c.spoil(r);
      return r;
    };
    auto env = *factory->make();
    ASSERT_TRUE(env->reset({}).ok());
    StatusOr<EnvStep> step = env->step({0, "t"});
    ASSERT_FALSE(step.ok()) << c.message;
    EXPECT_EQ(step.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(std::string(step.status().message()),
              "environment at " + address_ + ": " + c.message);
  }
}

TEST_F(RemoteEnvironmentTest, ASlowServerFailsTheCallAtTheDeadline) {
  auto factory = connect(std::chrono::milliseconds(200));
  ASSERT_NE(factory, nullptr);
  service_.delay = std::chrono::milliseconds(1500);
  auto env = *factory->make();
  ASSERT_TRUE(env->reset({}).ok());
  const auto t0 = std::chrono::steady_clock::now();
  StatusOr<EnvStep> step = env->step({0, "t"});
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(1200));
  ASSERT_FALSE(step.ok());
  EXPECT_EQ(step.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(std::string(step.status().message())
                .rfind("environment at " + address_ + ": Step: DEADLINE_EXCEEDED: ", 0),
            0u)
      << step.status();
}

TEST_F(RemoteEnvironmentTest, AServerThatIsGoneFailsTheCallAsUnavailable) {
  auto factory = connect(std::chrono::seconds(5));
  ASSERT_NE(factory, nullptr);
  auto env = *factory->make();
  ASSERT_TRUE(env->reset({}).ok());
  server_->Shutdown(std::chrono::system_clock::now());
  server_.reset();
  StatusOr<EnvStep> step = env->step({0, "t"});
  ASSERT_FALSE(step.ok());
  EXPECT_EQ(step.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(std::string(step.status().message())
                .rfind("environment at " + address_ + ": Step: UNAVAILABLE: ", 0),
            0u)
      << step.status();
}

TEST_F(RemoteEnvironmentTest, ConnectingSaysWhatIsWrong) {
  RemoteEnvironmentOptions o;
  auto empty = connect_remote_environment(o);
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(std::string(empty.status().message()),
            "environment address: empty (host:port of the server)");

  service_.tools = {"[1, 2]"};
  o.address = address_;
  auto bad_tool = connect_remote_environment(o);
  ASSERT_FALSE(bad_tool.ok());
  EXPECT_EQ(
      std::string(bad_tool.status().message()),
      "environment at " + address_ + ": Describe: tool_schemas_json[0]: not a JSON object: [1, 2]");

  server_->Shutdown(std::chrono::system_clock::now());
  server_.reset();
  o.connect_timeout = std::chrono::milliseconds(300);
  auto gone = connect_remote_environment(o);
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(std::string(gone.status().message()),
            "environment at " + address_ +
                ": no answer to Describe within 300 ms (is the server running?)");
}

}  // namespace
}  // namespace relay::env
