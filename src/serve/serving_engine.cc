#include "relay/serve/serving_engine.h"

#include <spdlog/spdlog.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "relay/model/core_share.h"

namespace relay::serve {

ServingEngine::ServingEngine(std::unique_ptr<rollout::Engine> engine) : engine_(std::move(engine)) {
  engine_->set_token_handler(
      [this](std::vector<rollout::SampledToken> t) { on_tokens(std::move(t)); });
  thread_ = std::thread([this] { run(); });
}

ServingEngine::~ServingEngine() {
  stop();
  thread_.join();
}

void ServingEngine::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  engine_->abort();
  cv_.notify_all();
}

Status ServingEngine::submit(rollout::PromptGroup group, std::shared_ptr<GroupListener> listener) {
  group.stream_tokens = true;
  const std::string id = group.group_id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed_.ok())
      return UnavailableError(absl::StrCat("the engine failed: ", failed_.message()));
    if (stopping_) return UnavailableError("the server is stopping");
    if (!listeners_.emplace(id, listener).second) {
      return InvalidArgumentError(absl::StrCat("group '", id, "': already in flight"));
    }
  }
  if (Status s = engine_->submit(std::move(group)); !s.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    listeners_.erase(id);
    return s;
  }
  cv_.notify_all();
  return OkStatus();
}

Status ServingEngine::end_sample(const std::string& group_id, int sample,
                                 rollout::FinishReason reason) {
  return engine_->end_sample(group_id, sample, reason);
}

Status ServingEngine::update_weights(int64_t version, uint64_t digest,
                                     std::unordered_map<std::string, at::Tensor> tensors) {
  RELAY_RETURN_IF_ERROR(engine_->update_weights(version, digest, std::move(tensors)));
  {
    std::lock_guard<std::mutex> lock(mu_);
    step_once_ = true;
  }
  cv_.notify_all();
  return OkStatus();
}

Status ServingEngine::health() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failed_;
}

int ServingEngine::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(listeners_.size());
}

void ServingEngine::on_tokens(std::vector<rollout::SampledToken> tokens) {
  // Split by group, then call each listener outside the lock.
  std::map<std::string, std::vector<rollout::SampledToken>> by_group;
  for (rollout::SampledToken& t : tokens) by_group[t.group_id].push_back(std::move(t));
  std::vector<std::pair<std::shared_ptr<GroupListener>, std::vector<rollout::SampledToken>>> calls;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, list] : by_group) {
      auto it = listeners_.find(id);
      if (it != listeners_.end()) calls.emplace_back(it->second, std::move(list));
    }
  }
  for (auto& [listener, list] : calls) listener->on_tokens(list);
}

void ServingEngine::run() {
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (!stopping_ && listeners_.empty() && !step_once_) {
        // Nothing to decode (the agents are between turns, or there are
        // none): the machine's other processes may take the cores
        // (core_share.h; without a share this does nothing).
        model::cores_busy(false);
        cv_.wait(lock, [&] { return stopping_ || !listeners_.empty() || step_once_; });
        model::cores_busy(true);
      }
      if (stopping_ && listeners_.empty()) return;  // nothing in flight
      // A step with nothing in flight applies the version staged.
      step_once_ = false;
    }
    StatusOr<std::vector<rollout::TrajectoryGroup>> done = engine_->step();
    if (!done.ok()) {
      spdlog::error("serve: engine step failed: {}", std::string(done.status().message()));
      std::map<std::string, std::shared_ptr<GroupListener>> failed;
      {
        std::lock_guard<std::mutex> lock(mu_);
        failed_ = done.status();
        failed.swap(listeners_);
      }
      for (auto& [id, listener] : failed) listener->on_done(done.status());
      return;
    }
    for (rollout::TrajectoryGroup& g : *done) {
      std::shared_ptr<GroupListener> listener;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = listeners_.find(g.group_id);
        if (it == listeners_.end()) continue;
        listener = std::move(it->second);
        listeners_.erase(it);
      }
      listener->on_done(std::move(g));
    }
  }
}

}  // namespace relay::serve
