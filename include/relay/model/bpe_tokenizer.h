#pragma once

// Hugging Face tokenizer.json byte-level BPE (the GPT-2 / Llama-3 / Qwen2
// family) behind relay's Tokenizer interface.
//
// Supported tokenizer.json subset (anything else is InvalidArgument naming
// the file and the JSON path):
//   normalizer     null, or NFC treated as a no-op (see bpe_tokenizer.cc)
//   pre_tokenizer  ByteLevel, Split (Regex or String pattern, invert false),
//                  Digits, Punctuation, or a Sequence of them
//   model          BPE: vocab, merges ("a b" or ["a", "b"]), ignore_merges;
//                  no dropout, continuing_subword_prefix, end_of_word_suffix
//                  or byte_fallback
//   decoder        ByteLevel (or null)
//   added_tokens   matched on the raw text, leftmost then longest first
//                  (lstrip/rstrip take adjacent whitespace; single_word is
//                  not supported)
// Differences from Hugging Face: NFC is not applied; a character whose byte
// has no vocab symbol is an error rather than silently dropped.
// post_processor is ignored: encode() never adds BOS/EOS (as HF's
// add_special_tokens=False).
// Limits that keep a hostile file an error rather than a crash or a huge
// allocation: every id must be < 2 x the distinct tokens of vocab and
// added_tokens + 1024 (real files are dense); Sequence nodes, in any section,
// nest at most 32 deep; the JSON at most 128 levels. A field of the wrong
// type is an error naming it ("added_tokens[0].special: must be a boolean").
//
// Thread-safety: const methods may be called from any thread (the per-word
// BPE cache is guarded by a mutex).

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "relay/common/status.h"
#include "relay/model/tokenizer.h"

namespace relay::model {

class BpeTokenizer final : public Tokenizer {
 public:
  // Parses tokenizer.json text; `source` names the file in error messages.
  static StatusOr<BpeTokenizer> from_json(const std::string& json_text, const std::string& source);

  BpeTokenizer(BpeTokenizer&&) noexcept;
  BpeTokenizer& operator=(BpeTokenizer&&) noexcept;
  ~BpeTokenizer() override;

  // Fails on invalid UTF-8 (naming the offset).
  StatusOr<std::vector<int64_t>> encode(std::string_view text) const override;
  // Added tokens render as their content; other tokens map back through the
  // byte-level table to raw bytes (which may be invalid UTF-8 for a partial
  // sequence of ids).
  StatusOr<std::string> decode(const std::vector<int64_t>& ids) const override;
  // Max id + 1 over the vocab and the added tokens.
  int64_t vocab_size() const override;
  // Chosen among the added tokens by name (first present wins):
  //   eos: <|endoftext|>, <|im_end|>, <|end_of_text|>, <|eot_id|>, </s>,
  //        <｜end▁of▁sentence｜>
  //   bos: <|begin_of_text|>, <s>, <｜begin▁of▁sentence｜>
  //   pad: <|padding|>, <pad>, <|pad|>, <|finetune_right_pad_id|>
  // -1 when none is present.
  int64_t eos_id() const override;
  int64_t bos_id() const override;
  int64_t pad_id() const override;
  // tokenizer_config.json's eos_token / bos_token / pad_token, which name a
  // model's special tokens and win over the guesses above. Each given name
  // must be a token of this tokenizer (InvalidArgument naming `source` and
  // the key); nothing changes on error.
  struct SpecialTokens {
    std::optional<std::string> eos, bos, pad;
  };
  Status use_special_tokens(const SpecialTokens& names, const std::string& source);
  // Added token content or a vocab entry (in its byte-level form, "Ġthe").
  std::optional<int64_t> token_id(std::string_view token) const override;

 private:
  struct Impl;
  explicit BpeTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The Hugging Face tokenizer file load_tokenizer() falls back to, and the
// file beside it whose eos_token / bos_token / pad_token it honours.
inline constexpr const char* kHfTokenizerFile = "tokenizer.json";
inline constexpr const char* kHfTokenizerConfigFile = "tokenizer_config.json";

}  // namespace relay::model
