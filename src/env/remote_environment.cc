#include "relay/env/remote_environment.h"

#include <grpcpp/grpcpp.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "relay/common/utf8.h"
#include "relay/v1/environment.grpc.pb.h"

namespace relay::env {
namespace {

using Stub = relay::v1::Environment::Stub;

// What the episode's finish_detail says: where, which call, gRPC's code.
Status call_failed(const std::string& address, const char* call, const grpc::Status& s) {
  const auto code = static_cast<absl::StatusCode>(s.error_code());
  return Status(code, absl::StrCat("environment at ", address, ": ", call, ": ",
                                   absl::StatusCodeToString(code), ": ", s.error_message()));
}

std::unique_ptr<grpc::ClientContext> context_with(std::chrono::milliseconds deadline) {
  auto c = std::make_unique<grpc::ClientContext>();
  c->set_deadline(std::chrono::system_clock::now() + deadline);
  return c;
}

// Sends Close calls on a thread of its own, so that ending an episode never
// waits on the server (the episode driver ends episodes under its lock). The
// callback API would do without the thread, but gRPC 1.51 tears its
// callback queue down under its polling threads when the last channel or
// server goes, so plain blocking calls it is.
class Closer {
 public:
  Closer(Stub* stub, std::chrono::milliseconds deadline) : stub_(stub), deadline_(deadline) {
    thread_ = std::thread([this] { run(); });
  }
  // Sends what is queued while the server answers, then stops.
  ~Closer() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void close(std::string episode_id) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(episode_id));
    }
    cv_.notify_all();
  }

 private:
  void run() {
    bool answering = true;
    while (true) {
      std::string id;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty() || (stopping_ && !answering)) return;
        id = std::move(queue_.front());
        queue_.pop_front();
      }
      relay::v1::CloseEnvironmentRequest req;
      req.set_episode_id(id);
      relay::v1::CloseEnvironmentResponse resp;
      auto context = context_with(deadline_);
      answering = stub_->Close(context.get(), req, &resp).ok();
    }
  }

  Stub* const stub_;
  const std::chrono::milliseconds deadline_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

struct Connection {
  RemoteEnvironmentOptions options;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<Stub> stub;
  std::vector<std::string> tool_schemas;
  std::string id_prefix;  // unique per factory, so two workers' ids never meet
  std::atomic<uint64_t> next_episode{0};
  std::unique_ptr<Closer> closer;  // last: it goes first, while the stub is still there
};

class RemoteEnvironment : public Environment {
 public:
  RemoteEnvironment(std::shared_ptr<Connection> c, std::string episode_id)
      : c_(std::move(c)), episode_id_(std::move(episode_id)) {}

  // The server may free the episode's state; sent by the connection's closer.
  ~RemoteEnvironment() override {
    if (opened_) c_->closer->close(episode_id_);
  }

  Status reset(const EpisodeStart& start) override {
    relay::v1::ResetEnvironmentRequest req;
    req.set_episode_id(episode_id_);
    req.set_task_id(start.task_id);
    req.set_prompt(replace_invalid_utf8(start.prompt));
    req.set_reference(replace_invalid_utf8(start.reference));
    relay::v1::ResetEnvironmentResponse resp;
    opened_ = true;  // the server may hold state even when the answer is lost
    auto context = context_with(c_->options.deadline);
    grpc::Status s = c_->stub->Reset(context.get(), req, &resp);
    if (!s.ok()) return call_failed(c_->options.address, "Reset", s);
    return OkStatus();
  }

  StatusOr<EnvStep> step(const ModelTurn& turn) override {
    relay::v1::StepEnvironmentRequest req;
    req.set_episode_id(episode_id_);
    req.set_turn(turn.turn);
    // A proto3 string must be UTF-8; a turn cut inside a character is not.
    req.set_text(replace_invalid_utf8(turn.text));
    relay::v1::StepEnvironmentResponse resp;
    auto context = context_with(c_->options.deadline);
    grpc::Status s = c_->stub->Step(context.get(), req, &resp);
    if (!s.ok()) return call_failed(c_->options.address, "Step", s);
    return to_step(resp);
  }

