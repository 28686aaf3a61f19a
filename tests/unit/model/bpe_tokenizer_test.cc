#include "relay/model/bpe_tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "relay/common/file_io.h"
#include "testing/byte_tokenizer_json.h"

namespace relay::model {
namespace {

using nlohmann::json;
using Ids = std::vector<int64_t>;

using testing::byte_symbol;  // GPT-2's byte -> character table

// A small tokenizer.json: byte b has id b ("Ġ" = space = 32, "Ċ" = '\n' =
// 10), then these merges (rank = index), then added tokens from 300.
const std::vector<std::pair<std::string, std::string>> kMerges = {
    {"Ġ", "t"},    // 256 "Ġt"
    {"h", "e"},    // 257 "he"
    {"Ġt", "he"},  // 258 "Ġthe"
    {"1", "2"},    // 259 "12"
    {"Ġ", "Ġ"},    // 260 "ĠĠ"
    {"Ã", "©"},    // 261 "Ã©" (the bytes of "é")
    {"x", "y"},    // 262 "xy"
    {"Ġ", "Â"},    // 263 "ĠÂ" (space, then the first byte of U+0080..U+00BF)
};

json make_tokenizer(bool merges_as_pairs = false, bool ignore_merges = false) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_symbol(b)] = b;
  json merges = json::array();
  int64_t id = 256;
  for (const auto& [a, b] : kMerges) {
    vocab[a + b] = id++;
    merges.push_back(merges_as_pairs ? json::array({a, b}) : json(a + " " + b));
  }
  vocab["xyz"] = 270;  // no merge builds it: reachable only with ignore_merges
  json added = json::array();
  const auto add = [&](int64_t id, const std::string& content, bool special) {
    added.push_back({{"id", id},
                     {"content", content},
                     {"special", special},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", !special},
                     {"single_word", false}});
  };
  add(300, "<|endoftext|>", true);
  add(301, "<|im_end|>", true);
  add(302, "<|end|>", true);
  add(303, "<|end", false);  // a prefix of the two above: the longer match wins
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
            {"ignore_merges", ignore_merges},
            {"vocab", vocab},
            {"merges", merges}}}};
}

BpeTokenizer load(const json& j) {
  StatusOr<BpeTokenizer> t = BpeTokenizer::from_json(j.dump(), "test/tokenizer.json");
  EXPECT_TRUE(t.ok()) << t.status();
  return std::move(*t);
}

Ids encode(const BpeTokenizer& t, const std::string& text) {
  StatusOr<Ids> ids = t.encode(text);
  EXPECT_TRUE(ids.ok()) << ids.status();
  return ids.ok() ? *ids : Ids{};
}

TEST(BpeTokenizerTest, EncodesExactIds) {
  const BpeTokenizer t = load(make_tokenizer());
  struct Case {
    std::string text;
    Ids ids;
  } cases[] = {
      {"", {}},
      {"the", {116, 257}},                       // "h e" merges; "t" alone
      {" the", {258}},                           // Ġ t -> Ġt, h e -> he, Ġt he -> Ġthe
      {"the the", {116, 257, 258}},              // the leading space joins the word
      {"12345", {259, 51, 52, 53}},              // one digit run: "1 2" merges once
      {"a 12", {97, 32, 259}},                   // " ?\p{N}+" keeps the space: Ġ 12
      {"a  \n\nb", {97, 260, 10, 10, 98}},       // \s+(?!\S) takes "  \n", then "\n"
      {"a  b", {97, 32, 32, 98}},                // "Ġ" then "Ġb": the last space joins b
      {"café", {99, 97, 102, 261}},              // é is bytes C3 A9 -> "Ã©"
      {"你好", {228, 189, 160, 229, 165, 189}},  // CJK: raw bytes, no merges
      {"👍!", {240, 159, 145, 141, 33}},          // emoji and '!' are one piece
      {"hi<|endoftext|>the", {104, 105, 300, 116, 257}},
      {"<|end|><|endoftext|><|end", {302, 300, 303}},  // longest match first
      {" <|im_end|>\n", {32, 301, 10}},
      {"xyz", {262, 122}},            // without ignore_merges: xy, z
      {"it's", {105, 116, 39, 115}},  // "'s" is its own piece
      // U+0085 (NEL, bytes C2 85) is whitespace to HF's Oniguruma \s: " " and
      // NEL are separate pieces, so "Ġ Â" does not merge. U+00A0 (C2 A0) is
      // whitespace to both: \s+(?!\S) keeps " " apart from it too.
      {" \u0085a", {32, 194, 133, 97}},
      {" \u00a0a", {32, 194, 160, 97}},
      {" \u00a9a", {263, 169, 97}},  // © is not whitespace: " ©" is one piece
  };
  for (const Case& c : cases) EXPECT_EQ(encode(t, c.text), c.ids) << json(c.text).dump();
}

