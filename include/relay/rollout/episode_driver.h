#pragma once

// Runs the environments of an engine's episodes (engine.h, "Episodes").
// Installed as the engine's turn handler, it takes each ended model turn off
// the engine thread at once and answers it on one of its own threads, so the
// engine keeps decoding the other sequences meanwhile:
//
//   1. the episode's Environment is made and reset with its task instance at
//      its first turn (one per episode, kept until end_group);
//   2. the turn's tokens, less the stop token that ended it, are decoded and
//      given to Environment::step;
//   3. kContinue: the messages are rendered as the chat template writes them
//      after the end-of-turn token (env/tool_prompt.h), tokenized once and
//      appended by Engine::reply (token-in/token-out). kAnswered ends the
//      episode as stop, kDone as env_done.
//
// An environment that fails (an error status, a throw, no answer within
// step_timeout, an observation the template or the tokenizer cannot take, a
// turn the tokenizer cannot decode) ends that episode as env_error with the
// reason in finish_detail; the other episodes and the worker go on.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "relay/env/environment.h"
#include "relay/model/chat_template.h"
#include "relay/model/tokenizer.h"
#include "relay/rollout/engine.h"
#include "relay/rollout/task.h"

namespace relay::rollout {

struct EpisodeDriverOptions {
  model::ChatTemplate chat_template = model::ChatTemplate::kNone;
  int threads = 2;  // environment calls at once
  // Deadline of one Environment::reset + step. A call past it ends the
  // episode as env_error; C++ cannot cancel it, so it is abandoned on its own
  // thread (which owns the environment) and counted, like SafeVerifier's.
  std::chrono::milliseconds step_timeout{60000};
};

// Counters since construction.
struct EpisodeDriverStats {
  int64_t episodes = 0;      // environments made
  int64_t env_steps = 0;     // turns answered
  int64_t tool_calls = 0;    // EnvStep::tool_calls, summed
  int64_t tool_errors = 0;   // EnvStep::tool_errors, summed
  int64_t env_errors = 0;    // episodes ended as env_error
  int64_t env_timeouts = 0;  // of those, calls abandoned at step_timeout
  double env_seconds = 0.0;  // wall time inside Environment::step, summed
};

// A trajectory's score from the verifier's score of its answer
// (Trajectory::answer_tokens): for an episode, plus the environment's turn
// rewards, which also show as sub-score "environment"; for a single
// response, the verifier's as it is.
Score episode_score(Score verifier_score, const Trajectory& t);

class EpisodeDriver {
 public:
  // Sets itself as `engine`'s turn handler; `engine` must outlive it. The
  // tokenizer decodes turns and encodes observations.
  EpisodeDriver(Engine& engine, std::shared_ptr<const env::EnvironmentFactory> factory,
                std::shared_ptr<const model::Tokenizer> tokenizer, EpisodeDriverOptions options);
  // Stops its threads; turns not yet answered are dropped (abort the engine
  // first to get their episodes back).
  ~EpisodeDriver();
  EpisodeDriver(const EpisodeDriver&) = delete;
  EpisodeDriver& operator=(const EpisodeDriver&) = delete;

  // The task instance of `group_id`'s episodes; call before submitting it.
  void begin_group(const std::string& group_id, env::EpisodeStart start);
  // Forgets the group's environments, once the engine has returned it.
  void end_group(const std::string& group_id);

  EpisodeDriverStats stats() const;

 private:
  struct Episode {
    std::unique_ptr<env::Environment> env;
  };
  void on_turn(TurnEnd end);  // the engine thread
  void work();                // the driver's threads
  TurnReply answer(const TurnEnd& end);

  Engine& engine_;
  const std::shared_ptr<const env::EnvironmentFactory> factory_;
  const std::shared_ptr<const model::Tokenizer> tokenizer_;
  const EpisodeDriverOptions options_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<TurnEnd> queue_;
  bool stopping_ = false;
  std::map<std::string, env::EpisodeStart> starts_;                           // by group id
  std::map<std::pair<std::string, int>, std::shared_ptr<Episode>> episodes_;  // (group, sample)
  EpisodeDriverStats stats_;
  std::vector<std::thread> threads_;
};

}  // namespace relay::rollout
