#include "relay/env/tool_prompt.h"

#include <gtest/gtest.h>

#include "relay/env/calculator.h"

namespace relay::env {
namespace {

TEST(ToolPromptTest, PythonJsonKeepsKeyOrderAndPythonSeparators) {
  auto j = python_json(R"({"b":1,"a":[1,2,{"z":"é\n\"q\""}],"c":null,"d":true,"e":"\u0001"})");
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ(*j,
            "{\"b\": 1, \"a\": [1, 2, {\"z\": \"é\\n\\\"q\\\"\"}], \"c\": null, \"d\": true, "
            "\"e\": \"\\u0001\"}");
  EXPECT_FALSE(python_json("{").ok());
}

// The system message Qwen3's template writes for a system prompt and one
// tool (Qwen2.5's is the same once model.system_prompt holds its default).
TEST(ToolPromptTest, ToolsSystemContentMatchesQwensTemplate) {
  const std::string schema =
      R"({"type":"function","function":{"name":"calculator","description":"Adds.","parameters":{"type":"object","properties":{"expression":{"type":"string"}},"required":["expression"]}}})";
  auto content = tools_system_content("Be brief.", {schema});
  ASSERT_TRUE(content.ok()) << content.status();
  EXPECT_EQ(*content,
            "Be brief.\n\n# Tools\n\nYou may call one or more functions to assist with the user "
            "query.\n\nYou are provided with function signatures within <tools></tools> XML "
            "tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"calculator\", "
            "\"description\": \"Adds.\", \"parameters\": {\"type\": \"object\", \"properties\": "
            "{\"expression\": {\"type\": \"string\"}}, \"required\": [\"expression\"]}}}\n"
            "</tools>\n\nFor each function call, return a json object with function name and "
            "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
            "<function-name>, \"arguments\": <args-json-object>}\n</tool_call>");
  // Rendered as the system message, it is what the template writes before
  // the first user turn: "<|im_start|>system\n" + content + "<|im_end|>\n".
  const std::string prompt = model::render_chat(model::ChatTemplate::kChatml,
                                                {{"system", *content}, {"user", "What is 2+3?"}});
  EXPECT_EQ(prompt.rfind("<|im_start|>system\nBe brief.\n\n# Tools\n\n", 0), 0u);
  EXPECT_NE(prompt.find("</tool_call><|im_end|>\n<|im_start|>user\nWhat is 2+3?<|im_end|>\n"
                        "<|im_start|>assistant\n"),
            std::string::npos);
  // Without a system prompt the section stands alone (Qwen3).
  EXPECT_EQ(tools_system_content("", {schema})->rfind("# Tools\n\n", 0), 0u);
  // The built-in calculator's schema is a valid tool.
  EXPECT_TRUE(tools_system_content("", {calculator_schema()}).ok());
  auto bad = tools_system_content("", {"[1]"});
  EXPECT_NE(bad.status().message().find("tool schema 0: not a JSON object"), std::string::npos)
      << bad.status();
}

// Tool results continue the conversation right after the assistant's
// <|im_end|>: the rendering of [..., assistant, tool, tool, user] with the
// generation prompt, less the part up to that token.
TEST(ToolPromptTest, ObservationsFollowTheAssistantTurnAsTheTemplateRendersThem) {
  using model::ChatTemplate;
  auto text =
      render_observation(ChatTemplate::kChatml, {{"tool", "105"}, {"tool", "error: no such tool"}});
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text,
            "\n<|im_start|>user\n<tool_response>\n105\n</tool_response>\n<tool_response>\nerror: "
            "no such tool\n</tool_response><|im_end|>\n<|im_start|>assistant\n");
  // Check against the whole conversation rendered by render_chat, with the
  // tool turn written as Qwen's template writes it.
  const std::string before =
      model::render_chat(ChatTemplate::kChatml, {{"user", "2*3?"}, {"assistant", "<tool_call>x"}},
                         /*add_generation_prompt=*/false);
  auto mixed = render_observation(ChatTemplate::kChatml, {{"tool", "6"}, {"user", "And 2*4?"}});
  ASSERT_TRUE(mixed.ok());
  EXPECT_EQ(before.substr(0, before.size() - 1) + *mixed,
            "<|im_start|>user\n2*3?<|im_end|>\n<|im_start|>assistant\n<tool_call>x<|im_end|>\n"
            "<|im_start|>user\n<tool_response>\n6\n</tool_response><|im_end|>\n"
            "<|im_start|>user\nAnd 2*4?<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(*render_observation(ChatTemplate::kLlama3, {{"user", " Try again. "}}),
            "<|start_header_id|>user<|end_header_id|>\n\nTry again.<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(*render_observation(ChatTemplate::kNone, {{"tool", "=12"}, {"user", "#"}}), "=12#");
  auto llama_tool = render_observation(ChatTemplate::kLlama3, {{"tool", "1"}});
  EXPECT_NE(llama_tool.status().message().find("observation message 0: a tool result"),
            std::string::npos)
      << llama_tool.status();
  auto bad_role = render_observation(ChatTemplate::kChatml, {{"tool", "1"}, {"system", "x"}});
  EXPECT_NE(bad_role.status().message().find("observation message 1: role 'system'"),
            std::string::npos)
      << bad_role.status();
}

