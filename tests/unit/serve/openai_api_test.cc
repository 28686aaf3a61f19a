// The OpenAI wire format (serve/openai_api.h): requests read into structs
// with each refusal naming its field, and responses in OpenAI's shape with
// relay's token ids, versions and behavior log-probs.

#include "relay/serve/openai_api.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace relay::serve {
namespace {

using nlohmann::json;

TEST(OpenAiApiTest, AChatRequestIsReadWhole) {
  auto parsed = parse_chat_request(R"({
    "model": "m", "n": 2, "temperature": 0.5, "top_p": 0.9, "top_k": 5, "max_tokens": 7,
    "stop": ["\n\n", "END"], "seed": 3, "stream": true, "stream_options": {"include_usage": true},
    "logprobs": true, "top_logprobs": 0, "user": "u", "tool_choice": "auto",
    "tools": [{"type": "function", "function": {"name": "calc", "parameters": {"b": 1, "a": 2}}}],
    "messages": [
      {"role": "developer", "content": "be brief"},
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "calc", "arguments": "{\"x\": 1}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "2"}
    ]})");
  ASSERT_TRUE(std::holds_alternative<ChatRequest>(parsed)) << std::get<ApiError>(parsed).message;
  const ChatRequest& r = std::get<ChatRequest>(parsed);
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.n, 2);
  EXPECT_EQ(r.temperature, 0.5);
  EXPECT_EQ(r.top_p, 0.9);
  EXPECT_EQ(r.top_k, 5);
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"\n\n", "END"}));
  EXPECT_EQ(r.seed, 3u);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.logprobs);
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].content, "a\nb");
  EXPECT_EQ(r.messages[2].content, "");
  ASSERT_EQ(r.messages[2].tool_calls.size(), 1u);
  EXPECT_EQ(r.messages[2].tool_calls[0].name, "calc");
  EXPECT_EQ(r.messages[2].tool_calls[0].arguments, R"({"x":1})");
  // The schema keeps its key order: the prompt shows it.
  ASSERT_EQ(r.tools.size(), 1u);
  EXPECT_EQ(r.tools[0],
            R"({"type":"function","function":{"name":"calc","parameters":{"b":1,"a":2}}})");
  EXPECT_FALSE(r.tool_choice_none);
}

