// The "jsonl" task, and the JSONL reader it shares with "math_answer".

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <nlohmann/json.hpp>

#include "relay/common/file_io.h"
#include "rollout/builtin_tasks.h"

namespace relay::rollout {
namespace {

using nlohmann::json;

// `s` without leading and trailing ASCII whitespace. (absl's version takes
// absl::string_view, which is not std::string_view in Debian's absl.)
std::string_view trim(std::string_view s) {
  const auto space = [](char c) { return c == ' ' || (c >= '\t' && c <= '\r'); };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

// ---- reading ----------------------------------------------------------------

// The text of j[key]: nullopt when the key is absent; an error naming the
// line and field when it has a type other than string (or number, where
// `allow_number`; a number is rendered as its JSON text, "42" or "0.5").
StatusOr<std::optional<std::string>> field_text(const json& j, const std::string& key,
                                                const std::string& where, bool allow_number) {
  const auto it = j.find(key);
  if (it == j.end()) return std::optional<std::string>();
  if (it->is_string()) return std::optional<std::string>(it->get<std::string>());
  if (allow_number && it->is_number()) return std::optional<std::string>(it->dump());
  return InvalidArgumentError(absl::StrCat(where, ": field '", key, "': expected a string",
                                           allow_number ? " or number" : "", ", got ",
                                           it->type_name()));
}

StatusOr<std::string> required_text(const json& j, const std::string& key, const std::string& where,
                                    bool allow_number) {
  RELAY_ASSIGN_OR_RETURN(std::optional<std::string> text, field_text(j, key, where, allow_number));
  if (!text) return InvalidArgumentError(absl::StrCat(where, ": field '", key, "': missing"));
  return *std::move(text);
}

// nlohmann's parse error without its "[json.exception.parse_error.101] " tag.
std::string parse_error_text(const json::parse_error& e) {
  std::string_view what = e.what();
  const size_t tag_end = what.find("] ");
  if (tag_end != std::string_view::npos) what.remove_prefix(tag_end + 2);
  return std::string(what);
}

// j[key] as a list of chat messages; `where` is "<path>:<line>". Errors name
// the element: "field 'prompt[1].content': missing".
StatusOr<std::vector<model::ChatMessage>> parse_messages(const json& list, const std::string& key,
                                                         const std::string& where) {
  std::vector<model::ChatMessage> messages;
  for (size_t i = 0; i < list.size(); ++i) {
    const json& m = list[i];
    const std::string at = absl::StrCat(where, ": field '", key, "[", i, "]");
    if (!m.is_object()) {
      return InvalidArgumentError(absl::StrCat(at, "': expected an object with \"role\" and ",
                                               "\"content\", got ", m.type_name()));
    }
    for (const auto& [name, value] : m.items()) {
      if (name != "role" && name != "content") {
        return InvalidArgumentError(absl::StrCat(at, ".", name,
                                                 "': unknown key; a message has only \"role\" "
                                                 "and \"content\""));
      }
    }
    const auto text = [&](const char* name, std::string& out) -> Status {
      const auto it = m.find(name);
      if (it == m.end()) return InvalidArgumentError(absl::StrCat(at, ".", name, "': missing"));
      if (!it->is_string()) {
        return InvalidArgumentError(
            absl::StrCat(at, ".", name, "': expected a string, got ", it->type_name()));
      }
      out = it->get<std::string>();
      return OkStatus();
    };
    model::ChatMessage message;
    RELAY_RETURN_IF_ERROR(text("role", message.role));
    RELAY_RETURN_IF_ERROR(text("content", message.content));
    messages.push_back(std::move(message));
  }
  return messages;
}

// The prompt field: a non-empty string, or with a chat template a list of
// messages (TaskPrompt::messages). Either way checked for the template.
Status parse_prompt_field(const json& j, const JsonlKeys& keys, const std::string& where,
                          TaskPrompt& p) {
  const auto it = j.find(keys.prompt);
  if (it != j.end() && it->is_array()) {
    if (keys.chat_template == model::ChatTemplate::kNone) {
      return InvalidArgumentError(absl::StrCat(
          where, ": field '", keys.prompt,
          "': a list of messages needs a chat template; set model.chat_template to chatml, "
          "llama3 or auto"));
    }
    RELAY_ASSIGN_OR_RETURN(p.messages, parse_messages(*it, keys.prompt, where));
    if (std::optional<model::ChatProblem> problem =
            model::find_chat_problem(keys.chat_template, p.messages)) {
      return InvalidArgumentError(
          absl::StrCat(where, ": field '", keys.prompt, problem->path, "': ", problem->what));
    }
    return OkStatus();
  }
  if (it != j.end() && !it->is_string()) {
    return InvalidArgumentError(absl::StrCat(
        where, ": field '", keys.prompt, "': expected a string",
        keys.chat_template == model::ChatTemplate::kNone ? "" : " or a list of messages", ", got ",
        it->type_name()));
  }
  RELAY_ASSIGN_OR_RETURN(p.prompt, required_text(j, keys.prompt, where, /*allow_number=*/false));
  if (p.prompt.empty()) {
    return InvalidArgumentError(absl::StrCat(where, ": field '", keys.prompt, "': empty"));
  }
  if (std::string_view token = model::find_chat_token(keys.chat_template, p.prompt);
      !token.empty()) {
    return InvalidArgumentError(absl::StrCat(
        where, ": field '", keys.prompt, "': contains '", std::string(token),
        "', but with model.chat_template set a text prompt becomes one user message; give the "
        "text alone or a list of messages (or chat_template none for prompts already rendered)"));
  }
  return OkStatus();
}

// One non-blank line; `where` is "<path>:<line>".
StatusOr<TaskPrompt> parse_prompt_line(std::string_view line, const std::string& where,
                                       const JsonlKeys& keys) {
  json j;
  try {
    j = json::parse(line);
  } catch (const json::parse_error& e) {
    return InvalidArgumentError(absl::StrCat(where, ": not valid JSON: ", parse_error_text(e)));
  }
  if (!j.is_object()) {
    return InvalidArgumentError(
        absl::StrCat(where, ": expected a JSON object, got ", j.type_name()));
  }
  TaskPrompt p;
  p.id = where;
  RELAY_RETURN_IF_ERROR(parse_prompt_field(j, keys, where, p));
  RELAY_ASSIGN_OR_RETURN(p.reference, required_text(j, keys.answer, where, /*allow_number=*/true));
  if (!keys.target.empty()) {
    RELAY_ASSIGN_OR_RETURN(p.target, field_text(j, keys.target, where, /*allow_number=*/false));
    if (std::string_view token = model::find_chat_token(keys.chat_template, p.target.value_or(""));
        !token.empty()) {
      return InvalidArgumentError(
          absl::StrCat(where, ": field '", keys.target, "': contains '", std::string(token),
                       "'; the chat template appends the end-of-turn token itself"));
    }
  }
  return p;
}

// ---- regex matching (PCRE2) -------------------------------------------------

struct CodeFree {
  void operator()(pcre2_code* code) const { pcre2_code_free(code); }
};
struct MatchDataFree {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};
using Regex = std::unique_ptr<pcre2_code, CodeFree>;

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  const int n = pcre2_get_error_message(code, buffer, sizeof(buffer));
  if (n < 0) return absl::StrCat("PCRE2 error ", code);
  return std::string(reinterpret_cast<const char*>(buffer), static_cast<size_t>(n));
}

// Compiled to match the whole subject (anchored at both ends), byte-wise:
// no UTF mode, so arbitrary model output can never be "invalid UTF-8".
StatusOr<Regex> compile_full_match(const TaskPrompt& p, const std::string& field) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.reference.data()), p.reference.size(),
                    PCRE2_ANCHORED | PCRE2_ENDANCHORED, &error, &offset, nullptr);
  if (code == nullptr) {
    return InvalidArgumentError(absl::StrCat(p.id, ": field '", field, "': bad regex at offset ",
                                             offset, ": ", pcre2_message(error)));
  }
  return Regex(code);
}

