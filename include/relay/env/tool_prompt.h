#pragma once

// Tools in the prompt, as the Qwen2.5 / Qwen3 chat templates (ChatML) render
// them, byte for byte like Hugging Face's apply_chat_template(messages,
// tools=...):
//
//   - the tool list goes into the system message: its content (if any), a
//     blank line, then a "# Tools" section listing each tool's JSON schema
//     (Jinja's `tojson`: Python's json.dumps with ", " and ": " separators,
//     keys in their given order, non-ASCII kept) inside <tools></tools>, and
//     the instruction to answer with <tool_call> blocks;
//   - tool results come back as one user turn holding one
//     <tool_response>...</tool_response> per result, consecutive results
//     merged into the same turn.
//
// Like relay's chat templates (model/chat_template.h) nothing is added by
// default: Qwen2.5's template writes "You are Qwen, created by Alibaba Cloud.
// You are a helpful assistant." when the conversation has no system message
// and Qwen3's writes nothing; a run that wants Qwen2.5's exact prompt sets
// model.system_prompt to that sentence. Pure text, no LibTorch.

#include <string>
#include <string_view>
#include <vector>

#include "relay/common/status.h"
#include "relay/env/tool_call.h"
#include "relay/model/chat_template.h"

namespace relay::env {

// `json` re-serialized as Jinja's tojson filter writes it (Python json.dumps,
// ensure_ascii=False, default separators, key order kept). InvalidArgument
// when it is not JSON.
StatusOr<std::string> python_json(std::string_view json);

// The system message's content with the tool section: `system` (may be
// empty), then "# Tools" with each of `tool_schemas` (JSON objects in the
// OpenAI function format). InvalidArgument naming the schema that is not a
// JSON object.
StatusOr<std::string> tools_system_content(std::string_view system,
                                           const std::vector<std::string>& tool_schemas);

// What follows the end-of-turn token of an assistant turn when the
// environment answers with `messages` ("tool" and "user" roles): the newline
// ChatML writes after every message, consecutive tool messages as one user
// turn of <tool_response> blocks, each user message as a user turn, then the
// assistant header the model continues from -- what the template renders for
// [..., assistant, messages...] with the generation prompt, after the
// assistant's end-of-turn token. Appended to the episode's tokens as they
// are (token-in/token-out). Llama 3 takes user messages only (its tool
// format is another); kNone concatenates the contents as they are.
// InvalidArgument naming the message for another role, or a tool message
// under llama3.
StatusOr<std::string> render_observation(model::ChatTemplate t,
                                         const std::vector<model::ChatMessage>& messages);

// One message of a conversation as an OpenAI chat client sends it.
struct ConversationMessage {
  std::string role;  // system | user | assistant | tool
  std::string content;
  std::vector<ToolCall> tool_calls;  // assistant: the calls it made, arguments as JSON objects
};

// A whole conversation as the chat template renders it, byte for byte like
// Hugging Face's apply_chat_template(messages, tools=...) with Qwen2.5's and
// Qwen3's templates (ChatML): the system message first, with the tool
// section when `tool_schemas` is non-empty (tools_system_content); user
// turns; assistant turns with their content, then each call as a
// <tool_call> block holding {"name": ..., "arguments": ...} (tojson), a
// newline before each block but a first one that follows no content;
// consecutive tool messages as one user turn of <tool_response> blocks; and
// the assistant header when `add_generation_prompt`. Qwen3's <think>
// handling of earlier turns is not reproduced: relay keeps an episode's
// earlier turns as the tokens that were sampled. llama3: system, user and
// assistant messages without tools. kNone has no conversation format.
// InvalidArgument naming the message: "messages[2].role: ...".
StatusOr<std::string> render_conversation(model::ChatTemplate t,
                                          const std::vector<ConversationMessage>& messages,
                                          const std::vector<std::string>& tool_schemas,
                                          bool add_generation_prompt = true);

}  // namespace relay::env