TEST(OpenAiApiTest, RefusalsNameTheField) {
  struct Case {
    std::string body, param, message;
  };
  const std::string msgs = R"("messages": [{"role": "user", "content": "hi"}])";
  const std::vector<Case> cases = {
      {"[1]", "", "the request body must be a JSON object"},
      {"{" + msgs + "}", "model", "model: required, a string"},
      {R"({"model": "m"})", "messages", "messages: required, a non-empty array"},
      {R"({"model": "m", "messages": [{"content": "x"}]})", "messages[0].role",
       "messages[0].role: required, a string"},
      {R"({"model": "m", "messages": [{"role": "user", "content": 5}]})", "messages[0].content",
       "messages[0].content: must be a string, text parts or null"},
      {R"({"model": "m", "temperature": "hot", )" + msgs + "}", "temperature",
       "temperature: must be a number in [0, 2], got \"hot\""},
      {R"({"model": "m", "temperature": 3, )" + msgs + "}", "temperature",
       "temperature: must be a number in [0, 2], got 3"},
      {R"({"model": "m", "top_p": 0, )" + msgs + "}", "top_p", "top_p: must be in (0, 1], got 0"},
      {R"({"model": "m", "n": 0, )" + msgs + "}", "n", "n: must be an integer in [1, 64], got 0"},
      {R"({"model": "m", "max_tokens": 0, )" + msgs + "}", "max_tokens",
       "max_tokens: must be an integer in [1, 2147483648], got 0"},
      {R"({"model": "m", "stop": ["a", ""], )" + msgs + "}", "stop",
       "stop: must not hold an empty string"},
      {R"({"model": "m", "stop": ["a", "b", "c", "d", "e"], )" + msgs + "}", "stop",
       "stop: must be a string or up to 4 strings"},
      {R"({"model": "m", "top_logprobs": 2, )" + msgs + "}", "top_logprobs",
       "top_logprobs: relay returns the sampled token's log-prob only; give 0 or leave it out"},
      {R"({"model": "m", "presence_penalty": 0.5, )" + msgs + "}", "presence_penalty",
       "presence_penalty: not supported by relay (it would change the distribution whose "
       "log-probs are recorded; give 0)"},
      {R"({"model": "m", "logit_bias": {"5": 1}, )" + msgs + "}", "logit_bias",
       "logit_bias: not supported by relay (it would change the distribution whose log-probs "
       "are recorded; give 0)"},
      {R"({"model": "m", "tool_choice": "required", )" + msgs + "}", "tool_choice",
       "tool_choice: relay takes \"auto\" or \"none\", got \"required\""},
      {R"({"model": "m", "stream_options": {"include_usage": true}, )" + msgs + "}",
       "stream_options", "stream_options: only with stream: true"},
      {R"({"model": "m", "frobnicate": 1, )" + msgs + "}", "frobnicate",
       "Unrecognized request argument supplied: frobnicate"},
      {R"({"model": "m", "messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}]})",
       "messages[0].tool_calls[0].function.arguments",
       "messages[0].tool_calls[0].function.arguments: must be a JSON object (as text)"},
      {R"({"model": "m", "tools": [{"type": "code"}], )" + msgs + "}", "tools[0]",
       "tools[0]: must be {\"type\": \"function\", \"function\": {\"name\": ...}}"},
  };
  for (const Case& c : cases) {
    auto parsed = parse_chat_request(c.body);
    ASSERT_TRUE(std::holds_alternative<ApiError>(parsed)) << c.body;
    const ApiError& e = std::get<ApiError>(parsed);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body;
    EXPECT_EQ(e.message, c.message) << c.body;
  }
}

TEST(OpenAiApiTest, ACompletionTakesTextOrIdsAndRefusesWhatItCannotDo) {
  auto text = parse_completion_request(R"({"model": "m", "prompt": "1+2=", "logprobs": 0})");
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(text));
  EXPECT_EQ(std::get<CompletionRequest>(text).prompt, "1+2=");
  EXPECT_TRUE(std::get<CompletionRequest>(text).logprobs);
  auto ids = parse_completion_request(R"({"model": "m", "prompt": [5, 6, 7]})");
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(ids));
  EXPECT_TRUE(std::get<CompletionRequest>(ids).prompt_is_ids);
  EXPECT_EQ(std::get<CompletionRequest>(ids).prompt_ids, (std::vector<int64_t>{5, 6, 7}));
  for (const auto& [body, param] : std::vector<std::pair<std::string, std::string>>{
           {R"({"model": "m", "prompt": ["a", "b"]})", "prompt"},
           {R"({"model": "m", "prompt": ""})", "prompt"},
           {R"({"model": "m", "prompt": "x", "echo": true})", "echo"},
           {R"({"model": "m", "prompt": "x", "best_of": 2})", "best_of"},
           {R"({"model": "m", "prompt": "x", "logprobs": 3})", "logprobs"},
           {R"({"model": "m", "prompt": "x", "messages": []})", "messages"}}) {
    auto parsed = parse_completion_request(body);
    ASSERT_TRUE(std::holds_alternative<ApiError>(parsed)) << body;
    EXPECT_EQ(std::get<ApiError>(parsed).param, param) << body;
  }
}