// A whole agent conversation as Qwen2.5/Qwen3's template renders it: the
// tool section in the system turn, an assistant turn of calls (no content:
// no newline before the first block), two results merged into one user
// turn, and an assistant turn with content before its calls.
TEST(ToolPromptTest, ConversationsRenderAsQwensTemplate) {
  using model::ChatTemplate;
  const std::string schema = R"({"type":"function","function":{"name":"calculator"}})";
  const std::vector<ConversationMessage> messages = {
      {"system", "S", {}},
      {"user", "What is 6*7+1?", {}},
      {"assistant", "", {{"calculator", R"({"expression":"6*7"})"}}},
      {"tool", "42", {}},
      {"assistant", "Now add.", {{"calculator", R"({"expression":"42+1"})"}, {"x", "{}"}}},
      {"tool", "43", {}},
      {"tool", "error: no tool named 'x'", {}},
  };
  auto text = render_conversation(ChatTemplate::kChatml, messages, {schema});
  ASSERT_TRUE(text.ok()) << text.status();
  const std::string system = *tools_system_content("S", {schema});
  EXPECT_EQ(*text,
            "<|im_start|>system\n" + system +
                "<|im_end|>\n"
                "<|im_start|>user\nWhat is 6*7+1?<|im_end|>\n"
                "<|im_start|>assistant\n<tool_call>\n{\"name\": \"calculator\", \"arguments\": "
                "{\"expression\": \"6*7\"}}\n</tool_call><|im_end|>\n"
                "<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n"
                "<|im_start|>assistant\nNow add.\n<tool_call>\n{\"name\": \"calculator\", "
                "\"arguments\": {\"expression\": \"42+1\"}}\n</tool_call>\n<tool_call>\n"
                "{\"name\": \"x\", \"arguments\": {}}\n</tool_call><|im_end|>\n"
                "<|im_start|>user\n<tool_response>\n43\n</tool_response>\n<tool_response>\n"
                "error: no tool named 'x'\n</tool_response><|im_end|>\n<|im_start|>assistant\n");
  // Without tools: the chat template's own rendering.
  auto plain = render_conversation(ChatTemplate::kChatml, {{"user", "hi", {}}}, {});
  EXPECT_EQ(*plain, model::render_chat(ChatTemplate::kChatml, {{"user", "hi"}}));
  auto llama =
      render_conversation(ChatTemplate::kLlama3, {{"system", "S", {}}, {"user", "hi", {}}}, {});
  EXPECT_EQ(*llama, model::render_chat(ChatTemplate::kLlama3, {{"system", "S"}, {"user", "hi"}}));
}

// Token-in/token-out holds: the conversation so far, the model's turn and
// its end-of-turn token, then render_observation, is the rendering of the
// longer conversation.
TEST(ToolPromptTest, AConversationExtendedByAnObservationRendersTheSame) {
  using model::ChatTemplate;
  std::vector<ConversationMessage> messages = {{"user", "6*7?", {}}};
  const std::string turn =
      "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": "
      "\"6*7\"}}\n</tool_call>";
  const std::string before = *render_conversation(ChatTemplate::kChatml, messages, {});
  const std::string observation = *render_observation(ChatTemplate::kChatml, {{"tool", "42"}});
  messages.push_back({"assistant", "", {{"calculator", R"({"expression": "6*7"})"}}});
  messages.push_back({"tool", "42", {}});
  EXPECT_EQ(before + turn + "<|im_end|>" + observation,
            *render_conversation(ChatTemplate::kChatml, messages, {}));
}

TEST(ToolPromptTest, ConversationProblemsNameTheMessage) {
  using model::ChatTemplate;
  struct Case {
    ChatTemplate t;
    std::vector<ConversationMessage> messages;
    std::vector<std::string> tools;
    std::string message;
  };
  const std::vector<Case> cases = {
      {ChatTemplate::kChatml,
       {{"user", "a", {}}, {"bot", "b", {}}},
       {},
       "messages[1].role: 'bot'; expected system, user, assistant or tool"},
      {ChatTemplate::kChatml,
       {{"user", "a", {}}, {"system", "b", {}}},
       {},
       "messages[1].role: a system message comes first only"},
      {ChatTemplate::kChatml,
       {{"user", "a<|im_end|>", {}}},
       {},
       "messages[0].content: holds the chat token '<|im_end|>', which would forge a turn "
       "boundary"},
      {ChatTemplate::kChatml,
       {{"user", "a", {{"f", "{}"}}}},
       {},
       "messages[0].tool_calls: only an assistant makes calls"},
      {ChatTemplate::kChatml,
       {{"assistant", "", {{"f", "{"}}}},
       {},
       "messages[0].tool_calls[0].function.arguments: not valid JSON"},
      {ChatTemplate::kLlama3,
       {{"tool", "1", {}}},
       {},
       "messages[0]: tool calls and results need chatml (Qwen2.5, Qwen3); the 'llama3' "
       "template's tool format is another"},
      {ChatTemplate::kLlama3,
       {{"user", "1", {}}},
       {"{}"},
       "tools: need chatml (Qwen2.5, Qwen3); the 'llama3' template's tool format is another"},
      {ChatTemplate::kNone,
       {{"user", "1", {}}},
       {},
       "messages: the model has no chat template (model.chat_template none); send the prompt "
       "as text instead"},
      {ChatTemplate::kChatml, {}, {}, "messages: empty"},
  };
  for (const Case& c : cases) {
    auto r = render_conversation(c.t, c.messages, c.tools);
    ASSERT_FALSE(r.ok()) << c.message;
    EXPECT_EQ(std::string(r.status().message()), c.message);
  }
}

}  // namespace
}  // namespace relay::env
