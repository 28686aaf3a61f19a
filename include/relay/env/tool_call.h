#pragma once

// Tool calls in a model's turn, in the format Qwen2.5/Qwen3's chat templates
// teach (the Hermes convention, which vLLM's "hermes" tool parser also reads):
//
//   <tool_call>
//   {"name": "calculator", "arguments": {"expression": "12*7"}}
//   </tool_call>
//
// A turn may hold text and any number of such blocks. Each block's body,
// trimmed, must be one JSON object with a non-empty string "name" and an
// "arguments" object; like vLLM's parser, "arguments" may also be a JSON
// string that holds an object (some fine-tunes emit it encoded), and a
// missing "arguments" means {}. Anything else in a block is a malformed call:
// it is reported with what is wrong, so an environment can tell the model
// instead of failing the episode. Pure text, no LibTorch.

#include <string>
#include <string_view>
#include <vector>

namespace relay::env {

inline constexpr std::string_view kToolCallOpen = "<tool_call>";
inline constexpr std::string_view kToolCallClose = "</tool_call>";

struct ToolCall {
  std::string name;
  std::string arguments;  // the arguments object as compact JSON text ("{}" when none)
};

// What went wrong with one block, for the observation the model reads.
struct ToolCallError {
  int index = 0;        // the block's position among the turn's blocks, from 0
  std::string message;  // "not a JSON object", "\"name\" must be a non-empty string", ...
};

struct ParsedTurn {
  std::string content;  // the text outside the blocks, trimmed
  std::vector<ToolCall> calls;
  std::vector<ToolCallError> errors;
  int blocks() const { return static_cast<int>(calls.size() + errors.size()); }
};

// Splits a turn into its text and calls. A block left open at the end (the
// turn was cut by max_new_tokens) is an error; a stray "</tool_call>" is text.
ParsedTurn parse_tool_calls(std::string_view turn);

}  // namespace relay::env
