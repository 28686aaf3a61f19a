#include "relay/rollout/math_answer.h"

#include <cmath>
#include <utility>

#include "rollout/builtin_tasks.h"

namespace relay::rollout {
namespace {

constexpr size_t npos = std::string_view::npos;

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Number of consecutive digits starting at text[i].
size_t digits_at(std::string_view text, size_t i) {
  size_t n = 0;
  while (i + n < text.size() && is_digit(text[i + n])) ++n;
  return n;
}

// `word` (a LaTeX command name with its backslash) starts at text[i] and is
// not the start of a longer command: "\right" matches in "\right)" but not in
// "\rightarrow".
bool command_at(std::string_view text, size_t i, std::string_view word) {
  if (text.substr(i, word.size()) != word) return false;
  const size_t after = i + word.size();
  return after >= text.size() || !is_letter(text[after]);
}

// Index just past the '}' that closes the '{' at text[open]; npos when it is
// never closed. Escaped braces (\{ \}) do not count.
size_t group_end(std::string_view text, size_t open) {
  int depth = 0;
  for (size_t i = open; i < text.size(); ++i) {
    if (text[i] == '\\') {
      ++i;
    } else if (text[i] == '{') {
      ++depth;
    } else if (text[i] == '}' && --depth == 0) {
      return i + 1;
    }
  }
  return npos;
}

// ---- number scanning ------------------------------------------------------

// Whether a '-' at text[minus] is a sign rather than a binary minus: it is a
// minus right after a letter, digit or closing bracket ("x-5", "3-5"), or
// after a digit or closing bracket across spaces ("3 - 5"); "is -5" is a sign.
bool minus_is_sign(std::string_view text, size_t minus) {
  if (minus == 0) return true;
  const auto closes = [](char c) { return is_digit(c) || c == ')' || c == ']' || c == '}'; };
  const char before = text[minus - 1];
  if (!is_space(before)) return !(closes(before) || is_letter(before));
  size_t k = minus - 1;
  while (k > 0 && is_space(text[k])) --k;
  return !closes(text[k]);
}

// End of the number whose first digit (or leading '.') is at text[i]:
// digits with optional ",ddd" groups (only after 1-3 leading digits), an
// optional ".ddd" part, and an optional "/" followed by a second such number.
size_t number_end(std::string_view text, size_t i, bool allow_fraction = true) {
  size_t j = i;
  const size_t int_digits = digits_at(text, j);
  j += int_digits;
  if (int_digits >= 1 && int_digits <= 3) {
    while (j < text.size() && text[j] == ',' && digits_at(text, j + 1) == 3) j += 4;
  }
  if (j + 1 < text.size() && text[j] == '.' && is_digit(text[j + 1])) {
    j += 1 + digits_at(text, j + 1);
  }
  if (allow_fraction && j + 1 < text.size() && text[j] == '/' && is_digit(text[j + 1])) {
    j = number_end(text, j + 1, /*allow_fraction=*/false);
  }
  return j;
}

// ---- exact rationals ------------------------------------------------------

using Int128 = __int128;
constexpr Int128 kInt64Max = INT64_MAX;

Int128 gcd128(Int128 a, Int128 b) {
  if (a < 0) a = -a;
  while (b != 0) a = std::exchange(b, a % b);
  return a;
}

// num/den reduced; nullopt when den == 0 or the reduced value needs more than
// 64 bits. INT64_MIN is excluded so that negation never overflows.
std::optional<Rational> make_rational(Int128 num, Int128 den) {
  if (den == 0) return std::nullopt;
  if (den < 0) {
    num = -num;
    den = -den;
  }
  const Int128 g = gcd128(num, den);
  num /= g;
  den /= g;
  if (num > kInt64Max || num < -kInt64Max || den > kInt64Max) return std::nullopt;
  return Rational{static_cast<int64_t>(num), static_cast<int64_t>(den)};
}

// Unsigned decimal: "12", "0.50", ".5". At most 36 digits, so the value fits
// in 128 bits before it is reduced.
std::optional<Rational> parse_decimal(std::string_view s) {
  const size_t int_digits = digits_at(s, 0);
  size_t frac_digits = 0;
  if (int_digits < s.size()) {
    if (s[int_digits] != '.') return std::nullopt;
    frac_digits = digits_at(s, int_digits + 1);
    if (int_digits + 1 + frac_digits != s.size() || frac_digits == 0) return std::nullopt;
  }
  if (int_digits + frac_digits == 0 || int_digits + frac_digits > 36) return std::nullopt;
  Int128 num = 0;
  Int128 den = 1;
  for (char c : s) {
    if (c == '.') continue;
    num = num * 10 + (c - '0');
  }
  for (size_t k = 0; k < frac_digits; ++k) den *= 10;
  return make_rational(num, den);
}

std::optional<Rational> parse_signed_decimal(std::string_view s) {
  bool negative = false;
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) {
    negative = s[0] == '-';
    s.remove_prefix(1);
  }
  std::optional<Rational> r = parse_decimal(s);
  if (r && negative) r->num = -r->num;
  return r;
}

std::optional<Rational> divide(const std::optional<Rational>& a, const std::optional<Rational>& b) {
  if (!a || !b) return std::nullopt;
  return make_rational(Int128{a->num} * b->den, Int128{a->den} * b->num);
}

// One argument of \frac: a {group} or a single character ("\frac12").
// Returns the argument's text and advances `s` past it.
std::optional<std::string_view> take_frac_argument(std::string_view& s) {
  if (s.empty()) return std::nullopt;
  if (s[0] != '{') {
    std::string_view arg = s.substr(0, 1);
    s.remove_prefix(1);
    return arg;
  }
  const size_t end = group_end(s, 0);
  if (end == npos) return std::nullopt;
  std::string_view arg = s.substr(1, end - 2);
  s.remove_prefix(end);
  return arg;
}

// The text after "\frac": exactly two decimal arguments.
std::optional<Rational> parse_frac_arguments(std::string_view s) {
  const std::optional<std::string_view> top = take_frac_argument(s);
  const std::optional<std::string_view> bottom = take_frac_argument(s);
  if (!top || !bottom || !s.empty()) return std::nullopt;
  return divide(parse_signed_decimal(*top), parse_signed_decimal(*bottom));
}

// ---- normalization ---------------------------------------------------------

// Drops \left, \right, LaTeX spaces, whitespace and '$'; \dfrac, \tfrac ->
// \frac.
std::string strip_latex_noise(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (is_space(c) || c == '$') continue;
    if (c != '\\') {
      out += c;
      continue;
    }
    const char next = i + 1 < s.size() ? s[i + 1] : '\0';
    if (next == '!' || next == ',' || next == ';' || next == ':' || next == ' ') {
      ++i;  // a LaTeX space
    } else if (command_at(s, i, "\\left")) {
      i += 4;
    } else if (command_at(s, i, "\\right")) {
      i += 5;
    } else if (command_at(s, i, "\\dfrac") || command_at(s, i, "\\tfrac")) {
      out += "\\frac";
      i += 5;
    } else if (next == '\\') {
      out += "\\\\";
      ++i;
    } else {
      out += c;
    }
  }
  return out;
}

