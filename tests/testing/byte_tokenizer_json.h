#pragma once

// The smallest Hugging Face tokenizer.json relay reads: byte-level BPE with
// one token per byte (byte b has id b) and no merges, then the given added
// (special) tokens from id 256 on. Text encodes to its bytes, added tokens to
// their single ids, so tests can spell out expected ids by hand.

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace relay::testing {

// GPT-2's byte -> vocabulary symbol table, written out independently of
// relay's tokenizer: printable Latin-1 maps to itself, the other bytes to
// U+0100 on, in order ("Ġ" = space, "Ċ" = '\n').
inline std::string byte_symbol(int b) {
  static const std::vector<std::string> table = [] {
    std::vector<std::string> t(256);
    int next = 256;
    for (int i = 0; i < 256; ++i) {
      const bool printable = (i >= 33 && i <= 126) || (i >= 161 && i <= 172) || i >= 174;
      const int cp = printable ? i : next++;
      std::string s;
      if (cp < 0x80) {
        s.push_back(static_cast<char>(cp));
      } else {
        s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      }
      t[i] = s;
    }
    return t;
  }();
  return table[b];
}

// Vocabulary size 256 + special_tokens.size().
inline nlohmann::json byte_tokenizer_json(const std::vector<std::string>& special_tokens) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_symbol(b)] = b;
  nlohmann::json added = nlohmann::json::array();
  for (size_t i = 0; i < special_tokens.size(); ++i) {
    added.push_back({{"id", 256 + i},
                     {"content", special_tokens[i]},
                     {"special", true},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"single_word", false}});
  }
  return {{"version", "1.0"},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer",
           {{"type", "ByteLevel"},
            {"add_prefix_space", false},
            {"trim_offsets", true},
            {"use_regex", true}}},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"ignore_merges", false},
            {"vocab", vocab},
            {"merges", nlohmann::json::array()}}}};
}

}  // namespace relay::testing
