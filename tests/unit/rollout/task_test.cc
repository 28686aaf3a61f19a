#include "relay/rollout/task.h"

#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <condition_variable>
#include <fstream>
#include <limits>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace relay::rollout {
namespace {

// ---- helpers ------------------------------------------------------------------

std::string write_temp(const std::string& name, const std::string& contents) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::binary) << contents;
  return path;
}

TaskConfig arithmetic_config(int min_operands, int max_operands, int min_digits, int max_digits,
                             std::string operators) {
  TaskConfig c;
  c.name = TaskKind::kArithmetic;
  c.arithmetic = {min_operands, max_operands, min_digits, max_digits, std::move(operators)};
  return c;
}

TaskConfig file_config(const std::string& name, const std::string& path) {
  TaskConfig c;
  c.name = kTaskKindNames.parse(name).value();
  c.path = path;
  return c;
}

std::unique_ptr<Task> must_make(const TaskConfig& config, uint64_t seed = 0) {
  StatusOr<std::unique_ptr<Task>> task = make_task(config, seed);
  EXPECT_TRUE(task.ok()) << task.status();
  return task.ok() ? *std::move(task) : nullptr;
}

TaskPrompt must_prompt(const Task& task, int64_t index) {
  StatusOr<TaskPrompt> p = task.prompt(index);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *std::move(p) : TaskPrompt{};
}

// One row of a verifier table: a response and the score it must get.
struct ScoreCase {
  int64_t index;  // prompt index
  std::string response;
  double reward;
  std::map<std::string, double> sub_scores;
};

void expect_scores(const Task& task, const std::vector<ScoreCase>& cases) {
  for (const ScoreCase& c : cases) {
    const TaskPrompt p = must_prompt(task, c.index);
    StatusOr<Score> s = task.score(p, c.response);
    ASSERT_TRUE(s.ok()) << c.response << ": " << s.status();
    EXPECT_DOUBLE_EQ(s->reward, c.reward) << p.id << " response '" << c.response << "'";
    EXPECT_EQ(s->sub_scores, c.sub_scores) << p.id << " response '" << c.response << "'";
  }
}

// An evaluator written apart from the task's: recursive descent over
// expr := term (('+' | '-') term)*, term := number ('*' number)*.
class ReferenceEvaluator {
 public:
  explicit ReferenceEvaluator(std::string_view text) : text_(text) {}
  // `<...>` -> value; sets ok() false on malformed input.
  int64_t evaluate_prompt() {
    if (!eat('<')) return fail();
    const int64_t v = expr();
    if (!eat('>') || pos_ != text_.size()) return fail();
    return v;
  }
  bool ok() const { return ok_; }

 private:
  int64_t expr() {
    int64_t v = term();
    while (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) {
      const char op = text_[pos_++];
      const int64_t t = term();
      v = op == '+' ? v + t : v - t;
    }
    return v;
  }
  int64_t term() {
    int64_t v = number();
    while (eat('*')) v *= number();
    return v;
  }
  int64_t number() {
    const size_t start = pos_;
    while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) ++pos_;
    if (pos_ == start) return fail();
    return std::stoll(std::string(text_.substr(start, pos_ - start)));
  }
  bool eat(char c) {
    if (pos_ >= text_.size() || text_[pos_] != c) return false;
    ++pos_;
    return true;
  }
  int64_t fail() {
    ok_ = false;
    return 0;
  }
  std::string_view text_;
  size_t pos_ = 0;
  bool ok_ = true;
};

// Operands and operators of a prompt "<12+3*4>".
struct Parsed {
  std::vector<std::string> operands;
  std::string operators;
};

Parsed parse_prompt(const std::string& prompt) {
  Parsed p;
  std::string current;
  for (char c : prompt.substr(1, prompt.size() - 2)) {
    if (std::isdigit(static_cast<unsigned char>(c))) {
      current += c;
    } else {
      p.operands.push_back(current);
      p.operators += c;
      current.clear();
    }
  }
  p.operands.push_back(current);
  return p;
}

