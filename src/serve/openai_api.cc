#include "relay/serve/openai_api.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <random>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"

namespace relay::serve {
namespace {

// Ordered: tool schemas keep their key order, which the prompt shows.
using Json = nlohmann::ordered_json;

// Responses may hold a token that is part of a UTF-8 character: its text is
// written with U+FFFD for the bytes that are not valid (its `bytes` are exact).
std::string dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

std::string shown(const Json& j) {
  std::string s = dump(j);
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

// Reads one request object, field by field, keeping the first problem.
class Fields {
 public:
  explicit Fields(const Json& body) : body_(body) {}

  bool failed() const { return error_.has_value(); }
  ApiError error() const { return *error_; }
  void fail(std::string param, std::string message) {
    if (!error_) error_ = bad_request(std::move(param), std::move(message));
  }
  const Json* get(const char* key) {
    seen_.insert(key);
    auto it = body_.find(key);
    return it == body_.end() || it->is_null() ? nullptr : &*it;
  }
  void ignore(const char* key) { seen_.insert(key); }

  std::optional<double> number(const char* key, double lo, double hi) {
    const Json* v = get(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_number() || !(v->get<double>() >= lo && v->get<double>() <= hi)) {
      fail(key, absl::StrCat(key, ": must be a number in [", lo, ", ", hi, "], got ", shown(*v)));
      return std::nullopt;
    }
    return v->get<double>();
  }
  std::optional<int64_t> integer(const char* key, int64_t lo, int64_t hi) {
    const Json* v = get(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_number_integer() || v->get<int64_t>() < lo || v->get<int64_t>() > hi) {
      fail(key, absl::StrCat(key, ": must be an integer in [", lo, ", ", hi, "], got ", shown(*v)));
      return std::nullopt;
    }
    return v->get<int64_t>();
  }
  bool boolean(const char* key) {
    const Json* v = get(key);
    if (v == nullptr) return false;
    if (!v->is_boolean()) {
      fail(key, absl::StrCat(key, ": must be true or false, got ", shown(*v)));
      return false;
    }
    return v->get<bool>();
  }
  // The field may only hold its neutral value (0, {}, ...).
  void only_neutral(const char* key, const char* why) {
    const Json* v = get(key);
    if (v == nullptr) return;
    const bool neutral =
        (v->is_number() && v->get<double>() == 0) || (v->is_object() && v->empty());
    if (!neutral) fail(key, absl::StrCat(key, ": not supported by relay (", why, ")"));
  }
  // Every key of the body must have been read.
  void no_unknown_keys() {
    for (const auto& [key, value] : body_.items()) {
      if (seen_.count(key) == 0) {
        fail(key, absl::StrCat("Unrecognized request argument supplied: ", key));
        return;
      }
    }
  }

 private:
  const Json& body_;
  std::set<std::string> seen_;
  std::optional<ApiError> error_;
};

constexpr char kPenaltyWhy[] =
    "it would change the distribution whose log-probs are recorded; give 0";

// The fields both endpoints share.
void read_sampling(Fields& f, SamplingRequest& r) {
  if (const Json* model = f.get("model"); model == nullptr || !model->is_string()) {
    f.fail("model", "model: required, a string");
  } else {
    r.model = model->get<std::string>();
  }
  r.n = static_cast<int>(f.integer("n", 1, kMaxChoices).value_or(1));
  r.temperature = f.number("temperature", 0, 2);
  r.top_p = f.number("top_p", 0, 1);
  if (r.top_p && *r.top_p == 0) f.fail("top_p", "top_p: must be in (0, 1], got 0");
  r.top_k = f.integer("top_k", -1, int64_t{1} << 31);
  r.max_tokens = f.integer("max_tokens", 1, int64_t{1} << 31);
  if (auto m = f.integer("max_completion_tokens", 1, int64_t{1} << 31)) r.max_tokens = m;
  if (const Json* stop = f.get("stop")) {
    if (stop->is_string()) {
      r.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array() && stop->size() <= kMaxStops) {
      for (const Json& s : *stop) {
        if (!s.is_string()) break;
        r.stop.push_back(s.get<std::string>());
      }
      if (r.stop.size() != stop->size()) f.fail("stop", "stop: must be a string or strings");
    } else {
      f.fail("stop", absl::StrCat("stop: must be a string or up to ", kMaxStops, " strings"));
    }
    for (const std::string& s : r.stop) {
      if (s.empty()) f.fail("stop", "stop: must not hold an empty string");
    }
  }
  if (auto seed = f.integer("seed", INT64_MIN, INT64_MAX)) r.seed = static_cast<uint64_t>(*seed);
  r.stream = f.boolean("stream");
  if (const Json* options = f.get("stream_options")) {
    if (!r.stream) f.fail("stream_options", "stream_options: only with stream: true");
    if (!options->is_object()) {
      f.fail("stream_options", "stream_options: must be an object");
    } else {
      for (const auto& [key, value] : options->items()) {
        if (key != "include_usage" || !value.is_boolean()) {
          f.fail("stream_options", absl::StrCat("stream_options.", key,
                                                ": only include_usage (true or false) is known"));
        }
      }
      r.include_usage = options->value("include_usage", false);
    }
  }
  f.only_neutral("frequency_penalty", kPenaltyWhy);
  f.only_neutral("presence_penalty", kPenaltyWhy);
  f.only_neutral("logit_bias", kPenaltyWhy);
  for (const char* key : {"user", "metadata", "store", "service_tier"}) f.ignore(key);
}

// A message's content: a string, or text parts joined by newlines (as vLLM
// joins them); null is "".
std::optional<std::string> read_content(Fields& f, const Json& m, const std::string& at) {
  auto it = m.find("content");
  if (it == m.end() || it->is_null()) return std::string();
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    std::string out;
    for (size_t p = 0; p < it->size(); ++p) {
      const Json& part = (*it)[p];
      const std::string where = absl::StrCat(at, ".content[", p, "]");
      if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
          !part["text"].is_string()) {
        f.fail(where, absl::StrCat(where, ": only {\"type\": \"text\", \"text\": ...} parts"));
        return std::nullopt;
      }
      if (p > 0) out += '\n';
      out += part["text"].get<std::string>();
    }
    return out;
  }
  f.fail(at + ".content", absl::StrCat(at, ".content: must be a string, text parts or null"));
  return std::nullopt;
}

std::vector<env::ToolCall> read_tool_calls(Fields& f, const Json& calls, const std::string& at) {
  std::vector<env::ToolCall> out;
  if (!calls.is_array()) {
    f.fail(at, absl::StrCat(at, ": must be an array"));
    return out;
  }
  for (size_t c = 0; c < calls.size(); ++c) {
    const std::string where = absl::StrCat(at, "[", c, "]");
    const Json& call = calls[c];
    const Json* fn = call.is_object() && call.contains("function") ? &call["function"] : nullptr;
    if (fn == nullptr || !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string()) {
      f.fail(where, absl::StrCat(where, ".function.name: required, a string"));
      return out;
    }
    env::ToolCall tc;
    tc.name = (*fn)["name"].get<std::string>();
    const Json args = fn->value("arguments", Json("{}"));
    // OpenAI sends the arguments as JSON text; Hugging Face's templates take
    // the object (vLLM parses it before rendering), so an object is accepted too.
    Json parsed = args.is_string() ? Json::parse(args.get<std::string>(), nullptr, false) : args;
    if (parsed.is_discarded() || !parsed.is_object()) {
      f.fail(where + ".function.arguments",
             absl::StrCat(where, ".function.arguments: must be a JSON object (as text)"));
      return out;
    }
    tc.arguments = parsed.dump();
    out.push_back(std::move(tc));
  }
  return out;
}

void read_messages(Fields& f, ChatRequest& r) {
  const Json* messages = f.get("messages");
  if (messages == nullptr || !messages->is_array() || messages->empty()) {
    f.fail("messages", "messages: required, a non-empty array");
    return;
  }
  for (size_t i = 0; i < messages->size(); ++i) {
    const Json& m = (*messages)[i];
    const std::string at = absl::StrCat("messages[", i, "]");
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      f.fail(at + ".role", absl::StrCat(at, ".role: required, a string"));
      return;
    }
    env::ConversationMessage out;
    out.role = m["role"].get<std::string>();
    if (out.role == "developer") out.role = "system";  // OpenAI's newer name for it
    std::optional<std::string> content = read_content(f, m, at);
    if (!content) return;
    out.content = *std::move(content);
    if (auto calls = m.find("tool_calls"); calls != m.end() && !calls->is_null()) {
      out.tool_calls = read_tool_calls(f, *calls, at + ".tool_calls");
    }
    r.messages.push_back(std::move(out));
  }
}

