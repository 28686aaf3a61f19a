#include "relay/model/tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>

namespace relay::model {
namespace {

TEST(CharTokenizerTest, EncodesTheToyTask) {
  auto t = CharTokenizer::create();
  ASSERT_TRUE(t.ok());
  // 0 <pad>, 1 <bos>, 2 <eos>, then "0123456789+-*/=<>()#., ?:"
  auto ids = t->encode("<3+4+5>");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<int64_t>{18, 6, 13, 7, 13, 8, 19}));
  EXPECT_EQ(*t->decode({4, 5, 22, 2}), "12#<eos>");
  EXPECT_EQ(t->vocab_size(), 3 + 25);
  EXPECT_EQ(t->token_id("<eos>"), 2);
  EXPECT_EQ(t->token_id("7"), 10);
  EXPECT_FALSE(t->token_id("x").has_value());
}

TEST(CharTokenizerTest, ErrorsNameTheOffsetOrId) {
  auto t = CharTokenizer::create("ab");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->encode("abc").status().message(),
            "char tokenizer: character 'c' at offset 2 is not in the alphabet \"ab\"");
  EXPECT_EQ(t->decode({3, 5}).status().message(),
            "char tokenizer: ids[1] = 5 is outside the vocabulary [0, 5)");
  EXPECT_FALSE(CharTokenizer::create("aba").ok());
  EXPECT_FALSE(CharTokenizer::create("").ok());
  EXPECT_FALSE(CharTokenizer::create("\xc3\xa9").ok());
}

TEST(CharTokenizerTest, SavesAndLoadsFromAModelDirectory) {
  const std::string dir = ::testing::TempDir() + "/char_tok_dir";
  std::filesystem::create_directories(dir);
  auto t = CharTokenizer::create("xyz01");
  ASSERT_TRUE(save_char_tokenizer(*t, dir).ok());
  auto loaded = load_tokenizer(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)->vocab_size(), 8);
  EXPECT_EQ(*(*loaded)->encode("z1"), (std::vector<int64_t>{5, 7}));
  EXPECT_EQ(load_tokenizer(dir + "/nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(CharTokenizer::from_json("{\"type\": \"bpe\"}", "t.json").ok());
}

}  // namespace
}  // namespace relay::model
