#include "model/json_nesting.h"

#include "absl/strings/str_cat.h"

namespace relay::model {

size_t find_json_nesting_over(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character cannot end the string
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return i;
    } else if (c == ']' || c == '}') {
      // Unbalanced closers are the parser's to report; never go below 0 so
      // that "]]]" cannot buy room for deeper nesting later.
      if (depth > 0) --depth;
    }
  }
  return std::string_view::npos;
}

Status check_json_nesting(std::string_view text, const std::string& source) {
  const size_t at = find_json_nesting_over(text);
  if (at == std::string_view::npos) return OkStatus();
  return InvalidArgumentError(absl::StrCat(source, ": JSON nests deeper than ", kMaxJsonNesting,
                                           " levels (at byte ", at, ")"));
}

}  // namespace relay::model