void read_tools(Fields& f, ChatRequest& r) {
  if (const Json* tools = f.get("tools")) {
    if (!tools->is_array()) {
      f.fail("tools", "tools: must be an array");
    } else {
      for (size_t i = 0; i < tools->size(); ++i) {
        const Json& t = (*tools)[i];
        if (!t.is_object() || t.value("type", "") != "function" || !t.contains("function") ||
            !t["function"].is_object() || !t["function"].contains("name") ||
            !t["function"]["name"].is_string()) {
          f.fail(
              absl::StrCat("tools[", i, "]"),
              absl::StrCat("tools[", i,
                           "]: must be {\"type\": \"function\", \"function\": {\"name\": ...}}"));
          return;
        }
        r.tools.push_back(t.dump());
      }
    }
  }
  if (const Json* choice = f.get("tool_choice")) {
    const std::string c = choice->is_string() ? choice->get<std::string>() : "";
    if (c == "none") {
      r.tool_choice_none = true;
    } else if (c != "auto") {
      f.fail("tool_choice",
             absl::StrCat("tool_choice: relay takes \"auto\" or \"none\", got ", shown(*choice)));
    }
  }
  f.ignore("parallel_tool_calls");
  if (const Json* format = f.get("response_format")) {
    if (!format->is_object() || format->value("type", "") != "text") {
      f.fail("response_format", "response_format: only {\"type\": \"text\"} is supported");
    }
  }
}

