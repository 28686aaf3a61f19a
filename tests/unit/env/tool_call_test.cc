#include "relay/env/tool_call.h"

#include <gtest/gtest.h>

namespace relay::env {
namespace {

TEST(ToolCallTest, ReadsQwenStyleCallsAndTheTextAroundThem) {
  const ParsedTurn t = parse_tool_calls(
      "Let me compute.\n<tool_call>\n{\"name\": \"calculator\", \"arguments\": "
      "{\"expression\": \"12*7\"}}\n</tool_call>\n<tool_call>{\"name\": \"lookup\", "
      "\"arguments\": {\"key\": [1, 2]}}</tool_call>");
  EXPECT_EQ(t.content, "Let me compute.");
  ASSERT_EQ(t.calls.size(), 2u);
  EXPECT_TRUE(t.errors.empty());
  EXPECT_EQ(t.calls[0].name, "calculator");
  EXPECT_EQ(t.calls[0].arguments, "{\"expression\":\"12*7\"}");
  EXPECT_EQ(t.calls[1].name, "lookup");
  EXPECT_EQ(t.calls[1].arguments, "{\"key\":[1,2]}");
  EXPECT_EQ(t.blocks(), 2);
}

TEST(ToolCallTest, ATurnWithoutCallsIsAllContent) {
  const ParsedTurn t = parse_tool_calls("  The answer is 84. </tool_call>\n");
  EXPECT_EQ(t.content, "The answer is 84. </tool_call>");  // a stray close tag is text
  EXPECT_TRUE(t.calls.empty());
  EXPECT_TRUE(t.errors.empty());
}

TEST(ToolCallTest, ArgumentsMayBeAnEncodedObjectOrMissing) {
  const ParsedTurn t = parse_tool_calls(
      "<tool_call>{\"name\": \"calculator\", \"arguments\": \"{\\\"expression\\\": \\\"1+1\\\"}\"}"
      "</tool_call><tool_call>{\"name\": \"clock\"}</tool_call>");
  ASSERT_EQ(t.calls.size(), 2u) << (t.errors.empty() ? "" : t.errors[0].message);
  EXPECT_EQ(t.calls[0].arguments, "{\"expression\":\"1+1\"}");
  EXPECT_EQ(t.calls[1].arguments, "{}");
}

// Each malformed block is reported with what is wrong and where it stands
// among the turn's blocks; the good ones around it still count.
TEST(ToolCallTest, MalformedBlocksAreReportedNotThrown) {
  const ParsedTurn t = parse_tool_calls(
      "<tool_call>{\"name\": \"calculator\", \"arguments\": {\"expression\": \"2\"}}</tool_call>"
      "<tool_call>{\"name\": calculator}</tool_call>"
      "<tool_call>[1, 2]</tool_call>"
      "<tool_call>{\"arguments\": {}}</tool_call>"
      "<tool_call>{\"name\": \"\"}</tool_call>"
      "<tool_call>{\"name\": \"c\", \"arguments\": 7}</tool_call>"
      "<tool_call>{\"name\": \"c\", \"arguments\": \"[1]\"}</tool_call>"
      "<tool_call>{\"name\": \"calculator\", \"argu");
  ASSERT_EQ(t.calls.size(), 1u);
  EXPECT_EQ(t.calls[0].name, "calculator");
  ASSERT_EQ(t.errors.size(), 7u);
  const char* expected[] = {
      "not a JSON object",
      "not a JSON object, got a array",
      "\"name\" must be a non-empty string",
      "\"name\" must be a non-empty string",
      "\"arguments\" must be an object (or a string holding one)",
      "\"arguments\" must be an object (or a string holding one)",
      "<tool_call> is not closed by </tool_call>",
  };
  for (size_t i = 0; i < t.errors.size(); ++i) {
    EXPECT_EQ(t.errors[i].index, static_cast<int>(i) + 1);
    EXPECT_EQ(t.errors[i].message, expected[i]);
  }
  EXPECT_EQ(t.blocks(), 8);
  EXPECT_EQ(t.content, "");
}

}  // namespace
}  // namespace relay::env
