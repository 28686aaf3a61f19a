#include "relay/env/tool_call.h"

#include <nlohmann/json.hpp>

#include <utility>

namespace relay::env {
namespace {

// ordered: the arguments keep the order the model wrote them in.
using json = nlohmann::ordered_json;

std::string_view trim(std::string_view s) {
  const auto space = [](char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

// The call in one block's body, or what is wrong with it.
std::pair<ToolCall, std::string> parse_call(std::string_view body) {
  ToolCall call;
  const json parsed = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return {call, "not a JSON object"};
  if (!parsed.is_object()) {
    return {call, std::string("not a JSON object, got a ") + parsed.type_name()};
  }
  const auto name = parsed.find("name");
  if (name == parsed.end() || !name->is_string() || name->get<std::string>().empty()) {
    return {call, "\"name\" must be a non-empty string"};
  }
  call.name = name->get<std::string>();
  const auto args = parsed.find("arguments");
  if (args == parsed.end() || args->is_null()) {
    call.arguments = "{}";
  } else if (args->is_object()) {
    call.arguments = args->dump();
  } else if (args->is_string()) {
    const std::string& text = args->get_ref<const std::string&>();
    const json inner = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (inner.is_discarded() || !inner.is_object()) {
      return {call, "\"arguments\" must be an object (or a string holding one)"};
    }
    call.arguments = inner.dump();
  } else {
    return {call, "\"arguments\" must be an object (or a string holding one)"};
  }
  return {std::move(call), ""};
}

}  // namespace

ParsedTurn parse_tool_calls(std::string_view turn) {
  ParsedTurn out;
  std::string content;
  size_t pos = 0;
  int index = 0;
  while (true) {
    const size_t open = turn.find(kToolCallOpen, pos);
    if (open == std::string_view::npos) {
      content.append(turn.substr(pos));
      break;
    }
    content.append(turn.substr(pos, open - pos));
    const size_t body_start = open + kToolCallOpen.size();
    const size_t close = turn.find(kToolCallClose, body_start);
    if (close == std::string_view::npos) {
      out.errors.push_back({index, "<tool_call> is not closed by </tool_call>"});
      break;
    }
    const std::string_view body = trim(turn.substr(body_start, close - body_start));
    auto [call, error] = parse_call(body);
    if (error.empty()) {
      out.calls.push_back(std::move(call));
    } else {
      out.errors.push_back({index, std::move(error)});
    }
    ++index;
    pos = close + kToolCallClose.size();
  }
  out.content = std::string(trim(content));
  return out;
}

}  // namespace relay::env
