#pragma once

// Environments of multi-turn episodes (rollout/engine.h, "Episodes"): what
// answers a model's turn. One Environment object serves one episode: reset()
// with the task instance, then step() with each model turn until it says the
// episode is over. Text in, messages out: the caller renders the messages in
// the run's chat template (env/tool_prompt.h, render_observation), tokenizes them once and
// appends the tokens to the episode, so an environment never sees or makes
// token ids and never re-renders earlier turns.
//
// An environment's errors come in two kinds. What the model did wrong (a
// malformed tool call, an unknown tool, a bad argument) is an observation
// the model reads, counted in EnvStep, never an error status. An error status
// means the environment itself failed; the caller ends that episode as
// env_error with the message, and the worker goes on. No LibTorch.

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "relay/common/status.h"
#include "relay/model/chat_template.h"

namespace relay::env {

// The task instance an episode starts from.
struct EpisodeStart {
  std::string task_id;    // TaskPrompt::id, e.g. "arithmetic/17"
  std::string prompt;     // the prompt text the model was given
  std::string reference;  // what the verifier compares against (may be empty)
};

// One model turn, as the environment reads it.
struct ModelTurn {
  int turn = 0;      // 0 for the first
  std::string text;  // decoded, without the end-of-turn token
};

// The environment's answer to a turn.
struct EnvStep {
  enum class Next {
    kContinue,  // the model reads `messages` and takes another turn
    kAnswered,  // the turn was the model's final answer (the task's verifier scores it)
    kDone,      // the environment ended the episode (a game over, a task solved)
  };
  Next next = Next::kContinue;
  // What the model reads next: "tool" messages (a tool's output, rendered as
  // <tool_response> blocks) and/or "user" messages. Non-empty with
  // kContinue, ignored otherwise.
  std::vector<model::ChatMessage> messages;
  double reward = std::numeric_limits<double>::quiet_NaN();  // for this turn; NaN = none
  // Counters for metrics.
  int tool_calls = 0;   // calls that ran
  int tool_errors = 0;  // malformed calls, unknown tools, calls the tool refused
};

class Environment {
 public:
  virtual ~Environment() = default;
  virtual Status reset(const EpisodeStart& start) = 0;
  virtual StatusOr<EnvStep> step(const ModelTurn& turn) = 0;
};

// Makes one Environment per episode; shared by the worker's threads.
class EnvironmentFactory {
 public:
  virtual ~EnvironmentFactory() = default;
  virtual StatusOr<std::unique_ptr<Environment>> make() const = 0;
  // Tool schemas (OpenAI function format) the prompt lists, in order; empty
  // for an environment without tools.
  virtual std::vector<std::string> tool_schemas() const { return {}; }
};

}  // namespace relay::env
