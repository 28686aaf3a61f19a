// Parity of BpeTokenizer with Hugging Face tokenizers on nine real byte-level
// BPE vocabularies and llama.cpp's tokenizer test texts. The vocabularies are
// other projects' files and live outside the repository, in
// ../shared/testdata/tokenizer_parity (see its README); without it the test
// skips.

#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "relay/common/file_io.h"
#include "relay/model/bpe_tokenizer.h"

namespace relay::model {
namespace {

const std::string kParityDir = RELAY_SOURCE_DIR "/../shared/testdata/tokenizer_parity";

std::string printable(const std::string& text) { return nlohmann::json(text).dump(); }

class BpeParityTest : public testing::TestWithParam<std::string> {};

TEST_P(BpeParityTest, EncodeAndDecodeMatchHuggingFace) {
  const std::string dir = kParityDir + "/" + GetParam();
  if (!std::filesystem::exists(dir + "/tokenizer.json")) {
    GTEST_SKIP() << dir << " is absent: parity vocabularies are not checked";
  }
  StatusOr<std::string> json_text = read_file(dir + "/tokenizer.json");
  ASSERT_TRUE(json_text.ok()) << json_text.status();
  StatusOr<BpeTokenizer> t = BpeTokenizer::from_json(*json_text, dir + "/tokenizer.json");
  ASSERT_TRUE(t.ok()) << t.status();
  StatusOr<std::string> cases_text = read_file(dir + "/cases.json");
  ASSERT_TRUE(cases_text.ok()) << cases_text.status();
  const nlohmann::json cases = nlohmann::json::parse(*cases_text);
  ASSERT_FALSE(cases.empty());
  int passed = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string text = cases[i]["text"];
    const std::vector<int64_t> expected = cases[i]["ids"];
    StatusOr<std::vector<int64_t>> ids = t->encode(text);
    ASSERT_TRUE(ids.ok()) << "case " << i << ": " << ids.status();
    EXPECT_EQ(*ids, expected) << "case " << i << ": " << printable(text);
    StatusOr<std::string> decoded = t->decode(expected);
    ASSERT_TRUE(decoded.ok()) << "case " << i << ": " << decoded.status();
    EXPECT_EQ(*decoded, text) << "case " << i;
    passed += (*ids == expected && *decoded == text);
  }
  std::printf("%s: %d/%zu cases pass\n", GetParam().c_str(), passed, cases.size());
}

// Random text from a mix of scripts, whitespace and emoji (fixed seed), and
// one long input: decode(encode(text)) == text.
TEST_P(BpeParityTest, RandomTextRoundTrips) {
  const std::string path = kParityDir + "/" + GetParam() + "/tokenizer.json";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " is absent";
  StatusOr<BpeTokenizer> t = BpeTokenizer::from_json(*read_file(path), path);
  ASSERT_TRUE(t.ok()) << t.status();
  const std::vector<std::pair<uint32_t, uint32_t>> ranges = {
      // Tab, LF, FF, CR: falcon's vocabulary has no symbol for \v (nor for some other control
      // bytes).
      {0x20, 0x7E},     {0x09, 0x0A},       {0x0C, 0x0D},     {0xA0, 0x24F},    {0x370, 0x3FF},
      {0x400, 0x4FF},   {0x600, 0x6FF},     {0x900, 0x97F},   {0x3000, 0x303F}, {0x4E00, 0x4FFF},
      {0xAC00, 0xAD00}, {0x1F300, 0x1F64F}, {0x2000, 0x206F}, {0x0300, 0x036F}};
  std::mt19937 rng(0);
  for (int n = 0; n < 200; ++n) {
    std::string text;
    const int len = static_cast<int>(rng() % 40);
    for (int i = 0; i < len; ++i) {
      const auto& [lo, hi] = ranges[rng() % ranges.size()];
      const uint32_t cp = lo + static_cast<uint32_t>(rng() % (hi - lo + 1));
      // UTF-8 by hand: nlohmann does not encode code points.
      if (cp < 0x80) {
        text += static_cast<char>(cp);
      } else if (cp < 0x800) {
        text += static_cast<char>(0xC0 | (cp >> 6));
        text += static_cast<char>(0x80 | (cp & 0x3F));
      } else if (cp < 0x10000) {
        text += static_cast<char>(0xE0 | (cp >> 12));
        text += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        text += static_cast<char>(0x80 | (cp & 0x3F));
      } else {
        text += static_cast<char>(0xF0 | (cp >> 18));
        text += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        text += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        text += static_cast<char>(0x80 | (cp & 0x3F));
      }
    }
    StatusOr<std::vector<int64_t>> ids = t->encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*t->decode(*ids), text) << printable(text);
  }
  std::string long_text;
  for (int i = 0; i < 2000; ++i) long_text += "word  \n\t 12345 ..!! 你好世界 ";
  long_text += std::string(100000, ' ');
  StatusOr<std::vector<int64_t>> ids = t->encode(long_text);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*t->decode(*ids), long_text);
}

INSTANTIATE_TEST_SUITE_P(Vocabs, BpeParityTest,
                         testing::Values("gpt-2", "llama-bpe", "qwen2", "mpt", "starcoder",
                                         "refact", "falcon", "deepseek-coder", "deepseek-llm"),
                         [](const testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           for (char& c : name) {
                             if (c == '-') c = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace relay::model
