#pragma once

// The tool-calling environment: the model's turn is read for Qwen/Hermes
// <tool_call> blocks (env/tool_call.h); each call runs its tool and the
// results come back as "tool" messages, in the order of the blocks. A turn
// with no block is the model's final answer and ends the episode (the task's
// verifier scores it). A malformed block, an unknown tool or an argument the
// tool refuses is answered with an "error: ..." tool message and counted,
// never an error status. No LibTorch.

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "relay/env/environment.h"

namespace relay::env {

struct ToolSpec {
  std::string name;
  std::string schema;  // OpenAI function format, listed in the prompt
  // The call's arguments object as JSON text -> the result text, or an
  // error the model is shown. May throw; a throw is shown like an error.
  std::function<StatusOr<std::string>(std::string_view arguments)> run;
};

struct ToolEnvironmentOptions {
  // Calls run per turn; blocks past it are answered with an error.
  int max_calls_per_turn = 4;
};

class ToolEnvironment : public Environment {
 public:
  ToolEnvironment(std::shared_ptr<const std::vector<ToolSpec>> tools,
                  ToolEnvironmentOptions options);
  Status reset(const EpisodeStart& start) override;
  StatusOr<EnvStep> step(const ModelTurn& turn) override;

 private:
  std::shared_ptr<const std::vector<ToolSpec>> tools_;
  ToolEnvironmentOptions options_;
};

class ToolEnvironmentFactory : public EnvironmentFactory {
 public:
  ToolEnvironmentFactory(std::vector<ToolSpec> tools, ToolEnvironmentOptions options = {});
  StatusOr<std::unique_ptr<Environment>> make() const override;
  std::vector<std::string> tool_schemas() const override;

 private:
  std::shared_ptr<const std::vector<ToolSpec>> tools_;
  ToolEnvironmentOptions options_;
};

// The built-in calculator tool (env/calculator.h) as a ToolSpec.
ToolSpec calculator_tool();

}  // namespace relay::env
