#pragma once

// The OpenAI API's wire format as relay's endpoint speaks it (docs/serve.md):
// requests of POST /v1/chat/completions and POST /v1/completions parsed and
// checked into plain structs, and the JSON of responses, stream chunks and
// errors. Pure functions over JSON text; no LibTorch, no HTTP.
//
// What relay adds to OpenAI's schema, in each choice: `token_ids` (every
// sampled token, the stop token included, as the trainer sees them) and
// `token_versions` (the policy version that sampled each); at the top
// level: `prompt_token_ids`, and `episode_id` inside an episode. Each
// logprobs entry is a token's behavior log-prob: the log-prob of the
// distribution it was sampled from (after temperature, top_k and top_p), the
// number relay trains on; with temperature 1 and no truncation it is the
// model's own log-prob (what `relay score` prints), as OpenAI's is. The stop
// token has an entry too, so entries and token_ids pair one to one.
//
// What is refused rather than silently ignored (400 naming the field):
// unknown fields; top_logprobs > 0 and completions' logprobs > 0; echo,
// suffix, best_of > 1; non-zero frequency/presence penalties and a
// logit_bias (they would change the distribution whose log-probs are
// recorded); response formats other than text; tool_choice other than auto
// or none. Accepted and ignored: user, metadata, store, service_tier,
// parallel_tool_calls.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "relay/env/tool_prompt.h"

namespace relay::serve {

// An error as the OpenAI API answers it: the HTTP status and
// {"error": {"message", "type", "param", "code"}}.
struct ApiError {
  int status = 400;
  std::string message;
  std::string param;  // the request field at fault, "" = none
  std::string type = "invalid_request_error";
  std::string code;  // "" = none (null)
  std::string json() const;
};

ApiError bad_request(std::string param, std::string message);

// What both endpoints take.
struct SamplingRequest {
  std::string model;
  int n = 1;                          // choices, 1..kMaxChoices
  std::optional<double> temperature;  // [0, 2]; 0 = greedy
  std::optional<double> top_p;        // (0, 1]
  std::optional<int64_t> top_k;       // relay's (and vLLM's) extension; 0 or -1 = off
  std::optional<int64_t> max_tokens;  // max_tokens or max_completion_tokens, >= 1
  std::vector<std::string> stop;      // up to 4 non-empty strings
  std::optional<uint64_t> seed;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool logprobs = false;
};
inline constexpr int kMaxChoices = 64;
inline constexpr size_t kMaxStops = 4;

struct ChatRequest : SamplingRequest {
  std::vector<env::ConversationMessage> messages;  // "developer" is read as "system"
  std::vector<std::string> tools;                  // function schemas as JSON objects
  bool tool_choice_none = false;                   // tool_choice "none": calls are not parsed
};

struct CompletionRequest : SamplingRequest {
  std::string prompt;               // text; or
  std::vector<int64_t> prompt_ids;  // token ids (prompt given as an array of integers)
  bool prompt_is_ids = false;
};

// Parse and check a request body. The error names the field as OpenAI
// does ("messages[1].content", "temperature").
std::variant<ChatRequest, ApiError> parse_chat_request(std::string_view body);
std::variant<CompletionRequest, ApiError> parse_completion_request(std::string_view body);

// One sampled token as a logprobs entry shows it.
struct TokenInfo {
  int64_t id = 0;
  std::string text;  // the token decoded alone (raw bytes; may be part of a character)
  float logprob = 0;
  int64_t version = 0;
};

// A tool call of the response, OpenAI's shape.
struct ResponseToolCall {
  std::string id;  // "call_..."
  std::string name;
  std::string arguments;  // JSON text of the arguments object
};

struct Choice {
  int index = 0;
  std::optional<std::string> content;  // null when the turn was only tool calls
  std::vector<ResponseToolCall> tool_calls;
  std::string finish_reason;  // stop | length | tool_calls
  std::vector<TokenInfo> tokens;
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
};

// Where a response came from.
struct ResponseHead {
  std::string id;  // chatcmpl-... / cmpl-...
  int64_t created = 0;
  std::string model;
  std::vector<int64_t> prompt_token_ids;
  std::string episode_id;  // "" outside an episode
};

std::string chat_completion_json(const ResponseHead& head, const std::vector<Choice>& choices,
                                 const Usage& usage, bool logprobs);
std::string completion_json(const ResponseHead& head, const std::vector<Choice>& choices,
                            const Usage& usage, bool logprobs);

// One streamed piece of a choice: new text (and, at the end, its tool
// calls), the tokens it came from, and the finish reason on the last.
struct ChoiceDelta {
  int index = 0;
  bool first = false;  // chat: carries role "assistant"
  std::string text;
  std::vector<ResponseToolCall> tool_calls;
  std::vector<TokenInfo> tokens;
  std::string finish_reason;  // "" = not finished
};
// The chunk's JSON (without the "data: " framing).
std::string chat_chunk_json(const ResponseHead& head, const ChoiceDelta& delta, bool logprobs);
std::string completion_chunk_json(const ResponseHead& head, const ChoiceDelta& delta,
                                  bool logprobs);
// The last chunk of a stream with stream_options.include_usage: no choices.
std::string usage_chunk_json(const ResponseHead& head, bool chat, const Usage& usage);

// `prefix` and 24 random hex digits, as OpenAI's ids look: "chatcmpl-...",
// "cmpl-...", "call_...".
std::string random_id(std::string_view prefix);

// GET /v1/models.
std::string models_json(const std::string& model, int64_t created);

// Server-sent events framing: "data: <json>\n\n"; the stream ends with
// "data: [DONE]\n\n".
std::string sse_event(const std::string& json);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

}  // namespace relay::serve
