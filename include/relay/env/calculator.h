#pragma once

// The calculator tool of the built-in tool environment: integer arithmetic
// with + - * and parentheses, the operations of the arithmetic task, so a
// small model can learn to hand the computation to the tool.
//
//   call {"name": "calculator", "arguments": {"expression": "(12 + 3) * 7"}}  ->  "105"
//
// Errors are what the model sent wrong (a missing expression, a stray
// character, a result past 64-bit integers) and come back as InvalidArgument
// whose message the environment shows the model as the tool's output.

#include <cstdint>
#include <string>
#include <string_view>

#include "relay/common/status.h"

namespace relay::env {

// The value of an integer expression: decimal literals, binary + - *, unary
// minus, parentheses, spaces; '*' binds tighter, operators of one precedence
// associate to the left. InvalidArgument naming the offset of the first
// character it cannot read, or saying the result (or a partial one)
// overflows int64.
StatusOr<int64_t> evaluate_expression(std::string_view expression);

// The tool: `arguments` is the call's JSON object (ToolCall::arguments),
// which must hold a string "expression". The result is the value in decimal.
StatusOr<std::string> run_calculator(std::string_view arguments);

// The tool's description in the OpenAI function format, as Qwen's chat
// templates list tools inside <tools></tools> in the system message.
std::string calculator_schema();

}  // namespace relay::env
