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
    const model::ChatMessage& m = messages[i];
    if (m.role == "user") {
      absl::StrAppend(&out, "<|im_start|>user\n", m.content, "<|im_end|>\n");
      continue;
    }
    // Consecutive tool messages share one user turn.
    if (i == 0 || messages[i - 1].role != "tool") out += "<|im_start|>user";
    absl::StrAppend(&out, "\n<tool_response>\n", m.content, "\n</tool_response>");
    if (i + 1 == messages.size() || messages[i + 1].role != "tool") out += "<|im_end|>\n";
  }
  out += "<|im_start|>assistant\n";
  return out;
}

}  // namespace relay::env