// Match data is per call, so concurrent score() calls share only the
// (read-only) compiled pattern.
StatusOr<bool> full_match(const pcre2_code* code, std::string_view text, const std::string& id) {
  std::unique_ptr<pcre2_match_data, MatchDataFree> data(
      pcre2_match_data_create_from_pattern(code, nullptr));
  if (data == nullptr)
    return absl::ResourceExhaustedError(id + ": regex match data: out of memory");
  static const char kEmpty[] = "";
  const char* subject = text.empty() ? kEmpty : text.data();
  const int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(subject), text.size(), 0, 0,
                             data.get(), nullptr);
  if (rc >= 0) return true;
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  // Match or depth limit (catastrophic backtracking) and the like: the
  // pattern is unusable for this response; SafeVerifier counts it.
  return absl::ResourceExhaustedError(
      absl::StrCat(id, ": regex match failed: ", pcre2_message(rc)));
}

// ---- the task -----------------------------------------------------------------

// JSONL prompts; "exact": the trimmed response equals the trimmed answer;
// "regex": the answer is a PCRE2 pattern the whole response must match (not
// trimmed, so a pattern can require or allow surrounding text). For both, a
// trailing "<eos>" is not part of the response. Sub-score: "correct".
class JsonlTask final : public Task {
 public:
  JsonlTask(std::vector<TaskPrompt> prompts, std::vector<Regex> regexes)
      : prompts_(std::move(prompts)), regexes_(std::move(regexes)) {}

