#include "relay/rollout/math_answer.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>

namespace relay::rollout {
namespace {

struct ExtractCase {
  std::string text;
  std::optional<std::string> want;
};

TEST(MathAnswerTest, ExtractBoxed) {
  const ExtractCase cases[] = {
      {"so \\boxed{42}.", "42"},
      {"\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"},
      {"first \\boxed{1} then \\boxed{2}", "2"},
      {"\\fbox{7}", "7"},
      {"\\boxed {3}", "3"},
      {"\\boxed{\\{1,2\\}}", "\\{1,2\\}"},
      {"\\boxed{1} and a truncated \\boxed{2", "1"},  // the last complete box
      {"\\boxed{\\boxed{5}}", "\\boxed{5}"},          // the outer box is the answer
      {"\\boxed{}", ""},
      {"no box, 12", std::nullopt},
      {"\\boxedx{3}", std::nullopt},  // another command
      {"\\boxed 3", std::nullopt},
      {"\\boxed{never closed", std::nullopt},
  };
  for (const ExtractCase& c : cases) EXPECT_EQ(extract_boxed(c.text), c.want) << c.text;
}

TEST(MathAnswerTest, ExtractLastNumber) {
  const ExtractCase cases[] = {
      {"12 apples and 30 pears", "30"},
      {"The answer is -5", "-5"},
      {"x = -5.", "-5"},
      {"(-3)", "-3"},
      {"3 - 5 = 2", "2"},
      {"10 - 3", "3"},  // binary minus across spaces
      {"3-5", "5"},
      {"x-5", "5"},
      {"total 1,000,000 dollars", "1,000,000"},
      {"1,2,3", "3"},  // a list, not thousands
      {"1,0000", "0000"},
      {"pi is 3.14.", "3.14"},
      {"half is .5", ".5"},
      {"ratio 3/4", "3/4"},
      {"v2", "2"},
      {"12#<eos>", "12"},
      {"no digits here", std::nullopt},
      {"", std::nullopt},
  };
  for (const ExtractCase& c : cases) EXPECT_EQ(extract_last_number(c.text), c.want) << c.text;
}

TEST(MathAnswerTest, ExtractMathAnswerPrefersTheBox) {
  EXPECT_EQ(extract_math_answer("2+2 is \\boxed{4}, not 5"), "4");
  EXPECT_EQ(extract_math_answer("2+2 is 4, not 5"), "5");
  EXPECT_EQ(extract_math_answer("nothing"), std::nullopt);
}

TEST(MathAnswerTest, Normalize) {
  const std::pair<std::string, std::string> cases[] = {
      {" 42 ", "42"},
      {"$42$", "42"},
      {"42.", "42"},
      {"1,000", "1000"},
      {"-1,234.5", "-1234.5"},
      {"1,2", "1,2"},
      {"12,34", "12,34"},
      {"\\left(1,2\\right)", "(1,2)"},
      {"\\rightarrow", "\\rightarrow"},
      {"1\\!000", "1000"},
      {"1\\,000", "1000"},
      {"\\dfrac{1}{2}", "\\frac{1}{2}"},
      {"\\tfrac{3}{4}", "\\frac{3}{4}"},
      {"+5", "5"},
      {"+.5", ".5"},
      {"+x", "+x"},
      {"\\\\", "\\\\"},
  };
  for (const auto& [in, want] : cases) EXPECT_EQ(normalize_math_answer(in), want) << in;
}

TEST(MathAnswerTest, ParseRational) {
  const std::pair<std::string, std::optional<Rational>> cases[] = {
      {"3", Rational{3, 1}},
      {"-3", Rational{-3, 1}},
      {"+3", Rational{3, 1}},
      {"0.50", Rational{1, 2}},
      {".5", Rational{1, 2}},
      {"-0.125", Rational{-1, 8}},
      {"0", Rational{0, 1}},
      {"-0", Rational{0, 1}},
      {"1/2", Rational{1, 2}},
      {"2/4", Rational{1, 2}},
      {"-3/4", Rational{-3, 4}},
      {"3/-4", Rational{-3, 4}},
      {"1.5/3", Rational{1, 2}},
      {"\\frac{1}{2}", Rational{1, 2}},
      {"-\\frac{6}{4}", Rational{-3, 2}},
      {"\\frac{-1}{2}", Rational{-1, 2}},
      {"\\frac12", Rational{1, 2}},
      {"9223372036854775807", Rational{INT64_MAX, 1}},
      {"1/0", std::nullopt},
      {"\\frac{1}{0}", std::nullopt},
      {"1/2/3", std::nullopt},
      {"\\frac{1}{2}3", std::nullopt},
      {"\\frac{x}{2}", std::nullopt},
      {"\\sqrt{2}", std::nullopt},
      {"1e5", std::nullopt},
      {"5.", std::nullopt},  // normalization drops the '.' first
      {".", std::nullopt},
      {"", std::nullopt},
      {"--5", std::nullopt},
      {"99999999999999999999", std::nullopt},  // needs more than 64 bits
      {"1,000", std::nullopt},                 // not normalized
  };
  for (const auto& [in, want] : cases) {
    const std::optional<Rational> got = parse_rational(in);
    ASSERT_EQ(got.has_value(), want.has_value()) << in;
    if (want) {
      EXPECT_EQ(*got, *want) << in << " -> " << got->num << "/" << got->den;
    }
  }
}

TEST(MathAnswerTest, AnswersEqual) {
  struct Case {
    std::string a, b;
    bool equal;
  };
  const Case cases[] = {
      {"0.50", "1/2", true},
      {"1/2", ".5", true},
      {"\\frac{1}{2}", "0.5", true},
      {"\\dfrac{2}{4}", "1/2", true},
      {"1,000", "1000", true},
      {"+7", "7", true},
      {"$-3$", "-3.0", true},
      {"12.", "12", true},
      {"\\left(1,2\\right)", "(1, 2)", true},
      {"\\sqrt{2}", "\\sqrt{2}", true},
      {"x+1", "x + 1", true},
      {"0.5", "0.51", false},
      {"1/3", "0.333", false},
      {"-3", "3", false},
      {"\\sqrt{2}", "\\sqrt{3}", false},
      {"1,2", "12", false},
      {"", "0", false},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(math_answers_equal(c.a, c.b), c.equal) << c.a << " vs " << c.b;
    EXPECT_EQ(math_answers_equal(c.b, c.a), c.equal) << c.b << " vs " << c.a;
  }
}

}  // namespace
}  // namespace relay::rollout