TEST(BpeTokenizerTest, MergesAsPairsEncodeTheSame) {
  const BpeTokenizer strings = load(make_tokenizer(false));
  const BpeTokenizer pairs = load(make_tokenizer(true));
  for (const std::string text : {" the 12 café", "a  \n\nb xyz"}) {
    EXPECT_EQ(encode(strings, text), encode(pairs, text)) << text;
  }
  EXPECT_EQ(encode(pairs, " the"), (Ids{258}));
}

TEST(BpeTokenizerTest, IgnoreMergesMapsWholeVocabWords) {
  const BpeTokenizer t = load(make_tokenizer(false, /*ignore_merges=*/true));
  EXPECT_EQ(encode(t, "xyz"), (Ids{270}));
  EXPECT_EQ(encode(t, "xyzz"), (Ids{262, 122, 122}));  // not in the vocab: merges as usual
  EXPECT_EQ(encode(t, " the"), (Ids{258}));
}

TEST(BpeTokenizerTest, SequenceOfSplitsIsolatesEachMatch) {
  json j = make_tokenizer();
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"},
         {"pattern", {{"Regex", "\\p{N}"}}},
         {"behavior", "Isolated"},
         {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  const BpeTokenizer t = load(j);
  // Each digit is its own piece, so "1 2" never merges; without the GPT-2
  // regex " the" and "x" stay in one piece.
  EXPECT_EQ(encode(t, "x12 the"), (Ids{120, 49, 50, 258}));
  EXPECT_EQ(encode(t, "x12 the").size(), 4u);
}

TEST(BpeTokenizerTest, DecodeRoundTrips) {
  const BpeTokenizer t = load(make_tokenizer());
  for (const std::string text :
       {"", "the the", "  leading and trailing  ", "tabs\tand\r\nnewlines\n\n\n",
        "café naïve Ångström", "你好，世界", "👍🏽 👨‍👩‍👧",
        "x<|endoftext|>y<|im_end|>", "1234567890", "it's we'll I'd"}) {
    StatusOr<Ids> ids = t.encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status();
    StatusOr<std::string> back = t.decode(*ids);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, text);
  }
  EXPECT_EQ(*t.decode({258, 300, 261}), " the<|endoftext|>é");
}

TEST(BpeTokenizerTest, SpecialIdsAndLookups) {
  const BpeTokenizer t = load(make_tokenizer());
  EXPECT_EQ(t.vocab_size(), 304);
  EXPECT_EQ(t.eos_id(), 300);  // <|endoftext|> comes before <|im_end|>
  EXPECT_EQ(t.bos_id(), -1);
  EXPECT_EQ(t.pad_id(), -1);
  EXPECT_EQ(t.token_id("<|im_end|>"), 301);
  EXPECT_EQ(t.token_id("Ġthe"), 258);
  EXPECT_FALSE(t.token_id("nope").has_value());
}

TEST(BpeTokenizerTest, EncodeAndDecodeErrors) {
  const BpeTokenizer t = load(make_tokenizer());
  EXPECT_EQ(t.encode("ab\xff").status().message(),
            "bpe tokenizer: invalid UTF-8 at offset 2 of the text");
  EXPECT_EQ(t.decode({1, 280}).status().message(),
            "bpe tokenizer: ids[1] = 280 is not in the vocabulary");
}

TEST(BpeTokenizerTest, LoadsTokenizerJsonFromAModelDirectory) {
  const std::string dir = ::testing::TempDir() + "/bpe_tok_dir";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  ASSERT_TRUE(write_file_atomic(dir + "/tokenizer.json", make_tokenizer().dump()).ok());
  auto loaded = load_tokenizer(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(*(*loaded)->encode(" the"), (Ids{258}));
  auto file = load_tokenizer_file(dir + "/tokenizer.json");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->vocab_size(), 304);
  // relay's own tokenizer file wins when both are present.
  ASSERT_TRUE(save_char_tokenizer(*CharTokenizer::create("ab"), dir).ok());
  EXPECT_EQ((*load_tokenizer(dir))->vocab_size(), 5);
}

