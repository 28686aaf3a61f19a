// The "arithmetic" toy task: prompt `<3+4*5>`, reference `23`, target `23#`
// (format brackets); or, for an agent with the calculator tool (format
// calculator), prompt "What is 3+4*5?", reference `23`, and as target the
// tool call a demonstration makes, the answer being the turn after the tool's.
//
// prompt(i) is a pure function of (seed, i, config), drawn from a splitmix64
// stream whose state starts at mix(mix(seed) + i). Draws, in order: the
// operand count n, uniform in [min_operands, max_operands]; then for each
// operand k = 0..n-1, the operator before it (k > 0; a uniform position in
// the `operators` string, so "++-" makes '+' twice as likely), its digit
// count d, uniform in [min_digits, max_digits], and its value, uniform in
// [0, 9] for d = 1, else in [10^(d-1), 10^d - 1] (no leading zeros).
// Integer ranges are mapped from the 64-bit outputs by rejection sampling,
// not std::uniform_int_distribution, whose mapping differs between standard
// libraries: every build gives every worker the same prompts.
//
// The reference is the value under the usual precedence: '*' before '+' and
// '-', and left to right among equals ("2-3*4+1" = -9). The brackets format
// uses only characters of the char tokenizer's alphabet; the calculator
// format needs a tokenizer with letters (a byte-level one).

#include <cctype>
#include <string>

#include "rollout/builtin_tasks.h"

namespace relay::rollout {
namespace {

// splitmix64's output function: a bijection on 64 bits that mixes well.
uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t state) : state_(state) {}
  uint64_t next() {
    state_ += 0x9E3779B97F4A7C15ULL;
    return mix(state_);
  }
  // Uniform in [lo, hi]: rejects the lowest 2^64 mod span outputs, so that
  // the accepted ones are a whole number of copies of [0, span).
  int64_t uniform(int64_t lo, int64_t hi) {
    const uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
    const uint64_t reject_below = (0 - span) % span;
    uint64_t r = next();
    while (r < reject_below) r = next();
    return lo + static_cast<int64_t>(r % span);
  }

 private:
  uint64_t state_;
};

int64_t pow10(int d) {
  int64_t p = 1;
  for (int k = 0; k < d; ++k) p *= 10;
  return p;
}

struct Expression {
  std::vector<int64_t> operands;
  std::string operators;  // operators[k] joins operands[k] and operands[k + 1]
};

Expression draw_expression(const ArithmeticTaskConfig& c, SplitMix64& rng) {
  Expression e;
  const int64_t n = rng.uniform(c.min_operands, c.max_operands);
  for (int64_t k = 0; k < n; ++k) {
    if (k > 0) {
      e.operators += c.operators[rng.uniform(0, static_cast<int64_t>(c.operators.size()) - 1)];
    }
    const int d = static_cast<int>(rng.uniform(c.min_digits, c.max_digits));
    e.operands.push_back(d == 1 ? rng.uniform(0, 9) : rng.uniform(pow10(d - 1), pow10(d) - 1));
  }
  return e;
}

// '*' binds tighter: a running product `term` is added to (or subtracted
// from) `total` when a '+' or '-' ends it. check(ArithmeticTaskConfig), run
// by make_task, has checked that no partial result can overflow.
int64_t evaluate(const Expression& e) {
  int64_t total = 0;
  int64_t term = e.operands[0];
  int64_t sign = 1;
  for (size_t k = 0; k < e.operators.size(); ++k) {
    const int64_t x = e.operands[k + 1];
    if (e.operators[k] == '*') {
      term *= x;
      continue;
    }
    total += sign * term;
    sign = e.operators[k] == '+' ? 1 : -1;
    term = x;
  }
  return total + sign * term;
}

// "37*48+5"
std::string render(const Expression& e) {
  std::string s = std::to_string(e.operands[0]);
  for (size_t k = 0; k < e.operators.size(); ++k) {
    s += e.operators[k];
    s += std::to_string(e.operands[k + 1]);
  }
  return s;
}

// The Qwen/Hermes call of the built-in calculator tool (env/calculator.h) on
// `expression`, as Qwen's templates show a call.
std::string calculator_call(const std::string& expression) {
  return absl::StrCat("<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"",
                      expression, "\"}}\n</tool_call>");
}

class ArithmeticTask final : public Task {
 public:
  ArithmeticTask(ArithmeticTaskConfig config, uint64_t seed)
      : config_(std::move(config)), seed_key_(mix(seed)) {}

  std::string name() const override { return "arithmetic"; }
  int64_t size() const override { return -1; }
  std::vector<std::string> stop_strings() const override {
    if (calculator()) return {};
    return {"#"};
  }