 private:
  // The answer, checked: a server's mistake is the episode's error, named.
  StatusOr<EnvStep> to_step(const relay::v1::StepEnvironmentResponse& resp) const {
    auto refuse = [&](const std::string& what) {
      return InvalidArgumentError(
          absl::StrCat("environment at ", c_->options.address, ": Step: answer: ", what));
    };
    EnvStep out;
    switch (resp.next()) {
      case relay::v1::StepEnvironmentResponse::CONTINUE:
        out.next = EnvStep::Next::kContinue;
        break;
      case relay::v1::StepEnvironmentResponse::ANSWERED:
        out.next = EnvStep::Next::kAnswered;
        break;
      case relay::v1::StepEnvironmentResponse::DONE:
        out.next = EnvStep::Next::kDone;
        break;
      default:
        return refuse(absl::StrCat("next: unknown value ", static_cast<int>(resp.next())));
    }
    if (out.next == EnvStep::Next::kContinue && resp.messages_size() == 0) {
      return refuse("messages: empty, but next is CONTINUE");
    }
    for (const relay::v1::EnvironmentMessage& m : resp.messages()) {
      out.messages.push_back({m.role(), m.content()});
    }
    if (resp.has_reward()) {
      if (!std::isfinite(resp.reward())) {
        return refuse(absl::StrCat("reward: must be finite, got ", resp.reward()));
      }
      out.reward = resp.reward();
    }
    if (resp.tool_calls() < 0 || resp.tool_errors() < 0) {
      return refuse("tool_calls and tool_errors: must be >= 0");
    }
    out.tool_calls = resp.tool_calls();
    out.tool_errors = resp.tool_errors();
    return out;
  }

  std::shared_ptr<Connection> c_;
  std::string episode_id_;
  bool opened_ = false;
};

class RemoteEnvironmentFactory : public EnvironmentFactory {
 public:
  explicit RemoteEnvironmentFactory(std::shared_ptr<Connection> c) : c_(std::move(c)) {}

  StatusOr<std::unique_ptr<Environment>> make() const override {
    const uint64_t n = c_->next_episode.fetch_add(1);
    return std::unique_ptr<Environment>(
        new RemoteEnvironment(c_, absl::StrCat(c_->id_prefix, "-", n)));
  }
  std::vector<std::string> tool_schemas() const override { return c_->tool_schemas; }

 private:
  std::shared_ptr<Connection> c_;
};

std::string random_prefix() {
  std::random_device rd;
  const uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return absl::StrCat(absl::Hex(v, absl::kZeroPad16));
}

}  // namespace

StatusOr<std::shared_ptr<const EnvironmentFactory>> connect_remote_environment(
    const RemoteEnvironmentOptions& options) {
  if (options.address.empty()) {
    return InvalidArgumentError("environment address: empty (host:port of the server)");
  }
  auto c = std::make_shared<Connection>();
  c->options = options;
  c->channel = grpc::CreateChannel(options.address, grpc::InsecureChannelCredentials());
  c->stub = relay::v1::Environment::NewStub(c->channel);
  c->id_prefix = random_prefix();
  c->closer = std::make_unique<Closer>(c->stub.get(),
                                       std::min(options.deadline, std::chrono::milliseconds(5000)));

  // Describe waits for the connection, so a server still starting is given
  // connect_timeout to come up.
  relay::v1::DescribeEnvironmentResponse resp;
  auto context = context_with(options.connect_timeout);
  context->set_wait_for_ready(true);
  grpc::Status s = c->stub->Describe(context.get(), {}, &resp);
  if (!s.ok()) {
    if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      return UnavailableError(
          absl::StrCat("environment at ", options.address, ": no answer to Describe within ",
                       options.connect_timeout.count(), " ms (is the server running?)"));
    }
    return call_failed(options.address, "Describe", s);
  }
  for (int i = 0; i < resp.tool_schemas_json_size(); ++i) {
    // The prompt lists each as a JSON object; anything else is the server's
    // error, said now rather than at the first prompt.
    const nlohmann::json j =
        nlohmann::json::parse(resp.tool_schemas_json(i), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return InvalidArgumentError(
          absl::StrCat("environment at ", options.address, ": Describe: tool_schemas_json[", i,
                       "]: not a JSON object: ", resp.tool_schemas_json(i)));
    }
    c->tool_schemas.push_back(resp.tool_schemas_json(i));
  }
  return std::shared_ptr<const EnvironmentFactory>(new RemoteEnvironmentFactory(std::move(c)));
}

}  // namespace relay::env
