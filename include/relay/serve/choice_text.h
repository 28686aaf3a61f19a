#pragma once

// The text of one choice as its tokens arrive (docs/serve.md, "Text"):
//
//   - decoded token by token, a character split across tokens held until its
//     last byte arrives;
//   - cut before the first stop string (the request's `stop`); the tokens
//     that made it stay in token_ids, as they were sampled;
//   - with tools on, everything from the first "<tool_call>" on is held back
//     and read at the end as the turn's tool calls (Qwen/Hermes blocks,
//     env/tool_call.h), as vLLM's hermes parser reads them: the content is
//     the text before the first block, and a malformed block leaves the
//     whole text as content with no calls;
//   - a suffix that could be the start of a stop string or of "<tool_call>"
//     is held until it is known not to be, so a stream never sends text
//     that the final response would not contain.
//
// The engine's stop tokens (end-of-turn, EOS) are never part of the text.
// One instance per choice; not thread-safe.

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "relay/common/status.h"
#include "relay/model/tokenizer.h"
#include "relay/serve/openai_api.h"

namespace relay::serve {

class ChoiceText {
 public:
  ChoiceText(std::shared_ptr<const model::Tokenizer> tokenizer, std::vector<std::string> stop,
             bool parse_tools, std::set<int64_t> stop_tokens);

  // Takes the next sampled tokens; returns the text that may be sent now.
  StatusOr<std::string> add(const std::vector<int64_t>& ids);
  // A stop string has matched: the sample should end (its later tokens, if
  // any arrive, add no text).
  bool stopped() const { return cut_.has_value(); }

  struct Final {
    std::optional<std::string> content;  // null when the turn is only tool calls
    std::vector<ResponseToolCall> tool_calls;
    std::string unsent;  // what a stream has not sent yet (held back), "" with tool calls
  };
  // The choice's content and calls once no more tokens come.
  Final finish() const;

  // One token's own text (its raw bytes), for a logprobs entry.
  StatusOr<std::string> token_text(int64_t id) const;

 private:
  // Bytes of text_ that may be sent: before any stop match or tool call, not
  // a possible start of one, and ending on a whole UTF-8 character.
  size_t sendable() const;

  std::shared_ptr<const model::Tokenizer> tokenizer_;
  std::vector<std::string> stop_;
  bool parse_tools_;
  std::set<int64_t> stop_tokens_;
  std::string text_;               // decoded text of every non-stop token
  size_t sent_ = 0;                // bytes of text_ returned by add()
  std::optional<size_t> cut_;      // where a stop string starts
  std::optional<size_t> tool_at_;  // where the first "<tool_call>" starts
};

}  // namespace relay::serve