TEST(OpenAiApiTest, AChatResponseHasOpenAisShapeAndRelaysFields) {
  ResponseHead head{"chatcmpl-1", 1700000000, "m", {1, 2, 3}, "ep"};
  Choice c;
  c.index = 0;
  c.content = std::nullopt;
  c.tool_calls = {{"call_a", "calc", R"({"x": 1})"}};
  c.finish_reason = "tool_calls";
  c.tokens = {{10, "\xe2\x82", -0.5f, 4}, {11, "<|im_end|>", -0.25f, 4}};
  const json j = json::parse(chat_completion_json(head, {c}, {3, 2}, /*logprobs=*/true));
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["id"], "chatcmpl-1");
  EXPECT_EQ(j["created"], 1700000000);
  EXPECT_EQ(j["prompt_token_ids"], json({1, 2, 3}));
  EXPECT_EQ(j["episode_id"], "ep");
  EXPECT_EQ(j["usage"],
            json({{"prompt_tokens", 3}, {"completion_tokens", 2}, {"total_tokens", 5}}));
  const json& choice = j["choices"][0];
  EXPECT_TRUE(choice["message"]["content"].is_null());
  EXPECT_EQ(choice["message"]["role"], "assistant");
  EXPECT_EQ(choice["message"]["tool_calls"][0],
            json({{"id", "call_a"},
                  {"type", "function"},
                  {"function", {{"name", "calc"}, {"arguments", R"({"x": 1})"}}}}));
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_EQ(choice["token_ids"], json({10, 11}));
  EXPECT_EQ(choice["token_versions"], json({4, 4}));
  // Part of a character: its text shows U+FFFD, its bytes are exact.
  const json& first = choice["logprobs"]["content"][0];
  EXPECT_EQ(first["bytes"], json({0xe2, 0x82}));
  EXPECT_EQ(first["logprob"], -0.5);
  EXPECT_EQ(first["top_logprobs"], json::array());
  EXPECT_EQ(choice["logprobs"]["content"][1]["token"], "<|im_end|>");
  // Without logprobs: null.
  const json plain = json::parse(chat_completion_json(head, {c}, {3, 2}, false));
  EXPECT_TRUE(plain["choices"][0]["logprobs"].is_null());
}

TEST(OpenAiApiTest, ChunksAndErrorsAreOpenAisToo) {
  ResponseHead head{"chatcmpl-1", 1, "m", {1}, ""};
  ChoiceDelta first;
  first.first = true;
  const json a = json::parse(chat_chunk_json(head, first, true));
  EXPECT_EQ(a["object"], "chat.completion.chunk");
  EXPECT_EQ(a["choices"][0]["delta"], json({{"role", "assistant"}, {"content", ""}}));
  EXPECT_TRUE(a["choices"][0]["finish_reason"].is_null());
  EXPECT_FALSE(a.contains("episode_id"));
  ChoiceDelta last;
  last.index = 1;
  last.tool_calls = {{"call_b", "f", "{}"}};
  last.finish_reason = "tool_calls";
  const json b = json::parse(chat_chunk_json(head, last, true));
  EXPECT_EQ(b["choices"][0]["index"], 1);
  EXPECT_EQ(b["choices"][0]["delta"]["tool_calls"][0]["index"], 0);
  EXPECT_EQ(b["choices"][0]["finish_reason"], "tool_calls");
  const json u = json::parse(usage_chunk_json(head, true, {4, 5}));
  EXPECT_EQ(u["choices"], json::array());
  EXPECT_EQ(u["usage"]["total_tokens"], 9);
  EXPECT_EQ(sse_event("{}"), "data: {}\n\n");

  ApiError e = bad_request("temperature", "temperature: bad");
  EXPECT_EQ(json::parse(e.json()), json({{"error",
                                          {{"message", "temperature: bad"},
                                           {"type", "invalid_request_error"},
                                           {"param", "temperature"},
                                           {"code", nullptr}}}}));
  const json models = json::parse(models_json("m", 5));
  EXPECT_EQ(models["data"][0]["id"], "m");
  EXPECT_EQ(models["object"], "list");
}

}  // namespace
}  // namespace relay::serve