// tokenizer_config.json names the special tokens (Qwen2.5-Instruct: eos
// <|im_end|>, pad <|endoftext|>); it wins over the guess by name.
TEST(BpeTokenizerTest, TokenizerConfigNamesTheSpecialTokens) {
  const std::string dir = ::testing::TempDir() + "/bpe_tok_config_dir";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  ASSERT_TRUE(write_file_atomic(dir + "/tokenizer.json", make_tokenizer().dump()).ok());
  ASSERT_TRUE(write_file_atomic(dir + "/tokenizer_config.json",
                                R"({"eos_token": "<|im_end|>", "bos_token": null,
                                    "pad_token": {"content": "<|endoftext|>", "special": true}})")
                  .ok());
  auto loaded = load_tokenizer(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)->eos_id(), 301);
  EXPECT_EQ((*loaded)->pad_id(), 300);
  EXPECT_EQ((*loaded)->bos_id(), -1);
  // A name the tokenizer does not have is an error naming the file and key.
  ASSERT_TRUE(write_file_atomic(dir + "/tokenizer_config.json", R"({"eos_token": "</s>"})").ok());
  auto bad = load_tokenizer(dir);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(),
            dir + "/tokenizer_config.json: eos_token: '</s>' is not a token of the tokenizer");
  std::filesystem::remove_all(dir);
}

TEST(BpeTokenizerTest, ByteMissingFromTheVocabIsAnError) {
  json j = make_tokenizer();
  j["model"]["vocab"].erase(byte_symbol(0x0B));  // "ċ": vertical tab
  const BpeTokenizer t = load(j);
  EXPECT_EQ(t.encode("ab c\vd").status().message(),
            "bpe tokenizer: the byte at offset 4 maps to symbol \"ċ\", which is not in the "
            "vocabulary");
  EXPECT_EQ(t.encode("<|end|>\v").status().message(),
            "bpe tokenizer: the byte at offset 7 maps to symbol \"ċ\", which is not in the "
            "vocabulary");
}

std::string load_error(const json& j) {
  StatusOr<BpeTokenizer> t = BpeTokenizer::from_json(j.dump(), "test/tokenizer.json");
  EXPECT_FALSE(t.ok());
  return std::string(t.status().message());
}

TEST(BpeTokenizerTest, LoadErrorsNameTheField) {
  json j = make_tokenizer();
  j["model"]["type"] = "WordPiece";
  EXPECT_EQ(load_error(j), "test/tokenizer.json: model.type: expected \"BPE\", got \"WordPiece\"");

  j = make_tokenizer();
  j["model"]["merges"][1] = "he";
  EXPECT_EQ(load_error(j), "test/tokenizer.json: model.merges[1]: expected \"a b\", got \"he\"");
  j["model"]["merges"][1] = json::array({"h"});
  EXPECT_EQ(
      load_error(j),
      "test/tokenizer.json: model.merges[1]: expected \"a b\" or [\"a\", \"b\"], got [\"h\"]");
  j["model"]["merges"][1] = "q z";
  EXPECT_EQ(load_error(j), "test/tokenizer.json: model.merges[1]: \"qz\" is not in model.vocab");

  j = make_tokenizer();
  j["normalizer"] = {{"type", "Lowercase"}};
  EXPECT_EQ(load_error(j),
            "test/tokenizer.json: normalizer.type: \"Lowercase\" is not supported (null or NFC "
            "only)");
  j["normalizer"] = {{"type", "NFC"}};  // accepted as a no-op
  EXPECT_TRUE(BpeTokenizer::from_json(j.dump(), "t").ok());

  j = make_tokenizer();
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers", {{{"type", "ByteLevel"}}, {{"type", "Metaspace"}}}}};
  EXPECT_EQ(load_error(j),
            "test/tokenizer.json: pre_tokenizer.pretokenizers[1].type: pre-tokenizer "
            "\"Metaspace\" is not supported");

  j = make_tokenizer();
  j["pre_tokenizer"] = {
      {"type", "Split"}, {"pattern", {{"Regex", "(["}}}, {"behavior", "Isolated"}};
  EXPECT_NE(load_error(j).find("test/tokenizer.json: pre_tokenizer.pattern: bad regex"),
            std::string::npos);

  j = make_tokenizer();
  j["model"]["ignore_merges"] = "yes";  // wrong type: an error, not an exception
  EXPECT_EQ(load_error(j),
            "test/tokenizer.json: model.ignore_merges: must be a boolean, got \"yes\"");

  EXPECT_EQ(load_error(json::array()), "test/tokenizer.json: not a JSON object");
}

