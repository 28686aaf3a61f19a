#include "relay/env/calculator.h"

#include <nlohmann/json.hpp>

#include <string>

namespace relay::env {
namespace {

// Recursive descent over
//   sum     := product (('+' | '-') product)*
//   product := factor ('*' factor)*
//   factor  := '-' factor | '(' sum ')' | digits
// with every step checked for int64 overflow. Nesting is bounded so a
// hostile expression cannot exhaust the stack.
class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  StatusOr<int64_t> parse() {
    StatusOr<int64_t> value = sum();
    if (!value.ok()) return value;
    skip_spaces();
    if (pos_ < text_.size()) return unexpected();
    return value;
  }

 private:
  static constexpr int kMaxDepth = 64;

  StatusOr<int64_t> sum() {
    StatusOr<int64_t> left = product();
    if (!left.ok()) return left;
    int64_t total = *left;
    while (true) {
      skip_spaces();
      if (pos_ >= text_.size() || (text_[pos_] != '+' && text_[pos_] != '-')) return total;
      const char op = text_[pos_++];
      StatusOr<int64_t> right = product();
      if (!right.ok()) return right;
      const bool overflow = op == '+' ? __builtin_add_overflow(total, *right, &total)
                                      : __builtin_sub_overflow(total, *right, &total);
      if (overflow) return too_large();
    }
  }

  StatusOr<int64_t> product() {
    StatusOr<int64_t> left = factor();
    if (!left.ok()) return left;
    int64_t total = *left;
    while (true) {
      skip_spaces();
      if (pos_ >= text_.size() || text_[pos_] != '*') return total;
      ++pos_;
      StatusOr<int64_t> right = factor();
      if (!right.ok()) return right;
      if (__builtin_mul_overflow(total, *right, &total)) return too_large();
    }
  }

  StatusOr<int64_t> factor() {
    skip_spaces();
    if (pos_ >= text_.size())
      return InvalidArgumentError("expression: ends where a number was expected");
    if (++depth_ > kMaxDepth) return InvalidArgumentError("expression: nested too deeply");
    StatusOr<int64_t> value = factor_at_depth();
    --depth_;
    return value;
  }

  StatusOr<int64_t> factor_at_depth() {
    const char c = text_[pos_];
    if (c == '-') {
      ++pos_;
      StatusOr<int64_t> inner = factor();
      if (!inner.ok()) return inner;
      int64_t negated = 0;
      if (__builtin_sub_overflow(int64_t{0}, *inner, &negated)) return too_large();
      return negated;
    }
    if (c == '(') {
      ++pos_;
      StatusOr<int64_t> inner = sum();
      if (!inner.ok()) return inner;
      skip_spaces();
      if (pos_ >= text_.size() || text_[pos_] != ')') return unexpected("')'");
      ++pos_;
      return inner;
    }
    if (c < '0' || c > '9') return unexpected("a number");
    int64_t value = 0;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      if (__builtin_mul_overflow(value, int64_t{10}, &value) ||
          __builtin_add_overflow(value, int64_t{text_[pos_] - '0'}, &value)) {
        return too_large();
      }
      ++pos_;
    }
    return value;
  }

  void skip_spaces() {
    while (pos_ < text_.size() && text_[pos_] == ' ') ++pos_;
  }

  Status unexpected(const char* expected = nullptr) const {
    std::string message = "expression: ";
    if (pos_ >= text_.size()) {
      message += "ends early";
    } else {
      message += "unexpected '";
      message += text_[pos_];
      message += "' at offset " + std::to_string(pos_);
    }
    if (expected != nullptr) message += std::string("; expected ") + expected;
    return InvalidArgumentError(message);
  }

  static Status too_large() {
    return InvalidArgumentError("expression: the result does not fit in a 64-bit integer");
  }

  std::string_view text_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

StatusOr<int64_t> evaluate_expression(std::string_view expression) {
  return Parser(expression).parse();
}

StatusOr<std::string> run_calculator(std::string_view arguments) {
  using nlohmann::json;
  const json args =
      json::parse(arguments.begin(), arguments.end(), nullptr, /*allow_exceptions=*/false);
  if (args.is_discarded() || !args.is_object()) {
    return InvalidArgumentError("calculator: arguments must be a JSON object");
  }
  const auto expression = args.find("expression");
  if (expression == args.end() || !expression->is_string()) {
    return InvalidArgumentError("calculator: arguments need a string \"expression\"");
  }
  StatusOr<int64_t> value = evaluate_expression(expression->get_ref<const std::string&>());
  if (!value.ok()) return value.status();
  return std::to_string(*value);
}

std::string calculator_schema() {
  const nlohmann::ordered_json schema = {
      {"type", "function"},
      {"function",
       {{"name", "calculator"},
        {"description", "Evaluates an integer expression with + - * and parentheses."},
        {"parameters",
         {{"type", "object"},
          {"properties",
           {{"expression", {{"type", "string"}, {"description", "for example (12 + 3) * 7"}}}}},
          {"required", {"expression"}}}}}}};
  return schema.dump();
}

}  // namespace relay::env
