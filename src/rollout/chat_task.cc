// The chat wrapper make_task puts around any task when model.chat_template is
// set: prompts become rendered conversations, targets end with the
// end-of-turn token, and the verifier never sees that token.

#include "absl/strings/str_cat.h"
#include "rollout/builtin_tasks.h"

namespace relay::rollout {
namespace {

class ChatTask final : public Task {
 public:
  ChatTask(std::unique_ptr<Task> inner, model::ChatOptions chat)
      : inner_(std::move(inner)),
        chat_(std::move(chat)),
        end_of_turn_(model::end_of_turn(chat_.chat_template)) {}

  std::string name() const override { return inner_->name(); }
  int64_t size() const override { return inner_->size(); }

  // The inner prompt's messages (or its text as one user message), after the
  // system prompt unless they bring their own, rendered with the assistant
  // header; the target as the reply the model should give, end-of-turn last.
  StatusOr<TaskPrompt> prompt(int64_t index) const override {
    RELAY_ASSIGN_OR_RETURN(TaskPrompt p, inner_->prompt(index));
    std::vector<model::ChatMessage> messages;
    const bool has_system = !p.messages.empty() && p.messages[0].role == "system";
    if (!chat_.system_prompt.empty() && !has_system) {
      messages.push_back({"system", chat_.system_prompt});
    }
    if (p.messages.empty()) {
      messages.push_back({"user", std::move(p.prompt)});
    } else {
      for (model::ChatMessage& m : p.messages) messages.push_back(std::move(m));
    }
    // JSONL tasks checked their messages when they read the file; this
    // catches any other task whose text the format cannot carry.
    if (std::optional<model::ChatProblem> problem =
            model::find_chat_problem(chat_.chat_template, messages)) {
      return InvalidArgumentError(
          absl::StrCat(p.id, ": prompt messages", problem->path, ": ", problem->what));
    }
    p.prompt = model::render_chat(chat_.chat_template, messages);
    p.messages = std::move(messages);
    if (p.target) p.target = model::chat_response(chat_.chat_template, *p.target);
    return p;
  }

  // A response that stopped at the end-of-turn token decodes with its text
  // last; verifiers compare answers, so it goes before they see the response.
  StatusOr<Score> score(const TaskPrompt& prompt, std::string_view response) const override {
    if (response.size() >= end_of_turn_.size() &&
        response.substr(response.size() - end_of_turn_.size()) == end_of_turn_) {
      response.remove_suffix(end_of_turn_.size());
    }
    return inner_->score(prompt, response);
  }

  std::vector<std::string> stop_strings() const override {
    std::vector<std::string> stops = inner_->stop_strings();
    stops.push_back(end_of_turn_);
    return stops;
  }

 private:
  std::unique_ptr<Task> inner_;
  model::ChatOptions chat_;
  std::string end_of_turn_;
};

}  // namespace

StatusOr<std::unique_ptr<Task>> make_chat_task(std::unique_ptr<Task> task,
                                               const model::ChatOptions& chat) {
  RELAY_CHECK(chat.chat_template != model::ChatTemplate::kNone,
              "make_chat_task without a template");
  if (std::string_view token = model::find_chat_token(chat.chat_template, chat.system_prompt);
      !token.empty()) {
    return InvalidArgumentError(absl::StrCat("model.system_prompt: contains '", std::string(token),
                                             "', a ", model::chat_template_name(chat.chat_template),
                                             " special token: it would forge a turn"));
  }
  return std::unique_ptr<Task>(std::make_unique<ChatTask>(std::move(task), chat));
}

}  // namespace relay::rollout