// A Split with a String pattern matches it literally. (PCRE2 refuses
// PCRE2_UCP with PCRE2_LITERAL, so these failed to load until the fuzzer's
// seeds used one.)
TEST(BpeTokenizerTest, SplitOnALiteralString) {
  json j = make_tokenizer();
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"String", "+ "}}}, {"behavior", "Removed"}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  const BpeTokenizer t = load(j);
  EXPECT_EQ(encode(t, "1+ 2+2 x"), (Ids{49, 50, 43, 50, 32, 120}));  // "+ " is dropped, "+" kept
}

// A field of the wrong type is named with its JSON path (nlohmann's own
// type_error names neither the file nor the field).
TEST(BpeTokenizerTest, WrongTypesNameTheField) {
  struct Case {
    std::function<void(json&)> edit;
    std::string message;
  } cases[] = {
      {[](json& j) { j["added_tokens"][0]["special"] = "yes"; },
       "added_tokens[0].special: must be a boolean, got \"yes\""},
      {[](json& j) { j["added_tokens"][1]["lstrip"] = 1; },
       "added_tokens[1].lstrip: must be a boolean, got 1"},
      {[](json& j) { j["added_tokens"][2]["normalized"] = json::array(); },
       "added_tokens[2].normalized: must be a boolean, got []"},
      {[](json& j) { j["added_tokens"][0]["id"] = "300"; },
       "added_tokens[0].id: must be an integer >= 0, got \"300\""},
      {[](json& j) { j["added_tokens"][0]["id"] = -1; },
       "added_tokens[0].id: must be an integer >= 0, got -1"},
      {[](json& j) { j["added_tokens"][3]["content"] = 5; },
       "added_tokens[3].content: must be a non-empty string, got 5"},
      {[](json& j) { j["added_tokens"][0] = "x"; },
       "added_tokens[0]: must be an object, got \"x\""},
      {[](json& j) { j["added_tokens"] = json::object(); }, "added_tokens: expected an array"},
      {[](json& j) { j["model"]["byte_fallback"] = 0; },
       "model.byte_fallback: must be a boolean, got 0"},
      {[](json& j) { j["model"]["vocab"]["a"] = "97"; },
       "model.vocab[\"a\"]: expected an id in [0, 2^31), got \"97\""},
      {[](json& j) { j["pre_tokenizer"]["add_prefix_space"] = "no"; },
       "pre_tokenizer.add_prefix_space: must be a boolean, got \"no\""},
      {[](json& j) { j["pre_tokenizer"]["type"] = 5; },
       "pre_tokenizer.type: must be a string, got 5"},
      {[](json& j) {
         j["pre_tokenizer"] = {{"type", "Split"},
                               {"pattern", {{"String", " "}}},
                               {"behavior", "Isolated"},
                               {"invert", "false"}};
       },
       "pre_tokenizer.invert: must be a boolean, got \"false\""},
      {[](json& j) {
         j["normalizer"] = {{"type", json::array()}};
       },
       "normalizer.type: must be a string, got []"},
      {[](json& j) { j["normalizer"] = 3; }, "normalizer: must be null or an object, got 3"},
      {[](json& j) { j["decoder"] = 7; }, "decoder: must be null or an object, got 7"},
      {[](json& j) {
         j["decoder"] = {{"type", "Metaspace"}};
       },
       "decoder.type: \"Metaspace\" is not supported (ByteLevel only)"},
  };
  for (const Case& c : cases) {
    json j = make_tokenizer();
    c.edit(j);
    EXPECT_EQ(load_error(j), "test/tokenizer.json: " + c.message);
  }
}

// Issue 17: an id of 2^30 in a small file made the id table 2^30 strings
// (std::bad_alloc, rc 134). Ids are bounded by the tokens the file defines:
// below 2 x tokens + 1024, which leaves room for gaps.
TEST(BpeTokenizerTest, IdsAreBoundedByTheTokensDefined) {
  // make_tokenizer(): 256 bytes + 8 merges + "xyz" in the vocab, 4 added
  // tokens that are not in it: 269 tokens, so ids must be < 1562.
  json j = make_tokenizer();
  j["model"]["vocab"]["xyz"] = 1 << 30;
  EXPECT_EQ(load_error(j),
            "test/tokenizer.json: model.vocab[\"xyz\"]: id 1073741824 is too large for the 269 "
            "tokens defined (ids must be < 1562: 2 x tokens + 1024)");
  j = make_tokenizer();
  j["added_tokens"][1]["id"] = 1 << 30;
  EXPECT_EQ(load_error(j),
            "test/tokenizer.json: added_tokens[1].id: id 1073741824 is too large for the 269 "
            "tokens defined (ids must be < 1562: 2 x tokens + 1024)");
  j["added_tokens"][1]["id"] = int64_t{1} << 40;
  EXPECT_NE(load_error(j).find("added_tokens[1].id: id 1099511627776 is too large"),
            std::string::npos);
  // An added token that repeats a vocab entry is one token, not two.
  j = make_tokenizer();
  j["added_tokens"].push_back({{"id", 1562}, {"content", "Ġthe"}});
  EXPECT_EQ(load_error(j),
            "test/tokenizer.json: added_tokens[4].id: id 1562 is too large for the 269 tokens "
            "defined (ids must be < 1562: 2 x tokens + 1024)");
  j["added_tokens"].back()["content"] = "<new>";  // 270 tokens: ids < 1564
  const BpeTokenizer gappy = load(j);
  EXPECT_EQ(gappy.vocab_size(), 1563);
  EXPECT_EQ(encode(gappy, " the<new>"), (Ids{258, 1562}));
  EXPECT_EQ(gappy.decode({1400}).status().message(),
            "bpe tokenizer: ids[0] = 1400 is not in the vocabulary");
}