// A plain number with thousands separators: [sign] d{1,3} (,ddd)+ [.d+].
bool has_thousands_groups(std::string_view s) {
  size_t i = (!s.empty() && (s[0] == '-' || s[0] == '+')) ? 1 : 0;
  const size_t lead = digits_at(s, i);
  if (lead == 0 || lead > 3) return false;
  i += lead;
  size_t groups = 0;
  while (i < s.size() && s[i] == ',' && digits_at(s, i + 1) == 3) {
    i += 4;
    ++groups;
  }
  if (groups == 0) return false;
  if (i == s.size()) return true;
  return s[i] == '.' && digits_at(s, i + 1) > 0 && i + 1 + digits_at(s, i + 1) == s.size();
}

}  // namespace

std::optional<std::string> extract_boxed(std::string_view text) {
  std::optional<std::string> last;
  size_t i = 0;
  while ((i = text.find('\\', i)) != npos) {
    size_t name_end = npos;
    if (command_at(text, i, "\\boxed")) name_end = i + 6;
    if (command_at(text, i, "\\fbox")) name_end = i + 5;
    if (name_end == npos) {
      ++i;
      continue;
    }
    size_t open = name_end;
    while (open < text.size() && is_space(text[open])) ++open;
    const size_t end = open < text.size() && text[open] == '{' ? group_end(text, open) : npos;
    if (end == npos) {  // no argument, or a truncated one: look for a later box
      i = name_end;
      continue;
    }
    last = std::string(text.substr(open + 1, end - open - 2));
    i = end;  // a box nested inside this one is part of its answer
  }
  return last;
}

