#pragma once

// Tokenizers behind one interface. The character tokenizer serves the
// built-in arithmetic tasks; Hugging Face's byte-level BPE (tokenizer.json)
// is BpeTokenizer (bpe_tokenizer.h).

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "relay/common/status.h"

namespace relay::model {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Text -> ids. Fails (InvalidArgument, naming the offset) on text the
  // vocabulary cannot represent.
  virtual StatusOr<std::vector<int64_t>> encode(std::string_view text) const = 0;
  // Ids -> text; special tokens render as their names ("<eos>"). Fails on
  // ids outside the vocabulary.
  virtual StatusOr<std::string> decode(const std::vector<int64_t>& ids) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t eos_id() const = 0;  // -1 = none
  virtual int64_t bos_id() const = 0;  // -1 = none
  virtual int64_t pad_id() const = 0;  // -1 = none
  // Id of a token given by its text ("<eos>", "7"), if it exists.
  virtual std::optional<int64_t> token_id(std::string_view token) const = 0;
};

// One id per character of a fixed alphabet, after three specials:
// 0 = <pad>, 1 = <bos>, 2 = <eos>, then alphabet[0], alphabet[1], ...
class CharTokenizer final : public Tokenizer {
 public:
  // Digits, arithmetic operators, brackets and a little punctuation: enough
  // for prompts like "<3+4+5>" with answers like "12#".
  static constexpr std::string_view kDefaultAlphabet = "0123456789+-*/=<>()#., ?:";
  static constexpr int64_t kPad = 0, kBos = 1, kEos = 2, kNumSpecials = 3;

  // Rejects an empty alphabet, repeated characters and non-ASCII bytes.
  static StatusOr<CharTokenizer> create(std::string_view alphabet = kDefaultAlphabet);

  // The file format relay writes next to a model: {"type": "char", "alphabet": "..."}.
  static StatusOr<CharTokenizer> from_json(const std::string& json_text, const std::string& source);
  std::string to_json() const;

  StatusOr<std::vector<int64_t>> encode(std::string_view text) const override;
  StatusOr<std::string> decode(const std::vector<int64_t>& ids) const override;
  int64_t vocab_size() const override {
    return kNumSpecials + static_cast<int64_t>(alphabet_.size());
  }
  int64_t eos_id() const override { return kEos; }
  int64_t bos_id() const override { return kBos; }
  int64_t pad_id() const override { return kPad; }
  std::optional<int64_t> token_id(std::string_view token) const override;
  const std::string& alphabet() const { return alphabet_; }

 private:
  explicit CharTokenizer(std::string alphabet);
  std::string alphabet_;
  int64_t index_[256];  // byte -> id, -1 when not in the alphabet
};

// The tokenizer file relay writes into a model directory.
inline constexpr const char* kCharTokenizerFile = "relay_tokenizer.json";

// Loads the tokenizer stored in a model directory: relay_tokenizer.json, or
// else a Hugging Face tokenizer.json (BpeTokenizer), whose eos / bos / pad
// come from tokenizer_config.json when the directory has one. A PEFT adapter
// directory without either file gives its base model's. NotFound when the
// directory has neither tokenizer file.
StatusOr<std::unique_ptr<Tokenizer>> load_tokenizer(const std::string& model_dir);
// Loads one tokenizer file: a Hugging Face tokenizer.json (it has a "model"
// object) or relay's char tokenizer file.
StatusOr<std::unique_ptr<Tokenizer>> load_tokenizer_file(const std::string& path);
Status save_char_tokenizer(const CharTokenizer& tokenizer, const std::string& model_dir);

}  // namespace relay::model