// `depth` pre-tokenizer Sequences, each holding the next, ByteLevel inside.
// Built as text: nlohmann would build and dump it recursively.
std::string nested_pre_tokenizers(int depth) {
  json j = make_tokenizer();
  j["pre_tokenizer"] = "@nested@";
  std::string inner;
  for (int i = 0; i < depth; ++i) inner += R"({"type": "Sequence", "pretokenizers": [)";
  inner += R"({"type": "ByteLevel", "add_prefix_space": false})";
  for (int i = 0; i < depth; ++i) inner += "]}";
  std::string text = j.dump();
  text.replace(text.find("\"@nested@\""), 10, inner);
  return text;
}

std::string repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

// Issue 17: 20,000 nested Sequence nodes overflowed the stack (SIGSEGV, rc
// 139). Sequences may nest 32 deep, and no JSON file relay reads more than
// 128 levels.
TEST(BpeTokenizerTest, DeepNestingIsAnErrorNotAStackOverflow) {
  StatusOr<BpeTokenizer> t = BpeTokenizer::from_json(nested_pre_tokenizers(32), "t.json");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t->encode(" the"), (Ids{258}));

  t = BpeTokenizer::from_json(nested_pre_tokenizers(33), "t.json");
  EXPECT_EQ(t.status().message(), "t.json: pre_tokenizer" + repeat(".pretokenizers[0]", 32) +
                                      ": Sequence nested deeper than 32 levels");

  const std::string deep = nested_pre_tokenizers(20000);
  t = BpeTokenizer::from_json(deep, "t.json");
  // Level 129 opens at the pretokenizers list of the 64th Sequence (the
  // first Sequence is level 2, its list level 3).
  size_t at = deep.find(R"({"type": "Sequence")");
  for (int i = 0; i < 64; ++i) at = deep.find('[', at + 1);
  EXPECT_EQ(t.status().message(),
            "t.json: JSON nests deeper than 128 levels (at byte " + std::to_string(at) + ")");

  // The other sections' Sequences are bounded alike, though relay ignores
  // post_processor and supports no Sequence normalizer or decoder.
  for (const auto& [section, children] :
       {std::pair<std::string, std::string>{"normalizer", "normalizers"},
        {"decoder", "decoders"},
        {"post_processor", "processors"}}) {
    json j = make_tokenizer();
    j[section] = {{"type", "NFC"}};
    for (int i = 0; i < 40; ++i) {
      j[section] = {{"type", "Sequence"}, {children, json::array({j[section]})}};
    }
    EXPECT_EQ(load_error(j), "test/tokenizer.json: " + section +
                                 repeat("." + children + "[0]", 32) +
                                 ": Sequence nested deeper than 32 levels");
  }
}

TEST(BpeTokenizerTest, TokenizerConfigErrorsNameTheKey) {
  const std::string dir = ::testing::TempDir() + "/bpe_tok_config_errors";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  ASSERT_TRUE(write_file_atomic(dir + "/tokenizer.json", make_tokenizer().dump()).ok());
  const std::string config = dir + "/tokenizer_config.json";
  ASSERT_TRUE(write_file_atomic(config, R"({"pad_token": 5})").ok());
  EXPECT_EQ(load_tokenizer(dir).status().message(),
            config + ": pad_token: expected a string or {\"content\": ...}, got 5");
  ASSERT_TRUE(write_file_atomic(config, "{\"eos_token\": " + std::string(100000, '[') + "}").ok());
  EXPECT_EQ(load_tokenizer(dir).status().message(),
            config + ": JSON nests deeper than 128 levels (at byte 141)");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace relay::model
