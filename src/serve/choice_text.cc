#include "relay/serve/choice_text.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "relay/env/tool_call.h"
#include "relay/env/tool_prompt.h"

namespace relay::serve {
namespace {

// The longest k < pattern.size() such that `text` ends with pattern's first k
// bytes: how much of text's tail could still become `pattern`.
size_t partial_suffix(const std::string& text, std::string_view pattern) {
  for (size_t k = std::min(text.size(), pattern.size() - 1); k > 0; --k) {
    if (text.compare(text.size() - k, k, pattern, 0, k) == 0) return k;
  }
  return 0;
}

// The largest end <= limit such that text[from, end) does not stop inside a
// UTF-8 character (a lead byte whose continuation bytes have not all come).
size_t utf8_boundary(const std::string& text, size_t from, size_t limit) {
  size_t i = limit;
  // Step back over at most 3 continuation bytes to the character's lead byte.
  size_t back = 0;
  while (i > from && back < 3 && (static_cast<unsigned char>(text[i - 1]) & 0xC0) == 0x80) {
    --i;
    ++back;
  }
  if (i == from) return limit;  // no lead byte in range: not ours to fix
  const auto lead = static_cast<unsigned char>(text[i - 1]);
  size_t need = 1;
  if ((lead & 0xE0) == 0xC0) need = 2;
  if ((lead & 0xF0) == 0xE0) need = 3;
  if ((lead & 0xF8) == 0xF0) need = 4;
  return need > back + 1 ? i - 1 : limit;
}

}  // namespace

ChoiceText::ChoiceText(std::shared_ptr<const model::Tokenizer> tokenizer,
                       std::vector<std::string> stop, bool parse_tools,
                       std::set<int64_t> stop_tokens)
    : tokenizer_(std::move(tokenizer)),
      stop_(std::move(stop)),
      parse_tools_(parse_tools),
      stop_tokens_(std::move(stop_tokens)) {}

StatusOr<std::string> ChoiceText::token_text(int64_t id) const { return tokenizer_->decode({id}); }

StatusOr<std::string> ChoiceText::add(const std::vector<int64_t>& ids) {
  std::vector<int64_t> visible;
  for (int64_t id : ids) {
    if (stop_tokens_.count(id) == 0) visible.push_back(id);
  }
  if (cut_ || visible.empty()) return std::string();
  const size_t old_size = text_.size();
  RELAY_ASSIGN_OR_RETURN(std::string more, tokenizer_->decode(visible));
  text_ += more;
  // A stop string may end in the new bytes and begin up to its length before.
  size_t longest = 0;
  for (const std::string& s : stop_) longest = std::max(longest, s.size());
  const size_t from = old_size > longest ? old_size - longest : 0;
  for (const std::string& s : stop_) {
    const size_t at = text_.find(s, from);
    if (at != std::string::npos && (!cut_ || at < *cut_)) cut_ = at;
  }
  if (parse_tools_ && !tool_at_) {
    const size_t probe =
        old_size > env::kToolCallOpen.size() ? old_size - env::kToolCallOpen.size() : 0;
    const size_t at = text_.find(env::kToolCallOpen, probe);
    if (at != std::string::npos) tool_at_ = at;
  }
  const size_t end = sendable();
  std::string out;
  if (end > sent_) {
    out = text_.substr(sent_, end - sent_);
    sent_ = end;
  }
  return out;
}

size_t ChoiceText::sendable() const {
  if (cut_) return std::max(sent_, std::min(*cut_, tool_at_.value_or(*cut_)));
  size_t limit = text_.size();
  for (const std::string& s : stop_)
    limit = std::min(limit, text_.size() - partial_suffix(text_, s));
  if (parse_tools_) {
    if (tool_at_) limit = std::min(limit, *tool_at_);
    limit = std::min(limit, text_.size() - partial_suffix(text_, env::kToolCallOpen));
  }
  if (limit <= sent_) return sent_;
  return std::max(sent_, utf8_boundary(text_, sent_, limit));
}

ChoiceText::Final ChoiceText::finish() const {
  const std::string text = text_.substr(0, cut_.value_or(text_.size()));
  Final out;
  if (parse_tools_ && tool_at_ && *tool_at_ < text.size()) {
    env::ParsedTurn parsed = env::parse_tool_calls(text);
    if (parsed.errors.empty() && !parsed.calls.empty()) {
      for (const env::ToolCall& call : parsed.calls) {
        StatusOr<std::string> arguments = env::python_json(call.arguments);
        out.tool_calls.push_back(
            {random_id("call_"), call.name, arguments.ok() ? *arguments : call.arguments});
      }
      const std::string before = text.substr(0, *tool_at_);
      if (before.find_first_not_of(" \t\r\n") != std::string::npos) out.content = before;
      // What a stream held back is the calls, sent as tool_calls instead.
      if (sent_ < *tool_at_) out.unsent = text.substr(sent_, *tool_at_ - sent_);
      return out;
    }
  }
  out.content = text;
  if (sent_ < text.size()) out.unsent = text.substr(sent_);
  return out;
}

}  // namespace relay::serve