template <typename Request>
std::variant<Request, ApiError> parse_body(std::string_view body, void (*read)(Fields&, Request&)) {
  Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return bad_request("", "the request body must be a JSON object");
  }
  Fields f(j);
  Request r;
  read_sampling(f, r);
  read(f, r);
  f.no_unknown_keys();
  if (f.failed()) return f.error();
  return r;
}

void read_chat(Fields& f, ChatRequest& r) {
  read_messages(f, r);
  read_tools(f, r);
  r.logprobs = f.boolean("logprobs");
  if (auto top = f.integer("top_logprobs", 0, 20); top && *top > 0) {
    f.fail("top_logprobs",
           "top_logprobs: relay returns the sampled token's log-prob only; give 0 or leave it out");
  }
}

void read_completion(Fields& f, CompletionRequest& r) {
  const Json* prompt = f.get("prompt");
  if (prompt != nullptr && prompt->is_string()) {
    r.prompt = prompt->get<std::string>();
  } else if (prompt != nullptr && prompt->is_array() && !prompt->empty() &&
             (*prompt)[0].is_number_integer()) {
    r.prompt_is_ids = true;
    for (const Json& id : *prompt) {
      if (!id.is_number_integer()) {
        f.fail("prompt", "prompt: token ids must all be integers");
        break;
      }
      r.prompt_ids.push_back(id.get<int64_t>());
    }
  } else {
    f.fail("prompt", "prompt: required, one string or one array of token ids (no batches)");
  }
  if (r.prompt.empty() && r.prompt_ids.empty() && !f.failed()) f.fail("prompt", "prompt: empty");
  if (const Json* lp = f.get("logprobs")) {
    if (!lp->is_number_integer() || lp->get<int64_t>() < 0 || lp->get<int64_t>() > 5) {
      f.fail("logprobs", absl::StrCat("logprobs: must be an integer in [0, 5], got ", shown(*lp)));
    } else if (lp->get<int64_t>() > 0) {
      f.fail("logprobs",
             "logprobs: relay returns the sampled token's log-prob only; give 0 for it");
    } else {
      r.logprobs = true;
    }
  }
  if (f.boolean("echo")) f.fail("echo", "echo: not supported by relay");
  if (f.get("suffix") != nullptr) f.fail("suffix", "suffix: not supported by relay");
  if (auto best_of = f.integer("best_of", 1, kMaxChoices); best_of && *best_of != 1) {
    f.fail("best_of", "best_of: not supported by relay (only 1)");
  }
}

