#include "model/json_nesting.h"

#include <gtest/gtest.h>

#include <string>

namespace relay::model {
namespace {

constexpr size_t kNone = std::string_view::npos;

TEST(JsonNestingTest, FindsTheFirstBracketPastTheLimit) {
  struct Case {
    std::string text;
    int max_depth;
    size_t at;
  } cases[] = {
      {"", 1, kNone},
      {"5", 0, kNone},
      {"[]", 1, kNone},
      {"[]", 0, 0},
      {"[[]]", 1, 1},
      {R"({"a": [{"b": 1}]})", 3, kNone},
      {R"({"a": [{"b": 1}]})", 2, 7},
      {"[[], [[]]]", 2, 6},  // siblings do not add up
      // Brackets inside strings, escaped quotes included, are text.
      {R"(["[[[", "\"[[[", "\\"])", 1, kNone},
      {R"(["\\", [[]]])", 2, 8},
      // Closers beyond the opened ones are the parser's to report; they buy
      // no room for deeper nesting.
      {"]]]][[[", 2, 6},
      {R"("unterminated [[[)", 1, kNone},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(find_json_nesting_over(c.text, c.max_depth), c.at) << c.text;
  }
}

TEST(JsonNestingTest, StatusNamesTheSourceAndTheByte) {
  EXPECT_TRUE(check_json_nesting(std::string(128, '[') + std::string(128, ']'), "f.json").ok());
  const Status s = check_json_nesting("{\"a\": " + std::string(200000, '['), "f.json");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "f.json: JSON nests deeper than 128 levels (at byte 133)");
}

}  // namespace
}  // namespace relay::model
