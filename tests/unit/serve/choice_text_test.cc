// A choice's text as tokens arrive (serve/choice_text.h): stop strings found
// across token boundaries, text held back until it cannot be the start of
// one, characters never split, and tool calls read at the end.

#include "relay/serve/choice_text.h"

#include <gtest/gtest.h>

#include "relay/model/bpe_tokenizer.h"
#include "testing/byte_tokenizer_json.h"

namespace relay::serve {
namespace {

// Byte b is id b; <|im_end|> is 256.
std::shared_ptr<const model::Tokenizer> bytes() {
  static auto t = std::make_shared<model::BpeTokenizer>(*model::BpeTokenizer::from_json(
      relay::testing::byte_tokenizer_json({"<|im_end|>"}).dump(), "test"));
  return t;
}

std::vector<int64_t> ids(const std::string& s) {
  std::vector<int64_t> out;
  for (unsigned char c : s) out.push_back(c);
  return out;
}

// Feeds `text` one byte-token at a time; returns what was sent, joined.
std::string feed(ChoiceText& t, const std::string& text) {
  std::string sent;
  for (int64_t id : ids(text)) {
    auto piece = t.add({id});
    EXPECT_TRUE(piece.ok());
    sent += *piece;
    if (t.stopped()) break;
  }
  return sent;
}

TEST(ChoiceTextTest, PlainTextIsSentAsItComesAndTheStopTokenIsNotText) {
  ChoiceText t(bytes(), {}, false, {256});
  EXPECT_EQ(*t.add(ids("Hel")), "Hel");
  EXPECT_EQ(*t.add(ids("lo")), "lo");
  EXPECT_EQ(*t.add({256}), "");
  ChoiceText::Final f = t.finish();
  EXPECT_EQ(f.content, "Hello");
  EXPECT_EQ(f.unsent, "");
  EXPECT_FALSE(t.stopped());
}

TEST(ChoiceTextTest, AStopStringAcrossTokensCutsTheTextBeforeIt) {
  ChoiceText t(bytes(), {"END", "##"}, false, {256});
  // "E" and "EN" could start "END": held until they cannot.
  EXPECT_EQ(feed(t, "abE"), "ab");
  EXPECT_EQ(feed(t, "x"), "Ex");
  EXPECT_EQ(feed(t, "yEN"), "y");
  EXPECT_FALSE(t.stopped());
  EXPECT_EQ(feed(t, "D tail"), "");
  EXPECT_TRUE(t.stopped());
  EXPECT_EQ(t.finish().content, "abExy");
  EXPECT_EQ(*t.add(ids("more")), "") << "nothing after a stop";
  // Two stop strings: the earlier match wins.
  ChoiceText u(bytes(), {"bc", "abcd"}, false, {});
  EXPECT_EQ(*u.add(ids("xabcd")), "x");
  EXPECT_EQ(u.finish().content, "x");
}

TEST(ChoiceTextTest, ACharacterSplitAcrossTokensWaitsForItsLastByte) {
  ChoiceText t(bytes(), {}, false, {});
  const std::string euro = "\xe2\x82\xac";  // U+20AC, three bytes
  EXPECT_EQ(*t.add({'a', 0xe2}), "a");
  EXPECT_EQ(*t.add({0x82}), "");
  EXPECT_EQ(*t.add({0xac}), euro);
  // Cut by a length limit mid-character: the bytes come out at the end.
  EXPECT_EQ(*t.add({0xe2}), "");
  EXPECT_EQ(t.finish().unsent, "\xe2");
}

TEST(ChoiceTextTest, ToolCallsAreHeldBackAndReadAtTheEnd) {
  ChoiceText t(bytes(), {}, true, {256});
  const std::string turn =
      "Let me add.\n<tool_call>\n{\"name\": \"calc\", \"arguments\": {\"b\": 1, \"a\": 2}}\n"
      "</tool_call>";
  EXPECT_EQ(feed(t, turn), "Let me add.\n");
  ChoiceText::Final f = t.finish();
  EXPECT_EQ(f.content, "Let me add.\n");
  ASSERT_EQ(f.tool_calls.size(), 1u);
  EXPECT_EQ(f.tool_calls[0].name, "calc");
  EXPECT_EQ(f.tool_calls[0].arguments, "{\"b\": 1, \"a\": 2}");
  EXPECT_EQ(f.tool_calls[0].id.rfind("call_", 0), 0u);
  EXPECT_EQ(f.tool_calls[0].id.size(), 29u);
  EXPECT_EQ(f.unsent, "");

  // Only calls: content is null.
  ChoiceText only(bytes(), {}, true, {});
  feed(only, "<tool_call>{\"name\": \"f\"}</tool_call>");
  EXPECT_FALSE(only.finish().content.has_value());
  EXPECT_EQ(only.finish().tool_calls.at(0).arguments, "{}");

  // "<tool" that turns out to be text is sent once it is known.
  ChoiceText text(bytes(), {}, true, {});
  EXPECT_EQ(feed(text, "a <tool"), "a ");
  EXPECT_EQ(feed(text, "s>"), "<tools>");

  // A malformed block: the whole text is the content, no calls (vLLM's hermes
  // parser does the same); a stream sends what it held back at the end.
  ChoiceText bad(bytes(), {}, true, {});
  EXPECT_EQ(feed(bad, "x<tool_call>{oops</tool_call>"), "x");
  ChoiceText::Final g = bad.finish();
  EXPECT_TRUE(g.tool_calls.empty());
  EXPECT_EQ(g.content, "x<tool_call>{oops</tool_call>");
  EXPECT_EQ(g.unsent, "<tool_call>{oops</tool_call>");

  // Without tools on, a block is text.
  ChoiceText off(bytes(), {}, false, {});
  EXPECT_EQ(feed(off, "<tool_call>{\"name\": \"f\"}</tool_call>"),
            "<tool_call>{\"name\": \"f\"}</tool_call>");
  EXPECT_TRUE(off.finish().tool_calls.empty());
}

}  // namespace
}  // namespace relay::serve
