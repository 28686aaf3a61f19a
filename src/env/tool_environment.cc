#include "relay/env/tool_environment.h"

#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "relay/env/calculator.h"
#include "relay/env/tool_call.h"

namespace relay::env {

ToolEnvironment::ToolEnvironment(std::shared_ptr<const std::vector<ToolSpec>> tools,
                                 ToolEnvironmentOptions options)
    : tools_(std::move(tools)), options_(options) {}

Status ToolEnvironment::reset(const EpisodeStart&) { return OkStatus(); }

namespace {

// One call's output: the tool's result, or what went wrong, as the model
// reads it.
std::string run_call(const std::vector<ToolSpec>& tools, const ToolCall& call, bool* failed) {
  for (const ToolSpec& tool : tools) {
    if (tool.name != call.name) continue;
    try {
      StatusOr<std::string> result = tool.run(call.arguments);
      if (result.ok()) return *std::move(result);
      *failed = true;
      return absl::StrCat("error: ", std::string(result.status().message()));
    } catch (const std::exception& e) {
      *failed = true;
      return absl::StrCat("error: tool '", call.name, "' failed: ", e.what());
    }
  }
  *failed = true;
  std::string names;
  for (const ToolSpec& tool : tools) absl::StrAppend(&names, names.empty() ? "" : ", ", tool.name);
  return absl::StrCat("error: no tool named '", call.name, "' (tools: ", names, ")");
}

}  // namespace

StatusOr<EnvStep> ToolEnvironment::step(const ModelTurn& turn) {
  const ParsedTurn parsed = parse_tool_calls(turn.text);
  EnvStep out;
  if (parsed.blocks() == 0) {
    out.next = EnvStep::Next::kAnswered;
    return out;
  }
  // Blocks in their order: errors carry their index, calls fill the rest.
  size_t next_call = 0, next_error = 0;
  for (int b = 0; b < parsed.blocks(); ++b) {
    std::string result;
    bool failed = false;
    if (next_error < parsed.errors.size() && parsed.errors[next_error].index == b) {
      failed = true;
      result = absl::StrCat("error: malformed tool call: ", parsed.errors[next_error++].message);
    } else {
      const ToolCall& call = parsed.calls[next_call++];
      if (out.tool_calls + out.tool_errors >= options_.max_calls_per_turn) {
        failed = true;
        result = absl::StrCat("error: more than ", options_.max_calls_per_turn,
                              " tool calls in one turn; this one was not run");
      } else {
        result = run_call(*tools_, call, &failed);
      }
    }
    if (failed) {
      ++out.tool_errors;
    } else {
      ++out.tool_calls;
    }
    out.messages.push_back({"tool", std::move(result)});
  }
  return out;
}

ToolEnvironmentFactory::ToolEnvironmentFactory(std::vector<ToolSpec> tools,
                                               ToolEnvironmentOptions options)
    : tools_(std::make_shared<const std::vector<ToolSpec>>(std::move(tools))), options_(options) {}

StatusOr<std::unique_ptr<Environment>> ToolEnvironmentFactory::make() const {
  return std::unique_ptr<Environment>(new ToolEnvironment(tools_, options_));
}

std::vector<std::string> ToolEnvironmentFactory::tool_schemas() const {
  std::vector<std::string> out;
  for (const ToolSpec& tool : *tools_) out.push_back(tool.schema);
  return out;
}

ToolSpec calculator_tool() {
  return {"calculator", calculator_schema(),
          [](std::string_view arguments) { return run_calculator(arguments); }};
}

}  // namespace relay::env
