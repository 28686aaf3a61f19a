#pragma once

// Tasks: where prompts come from and how responses are scored.
//
// A task is an indexed source of prompts: prompt(i) is a pure function of the
// task's options, its seed and i (a generated stream) or of line i of a file,
// so the trainer's prompt dispenser can hand out indices and any worker can
// rebuild the same prompt. score() is the verifier. Tasks work on text; the
// rollout worker tokenizes.
//
// Built in (make_task): "arithmetic" (the toy `<3+4+5>` -> `12#`),
// "math_answer" (JSONL question/answer, \boxed{} or last-number extraction),
// "jsonl" (JSONL prompts with an exact or regex verifier).
//
// With a chat template (model.chat_template) make_task wraps the task so that
// every prompt is a rendered conversation ending with the assistant header,
// every target ends with the end-of-turn token, that token is a stop string,
// and score() sees the response without it (model/chat_template.h).
//
// Verifiers are user-facing code paths that see arbitrary model output; run
// them through SafeVerifier, which turns a throw or a timeout into reward 0
// and a counted error instead of a dead worker.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "relay/common/status.h"
#include "relay/model/chat_template.h"
#include "relay/rollout/options.h"

namespace relay::rollout {

struct TaskPrompt {
  int64_t index = 0;  // position in the task's stream or file
  std::string id;     // stable, human-readable: "arithmetic/17", "data/q.jsonl:12"
  // Text given to the policy; with a chat template, `messages` rendered.
  std::string prompt;
  // With a chat template: the conversation `prompt` renders (the system
  // prompt, then the file's messages or the prompt text as one user message).
  // Empty without one.
  std::vector<model::ChatMessage> messages;
  std::string reference;  // what the verifier compares against (may be empty)
  // A target solution, for prefix guidance and warm starts; with a chat
  // template it ends with the end-of-turn token.
  std::optional<std::string> target;
};

struct Score {
  double reward = 0.0;                       // [0, 1] for built-ins; any finite float allowed
  std::map<std::string, double> sub_scores;  // named parts, e.g. {"correct", "formatted"}
};

class Task {
 public:
  virtual ~Task() = default;
  virtual std::string name() const = 0;
  // Number of prompts; -1 for an unbounded generated stream.
  virtual int64_t size() const = 0;
  // Prompt `index`; OutOfRange past the end of a finite task.
  virtual StatusOr<TaskPrompt> prompt(int64_t index) const = 0;
  // Scores `response` (the decoded response text, stop text included, except
  // a chat template's end-of-turn token, which the chat wrapper removes) for
  // `prompt`. A malformed response is a low score, not an error; errors are
  // for broken tasks. May throw (SafeVerifier guards callers). Must be safe
  // to call concurrently (an abandoned call may still be running). The
  // built-in verifiers ignore one trailing "<eos>", the char tokenizer's
  // rendering of end-of-sequence.
  virtual StatusOr<Score> score(const TaskPrompt& prompt, std::string_view response) const = 0;
  // Text that ends a response for this task (e.g. "#" for arithmetic); the
  // rollout maps each to a stop token.
  virtual std::vector<std::string> stop_strings() const { return {}; }
};

// Builds the task named by config.name. `seed` drives generated streams.
// `chat` is the resolved model.chat_template and model.system_prompt
// (resolve_chat_template); with kNone prompts are used as written and a JSONL
// message list is an error. Errors name the config field or the file and line
// (JSONL tasks read and check their whole file here, so a bad line fails at
// startup, not mid-run).
StatusOr<std::unique_ptr<Task>> make_task(const TaskConfig& config, uint64_t seed,
                                          const model::ChatOptions& chat = {});

// The same task for a process that samples none of its prompts (`relay
// serve`, which needs only the stop strings and the chat format): a task
// read from a file reads nothing, so its file may be absent on the serving
// machine; it then has no prompts, and prompt() and score() fail naming the
// task. A generated task is built as make_task builds it.
StatusOr<std::unique_ptr<Task>> make_task_without_prompts(const TaskConfig& config, uint64_t seed,
                                                          const model::ChatOptions& chat = {});

// Runs a task's verifier with a time limit. A verifier that throws, returns
// an error, returns a non-finite reward or runs past the limit yields reward
// 0 and is counted; the caller keeps going. A timed-out call is abandoned on
// its own thread (C++ cannot cancel a thread), so a verifier that never
// returns leaks that thread; it is counted in timeouts(). The thread owns
// copies of the prompt and response and a reference on the task, so the
// caller may free them (and the SafeVerifier) at once. A failed call's Score
// is reward 0 with no sub-scores. Thread-safe; each call runs on a new thread.
class SafeVerifier {
 public:
  SafeVerifier(std::shared_ptr<const Task> task, std::chrono::milliseconds timeout);

  // Never fails. `error` (when non-null) receives what went wrong, or "".
  Score score(const TaskPrompt& prompt, std::string_view response, std::string* error = nullptr);

  int64_t errors() const { return errors_.load(); }      // throws, error statuses, bad rewards
  int64_t timeouts() const { return timeouts_.load(); }  // calls abandoned at the time limit

 private:
  std::shared_ptr<const Task> task_;
  std::chrono::milliseconds timeout_;
  std::atomic<int64_t> errors_{0};
  std::atomic<int64_t> timeouts_{0};
};

}  // namespace relay::rollout