// ---- make_task ---------------------------------------------------------------

TEST(MakeTaskTest, RejectsWhatItCannotBuild) {
  struct Case {
    TaskConfig config;
    std::string message;
  };
  TaskConfig weight = file_config("math_answer", "q.jsonl");
  weight.math_answer.format_reward = 1.5;
  TaskConfig nan_weight = weight;
  nan_weight.math_answer.format_reward = std::numeric_limits<double>::quiet_NaN();
  TaskConfig no_key = file_config("jsonl", "q.jsonl");
  no_key.jsonl.answer_key = "";
  const Case cases[] = {
      {file_config("jsonl", ""), "task.path: must name a JSONL file for task 'jsonl', got ''"},
      {file_config("math_answer", ""),
       "task.path: must name a JSONL file for task 'math_answer', got ''"},
      {weight, "task.math_answer.format_reward: must be in [0, 1], got 1.5"},
      {nan_weight, "task.math_answer.format_reward: must be in [0, 1], got nan"},
      {no_key, "task.jsonl.answer_key: must be non-empty, got ''"},
      {arithmetic_config(0, 3, 1, 1, "+"), "task.arithmetic.min_operands: must be >= 1, got 0"},
      {arithmetic_config(3, 2, 1, 1, "+"),
       "task.arithmetic.max_operands: must be >= task.arithmetic.min_operands (3), got 2"},
      {arithmetic_config(2, 2, 0, 1, "+"), "task.arithmetic.min_digits: must be >= 1, got 0"},
      {arithmetic_config(2, 2, 2, 1, "+"),
       "task.arithmetic.max_digits: must be >= task.arithmetic.min_digits (2), got 1"},
      {arithmetic_config(2, 2, 1, 19, "+"), "task.arithmetic.max_digits: must be <= 18, got 19"},
      {arithmetic_config(2, 2, 1, 1, "+/"),
       "task.arithmetic.operators: must be a non-empty string of + - *, got '+/'"},
      {arithmetic_config(2, 2, 1, 1, ""),
       "task.arithmetic.operators: must be a non-empty string of + - *, got ''"},
      {arithmetic_config(2, 3, 1, 9, "+*"),
       "task.arithmetic.max_operands: with operators '+*' and up to 9 digits per operand, results "
       "can overflow 64-bit integers, got 3"},
  };
  for (const Case& c : cases) {
    StatusOr<std::unique_ptr<Task>> task = make_task(c.config, 0);
    ASSERT_FALSE(task.ok()) << c.message;
    EXPECT_EQ(task.status().code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_EQ(task.status().message(), c.message);
  }
}

TEST(MakeTaskTest, LargestSafeArithmeticConfigsAreAccepted) {
  // 999999999^2 < 2^63 with '*'; 9 operands of 18 digits sum below 2^63.
  EXPECT_TRUE(make_task(arithmetic_config(2, 2, 9, 9, "*"), 0).ok());
  EXPECT_TRUE(make_task(arithmetic_config(9, 9, 18, 18, "+-"), 0).ok());
  EXPECT_FALSE(make_task(arithmetic_config(10, 10, 18, 18, "+-"), 0).ok());
}

// ---- arithmetic -------------------------------------------------------------------

TEST(ArithmeticTaskTest, ToyTaskFormat) {
  auto task = must_make(arithmetic_config(3, 3, 1, 1, "+"));
  ASSERT_NE(task, nullptr);
  EXPECT_EQ(task->name(), "arithmetic");
  EXPECT_EQ(task->size(), -1);
  EXPECT_EQ(task->stop_strings(), std::vector<std::string>{"#"});
  const TaskPrompt p = must_prompt(*task, 17);
  EXPECT_EQ(p.index, 17);
  EXPECT_EQ(p.id, "arithmetic/17");
  ASSERT_EQ(p.prompt.size(), 7u);  // "<a+b+c>"
  EXPECT_EQ(p.prompt.front(), '<');
  EXPECT_EQ(p.prompt.back(), '>');
  const int sum = (p.prompt[1] - '0') + (p.prompt[3] - '0') + (p.prompt[5] - '0');
  EXPECT_EQ(p.reference, std::to_string(sum));
  EXPECT_EQ(p.target, std::to_string(sum) + "#");
  EXPECT_EQ(task->prompt(-1).status().code(), absl::StatusCode::kOutOfRange);
}

TEST(ArithmeticTaskTest, PromptIsAPureFunctionOfSeedAndIndex) {
  const TaskConfig config = arithmetic_config(2, 5, 1, 3, "+-*");
  auto a = must_make(config, 7);
  auto b = must_make(config, 7);
  auto other = must_make(config, 8);
  ASSERT_TRUE(a && b && other);
  int differ = 0;
  // Out of order on purpose: no hidden stream state between calls.
  for (int64_t i : {5, 0, 3, 1000000, 2, 1, 4, 99}) {
    const TaskPrompt pa = must_prompt(*a, i);
    EXPECT_EQ(pa.prompt, must_prompt(*b, i).prompt) << i;
    EXPECT_EQ(pa.prompt, must_prompt(*a, i).prompt) << i;
    EXPECT_EQ(pa.reference, must_prompt(*b, i).reference) << i;
    if (pa.prompt != must_prompt(*other, i).prompt) ++differ;
  }
  EXPECT_GE(differ, 6);  // two seeds may collide on a short prompt, not on most
}

TEST(ArithmeticTaskTest, PinnedPromptsForSeedZero) {
  // The generator is fully specified (splitmix64, own range mapping), so
  // these are the same on every standard library and machine. A change here
  // changes every experiment's data.
  auto task = must_make(arithmetic_config(2, 3, 1, 2, "+-*"), 0);
  ASSERT_NE(task, nullptr);
  const std::vector<std::string> want = {"<9-40*9>", "<17+10>", "<40*0>", "<14+1>"};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(must_prompt(*task, i).prompt, want[i]) << i;
}

TEST(ArithmeticTaskTest, PromptsStayWithinTheConfig) {
  const TaskConfig config = arithmetic_config(2, 4, 1, 3, "+-*");
  auto task = must_make(config, 3);
  ASSERT_NE(task, nullptr);
  std::set<size_t> counts, digits;
  std::set<char> operators;
  const std::string alphabet = "0123456789+-*/=<>()#., ?:";
  for (int64_t i = 0; i < 2000; ++i) {
    const TaskPrompt p = must_prompt(*task, i);
    ASSERT_EQ(p.prompt.find_first_not_of(alphabet), std::string::npos) << p.prompt;
    ASSERT_EQ(p.target->find_first_not_of(alphabet), std::string::npos) << *p.target;
    const Parsed parsed = parse_prompt(p.prompt);
    ASSERT_GE(parsed.operands.size(), 2u) << p.prompt;
    ASSERT_LE(parsed.operands.size(), 4u) << p.prompt;
    counts.insert(parsed.operands.size());
    for (const std::string& x : parsed.operands) {
      ASSERT_GE(x.size(), 1u) << p.prompt;
      ASSERT_LE(x.size(), 3u) << p.prompt;
      ASSERT_TRUE(x.size() == 1 || x[0] != '0') << "leading zero in " << p.prompt;
      digits.insert(x.size());
    }
    for (char op : parsed.operators) operators.insert(op);
  }
  EXPECT_EQ(counts, (std::set<size_t>{2, 3, 4}));
  EXPECT_EQ(digits, (std::set<size_t>{1, 2, 3}));
  EXPECT_EQ(operators, (std::set<char>{'+', '-', '*'}));
}

TEST(ArithmeticTaskTest, ReferenceIsTheValueWithStarBeforePlusAndMinus) {
  for (const std::string ops : {"+", "-", "*", "+-*", "-*"}) {
    auto task = must_make(arithmetic_config(1, 6, 1, 3, ops), 11);
    ASSERT_NE(task, nullptr);
    for (int64_t i = 0; i < 500; ++i) {
      const TaskPrompt p = must_prompt(*task, i);
      ReferenceEvaluator eval(p.prompt);
      const int64_t want = eval.evaluate_prompt();
      ASSERT_TRUE(eval.ok()) << p.prompt;
      ASSERT_EQ(p.reference, std::to_string(want)) << p.prompt;
      ASSERT_EQ(p.target, p.reference + "#");
    }
  }
}

TEST(ArithmeticTaskTest, VerifierIsAnExactMatch) {
  auto task = must_make(arithmetic_config(2, 2, 1, 1, "+"));
  ASSERT_NE(task, nullptr);
  const auto score = [&](const std::string& reference, const std::string& response) {
    TaskPrompt p;
    p.reference = reference;
    StatusOr<Score> s = task->score(p, response);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : Score{};
  };
  struct Case {
    std::string reference, response;
    double correct, formatted;
  };
  const Case cases[] = {
      {"12", "12#", 1, 1},     {"12", "12#<eos>", 1, 1}, {"12", "12", 1, 0},
      {"12", "12<eos>", 1, 0}, {"-3", "-3#", 1, 1},      {"12", "13#", 0, 1},
      {"12", "012#", 0, 1},    {"12", " 12#", 0, 1},     {"12", "12 #", 0, 1},
      {"12", "12##", 0, 1},    {"12", "1#2", 0, 0},      {"12", "#", 0, 1},
      {"12", "", 0, 0},        {"12", "<eos>", 0, 0},    {"12", "12#<eos><eos>", 0, 0},
      {"3", "-3#", 0, 1},      {"12", "12#3", 0, 0},
  };
  for (const Case& c : cases) {
    const Score s = score(c.reference, c.response);
    EXPECT_EQ(s.reward, c.correct) << c.reference << " vs '" << c.response << "'";
    EXPECT_EQ(s.sub_scores,
              (std::map<std::string, double>{{"correct", c.correct}, {"formatted", c.formatted}}))
        << c.reference << " vs '" << c.response << "'";
  }
  // The target solution always scores full marks.
  for (int64_t i = 0; i < 20; ++i) {
    const TaskPrompt p = must_prompt(*task, i);
    EXPECT_EQ(task->score(p, *p.target)->reward, 1.0) << p.prompt;
  }
}

// ---- JSONL loading --------------------------------------------------------------

TEST(JsonlLoadTest, ErrorsNameFileLineAndField) {
  struct Case {
    std::string name, contents, message;  // message after "<path>"
    bool prefix_only = false;             // message is a prefix (parser details follow)
  };
  const std::string ok_line = R"({"prompt": "p", "answer": "a"})";
  const std::vector<Case> cases = {
      {"missing", ok_line + "\n" + R"({"prompt": "p"})" + "\n", ":2: field 'answer': missing"},
      {"blank_lines_count", "\n  \n" + std::string(R"({"prompt": 3, "answer": "a"})"),
       ":3: field 'prompt': expected a string, got number"},
      {"bool_answer", R"({"prompt": "p", "answer": true})",
       ":1: field 'answer': expected a string or number, got boolean"},
      {"null_answer", R"({"prompt": "p", "answer": null})",
       ":1: field 'answer': expected a string or number, got null"},
      {"number_target", R"({"prompt": "p", "answer": "a", "target": 5})",
       ":1: field 'target': expected a string, got number"},
      {"empty_prompt", R"({"prompt": "", "answer": "a"})", ":1: field 'prompt': empty"},
      {"array", ok_line + "\n[1, 2]\n", ":2: expected a JSON object, got array"},
      {"not_json", ok_line + "\n" + ok_line + "\n{\"prompt\": ", ":3: not valid JSON: ", true},
      {"trailing_garbage", ok_line + " x", ":1: not valid JSON: ", true},
      {"empty_file", "", ": no prompts"},
      {"only_blanks", "\n \n\t\n", ": no prompts"},
  };
  for (const Case& c : cases) {
    const std::string path = write_temp("load_" + c.name + ".jsonl", c.contents);
    StatusOr<std::unique_ptr<Task>> task = make_task(file_config("jsonl", path), 0);
    ASSERT_FALSE(task.ok()) << c.name;
    EXPECT_EQ(task.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    const std::string want = path + c.message;
    if (c.prefix_only) {
      EXPECT_EQ(std::string(task.status().message()).substr(0, want.size()), want) << c.name;
      EXPECT_GT(task.status().message().size(), want.size()) << c.name;
    } else {
      EXPECT_EQ(task.status().message(), want) << c.name;
    }
  }
  const std::string missing = ::testing::TempDir() + "/no_such.jsonl";
  StatusOr<std::unique_ptr<Task>> task = make_task(file_config("jsonl", missing), 0);
  EXPECT_EQ(task.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(task.status().message(), "task.path: " + missing + ": no such file");
}

TEST(JsonlLoadTest, MathAnswerFieldsAreQuestionAnswerSolution) {
  const std::string path = write_temp("math_fields.jsonl",
                                      "{\"question\": \"q\", \"answer\": \"1\"}\n"
                                      "{\"question\": \"q\", \"solution\": \"s\"}\n");
  StatusOr<std::unique_ptr<Task>> task = make_task(file_config("math_answer", path), 0);
  EXPECT_EQ(task.status().message(), path + ":2: field 'answer': missing");
  const std::string blank =
      write_temp("math_blank.jsonl", "{\"question\": \"q\", \"answer\": \" $ \"}\n");
  task = make_task(file_config("math_answer", blank), 0);
  EXPECT_EQ(task.status().message(), blank + ":1: field 'answer': empty");
}

TEST(JsonlLoadTest, IdsNameTheLineAndNumbersBecomeText) {
  const std::string path = write_temp("ids.jsonl",
                                      "{\"prompt\": \"p0\", \"answer\": 42, \"target\": \"t0\"}\r\n"
                                      "\r\n"
                                      "{\"prompt\": \"p1\", \"answer\": 0.5, \"extra\": [1]}\n"
                                      "\n"
                                      "{\"prompt\": \"p2\", \"answer\": -7}");  // no final newline
  auto task = must_make(file_config("jsonl", path));
  ASSERT_NE(task, nullptr);
  EXPECT_EQ(task->name(), "jsonl");
  EXPECT_EQ(task->size(), 3);
  EXPECT_TRUE(task->stop_strings().empty());
  const TaskPrompt p0 = must_prompt(*task, 0), p1 = must_prompt(*task, 1),
                   p2 = must_prompt(*task, 2);
  EXPECT_EQ(p0.id, path + ":1");
  EXPECT_EQ(p1.id, path + ":3");
  EXPECT_EQ(p2.id, path + ":5");
  EXPECT_EQ(p1.index, 1);
  EXPECT_EQ(p0.prompt, "p0");
  EXPECT_EQ(p0.reference, "42");
  EXPECT_EQ(p1.reference, "0.5");
  EXPECT_EQ(p2.reference, "-7");
  EXPECT_EQ(p0.target, "t0");
  EXPECT_EQ(p1.target, std::nullopt);
  EXPECT_EQ(task->prompt(3).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(task->prompt(3).status().message(), "jsonl: prompt index 3 is outside [0, 3)");
  EXPECT_EQ(task->prompt(-1).status().code(), absl::StatusCode::kOutOfRange);
}

// ---- math_answer --------------------------------------------------------------------

TEST(MathAnswerTaskTest, ScoresRightWrongAndMalformedAnswers) {
  const std::string path =
      write_temp("math.jsonl",
                 "{\"question\": \"What is 1/4 + 1/4?\", \"answer\": \"1/2\", \"solution\": "
                 "\"\\\\boxed{1/2}\"}\n"
                 "{\"question\": \"What is 10^3?\", \"answer\": 1000}\n"
                 "\n"
                 "{\"question\": \"What is 3/4?\", \"answer\": \"\\\\frac{3}{4}\"}\n");
  TaskConfig config = file_config("math_answer", path);
  config.math_answer.format_reward = 0.2;
  auto task = must_make(config);
  ASSERT_NE(task, nullptr);
  EXPECT_EQ(task->name(), "math_answer");
  EXPECT_EQ(task->size(), 3);
  EXPECT_EQ(must_prompt(*task, 0).prompt, "What is 1/4 + 1/4?");
  EXPECT_EQ(must_prompt(*task, 0).target, "\\boxed{1/2}");
  EXPECT_EQ(must_prompt(*task, 1).target, std::nullopt);
  EXPECT_EQ(must_prompt(*task, 2).id, path + ":4");
  // reward = 0.8 * correct + 0.2 * formatted
  const auto row = [](int64_t i, std::string response, double correct, double formatted) {
    return ScoreCase{i,
                     std::move(response),
                     0.8 * correct + 0.2 * formatted,
                     {{"correct", correct}, {"formatted", formatted}}};
  };
  expect_scores(*task,
                {
                    row(0, "so \\boxed{0.5}", 1, 1),
                    row(0, "\\boxed{\\dfrac{1}{2}}.", 1, 1),
                    row(0, "the answer is 0.5", 1, 0),
                    row(0, "1/4 + 1/4 = 1/2", 1, 0),
                    row(0, "\\boxed{0.4}", 0, 1),
                    row(0, "\\boxed{}", 0, 1),
                    row(0, "\\boxed{1/2", 1, 0),  // unclosed: no box, but the last number is 1/2
                    row(0, "\\boxed{1/3", 0, 0),
                    row(0, "", 0, 0),
                    row(0, "<eos>", 0, 0),
                    row(1, "1,000", 1, 0),
                    row(1, "\\boxed{1000.0}<eos>", 1, 1),
                    row(1, "$\\boxed{1,000}$", 1, 1),
                    row(1, "\\boxed{999}", 0, 1),
                    row(1, "10^3", 0, 0),
                    row(2, "\\boxed{\\tfrac34}", 1, 1),
                    row(2, "0.75", 1, 0),
                    row(2, "\\boxed{3/4} or maybe 4", 1, 1),
                    row(2, "3/4 or maybe 4", 0, 0),
                });
}

TEST(MathAnswerTaskTest, FormatRewardZeroIsCorrectnessOnly) {
  const std::string path =
      write_temp("math_w0.jsonl", "{\"question\": \"q\", \"answer\": \"-2\"}\n");
  auto task = must_make(file_config("math_answer", path));
  ASSERT_NE(task, nullptr);
  expect_scores(*task, {
                           {0, "\\boxed{-2}", 1, {{"correct", 1}, {"formatted", 1}}},
                           {0, "x = -2", 1, {{"correct", 1}, {"formatted", 0}}},
                           {0, "\\boxed{2}", 0, {{"correct", 0}, {"formatted", 1}}},
                       });
}

// ---- jsonl --------------------------------------------------------------------------

TEST(JsonlTaskTest, ExactMatchTrimsWhitespace) {
  const std::string path =
      write_temp("exact.jsonl",
                 "{\"q\": \"Capital of France?\", \"a\": \" Paris\", \"t\": \"Paris\"}\n"
                 "{\"q\": \"2+2?\", \"a\": 4}\n");
  TaskConfig config = file_config("jsonl", path);
  config.jsonl.prompt_key = "q";
  config.jsonl.answer_key = "a";
  config.jsonl.target_key = "t";
  auto task = must_make(config);
  ASSERT_NE(task, nullptr);
  EXPECT_EQ(must_prompt(*task, 0).target, "Paris");
  const auto row = [](int64_t i, std::string response, double correct) {
    return ScoreCase{i, std::move(response), correct, {{"correct", correct}}};
  };
  expect_scores(*task, {
                           row(0, "Paris", 1),
                           row(0, "  Paris \n", 1),
                           row(0, "Paris<eos>", 1),
                           row(0, "paris", 0),
                           row(0, "Paris.", 0),
                           row(0, "Paris, France", 0),
                           row(0, "", 0),
                           row(1, "4", 1),
                           row(1, "4.0", 0),  // exact text, not numeric
                           row(1, "44", 0),
                       });
}

TEST(JsonlTaskTest, RegexMustMatchTheWholeResponse) {
  const std::string path =
      write_temp("regex.jsonl",
                 "{\"prompt\": \"digits\", \"answer\": \"[0-9]+\"}\n"
                 "{\"prompt\": \"alt\", \"answer\": \"a|ab\"}\n"
                 "{\"prompt\": \"money\", \"answer\": \"\\\\d+\\\\.\\\\d{2}\"}\n"
                 "{\"prompt\": \"any\", \"answer\": \".*\"}\n");
  TaskConfig config = file_config("jsonl", path);
  config.jsonl.match = AnswerMatch::kRegex;
  auto task = must_make(config);
  ASSERT_NE(task, nullptr);
  const auto row = [](int64_t i, std::string response, double correct) {
    return ScoreCase{i, std::move(response), correct, {{"correct", correct}}};
  };
  expect_scores(*task,
                {
                    row(0, "123", 1), row(0, "123<eos>", 1), row(0, "123abc", 0), row(0, "x123", 0),
                    row(0, "123\n", 0),  // not trimmed, and '$'-style newline slack is off
                    row(0, "", 0), row(1, "a", 1),
                    row(1, "ab", 1),  // needs backtracking into the second branch
                    row(1, "abb", 0), row(2, "12.50", 1), row(2, "12.5", 0), row(3, "", 1),
                    row(3, "\xff\xfe not UTF-8", 1),  // matched byte-wise
                });
  // A prompt that is not this task's is a caller's bug, reported as such.
  TaskPrompt stranger = must_prompt(*task, 0);
  stranger.index = 9;
  EXPECT_EQ(task->score(stranger, "1").status().code(), absl::StatusCode::kFailedPrecondition);
  stranger = must_prompt(*task, 0);
  stranger.reference = "[a-z]+";
  EXPECT_EQ(task->score(stranger, "1").status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(JsonlTaskTest, BadRegexFailsLoadingWithFileAndLine) {
  const std::string path = write_temp("bad_regex.jsonl",
                                      "{\"prompt\": \"p\", \"answer\": \"ok\"}\n"
                                      "\n"
                                      "{\"prompt\": \"p\", \"answer\": \"(unclosed\"}\n");
  TaskConfig config = file_config("jsonl", path);
  config.jsonl.match = AnswerMatch::kRegex;
  StatusOr<std::unique_ptr<Task>> task = make_task(config, 0);
  ASSERT_FALSE(task.ok());
  EXPECT_EQ(task.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string want = path + ":3: field 'answer': bad regex at offset 9: ";
  EXPECT_EQ(std::string(task.status().message()).substr(0, want.size()), want)
      << task.status().message();
  // The same file is fine as exact answers.
  config.jsonl.match = AnswerMatch::kExact;
  EXPECT_TRUE(make_task(config, 0).ok());
}

// ---- SafeVerifier -------------------------------------------------------------------

// Lets a test hold a verifier call open and see when it has finished.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  bool finished = false;

  void release() {
    std::lock_guard<std::mutex> lock(mu);
    open = true;
    cv.notify_all();
  }
  void wait_finished() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return finished; });
  }
};

// Behaves as its response says: "throw", "throw-int", "error", "nan",
// "inf-sub", "block" (until the gate opens); anything else scores 0.5.
class FakeTask final : public Task {
 public:
  explicit FakeTask(std::shared_ptr<Gate> gate) : gate_(std::move(gate)) {}
  std::string name() const override { return "fake"; }
  int64_t size() const override { return 1; }
  StatusOr<TaskPrompt> prompt(int64_t) const override { return TaskPrompt{}; }
  StatusOr<Score> score(const TaskPrompt&, std::string_view response) const override {
    if (response == "throw") throw std::runtime_error("boom");
    if (response == "throw-int") throw 42;
    if (response == "error") return InternalError("broken task");
    if (response == "nan") return Score{std::nan(""), {}};
    if (response == "inf-sub") return Score{1.0, {{"x", HUGE_VAL}}};
    if (response == "block") {
      std::unique_lock<std::mutex> lock(gate_->mu);
      gate_->cv.wait(lock, [&] { return gate_->open; });
      gate_->finished = true;
      gate_->cv.notify_all();
      return Score{1.0, {}};
    }
    return Score{0.5, {{"x", 1.0}}};
  }

 private:
  std::shared_ptr<Gate> gate_;
};

TaskPrompt fake_prompt() {
  TaskPrompt p;
  p.id = "fake/0";
  return p;
}

TEST(SafeVerifierTest, FailuresScoreZeroAndAreCounted) {
  auto gate = std::make_shared<Gate>();
  SafeVerifier verifier(std::make_shared<FakeTask>(gate), std::chrono::seconds(10));
  struct Case {
    std::string response, error;
  };
  const Case cases[] = {
      {"throw", "fake/0: verifier threw: boom"},
      {"throw-int", "fake/0: verifier threw something that is not a std::exception"},
      {"error", "fake/0: verifier returned an error: INTERNAL: broken task"},
      {"nan", "fake/0: verifier returned a non-finite reward = nan"},
      {"inf-sub", "fake/0: verifier returned a non-finite sub-score 'x' = inf"},
  };
  int64_t errors = 0;
  for (const Case& c : cases) {
    std::string error;
    const Score s = verifier.score(fake_prompt(), c.response, &error);
    EXPECT_EQ(s.reward, 0.0) << c.response;
    EXPECT_TRUE(s.sub_scores.empty()) << c.response;
    EXPECT_EQ(error, c.error);
    EXPECT_EQ(verifier.errors(), ++errors);
    // A normal call after each failure still works and clears `error`.
    const Score ok = verifier.score(fake_prompt(), "fine", &error);
    EXPECT_EQ(ok.reward, 0.5);
    EXPECT_EQ(ok.sub_scores, (std::map<std::string, double>{{"x", 1.0}}));
    EXPECT_EQ(error, "");
  }
  EXPECT_EQ(verifier.timeouts(), 0);
}

TEST(SafeVerifierTest, TimedOutCallIsAbandonedAndCounted) {
  auto gate = std::make_shared<Gate>();
  auto verifier = std::make_unique<SafeVerifier>(std::make_shared<FakeTask>(gate),
                                                 std::chrono::milliseconds(50));
  std::string error;
  const Score s = verifier->score(fake_prompt(), std::string("block"), &error);
  EXPECT_EQ(s.reward, 0.0);
  EXPECT_EQ(error, "fake/0: verifier timed out after 50 ms; the call is abandoned");
  EXPECT_EQ(verifier->timeouts(), 1);
  EXPECT_EQ(verifier->errors(), 0);
  EXPECT_EQ(verifier->score(fake_prompt(), "fine", &error).reward, 0.5);
  EXPECT_EQ(error, "");
  {
    std::lock_guard<std::mutex> lock(gate->mu);
    EXPECT_FALSE(gate->finished);  // the abandoned call is still running
  }
  // Destroy the verifier (and with it the last reference the test has to the
  // task), then let the abandoned call finish: it must only touch what it
  // owns (run under ASan to check).
  verifier.reset();
  gate->release();
  gate->wait_finished();
}

}  // namespace
}  // namespace relay::rollout
