#include "relay/env/calculator.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <utility>

namespace relay::env {
namespace {

TEST(CalculatorTest, EvaluatesWithPrecedenceAndParentheses) {
  const std::pair<const char*, int64_t> cases[] = {
      {"7", 7},
      {"2+3*4", 14},
      {"(2+3)*4", 20},
      {"10-4-3", 3},  // left-associative
      {" -5 * -(2 + 1) ", 15},
      {"1*2*3*4*5*6*7*8*9*10", 3628800},
      {"9223372036854775807", INT64_MAX},
      {"-9223372036854775807 - 1", INT64_MIN},
  };
  for (const auto& [text, value] : cases) {
    StatusOr<int64_t> got = evaluate_expression(text);
    ASSERT_TRUE(got.ok()) << text << ": " << got.status();
    EXPECT_EQ(*got, value) << text;
  }
}

TEST(CalculatorTest, BadExpressionsSayWhereAndWhy) {
  const std::pair<const char*, const char*> cases[] = {
      {"", "expression: ends where a number was expected"},
      {"2 +", "expression: ends where a number was expected"},
      {"2 / 3", "expression: unexpected '/' at offset 2"},
      {"(1 + 2", "expression: ends early; expected ')'"},
      {"1 2", "expression: unexpected '2' at offset 2"},
      {"x", "expression: unexpected 'x' at offset 0; expected a number"},
      {"9223372036854775808", "expression: the result does not fit in a 64-bit integer"},
      {"3037000500 * 3037000500", "expression: the result does not fit in a 64-bit integer"},
      {"-(-9223372036854775807 - 1)", "expression: the result does not fit in a 64-bit integer"},
  };
  for (const auto& [text, message] : cases) {
    StatusOr<int64_t> got = evaluate_expression(text);
    ASSERT_FALSE(got.ok()) << text;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(got.status().message(), message) << text;
  }
  // Deep nesting is refused, not a stack overflow.
  const std::string deep = std::string(100000, '(') + "1" + std::string(100000, ')');
  EXPECT_EQ(evaluate_expression(deep).status().message(), "expression: nested too deeply");
}

TEST(CalculatorTest, TheToolReadsItsArgumentsObject) {
  EXPECT_EQ(run_calculator("{\"expression\": \"(12 + 3) * 7\"}").value(), "105");
  EXPECT_EQ(run_calculator("{}").status().message(),
            "calculator: arguments need a string \"expression\"");
  EXPECT_EQ(run_calculator("{\"expression\": 5}").status().message(),
            "calculator: arguments need a string \"expression\"");
  EXPECT_EQ(run_calculator("[]").status().message(), "calculator: arguments must be a JSON object");
  EXPECT_EQ(run_calculator("{\"expression\": \"1/0\"}").status().message(),
            "expression: unexpected '/' at offset 1");
}

TEST(CalculatorTest, SchemaIsAnOpenAiFunction) {
  const nlohmann::json schema = nlohmann::json::parse(calculator_schema());
  EXPECT_EQ(schema["type"], "function");
  EXPECT_EQ(schema["function"]["name"], "calculator");
  EXPECT_EQ(schema["function"]["parameters"]["required"], nlohmann::json::array({"expression"}));
  EXPECT_EQ(schema["function"]["parameters"]["properties"]["expression"]["type"], "string");
}

}  // namespace
}  // namespace relay::env
