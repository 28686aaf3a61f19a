#include "relay/env/tool_environment.h"

#include <gtest/gtest.h>

#include <stdexcept>

namespace relay::env {
namespace {

std::unique_ptr<Environment> calculator_env(ToolEnvironmentOptions options = {}) {
  std::vector<ToolSpec> tools = {calculator_tool()};
  tools.push_back(
      {"boom", R"({"type":"function","function":{"name":"boom"}})",
       [](std::string_view) -> StatusOr<std::string> { throw std::runtime_error("exploded"); }});
  ToolEnvironmentFactory factory(std::move(tools), options);
  EXPECT_EQ(factory.tool_schemas().size(), 2u);
  auto env = factory.make();
  EXPECT_TRUE(env.ok());
  EXPECT_TRUE((*env)->reset({"arithmetic/1", "<3*4>", "12"}).ok());
  return std::move(env).value();
}

TEST(ToolEnvironmentTest, ACallRunsItsToolAndAnAnswerEndsTheEpisode) {
  auto env = calculator_env();
  auto step = env->step({0,
                         "Let me compute.\n<tool_call>\n{\"name\": \"calculator\", \"arguments\": "
                         "{\"expression\": \"(12 + 3) * 7\"}}\n</tool_call>"});
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(step->next, EnvStep::Next::kContinue);
  ASSERT_EQ(step->messages.size(), 1u);
  EXPECT_EQ(step->messages[0].role, "tool");
  EXPECT_EQ(step->messages[0].content, "105");
  EXPECT_EQ(step->tool_calls, 1);
  EXPECT_EQ(step->tool_errors, 0);
  EXPECT_TRUE(std::isnan(step->reward));

  auto answer = env->step({1, "The answer is 105."});
  ASSERT_TRUE(answer.ok());
  EXPECT_EQ(answer->next, EnvStep::Next::kAnswered);
  EXPECT_TRUE(answer->messages.empty());
}

// What the model did wrong is an observation in block order, counted, and
// never an error status.
TEST(ToolEnvironmentTest, MistakesAreObservationsInBlockOrder) {
  auto env = calculator_env();
  auto step = env->step(
      {0,
       "<tool_call>{\"name\": \"calculator\", \"arguments\": {\"expression\": \"2*\"}}</tool_call>"
       "<tool_call>not json</tool_call>"
       "<tool_call>{\"name\": \"search\", \"arguments\": {}}</tool_call>"
       "<tool_call>{\"name\": \"boom\"}</tool_call>"
       "<tool_call>{\"name\": \"calculator\", \"arguments\": {\"expression\": \"6*7\"}}"
       "</tool_call>"});
  ASSERT_TRUE(step.ok()) << step.status();
  ASSERT_EQ(step->messages.size(), 5u);
  EXPECT_EQ(step->messages[0].content.rfind("error: ", 0), 0u) << step->messages[0].content;
  EXPECT_EQ(step->messages[1].content.rfind("error: malformed tool call: ", 0), 0u)
      << step->messages[1].content;
  EXPECT_EQ(step->messages[2].content, "error: no tool named 'search' (tools: calculator, boom)");
  EXPECT_EQ(step->messages[3].content, "error: tool 'boom' failed: exploded");
  EXPECT_EQ(step->messages[4].content,
            "error: more than 4 tool calls in one turn; this one was "
            "not run");
  EXPECT_EQ(step->tool_calls, 0);
  EXPECT_EQ(step->tool_errors, 5);

  ToolEnvironmentOptions many;
  many.max_calls_per_turn = 8;
  auto env2 = calculator_env(many);
  auto ok = env2->step(
      {0,
       "<tool_call>{\"name\": \"calculator\", \"arguments\": {\"expression\": \"6*7\"}}"
       "</tool_call><tool_call>{\"name\": \"calculator\", \"arguments\": \"{\\\"expression\\\": "
       "\\\"1+1\\\"}\"}</tool_call>"});
  ASSERT_TRUE(ok.ok());
  ASSERT_EQ(ok->messages.size(), 2u);
  EXPECT_EQ(ok->messages[0].content, "42");
  EXPECT_EQ(ok->messages[1].content, "2");
  EXPECT_EQ(ok->tool_calls, 2);
}

}  // namespace
}  // namespace relay::env