std::optional<std::string> extract_last_number(std::string_view text) {
  std::optional<std::string> last;
  size_t i = 0;
  while (i < text.size()) {
    const bool leading_dot = text[i] == '.' && i + 1 < text.size() && is_digit(text[i + 1]);
    if (!is_digit(text[i]) && !leading_dot) {
      ++i;
      continue;
    }
    const size_t start = (i > 0 && text[i - 1] == '-' && minus_is_sign(text, i - 1)) ? i - 1 : i;
    const size_t end = number_end(text, leading_dot ? i + 1 : i);
    last = std::string(text.substr(start, end - start));
    i = end;
  }
  return last;
}

std::optional<std::string> extract_math_answer(std::string_view response) {
  std::optional<std::string> boxed = extract_boxed(response);
  if (boxed) return boxed;
  return extract_last_number(response);
}

std::string normalize_math_answer(std::string_view answer) {
  std::string s = strip_latex_noise(answer);
  while (!s.empty() && s.back() == '.') s.pop_back();
  if (has_thousands_groups(s)) {
    std::string plain;
    for (char c : s) {
      if (c != ',') plain += c;
    }
    s = std::move(plain);
  }
  if (s.size() > 1 && s[0] == '+' && (is_digit(s[1]) || s[1] == '.')) s.erase(0, 1);
  return s;
}

std::optional<Rational> parse_rational(std::string_view s) {
  bool negative = false;
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) {
    negative = s[0] == '-';
    s.remove_prefix(1);
  }
  std::optional<Rational> r;
  if (s.substr(0, 5) == "\\frac") {
    r = parse_frac_arguments(s.substr(5));
  } else if (const size_t slash = s.find('/'); slash != npos) {
    r = divide(parse_signed_decimal(s.substr(0, slash)), parse_signed_decimal(s.substr(slash + 1)));
  } else {
    r = parse_decimal(s);
  }
  if (r && negative) r->num = -r->num;
  return r;
}

bool math_answers_equal(std::string_view a, std::string_view b) {
  const std::string na = normalize_math_answer(a);
  const std::string nb = normalize_math_answer(b);
  const std::optional<Rational> ra = parse_rational(na);
  const std::optional<Rational> rb = parse_rational(nb);
  if (ra && rb) return *ra == *rb;
  return na == nb;
}

// ---- the "math_answer" task --------------------------------------------------

namespace {

// JSONL lines {"question", "answer", optional "solution"}. Reward =
// (1 - w) * correct + w * formatted, where formatted = the response has a
// complete \boxed{} and w = format_reward. The question is given to the
// policy verbatim (or as a list of messages, with a chat template): put any
// instruction ("put the answer in \boxed{}") in the data.
class MathAnswerTask final : public Task {
 public:
  MathAnswerTask(std::vector<TaskPrompt> prompts, double format_reward)
      : prompts_(std::move(prompts)), format_reward_(format_reward) {}

  std::string name() const override { return "math_answer"; }
  int64_t size() const override { return static_cast<int64_t>(prompts_.size()); }
  StatusOr<TaskPrompt> prompt(int64_t index) const override {
    return prompt_at(prompts_, index, "math_answer");
  }

  StatusOr<Score> score(const TaskPrompt& prompt, std::string_view response) const override {
    const std::optional<std::string> boxed = extract_boxed(response);
    const std::optional<std::string> answer = boxed ? boxed : extract_last_number(response);
    // An empty box is no answer, even against an (invalid) empty reference.
    const bool correct = answer && !normalize_math_answer(*answer).empty() &&
                         math_answers_equal(*answer, prompt.reference);
    const double c = correct ? 1.0 : 0.0;
    const double f = boxed ? 1.0 : 0.0;
    Score s;
    s.reward = (1.0 - format_reward_) * c + format_reward_ * f;
    s.sub_scores = {{"correct", c}, {"formatted", f}};
    return s;
  }

 private:
  std::vector<TaskPrompt> prompts_;
  double format_reward_;
};

}  // namespace

StatusOr<std::unique_ptr<Task>> make_math_answer_task(const std::string& path,
                                                      const MathAnswerTaskConfig& config,
                                                      model::ChatTemplate chat_template) {
  RELAY_ASSIGN_OR_RETURN(
      std::vector<TaskPrompt> prompts,
      read_jsonl_prompts(path, {"question", "answer", "solution", chat_template}));
  for (const TaskPrompt& p : prompts) {
    if (normalize_math_answer(p.reference).empty()) {
      return InvalidArgumentError(absl::StrCat(p.id, ": field 'answer': empty"));
    }
  }
  return std::unique_ptr<Task>(
      std::make_unique<MathAnswerTask>(std::move(prompts), config.format_reward));
}

}  // namespace relay::rollout
