#pragma once

// Private to relay_tasks: the built-in tasks' constructors, which make_task
// (task.cc) dispatches to, and the pieces they share.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "relay/common/status.h"
#include "relay/rollout/options.h"
#include "relay/rollout/task.h"

namespace relay::rollout {

// Called by make_task once check(TaskConfig) has passed, so the configs obey
// their rules; errors name the file and line of bad data.
StatusOr<std::unique_ptr<Task>> make_arithmetic_task(const ArithmeticTaskConfig& config,
                                                     uint64_t seed);
// `chat_template` is the format the prompts will be rendered in (JsonlKeys).
StatusOr<std::unique_ptr<Task>> make_math_answer_task(const std::string& path,
                                                      const MathAnswerTaskConfig& config,
                                                      model::ChatTemplate chat_template);
StatusOr<std::unique_ptr<Task>> make_jsonl_task(const std::string& path,
                                                const JsonlTaskConfig& config,
                                                model::ChatTemplate chat_template);

// Wraps `task` so that its prompts are rendered in chat.chat_template (see
// task.h). Fails when chat.system_prompt holds one of the format's special
// tokens. REQUIRES: chat.chat_template != kNone.
StatusOr<std::unique_ptr<Task>> make_chat_task(std::unique_ptr<Task> task,
                                               const model::ChatOptions& chat);

// Which fields of a JSONL line make a prompt.
struct JsonlKeys {
  // Required: a string, or (with a chat template) a list of {"role", "content"}
  // messages, which goes to TaskPrompt::messages, leaving `prompt` empty.
  std::string prompt;
  std::string answer;  // required string or number (a number is rendered as its JSON text)
  std::string target;  // optional string; "" = the task has no targets
  // The format the prompts will be rendered in. kNone: a message list is an
  // error. Otherwise every prompt, message and target is checked for it
  // (find_chat_problem; no special token of the format in a string prompt
  // or a target).
  model::ChatTemplate chat_template = model::ChatTemplate::kNone;
};

// Reads the whole JSONL file at `path`: one prompt per non-blank line, in
// order (TaskPrompt::index counts prompts, not lines), id "<path>:<line>".
// Any bad line fails the whole read with InvalidArgument naming the file,
// the 1-based line and the field: "data/q.jsonl:12: field 'answer': missing".
// A file with no prompts is an error too.
StatusOr<std::vector<TaskPrompt>> read_jsonl_prompts(const std::string& path,
                                                     const JsonlKeys& keys);

// The prompt at `index` of a finite task, or OutOfRange naming the task.
StatusOr<TaskPrompt> prompt_at(const std::vector<TaskPrompt>& prompts, int64_t index,
                               std::string_view task_name);

// `response` without one trailing "<eos>", which is how the char tokenizer
// renders end-of-sequence when the rollout decodes the stop token.
std::string_view strip_eos(std::string_view response);

}  // namespace relay::rollout
