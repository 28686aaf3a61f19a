#include "relay/env/tool_prompt.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

namespace relay::env {
namespace {

using Json = nlohmann::ordered_json;

// Python's json.dumps(x, ensure_ascii=False): ", " between items, ": " after
// keys. Strings and numbers as nlohmann writes them compactly, which for
// strings is Python's escaping (\" \\ \n \r \t \b \f, other controls as
// \u00XX, everything else verbatim).
void dump_python(const Json& j, std::string& out) {
  if (j.is_object()) {
    out += '{';
    bool first = true;
    for (const auto& [key, value] : j.items()) {
      if (!first) out += ", ";
      first = false;
      out += Json(key).dump(-1, ' ', false);
      out += ": ";
      dump_python(value, out);
    }
    out += '}';
  } else if (j.is_array()) {
    out += '[';
    for (size_t i = 0; i < j.size(); ++i) {
      if (i > 0) out += ", ";
      dump_python(j[i], out);
    }
    out += ']';
  } else {
    out += j.dump(-1, ' ', false);
  }
}

constexpr char kToolsIntro[] =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are "
    "provided with function signatures within <tools></tools> XML tags:\n<tools>";
constexpr char kToolsOutro[] =
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
    "<function-name>, \"arguments\": <args-json-object>}\n</tool_call>";

// Message i of a ChatML conversation that is not the assistant's: system and
// user as themselves, consecutive tool results sharing one user turn.
void append_chatml(const std::vector<model::ChatMessage>& messages, size_t i, std::string& out) {
  const model::ChatMessage& m = messages[i];
  if (m.role != "tool") {
    absl::StrAppend(&out, "<|im_start|>", m.role, "\n", m.content, "<|im_end|>\n");
    return;
  }
  if (i == 0 || messages[i - 1].role != "tool") out += "<|im_start|>user";
  absl::StrAppend(&out, "\n<tool_response>\n", m.content, "\n</tool_response>");
  if (i + 1 == messages.size() || messages[i + 1].role != "tool") out += "<|im_end|>\n";
}

}  // namespace

StatusOr<std::string> python_json(std::string_view json) {
  Json j = Json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgumentError("not valid JSON");
  std::string out;
  dump_python(j, out);
  return out;
}

StatusOr<std::string> tools_system_content(std::string_view system,
                                           const std::vector<std::string>& tool_schemas) {
  std::string out;
  if (!system.empty()) absl::StrAppend(&out, std::string(system), "\n\n");
  out += kToolsIntro;
  for (size_t i = 0; i < tool_schemas.size(); ++i) {
    Json j = Json::parse(tool_schemas[i], nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return InvalidArgumentError(
          absl::StrCat("tool schema ", i, ": not a JSON object: ", tool_schemas[i]));
    }
    out += '\n';
    dump_python(j, out);
  }
  out += kToolsOutro;
  return out;
}

StatusOr<std::string> render_observation(model::ChatTemplate t,
                                         const std::vector<model::ChatMessage>& messages) {
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role != "tool" && role != "user") {
      return InvalidArgumentError(absl::StrCat("observation message ", i, ": role '", role,
                                               "'; an environment answers as tool or user"));
    }
    if (role == "tool" && t == model::ChatTemplate::kLlama3) {
      return InvalidArgumentError(absl::StrCat(
          "observation message ", i,
          ": a tool result, but the 'llama3' template has no tool format here; use chatml "
          "(Qwen2.5, Qwen3) or answer as user"));
    }
  }
  std::string out;
  if (t == model::ChatTemplate::kNone) {
    for (const model::ChatMessage& m : messages) out += m.content;
    return out;
  }
  if (t == model::ChatTemplate::kLlama3) {
    // render_chat writes <|begin_of_text|> before the first message; a
    // continuation has none. Llama 3 writes nothing after <|eot_id|>.
    const std::string full = model::render_chat(t, messages);
    return full.substr(std::string_view("<|begin_of_text|>").size());
  }
  out = "\n";
  for (size_t i = 0; i < messages.size(); ++i) {
    append_chatml(messages, i, out);
  }
  out += "<|im_start|>assistant\n";
  return out;
}

