#include "relay/rollout/episode_driver.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <future>

#include "absl/strings/str_cat.h"
#include "relay/env/tool_prompt.h"

namespace relay::rollout {

Score episode_score(Score score, const Trajectory& t) {
  if (t.turns.empty()) return score;
  score.sub_scores["environment"] = t.environment_reward();
  score.reward += t.environment_reward();
  return score;
}

EpisodeDriver::EpisodeDriver(Engine& engine, std::shared_ptr<const env::EnvironmentFactory> factory,
                             std::shared_ptr<const model::Tokenizer> tokenizer,
                             EpisodeDriverOptions options)
    : engine_(engine),
      factory_(std::move(factory)),
      tokenizer_(std::move(tokenizer)),
      options_(options) {
  engine_.set_turn_handler([this](TurnEnd end) { on_turn(std::move(end)); });
  for (int i = 0; i < std::max(1, options_.threads); ++i) threads_.emplace_back([this] { work(); });
}

EpisodeDriver::~EpisodeDriver() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
  engine_.set_turn_handler([](TurnEnd) {});
}

void EpisodeDriver::begin_group(const std::string& group_id, env::EpisodeStart start) {
  std::lock_guard<std::mutex> lock(mu_);
  starts_[group_id] = std::move(start);
}

void EpisodeDriver::end_group(const std::string& group_id) {
  std::lock_guard<std::mutex> lock(mu_);
  starts_.erase(group_id);
  for (auto it = episodes_.lower_bound({group_id, 0});
       it != episodes_.end() && it->first.first == group_id;) {
    it = episodes_.erase(it);
  }
}

EpisodeDriverStats EpisodeDriver::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void EpisodeDriver::on_turn(TurnEnd end) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(end));
  }
  cv_.notify_one();
}

void EpisodeDriver::work() {
  while (true) {
    TurnEnd end;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      end = std::move(queue_.front());
      queue_.pop_front();
    }
    TurnReply reply = answer(end);
    if (reply.end == FinishReason::kEnvError) {
      spdlog::warn("episode '{}' sample {}: environment error at turn {}: {}", end.group_id,
                   end.sample, end.turn, reply.detail);
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.env_errors;
    }
    // Refused only when the episode is no longer waiting (aborted meanwhile).
    if (Status s = engine_.reply(end.group_id, end.sample, std::move(reply)); !s.ok()) {
      spdlog::debug("episode '{}' sample {}: {}", end.group_id, end.sample,
                    std::string(s.message()));
    }
  }
}

namespace {

TurnReply failed(std::string detail) {
  TurnReply r;
  r.end = FinishReason::kEnvError;
  r.detail = std::move(detail);
  return r;
}

}  // namespace

TurnReply EpisodeDriver::answer(const TurnEnd& end) {
  // The episode's environment, made at its first turn. Only this thread
  // touches it until the turn is answered: an episode has one turn out.
  std::shared_ptr<Episode> episode;
  bool fresh = false;
  env::EpisodeStart start;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::shared_ptr<Episode>& slot = episodes_[{end.group_id, end.sample}];
    if (!slot) {
      slot = std::make_shared<Episode>();
      fresh = true;
      auto it = starts_.find(end.group_id);
      if (it != starts_.end()) start = it->second;
    }
    episode = slot;
  }
  try {
    // The turn without the stop token that ended it.
    std::vector<int64_t> body(end.tokens.begin(), end.tokens.end() - (end.tokens.empty() ? 0 : 1));
    StatusOr<std::string> text = tokenizer_->decode(body);
    if (!text.ok()) return failed(absl::StrCat("decoding the turn: ", text.status().message()));
    if (fresh) {
      StatusOr<std::unique_ptr<env::Environment>> made = factory_->make();
      if (!made.ok()) {
        return failed(absl::StrCat("making the environment: ", made.status().message()));
      }
      episode->env = *std::move(made);
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.episodes;
    }
    if (!episode->env) return failed("the environment could not be made at the first turn");
    // reset (first turn) and step on a thread of their own, so a call that
    // never returns costs its episode, not a driver thread.
    auto result = std::make_shared<std::promise<StatusOr<env::EnvStep>>>();
    std::future<StatusOr<env::EnvStep>> answered = result->get_future();
    const auto t0 = std::chrono::steady_clock::now();
    std::thread([episode, result, fresh, start, turn = env::ModelTurn{end.turn, *text}] {
      try {
        if (fresh) {
          if (Status s = episode->env->reset(start); !s.ok()) {
            result->set_value(Status(s.code(), absl::StrCat("reset: ", s.message())));
            return;
          }
        }
        StatusOr<env::EnvStep> step = episode->env->step(turn);
        if (!step.ok()) {
          step = Status(step.status().code(), absl::StrCat("step: ", step.status().message()));
        }
        result->set_value(std::move(step));
      } catch (const std::exception& e) {
        result->set_value(InternalError(absl::StrCat("the environment threw: ", e.what())));
      } catch (...) {
        result->set_value(InternalError("the environment threw a non-exception"));
      }
    }).detach();
    if (answered.wait_for(options_.step_timeout) != std::future_status::ready) {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.env_timeouts;
      return failed(absl::StrCat("no answer within ", options_.step_timeout.count(),
                                 " ms (the call is abandoned)"));
    }
    StatusOr<env::EnvStep> step = answered.get();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.env_steps;
      stats_.env_seconds += seconds;
      if (step.ok()) {
        stats_.tool_calls += step->tool_calls;
        stats_.tool_errors += step->tool_errors;
      }
    }
    if (!step.ok()) return failed(std::string(step.status().message()));
    TurnReply reply;
    reply.reward = step->reward;
    reply.tool_calls = step->tool_calls;
    reply.tool_errors = step->tool_errors;
    switch (step->next) {
      case env::EnvStep::Next::kAnswered:
        reply.end = FinishReason::kStop;
        return reply;
      case env::EnvStep::Next::kDone:
        reply.end = FinishReason::kEnvDone;
        return reply;
      case env::EnvStep::Next::kContinue:
        break;
    }
    StatusOr<std::string> observation =
        env::render_observation(options_.chat_template, step->messages);
    if (!observation.ok()) {
      return failed(absl::StrCat("rendering the observation: ", observation.status().message()));
    }
    if (observation->empty()) return failed("the environment went on with an empty observation");
    StatusOr<std::vector<int64_t>> ids = tokenizer_->encode(*observation);
    if (!ids.ok()) {
      return failed(absl::StrCat("tokenizing the observation: ", ids.status().message()));
    }
    reply.observation = *std::move(ids);
    return reply;
  } catch (const std::exception& e) {
    return failed(absl::StrCat("the environment threw: ", e.what()));
  }
}

}  // namespace relay::rollout
