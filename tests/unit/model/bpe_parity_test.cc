// Parity of BpeTokenizer with Hugging Face tokenizers on nine real byte-level
// BPE vocabularies and llama.cpp's tokenizer test texts. The vocabularies are
// other projects' files and live outside the repository, in
// ../shared/testdata/tokenizer_parity (see its README); without it the test
// skips.

#include <gtest/gtest.h>

#include <filesystem>
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