StatusOr<std::string> render_conversation(model::ChatTemplate t,
                                          const std::vector<ConversationMessage>& messages,
                                          const std::vector<std::string>& tool_schemas,
                                          bool add_generation_prompt) {
  if (t == model::ChatTemplate::kNone) {
    return InvalidArgumentError(
        "messages: the model has no chat template (model.chat_template "
        "none); send the prompt as text instead");
  }
  if (messages.empty()) return InvalidArgumentError("messages: empty");
  for (size_t i = 0; i < messages.size(); ++i) {
    const ConversationMessage& m = messages[i];
    const std::string at = absl::StrCat("messages[", i, "]");
    if (m.role != "system" && m.role != "user" && m.role != "assistant" && m.role != "tool") {
      return InvalidArgumentError(
          absl::StrCat(at, ".role: '", m.role, "'; expected system, user, assistant or tool"));
    }
    if (m.role == "system" && i > 0) {
      return InvalidArgumentError(absl::StrCat(at, ".role: a system message comes first only"));
    }
    if (std::string_view token = model::find_chat_token(t, m.content); !token.empty()) {
      return InvalidArgumentError(absl::StrCat(at, ".content: holds the chat token '",
                                               std::string(token),
                                               "', which would forge a turn boundary"));
    }
    if (t == model::ChatTemplate::kLlama3 && (m.role == "tool" || !m.tool_calls.empty())) {
      return InvalidArgumentError(absl::StrCat(
          at,
          ": tool calls and results need chatml (Qwen2.5, Qwen3); the 'llama3' template's "
          "tool format is another"));
    }
    if (!m.tool_calls.empty() && m.role != "assistant") {
      return InvalidArgumentError(absl::StrCat(at, ".tool_calls: only an assistant makes calls"));
    }
  }
  if (t == model::ChatTemplate::kLlama3) {
    if (!tool_schemas.empty()) {
      return InvalidArgumentError(
          "tools: need chatml (Qwen2.5, Qwen3); the 'llama3' template's tool format is another");
    }
    std::vector<model::ChatMessage> plain;
    for (const ConversationMessage& m : messages) plain.push_back({m.role, m.content});
    return model::render_chat(t, plain, add_generation_prompt);
  }
  std::string out;
  size_t first = 0;
  if (!tool_schemas.empty()) {
    const bool has_system = messages[0].role == "system";
    RELAY_ASSIGN_OR_RETURN(
        std::string system,
        tools_system_content(has_system ? messages[0].content : "", tool_schemas));
    absl::StrAppend(&out, "<|im_start|>system\n", system, "<|im_end|>\n");
    first = has_system ? 1 : 0;
  }
  std::vector<model::ChatMessage> plain;
  for (const ConversationMessage& m : messages) plain.push_back({m.role, m.content});
  for (size_t i = first; i < messages.size(); ++i) {
    const ConversationMessage& m = messages[i];
    if (m.role != "assistant") {
      append_chatml(plain, i, out);
      continue;
    }
    absl::StrAppend(&out, "<|im_start|>assistant\n", m.content);
    for (size_t c = 0; c < m.tool_calls.size(); ++c) {
      if (c > 0 || !m.content.empty()) out += '\n';
      StatusOr<std::string> arguments = python_json(m.tool_calls[c].arguments);
      if (!arguments.ok()) {
        return InvalidArgumentError(absl::StrCat("messages[", i, "].tool_calls[", c,
                                                 "].function.arguments: not valid JSON"));
      }
      absl::StrAppend(&out, "<tool_call>\n{\"name\": ", Json(m.tool_calls[c].name).dump(),
                      ", \"arguments\": ", *arguments, "}\n</tool_call>");
    }
    out += "<|im_end|>\n";
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

}  // namespace relay::env
