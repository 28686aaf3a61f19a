#include "relay/model/chat_template.h"

#include <cstdint>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "relay/model/tokenizer.h"

namespace relay::model {
namespace {

constexpr char kImStart[] = "<|im_start|>";
constexpr char kImEnd[] = "<|im_end|>";
constexpr char kBeginOfText[] = "<|begin_of_text|>";
constexpr char kStartHeader[] = "<|start_header_id|>";
constexpr char kEndHeader[] = "<|end_header_id|>";
constexpr char kEotId[] = "<|eot_id|>";

// The format's special tokens, in the order the header lists them.
const std::vector<std::string_view>& tokens_of(ChatTemplate t) {
  static const std::vector<std::string_view> kNoTokens;
  static const std::vector<std::string_view> kChatmlTokens = {kImStart, kImEnd};
  static const std::vector<std::string_view> kLlama3Tokens = {kBeginOfText, kStartHeader,
                                                              kEndHeader, kEotId};
  switch (t) {
    case ChatTemplate::kChatml:
      return kChatmlTokens;
    case ChatTemplate::kLlama3:
      return kLlama3Tokens;
    case ChatTemplate::kNone:
      break;
  }
  return kNoTokens;
}

// The UTF-8 code point starting at s[i] and its length in bytes; nullopt for
// a malformed sequence (which is then not whitespace).
std::optional<std::pair<uint32_t, size_t>> code_point_at(std::string_view s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char b0 = byte(i);
  size_t n = b0 < 0x80           ? 1
             : (b0 >> 5) == 0x6  ? 2
             : (b0 >> 4) == 0xE  ? 3
             : (b0 >> 3) == 0x1E ? 4
                                 : 0;
  if (n == 0 || i + n > s.size()) return std::nullopt;
  uint32_t cp = n == 1 ? b0 : b0 & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return std::nullopt;
    cp = (cp << 6) | (byte(i + k) & 0x3F);
  }
  return std::make_pair(cp, n);
}

// Python's str.isspace(), which Jinja's `trim` filter (str.strip()) uses.
bool is_python_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// `s` without leading and trailing whitespace, as Jinja's `trim` does it
// (Unicode whitespace included, so a no-break space goes too).
std::string_view jinja_trim(std::string_view s) {
  while (!s.empty()) {
    auto cp = code_point_at(s, 0);
    if (!cp || !is_python_space(cp->first)) break;
    s.remove_prefix(cp->second);
  }
  while (!s.empty()) {
    // Step back over continuation bytes to the start of the last code point.
    size_t start = s.size() - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    auto cp = code_point_at(s, start);
    if (!cp || start + cp->second != s.size() || !is_python_space(cp->first)) break;
    s.remove_suffix(cp->second);
  }
  return s;
}

// The single id `token` encodes to, or nullopt when the tokenizer has no
// such token or would split it (a vocab entry that is not an added token).
std::optional<int64_t> single_token(const Tokenizer& tokenizer, const std::string& token) {
  std::optional<int64_t> id = tokenizer.token_id(token);
  if (!id) return std::nullopt;
  StatusOr<std::vector<int64_t>> ids = tokenizer.encode(token);
  if (!ids.ok() || ids->size() != 1 || (*ids)[0] != *id) return std::nullopt;
  return id;
}

// The format's special tokens that the tokenizer lacks as single tokens.
std::vector<std::string> missing_tokens(ChatTemplate t, const Tokenizer& tokenizer) {
  std::vector<std::string> missing;
  for (const std::string& token : chat_special_tokens(t)) {
    if (!single_token(tokenizer, token)) missing.push_back(token);
  }
  return missing;
}

std::string quoted_list(const std::vector<std::string>& tokens) {
  return absl::StrCat("'", absl::StrJoin(tokens, "', '"), "'");
}

}  // namespace

const char* chat_template_name(ChatTemplate t) {
  switch (t) {
    case ChatTemplate::kChatml:
      return "chatml";
    case ChatTemplate::kLlama3:
      return "llama3";
    case ChatTemplate::kNone:
      break;
  }
  return "none";
}

std::vector<std::string> chat_special_tokens(ChatTemplate t) {
  const std::vector<std::string_view>& tokens = tokens_of(t);
  return std::vector<std::string>(tokens.begin(), tokens.end());
}

std::string end_of_turn(ChatTemplate t) {
  switch (t) {
    case ChatTemplate::kChatml:
      return std::string(kImEnd);
    case ChatTemplate::kLlama3:
      return std::string(kEotId);
    case ChatTemplate::kNone:
      break;
  }
  return "";
}

