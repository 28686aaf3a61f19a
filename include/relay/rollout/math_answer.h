#pragma once

// Final-answer extraction and comparison for math tasks ("math_answer").
// Pure functions over text, safe to call from any thread.
//
// A response's answer is the content of its last complete \boxed{...} (or
// \fbox{...}); without one, the last number in the text. Two answers are
// equal when both are numbers or simple fractions with the same exact
// rational value ("0.50" == "1/2" == "\frac{1}{2}" == ".5"), otherwise when
// their normalized texts are equal.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace relay::rollout {

// The content of the last complete \boxed{...} or \fbox{...} in `text`, with
// nested braces kept balanced ("\boxed{\frac{1}{2}}" -> "\frac{1}{2}").
// A box that is never closed (a truncated response) is skipped. nullopt when
// there is no complete box.
std::optional<std::string> extract_boxed(std::string_view text);

// The last number in `text`, as written: "-3", "1,000", "2.5", ".5", "3/4".
// A '-' is part of the number only where it cannot be a binary minus (not
// right after a letter, digit or closing bracket). nullopt when none.
std::optional<std::string> extract_last_number(std::string_view text);

// extract_boxed(response), else extract_last_number(response).
std::optional<std::string> extract_math_answer(std::string_view response);

// Canonical text of an answer: drops \left and \right (not \leftarrow),
// the LaTeX spaces \! \, \; \:, whitespace and '$'; maps \dfrac and \tfrac to
// \frac; drops trailing '.'; drops thousands separators in a plain number
// ("1,000,000" -> "1000000", while "1,2" stays a list); drops a leading '+'
// before a digit or '.'.
std::string normalize_math_answer(std::string_view answer);

// An exact rational number, reduced: den > 0 and gcd(|num|, den) == 1, so
// equal values have equal fields.
struct Rational {
  int64_t num = 0;
  int64_t den = 1;
  bool operator==(const Rational& o) const { return num == o.num && den == o.den; }
  bool operator!=(const Rational& o) const { return !(*this == o); }
};

// The value of a normalized answer that is a signed decimal ("-0.50", "3",
// ".5"), a simple fraction of two decimals ("1/2", "-3/4") or \frac with
// decimal arguments ("\frac{1}{2}", "-\frac{3}{4}", "\frac12"). nullopt for
// anything else, for a zero denominator and when a value needs more than 64
// bits (those answers still compare as text).
std::optional<Rational> parse_rational(std::string_view normalized);

// True when `a` and `b` are the same answer: equal rationals when both parse
// as numbers, else equal normalized texts.
bool math_answers_equal(std::string_view a, std::string_view b);

}  // namespace relay::rollout