  std::string name() const override { return "jsonl"; }
  int64_t size() const override { return static_cast<int64_t>(prompts_.size()); }
  StatusOr<TaskPrompt> prompt(int64_t index) const override {
    return prompt_at(prompts_, index, "jsonl");
  }

  StatusOr<Score> score(const TaskPrompt& prompt, std::string_view response) const override {
    response = strip_eos(response);
    bool correct = false;
    if (regexes_.empty()) {
      correct = trim(response) == trim(prompt.reference);
    } else {
      RELAY_ASSIGN_OR_RETURN(const pcre2_code* code, regex_for(prompt));
      RELAY_ASSIGN_OR_RETURN(correct, full_match(code, response, prompt.id));
    }
    Score s;
    s.reward = correct ? 1.0 : 0.0;
    s.sub_scores = {{"correct", s.reward}};
    return s;
  }

 private:
  // The pattern compiled at load time for this prompt. A prompt that is not
  // this task's (wrong index, or a different answer) is a caller's bug.
  StatusOr<const pcre2_code*> regex_for(const TaskPrompt& prompt) const {
    const bool known = prompt.index >= 0 && prompt.index < size() &&
                       prompts_[prompt.index].reference == prompt.reference;
    if (!known) {
      return FailedPreconditionError(
          absl::StrCat(prompt.id, ": prompt ", prompt.index, " is not one of this jsonl task's"));
    }
    return regexes_[prompt.index].get();
  }

  std::vector<TaskPrompt> prompts_;
  std::vector<Regex> regexes_;  // one per prompt for "regex", empty for "exact"
};

}  // namespace

StatusOr<std::vector<TaskPrompt>> read_jsonl_prompts(const std::string& path,
                                                     const JsonlKeys& keys) {
  StatusOr<std::string> text = read_file(path);
  if (!text.ok()) {
    return Status(text.status().code(), absl::StrCat("task.path: ", text.status().message()));
  }
  std::vector<TaskPrompt> prompts;
  std::string_view rest = *text;
  for (int64_t line_no = 1; !rest.empty(); ++line_no) {
    const size_t eol = rest.find('\n');
    std::string_view line = rest.substr(0, eol);
    rest.remove_prefix(eol == std::string_view::npos ? rest.size() : eol + 1);
    if (trim(line).empty()) continue;
    RELAY_ASSIGN_OR_RETURN(TaskPrompt p,
                           parse_prompt_line(line, absl::StrCat(path, ":", line_no), keys));
    p.index = static_cast<int64_t>(prompts.size());
    prompts.push_back(std::move(p));
  }
  if (prompts.empty()) return InvalidArgumentError(absl::StrCat(path, ": no prompts"));
  return prompts;
}

StatusOr<std::unique_ptr<Task>> make_jsonl_task(const std::string& path,
                                                const JsonlTaskConfig& config,
                                                model::ChatTemplate chat_template) {
  RELAY_ASSIGN_OR_RETURN(std::vector<TaskPrompt> prompts,
                         read_jsonl_prompts(path, {config.prompt_key, config.answer_key,
                                                   config.target_key, chat_template}));
  std::vector<Regex> regexes;
  if (config.match == AnswerMatch::kRegex) {
    regexes.reserve(prompts.size());
    for (const TaskPrompt& p : prompts) {
      RELAY_ASSIGN_OR_RETURN(Regex r, compile_full_match(p, config.answer_key));
      regexes.push_back(std::move(r));
    }
  }
  return std::unique_ptr<Task>(std::make_unique<JsonlTask>(std::move(prompts), std::move(regexes)));
}

}  // namespace relay::rollout