Json token_entries(const std::vector<TokenInfo>& tokens) {
  Json content = Json::array();
  for (const TokenInfo& t : tokens) {
    Json bytes = Json::array();
    for (unsigned char c : t.text) bytes.push_back(static_cast<int>(c));
    content.push_back({{"token", t.text},
                       {"logprob", t.logprob},
                       {"bytes", std::move(bytes)},
                       {"top_logprobs", Json::array()}});
  }
  return content;
}

// Legacy completions' logprobs: parallel lists.
Json completion_logprobs(const std::vector<TokenInfo>& tokens, int64_t text_offset) {
  Json names = Json::array(), values = Json::array(), offsets = Json::array(), top = Json::array();
  for (const TokenInfo& t : tokens) {
    names.push_back(t.text);
    values.push_back(t.logprob);
    offsets.push_back(text_offset);
    text_offset += static_cast<int64_t>(t.text.size());
    top.push_back(nullptr);
  }
  return {{"tokens", names},
          {"token_logprobs", values},
          {"top_logprobs", top},
          {"text_offset", offsets}};
}

Json token_ids(const std::vector<TokenInfo>& tokens) {
  Json ids = Json::array();
  for (const TokenInfo& t : tokens) ids.push_back(t.id);
  return ids;
}

Json token_versions(const std::vector<TokenInfo>& tokens) {
  Json v = Json::array();
  for (const TokenInfo& t : tokens) v.push_back(t.version);
  return v;
}

Json tool_calls_json(const std::vector<ResponseToolCall>& calls, bool streamed) {
  Json out = Json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    Json c = Json::object();
    if (streamed) c["index"] = i;  // a chunk's calls say which call they continue
    c["id"] = calls[i].id;
    c["type"] = "function";
    c["function"] = {{"name", calls[i].name}, {"arguments", calls[i].arguments}};
    out.push_back(std::move(c));
  }
  return out;
}

Json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

Json head_json(const ResponseHead& head, const char* object) {
  return {{"id", head.id}, {"object", object}, {"created", head.created}, {"model", head.model}};
}

void add_relay_fields(Json& out, const ResponseHead& head) {
  out["prompt_token_ids"] = head.prompt_token_ids;
  if (!head.episode_id.empty()) out["episode_id"] = head.episode_id;
}

// The fields every choice (and chunk choice) ends with: how it finished,
// and its tokens' ids and versions.
void add_choice_end(Json& choice, const std::string& finish_reason,
                    const std::vector<TokenInfo>& tokens) {
  choice["finish_reason"] = finish_reason.empty() ? Json(nullptr) : Json(finish_reason);
  choice["token_ids"] = token_ids(tokens);
  choice["token_versions"] = token_versions(tokens);
}

// A whole response: its choices, usage and relay's fields.
std::string response(Json out, Json choices, const Usage& usage, const ResponseHead& head) {
  out["choices"] = std::move(choices);
  out["usage"] = usage_json(usage);
  add_relay_fields(out, head);
  return dump(out);
}

}  // namespace

std::string ApiError::json() const {
  return dump(Json{{"error",
                    {{"message", message},
                     {"type", type},
                     {"param", param.empty() ? Json(nullptr) : Json(param)},
                     {"code", code.empty() ? Json(nullptr) : Json(code)}}}});
}