StatusOr<ChatTemplate> resolve_chat_template(ChatTemplateChoice choice, const Tokenizer& tokenizer,
                                             std::string_view field_view) {
  const std::string field(field_view);
  if (choice == ChatTemplateChoice::kNone) return ChatTemplate::kNone;
  if (choice != ChatTemplateChoice::kAuto) {
    const ChatTemplate t =
        choice == ChatTemplateChoice::kChatml ? ChatTemplate::kChatml : ChatTemplate::kLlama3;
    const std::vector<std::string> missing = missing_tokens(t, tokenizer);
    if (missing.empty()) return t;
    return InvalidArgumentError(absl::StrCat(
        field, ": '", chat_template_name(t), "' needs ", quoted_list(missing),
        missing.size() == 1 ? " as a single token" : " as single tokens",
        " of the model's tokenizer, which it does not have (the char tokenizer has no chat "
        "tokens; give a model directory whose tokenizer.json has them, or set none)"));
  }
  const bool chatml = missing_tokens(ChatTemplate::kChatml, tokenizer).empty();
  const bool llama3 = missing_tokens(ChatTemplate::kLlama3, tokenizer).empty();
  if (chatml && !llama3) return ChatTemplate::kChatml;
  if (llama3 && !chatml) return ChatTemplate::kLlama3;
  if (chatml && llama3) {
    return InvalidArgumentError(
        absl::StrCat(field,
                     ": 'auto' cannot tell: the tokenizer has both ChatML's and Llama 3's "
                     "special tokens; set chatml or llama3"));
  }
  return InvalidArgumentError(
      absl::StrCat(field, ": 'auto' cannot tell: the tokenizer has neither ChatML's ",
                   quoted_list(chat_special_tokens(ChatTemplate::kChatml)), " nor Llama 3's ",
                   quoted_list(chat_special_tokens(ChatTemplate::kLlama3)),
                   " as single tokens; set none (prompts as written), chatml or llama3"));
}

StatusOr<ChatTemplate> resolve_chat_template(std::string_view name, const Tokenizer& tokenizer,
                                             std::string_view field) {
  StatusOr<ChatTemplateChoice> choice = kChatTemplateChoiceNames.parse(name);
  if (!choice.ok()) {
    return InvalidArgumentError(absl::StrCat(std::string(field), ": ", choice.status().message()));
  }
  return resolve_chat_template(*choice, tokenizer, field);
}

std::string_view find_chat_token(ChatTemplate t, std::string_view text) {
  for (std::string_view token : tokens_of(t)) {
    if (text.find(token) != std::string_view::npos) return token;
  }
  return {};
}

std::optional<ChatProblem> find_chat_problem(ChatTemplate t,
                                             const std::vector<ChatMessage>& messages) {
  if (messages.empty()) return ChatProblem{"", "empty list of messages"};
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const std::string at = absl::StrCat("[", i, "]");
    if (m.role != "system" && m.role != "user" && m.role != "assistant") {
      return ChatProblem{at + ".role", absl::StrCat("unknown role '", m.role,
                                                    "'; expected system, user or assistant")};
    }
    if (m.role == "system" && i != 0) {
      return ChatProblem{at + ".role", "a system message may only come first"};
    }
    if (m.content.empty()) return ChatProblem{at + ".content", "empty"};
    if (std::string_view token = find_chat_token(t, m.content); !token.empty()) {
      return ChatProblem{at + ".content", absl::StrCat("contains '", std::string(token), "', a ",
                                                       chat_template_name(t),
                                                       " special token: it would forge a turn")};
    }
  }
  if (messages.back().role != "user") {
    return ChatProblem{
        absl::StrCat("[", messages.size() - 1, "].role"),
        absl::StrCat("the last message must be the user's (the model answers it), got '",
                     messages.back().role, "'")};
  }
  return std::nullopt;
}

std::string render_chat(ChatTemplate t, const std::vector<ChatMessage>& messages,
                        bool add_generation_prompt) {
  std::string out;
  if (t == ChatTemplate::kChatml) {
    for (const ChatMessage& m : messages) {
      absl::StrAppend(&out, kImStart, m.role, "\n", m.content, kImEnd, "\n");
    }
    if (add_generation_prompt) absl::StrAppend(&out, kImStart, "assistant\n");
  } else if (t == ChatTemplate::kLlama3) {
    // The HF template writes bos_token before the first message only.
    if (!messages.empty()) out = std::string(kBeginOfText);
    for (const ChatMessage& m : messages) {
      absl::StrAppend(&out, kStartHeader, m.role, kEndHeader, "\n\n",
                      std::string(jinja_trim(m.content)), kEotId);
    }
    if (add_generation_prompt) absl::StrAppend(&out, kStartHeader, "assistant", kEndHeader, "\n\n");
  }
  return out;
}

std::string chat_response(ChatTemplate t, std::string_view content) {
  if (t == ChatTemplate::kLlama3) content = jinja_trim(content);
  return absl::StrCat(std::string(content), end_of_turn(t));
}

}  // namespace relay::model
