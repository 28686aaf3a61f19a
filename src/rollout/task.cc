#include "relay/rollout/task.h"

#include <cmath>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "rollout/builtin_tasks.h"

namespace relay::rollout {

namespace {

StatusOr<std::unique_ptr<Task>> make_plain_task(const TaskConfig& config, uint64_t seed,
                                                model::ChatTemplate chat_template) {
  switch (config.name) {
    case TaskKind::kArithmetic:
      return make_arithmetic_task(config.arithmetic, seed);
    case TaskKind::kMathAnswer:
      return make_math_answer_task(config.path, config.math_answer, chat_template);
    case TaskKind::kJsonl:
      return make_jsonl_task(config.path, config.jsonl, chat_template);
  }
  return InternalError("make_task: a task kind without a constructor");
}

// A file-backed task whose file was not read (make_task_without_prompts).
// The file-backed kinds end responses at no text of their own, so it has no
// stop strings; the chat wrapper adds the template's.
class PromptlessTask final : public Task {
 public:
  explicit PromptlessTask(TaskKind kind) : name_(kTaskKindNames.name(kind)) {}
  std::string name() const override { return name_; }
  int64_t size() const override { return 0; }
  StatusOr<TaskPrompt> prompt(int64_t index) const override {
    return FailedPreconditionError(
        absl::StrCat("task '", name_, "': prompt ", index, ": its file was not read"));
  }
  StatusOr<Score> score(const TaskPrompt& prompt, std::string_view) const override {
    return FailedPreconditionError(
        absl::StrCat("task '", name_, "': ", prompt.id, ": its file was not read"));
  }

 private:
  std::string name_;
};

Status check_task(const TaskConfig& config, const model::ChatOptions& chat) {
  RELAY_RETURN_IF_ERROR(check_options(config, "task"));
  if (chat.chat_template == model::ChatTemplate::kNone && !chat.system_prompt.empty()) {
    // A system message exists only in a chat format; dropping it silently
    // would train on prompts other than the ones configured.
    return InvalidArgumentError(
        "model.system_prompt: needs model.chat_template (chatml, llama3 or auto)");
  }
  return OkStatus();
}

StatusOr<std::unique_ptr<Task>> with_chat(std::unique_ptr<Task> task,
                                          const model::ChatOptions& chat) {
  if (chat.chat_template == model::ChatTemplate::kNone) return task;
  return make_chat_task(std::move(task), chat);
}

}  // namespace

StatusOr<std::unique_ptr<Task>> make_task(const TaskConfig& config, uint64_t seed,
                                          const model::ChatOptions& chat) {
  RELAY_RETURN_IF_ERROR(check_task(config, chat));
  RELAY_ASSIGN_OR_RETURN(std::unique_ptr<Task> task,
                         make_plain_task(config, seed, chat.chat_template));
  return with_chat(std::move(task), chat);
}

StatusOr<std::unique_ptr<Task>> make_task_without_prompts(const TaskConfig& config, uint64_t seed,
                                                          const model::ChatOptions& chat) {
  RELAY_RETURN_IF_ERROR(check_task(config, chat));
  std::unique_ptr<Task> task;
  switch (config.name) {
    case TaskKind::kArithmetic: {  // generated: nothing to read
      RELAY_ASSIGN_OR_RETURN(task, make_plain_task(config, seed, chat.chat_template));
      break;
    }
    case TaskKind::kMathAnswer:
    case TaskKind::kJsonl:
      task = std::make_unique<PromptlessTask>(config.name);
      break;
  }
  if (task == nullptr) return InternalError("make_task_without_prompts: a task kind not handled");
  return with_chat(std::move(task), chat);
}

StatusOr<TaskPrompt> prompt_at(const std::vector<TaskPrompt>& prompts, int64_t index,
                               std::string_view task_name) {
  const int64_t n = static_cast<int64_t>(prompts.size());
  if (index < 0 || index >= n) {
    return OutOfRangeError(
        absl::StrCat(std::string(task_name), ": prompt index ", index, " is outside [0, ", n, ")"));
  }
  return prompts[index];
}

std::string_view strip_eos(std::string_view response) {
  constexpr std::string_view kEos = "<eos>";
  if (response.size() >= kEos.size() && response.substr(response.size() - kEos.size()) == kEos) {
    response.remove_suffix(kEos.size());
  }
  return response;
}

// ---- SafeVerifier -------------------------------------------------------------

namespace {

// One verifier call, shared by the caller and the thread running it. The
// thread holds its own copies of the prompt and response and a reference on
// the task, so when the caller abandons it at the time limit (and its
// arguments, even the SafeVerifier, may be destroyed) it touches nothing
// that can be freed under it.
struct VerifierCall {
  std::shared_ptr<const Task> task;
  TaskPrompt prompt;
  std::string response;