ApiError bad_request(std::string param, std::string message) {
  ApiError e;
  e.status = 400;
  e.param = std::move(param);
  e.message = std::move(message);
  return e;
}

std::variant<ChatRequest, ApiError> parse_chat_request(std::string_view body) {
  return parse_body<ChatRequest>(body, read_chat);
}

std::variant<CompletionRequest, ApiError> parse_completion_request(std::string_view body) {
  return parse_body<CompletionRequest>(body, read_completion);
}

std::string chat_completion_json(const ResponseHead& head, const std::vector<Choice>& choices,
                                 const Usage& usage, bool logprobs) {
  Json list = Json::array();
  for (const Choice& c : choices) {
    Json message = {{"role", "assistant"},
                    {"content", c.content ? Json(*c.content) : Json(nullptr)}};
    if (!c.tool_calls.empty()) message["tool_calls"] = tool_calls_json(c.tool_calls, false);
    Json choice = {{"index", c.index},
                   {"message", std::move(message)},
                   {"logprobs", logprobs ? Json{{"content", token_entries(c.tokens)}} : Json()}};
    add_choice_end(choice, c.finish_reason, c.tokens);
    list.push_back(std::move(choice));
  }
  return response(head_json(head, "chat.completion"), std::move(list), usage, head);
}

std::string completion_json(const ResponseHead& head, const std::vector<Choice>& choices,
                            const Usage& usage, bool logprobs) {
  Json list = Json::array();
  for (const Choice& c : choices) {
    Json choice = {{"index", c.index},
                   {"text", c.content.value_or("")},
                   {"logprobs", logprobs ? completion_logprobs(c.tokens, 0) : Json()}};
    add_choice_end(choice, c.finish_reason, c.tokens);
    list.push_back(std::move(choice));
  }
  return response(head_json(head, "text_completion"), std::move(list), usage, head);
}

std::string chat_chunk_json(const ResponseHead& head, const ChoiceDelta& d, bool logprobs) {
  Json out = head_json(head, "chat.completion.chunk");
  Json delta = Json::object();
  if (d.first) delta["role"] = "assistant";
  if (!d.text.empty() || d.first) delta["content"] = d.text;
  if (!d.tool_calls.empty()) delta["tool_calls"] = tool_calls_json(d.tool_calls, true);
  const bool entries = logprobs && !d.tokens.empty();
  Json choice = {{"index", d.index},
                 {"delta", std::move(delta)},
                 {"logprobs", entries ? Json{{"content", token_entries(d.tokens)}} : Json()}};
  add_choice_end(choice, d.finish_reason, d.tokens);
  out["choices"] = Json::array({std::move(choice)});
  if (d.first) add_relay_fields(out, head);
  return dump(out);
}

std::string completion_chunk_json(const ResponseHead& head, const ChoiceDelta& d, bool logprobs) {
  Json out = head_json(head, "text_completion");
  const bool entries = logprobs && !d.tokens.empty();
  Json choice = {{"index", d.index},
                 {"text", d.text},
                 {"logprobs", entries ? completion_logprobs(d.tokens, 0) : Json()}};
  add_choice_end(choice, d.finish_reason, d.tokens);
  out["choices"] = Json::array({std::move(choice)});
  if (d.first) add_relay_fields(out, head);
  return dump(out);
}

std::string usage_chunk_json(const ResponseHead& head, bool chat, const Usage& usage) {
  Json out = head_json(head, chat ? "chat.completion.chunk" : "text_completion");
  out["choices"] = Json::array();
  out["usage"] = usage_json(usage);
  return dump(out);
}

std::string models_json(const std::string& model, int64_t created) {
  return dump(Json{
      {"object", "list"},
      {"data",
       Json::array(
           {{{"id", model}, {"object", "model"}, {"created", created}, {"owned_by", "relay"}}})}});
}

std::string random_id(std::string_view prefix) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id(prefix);
  for (int i = 0; i < 24; ++i) id += kHex[rng() & 15];
  return id;
}

std::string sse_event(const std::string& json) { return absl::StrCat("data: ", json, "\n\n"); }

}  // namespace relay::serve