  StatusOr<TaskPrompt> prompt(int64_t index) const override {
    if (index < 0) {
      return OutOfRangeError(absl::StrCat("arithmetic: prompt index ", index, " is negative"));
    }
    SplitMix64 rng(mix(seed_key_ + static_cast<uint64_t>(index)));
    const Expression e = draw_expression(config_, rng);
    TaskPrompt p;
    p.index = index;
    p.id = absl::StrCat("arithmetic/", index);
    p.reference = std::to_string(evaluate(e));
    if (calculator()) {
      p.prompt = absl::StrCat("What is ", render(e), "?");
      p.target = calculator_call(render(e));
    } else {
      p.prompt = absl::StrCat("<", render(e), ">");
      p.target = p.reference + "#";
    }
    return p;
  }

  // Exact match: the response, less a trailing "<eos>" and then (brackets)
  // one trailing '#' or (calculator) surrounding whitespace, must be the
  // reference; "formatted" = it ended with '#' (brackets) or is a whole
  // number (calculator).
  StatusOr<Score> score(const TaskPrompt& prompt, std::string_view response) const override {
    std::string_view answer = strip_eos(response);
    bool formatted = false;
    if (calculator()) {
      while (!answer.empty() && std::isspace(static_cast<unsigned char>(answer.front()))) {
        answer.remove_prefix(1);
      }
      while (!answer.empty() && std::isspace(static_cast<unsigned char>(answer.back()))) {
        answer.remove_suffix(1);
      }
      const std::string_view digits =
          !answer.empty() && answer[0] == '-' ? answer.substr(1) : answer;
      formatted =
          !digits.empty() && digits.find_first_not_of("0123456789") == std::string_view::npos;
    } else {
      formatted = !answer.empty() && answer.back() == '#';
      if (formatted) answer.remove_suffix(1);
    }
    const double correct = answer == prompt.reference ? 1.0 : 0.0;
    Score s;
    s.reward = correct;
    s.sub_scores = {{"correct", correct}, {"formatted", formatted ? 1.0 : 0.0}};
    return s;
  }

 private:
  bool calculator() const { return config_.format == ArithmeticFormat::kCalculator; }

  ArithmeticTaskConfig config_;
  uint64_t seed_key_;
};

// The largest |value| (of the result or any partial result) an expression
// can reach, or nullopt past int64. Operands are at most m = 10^d - 1 >= 9;
// without '*' the sum of n of them is at most n*m; with '*' a sum of
// products of sizes k_1 + ... = n is at most m^n, since m^a + m^b <= m^(a+b).
std::optional<int64_t> largest_value(const ArithmeticTaskConfig& c) {
  const int64_t m = pow10(c.max_digits) - 1;
  int64_t bound = 0;
  if (c.operators.find('*') == std::string::npos) {
    if (__builtin_mul_overflow(m, int64_t{c.max_operands}, &bound)) return std::nullopt;
    return bound;
  }
  bound = 1;
  for (int k = 0; k < c.max_operands; ++k) {
    if (__builtin_mul_overflow(bound, m, &bound)) return std::nullopt;
  }
  return bound;
}

}  // namespace

StatusOr<std::unique_ptr<Task>> make_arithmetic_task(const ArithmeticTaskConfig& config,
                                                     uint64_t seed) {
  return std::unique_ptr<Task>(std::make_unique<ArithmeticTask>(config, seed));
}

}  // namespace relay::rollout

namespace relay {

void check(const ArithmeticTaskConfig& c, Problems p) {
  const size_t before = p.list().size();
  p.at_least("min_operands", c.min_operands, 1);
  if (c.max_operands < c.min_operands) {
    p.add("max_operands",
          absl::StrCat("must be >= ", p.path("min_operands"), " (", c.min_operands, ")"),
          c.max_operands);
  }
  p.at_least("min_digits", c.min_digits, 1);
  if (c.max_digits < c.min_digits) {
    p.add("max_digits", absl::StrCat("must be >= ", p.path("min_digits"), " (", c.min_digits, ")"),
          c.max_digits);
  }
  // 10^19 - 1 does not fit in int64.
  if (c.max_digits > 18) p.add("max_digits", "must be <= 18", c.max_digits);
  if (c.operators.empty() || c.operators.find_first_not_of("+-*") != std::string::npos) {
    p.add("operators", "must be a non-empty string of + - *", c.operators);
  }
  // The bound is only meaningful for settings that passed the rules above.
  if (p.list().size() == before && !rollout::largest_value(c)) {
    p.add("max_operands",
          absl::StrCat("with operators '", c.operators, "' and up to ", c.max_digits,
                       " digits per operand, results can overflow 64-bit integers"),
          c.max_operands);
  }
}

}  // namespace relay