  std::mutex mu;
  std::condition_variable done_cv;
  bool done ABSL_GUARDED_BY(mu) = false;
  std::optional<Score> score ABSL_GUARDED_BY(mu);  // set when the call succeeded
  std::string error ABSL_GUARDED_BY(mu);           // set when it did not
};

// "" when every value is finite, else which one is not.
std::string first_non_finite(const Score& s) {
  if (!std::isfinite(s.reward)) return absl::StrCat("reward = ", s.reward);
  for (const auto& [name, value] : s.sub_scores) {
    if (!std::isfinite(value)) return absl::StrCat("sub-score '", name, "' = ", value);
  }
  return "";
}

// Runs on the verifier thread: score, turning every failure into `error`.
void run_call(VerifierCall& call) {
  std::optional<Score> score;
  std::string error;
  try {
    StatusOr<Score> s = call.task->score(call.prompt, call.response);
    if (!s.ok()) {
      error = absl::StrCat("verifier returned an error: ", s.status().ToString());
    } else if (std::string bad = first_non_finite(*s); !bad.empty()) {
      error = absl::StrCat("verifier returned a non-finite ", bad);
    } else {
      score = *std::move(s);
    }
  } catch (const std::exception& e) {
    error = absl::StrCat("verifier threw: ", e.what());
  } catch (...) {
    error = "verifier threw something that is not a std::exception";
  }
  {
    std::lock_guard<std::mutex> lock(call.mu);
    call.score = std::move(score);
    call.error = std::move(error);
    call.done = true;
  }
  call.done_cv.notify_all();
}

}  // namespace

SafeVerifier::SafeVerifier(std::shared_ptr<const Task> task, std::chrono::milliseconds timeout)
    : task_(std::move(task)), timeout_(timeout) {
  RELAY_CHECK(task_ != nullptr, "SafeVerifier: task is null");
  RELAY_CHECK(timeout_.count() > 0, "SafeVerifier: timeout must be > 0");
}

Score SafeVerifier::score(const TaskPrompt& prompt, std::string_view response, std::string* error) {
  if (error != nullptr) error->clear();
  const auto fail = [&](std::atomic<int64_t>& counter, std::string what) {
    counter.fetch_add(1);
    if (error != nullptr) *error = absl::StrCat(prompt.id, ": ", what);
    return Score{};
  };

  auto call = std::make_shared<VerifierCall>();
  call->task = task_;
  call->prompt = prompt;
  call->response = std::string(response);
  // A thread per call: a pool would need a way to replace workers stuck in
  // an abandoned call, and thread start-up (~tens of microseconds) is small
  // next to generating the response being scored.
  try {
    std::thread([call] { run_call(*call); }).detach();
  } catch (const std::system_error& e) {
    return fail(errors_, absl::StrCat("could not start a verifier thread: ", e.what()));
  }

  std::unique_lock<std::mutex> lock(call->mu);
  if (!call->done_cv.wait_for(
          lock, timeout_, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(call->mu) { return call->done; })) {
    return fail(timeouts_, absl::StrCat("verifier timed out after ", timeout_.count(),
                                        " ms; the call is abandoned"));
  }
  if (!call->score) return fail(errors_, call->error);
  return *std::move(call->score);
}

}  // namespace relay::rollout
