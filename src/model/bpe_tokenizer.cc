#include "relay/model/bpe_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <mutex>
#include <queue>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "model/json_nesting.h"

namespace relay::model {
namespace {

using nlohmann::json;

// ---- UTF-8 ------------------------------------------------------------------

void append_utf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Length of the UTF-8 sequence starting at s[i] and its code point, or 0 when
// it is not a valid (shortest-form, non-surrogate, <= U+10FFFF) sequence.
size_t utf8_next(std::string_view s, size_t i, uint32_t* cp) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  size_t n;
  uint32_t v;
  if (c < 0x80) {
    *cp = c;
    return 1;
  } else if ((c & 0xE0) == 0xC0) {
    n = 2, v = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    n = 3, v = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    n = 4, v = c & 0x07;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return 0;
    v = (v << 6) | (b(i + k) & 0x3F);
  }
  static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (v < kMin[n] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
  *cp = v;
  return n;
}

// Unicode White_Space (what Rust's char::is_whitespace tests), for the
// lstrip/rstrip of added tokens.
bool is_unicode_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// ---- GPT-2's byte <-> unicode table -----------------------------------------
// Printable Latin-1 bytes map to themselves; the other 68 bytes map, in byte
// order, to U+0100, U+0101, ... so that every byte is a visible character.
struct ByteTable {
  std::string to_utf8[256];
  std::unordered_map<uint32_t, unsigned char> to_byte;
  ByteTable() {
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const uint32_t cp = printable ? b : next++;
      append_utf8(cp, &to_utf8[b]);
      to_byte[cp] = static_cast<unsigned char>(b);
    }
  }
};

const ByteTable& byte_table() {
  static const ByteTable* table = new ByteTable();
  return *table;
}

std::string bytes_to_unicode(std::string_view bytes) {
  const ByteTable& t = byte_table();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += t.to_utf8[static_cast<unsigned char>(c)];
  return out;
}

// ---- PCRE2 ------------------------------------------------------------------

struct CodeFree {
  void operator()(pcre2_code* code) const { pcre2_code_free(code); }
};
struct MatchDataFree {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};
using Regex = std::unique_ptr<pcre2_code, CodeFree>;
using MatchData = std::unique_ptr<pcre2_match_data, MatchDataFree>;

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  if (pcre2_get_error_message(code, buffer, sizeof(buffer)) < 0) {
    return absl::StrCat("PCRE2 error ", code);
  }
  return reinterpret_cast<const char*>(buffer);
}

// Hugging Face compiles these regexes with Oniguruma, whose Unicode \s also
// matches U+0085 (NEL); PCRE2's (with UCP) is tab..CR and \p{Z} only. So \s
// becomes [\s\x{85}] and \S [^\s\x{85}]; inside a character class \s gains
// \x{85} (a \S inside a class is left as it is).
std::string onig_whitespace(const std::string& pattern) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[++i];
      if (e == 's') {
        out += in_class ? "\\s\\x{85}" : "[\\s\\x{85}]";
      } else if (e == 'S' && !in_class) {
        out += "[^\\s\\x{85}]";
      } else if (e == 'Q') {  // \Q...\E is literal
        const size_t end = pattern.find("\\E", i);
        const size_t stop = end == std::string::npos ? pattern.size() : end + 2;
        out.append(pattern, i - 1, stop - (i - 1));
        i = stop - 1;
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    out += c;
    if (!in_class && c == '[') {
      in_class = true;
      // A ']' right after '[' or '[^' is a literal member.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
    } else if (in_class && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {
      const size_t end = pattern.find(":]", i);  // a POSIX class: [:alpha:]
      if (end != std::string::npos) {
        out.append(pattern, i + 1, end + 2 - (i + 1));
        i = end + 1;
      }
    } else if (in_class && c == ']') {
      in_class = false;
    }
  }
  return out;
}

// UTF + UCP so that \p{L}, \p{N}, \s and \w are Unicode-aware, as in the
// Oniguruma regexes Hugging Face tokenizers compiles.
StatusOr<Regex> compile_regex(const std::string& text, bool literal, const std::string& where) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  const std::string pattern = literal ? text : onig_whitespace(text);
  // PCRE2 refuses PCRE2_UCP beside PCRE2_LITERAL (a literal has no classes
  // for it to change).
  const uint32_t options = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   options, &error, &offset, nullptr);
  if (code == nullptr) {
    return InvalidArgumentError(absl::StrCat(where, ": bad regex ", nlohmann::json(text).dump(),
                                             ": ", pcre2_message(error)));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // best effort: falls back to the interpreter
  return Regex(code);
}

// The regex ByteLevel splits with when use_regex is true (GPT-2's).
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// A JSON value for a message, cut to about 80 bytes (a field of the wrong
// type may be a whole vocabulary) at a character boundary, so the message
// stays valid UTF-8.
std::string shown(const json& j) {
  std::string s = j.dump();
  if (s.size() <= 80) return s;
  size_t end = 77;
  while (end > 0 && (static_cast<unsigned char>(s[end]) & 0xC0) == 0x80) --end;
  return s.substr(0, end) + "...";
}

// HF's SplitDelimiterBehavior.
enum class Behavior { kRemoved, kIsolated, kContiguous, kMergedWithPrevious, kMergedWithNext };

StatusOr<Behavior> parse_behavior(const json& j, const std::string& where) {
  static const std::pair<const char*, Behavior> kNames[] = {
      {"Removed", Behavior::kRemoved},
      {"Isolated", Behavior::kIsolated},
      {"Contiguous", Behavior::kContiguous},
      {"MergedWithPrevious", Behavior::kMergedWithPrevious},
      {"MergedWithNext", Behavior::kMergedWithNext}};
  if (j.is_string()) {
    for (const auto& [name, b] : kNames) {
      if (j.get<std::string>() == name) return b;
    }
  }
  return InvalidArgumentError(absl::StrCat(where, ": unknown split behavior ", shown(j)));
}

// One pre-tokenizer step: split every piece with `regex` (when set), then map
// every piece through the byte table (when `byte_level`).
struct Step {
  Regex regex;
  Behavior behavior = Behavior::kIsolated;
  bool byte_level = false;
  bool add_prefix_space = false;
};

struct Span {
  size_t begin, end;
  bool match;
};

// Splits `piece` at the non-empty matches of `regex` and appends the parts
// that `behavior` keeps to `out`.
Status split_piece(const Step& step, pcre2_match_data* data, const std::string& piece,
                   std::vector<std::string>* out) {
  std::vector<Span> spans;
  size_t offset = 0, last = 0;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
  while (offset < piece.size()) {
    const int rc = pcre2_match(step.regex.get(), subject, piece.size(), offset, PCRE2_NO_UTF_CHECK,
                               data, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) return InternalError(absl::StrCat("pre-tokenizer regex: ", pcre2_message(rc)));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(data);
    if (ov[1] == ov[0]) {  // an empty match splits nothing: step over one character
      uint32_t cp;
      offset = ov[0] + std::max<size_t>(1, utf8_next(piece, ov[0], &cp));
      continue;
    }
    if (ov[0] > last) spans.push_back({last, ov[0], false});
    spans.push_back({ov[0], ov[1], true});
    offset = last = ov[1];
  }
  if (last < piece.size()) spans.push_back({last, piece.size(), false});

  std::vector<Span> kept;
  bool previous_match = false;
  for (size_t i = 0; i < spans.size(); ++i) {
    const Span& s = spans[i];
    switch (step.behavior) {
      case Behavior::kRemoved:
        if (!s.match) kept.push_back(s);
        break;
      case Behavior::kIsolated:
        kept.push_back(s);
        break;
      case Behavior::kContiguous:
        if (s.match && previous_match) {
          kept.back().end = s.end;
        } else {
          kept.push_back(s);
        }
        break;
      case Behavior::kMergedWithPrevious:
        if (s.match && !previous_match && !kept.empty()) {
          kept.back().end = s.end;
        } else {
          kept.push_back(s);
        }
        break;
      case Behavior::kMergedWithNext:
        if (!kept.empty() && kept.back().match && !s.match) {
          kept.back().end = s.end;
          kept.back().match = false;
        } else {
          kept.push_back(s);
        }
        break;
    }
    previous_match = s.match;
  }
  for (const Span& s : kept) out->push_back(piece.substr(s.begin, s.end - s.begin));
  return OkStatus();
}

// ---- reading tokenizer.json -------------------------------------------------

std::string member_path(const std::string& path, const std::string& key) {
  if (key.empty()) return path;
  return path.empty() ? key : absl::StrCat(path, ".", key);
}

// The members of one tokenizer.json object, read with their JSON path
// ("added_tokens[0].special") for messages. nlohmann's value() and get() throw
// a type_error that names neither the file nor the field.
class Fields {
 public:
  Fields(const json& j, std::string path, const std::string& source)
      : j_(j), path_(std::move(path)), source_(source) {}

  // Member `key`, or null when it is absent (or this is not an object).
  const json& at(const char* key) const {
    static const json* const kNull = new json();
    if (!j_.is_object()) return *kNull;
    const auto it = j_.find(key);
    return it == j_.end() ? *kNull : *it;
  }
  // "<source>: <path>.<key>: <what>"; an empty key names the object itself.
  Status error(const std::string& key, const std::string& what) const {
    return InvalidArgumentError(absl::StrCat(source_, ": ", member_path(path_, key), ": ", what));
  }
  // An absent or null member leaves *out as it is.
  Status get_bool(const char* key, bool* out) const {
    const json& v = at(key);
    if (v.is_null()) return OkStatus();
    if (!v.is_boolean()) return error(key, absl::StrCat("must be a boolean, got ", shown(v)));
    *out = v.get<bool>();
    return OkStatus();
  }
  Status get_string(const char* key, std::string* out) const {
    const json& v = at(key);
    if (v.is_null()) return OkStatus();
    if (!v.is_string()) return error(key, absl::StrCat("must be a string, got ", shown(v)));
    *out = v.get<std::string>();
    return OkStatus();
  }

 private:
  const json& j_;
  const std::string path_;
  const std::string& source_;
};

// How deeply Sequence nodes may nest: HF's files use one level, and parsing
// them recurses.
constexpr int kMaxSequenceDepth = 32;

// Unused ids a vocabulary may have beyond as many as its tokens (see the id
// check in from_json).
constexpr int64_t kIdSlack = 1024;

// Refuses a Sequence nested more than kMaxSequenceDepth deep in `j`, a
// normalizer, pre_tokenizer, decoder or post_processor whose Sequence keeps
// its children under `children` ("pretokenizers", ...). Anything else
// malformed is left for the section's parser to report.
Status check_sequence_depth(const json& j, const std::string& path, const char* children, int depth,
                            const std::string& source) {
  if (!j.is_object()) return OkStatus();
  const auto type = j.find("type");
  if (type == j.end() || *type != "Sequence") return OkStatus();
  if (depth > kMaxSequenceDepth) {
    return InvalidArgumentError(absl::StrCat(source, ": ", path, ": Sequence nested deeper than ",
                                             kMaxSequenceDepth, " levels"));
  }
  const auto list = j.find(children);
  if (list == j.end() || !list->is_array()) return OkStatus();
  for (size_t i = 0; i < list->size(); ++i) {
    RELAY_RETURN_IF_ERROR(check_sequence_depth(
        (*list)[i], absl::StrCat(path, ".", children, "[", i, "]"), children, depth + 1, source));
  }
  return OkStatus();
}

// Appends the steps of one pre_tokenizer node (recursing into Sequence, whose
// depth check_sequence_depth has bounded).
Status parse_pre_tokenizer(const json& j, const std::string& path, const std::string& source,
                           std::vector<Step>* steps) {
  if (j.is_null()) return OkStatus();
  const Fields f(j, path, source);
  if (!j.is_object() || !j.contains("type")) return f.error("", "expected an object with a type");
  std::string type;
  RELAY_RETURN_IF_ERROR(f.get_string("type", &type));
  Step step;
  if (type == "Sequence") {
    const json& list = f.at("pretokenizers");
    if (!list.is_array()) return f.error("pretokenizers", "expected an array");
    for (size_t i = 0; i < list.size(); ++i) {
      RELAY_RETURN_IF_ERROR(parse_pre_tokenizer(
          list[i], absl::StrCat(path, ".pretokenizers[", i, "]"), source, steps));
    }
    return OkStatus();
  } else if (type == "ByteLevel") {
    step.byte_level = true;
    bool use_regex = true;
    RELAY_RETURN_IF_ERROR(f.get_bool("add_prefix_space", &step.add_prefix_space));
    RELAY_RETURN_IF_ERROR(f.get_bool("use_regex", &use_regex));
    if (use_regex) {
      RELAY_ASSIGN_OR_RETURN(step.regex, compile_regex(kGpt2Pattern, false, source));
    }
  } else if (type == "Split") {
    const std::string where = absl::StrCat(source, ": ", path, ".pattern");
    const json& pattern = f.at("pattern");
    if (pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string()) {
      RELAY_ASSIGN_OR_RETURN(step.regex, compile_regex(pattern["Regex"], false, where));
    } else if (pattern.is_object() && pattern.contains("String") && pattern["String"].is_string()) {
      RELAY_ASSIGN_OR_RETURN(step.regex, compile_regex(pattern["String"], true, where));
    } else {
      return f.error("pattern", "expected {\"Regex\": ...} or {\"String\": ...}");
    }
    RELAY_ASSIGN_OR_RETURN(
        step.behavior,
        parse_behavior(f.at("behavior"), absl::StrCat(source, ": ", path, ".behavior")));
    bool invert = false;
    RELAY_RETURN_IF_ERROR(f.get_bool("invert", &invert));
    if (invert) return f.error("invert", "true is not supported");
  } else if (type == "Digits") {
    // HF tests char::is_numeric, i.e. \p{N}; a run of them is one piece
    // unless individual_digits.
    bool individual = false;
    RELAY_RETURN_IF_ERROR(f.get_bool("individual_digits", &individual));
    RELAY_ASSIGN_OR_RETURN(step.regex,
                           compile_regex(individual ? R"(\p{N})" : R"(\p{N}+)", false, source));
  } else if (type == "Punctuation") {
    // HF: char::is_ascii_punctuation || Unicode category P*.
    RELAY_ASSIGN_OR_RETURN(step.regex, compile_regex(R"([\p{P}!-/:-@\[-`{-~])", false, source));
    step.behavior = Behavior::kIsolated;
    if (!f.at("behavior").is_null()) {
      RELAY_ASSIGN_OR_RETURN(
          step.behavior,
          parse_behavior(f.at("behavior"), absl::StrCat(source, ": ", path, ".behavior")));
    }
  } else {
    return f.error("type", absl::StrCat("pre-tokenizer ", json(type).dump(), " is not supported"));
  }
  steps->push_back(std::move(step));
  return OkStatus();
}

struct AddedToken {
  std::string content;
  int64_t id = 0;
  bool special = false;
  bool normalized = false;
  bool lstrip = false;
  bool rstrip = false;
};

// A stretch of the input: either plain text or one added token.
struct Segment {
  std::string_view text;
  int64_t id = -1;  // added token id; -1 = text to pre-tokenize
};

// One symbol of a word during BPE, linked to its neighbours so that a merge
// unlinks the right one without moving the others.
struct Symbol {
  int64_t id;
  int prev, next;
  bool alive;
};

// Normalizer: NFC is a no-op here. Byte-level vocabularies were trained on
// NFC text and tokenize whatever bytes they get, so the only difference is
// on non-NFC input (decomposed accents), which then encodes as its own
// bytes rather than the composed form's.
Status check_normalizer(const json& normalizer, const std::string& source) {
  if (normalizer.is_null()) return OkStatus();
  const Fields n(normalizer, "normalizer", source);
  if (!normalizer.is_object()) {
    return n.error("", absl::StrCat("must be null or an object, got ", shown(normalizer)));
  }
  std::string type;
  RELAY_RETURN_IF_ERROR(n.get_string("type", &type));
  if (type != "NFC") {
    return n.error("type",
                   absl::StrCat(shown(n.at("type")), " is not supported (null or NFC only)"));
  }
  return OkStatus();
}

Status check_decoder(const json& decoder, const std::string& source) {
  if (decoder.is_null()) return OkStatus();
  const Fields d(decoder, "decoder", source);
  if (!decoder.is_object()) {
    return d.error("", absl::StrCat("must be null or an object, got ", shown(decoder)));
  }
  std::string type;
  RELAY_RETURN_IF_ERROR(d.get_string("type", &type));
  if (type != "ByteLevel") {
    return d.error("type", absl::StrCat(shown(d.at("type")), " is not supported (ByteLevel only)"));
  }
  return OkStatus();
}

// One of added_tokens.
StatusOr<AddedToken> parse_added_token(const json& t, const Fields& f) {
  if (!t.is_object()) return f.error("", absl::StrCat("must be an object, got ", shown(t)));
  const json& id = f.at("id");
  if (!id.is_number_integer() || id.get<int64_t>() < 0) {
    return f.error("id", absl::StrCat("must be an integer >= 0, got ", shown(id)));
  }
  const json& content = f.at("content");
  if (!content.is_string() || content.get<std::string>().empty()) {
    return f.error("content", absl::StrCat("must be a non-empty string, got ", shown(content)));
  }
  AddedToken a;
  a.content = content.get<std::string>();
  a.id = id.get<int64_t>();
  bool single_word = false;
  RELAY_RETURN_IF_ERROR(f.get_bool("single_word", &single_word));
  if (single_word) return f.error("single_word", "true is not supported");
  RELAY_RETURN_IF_ERROR(f.get_bool("special", &a.special));
  a.normalized = !a.special;
  RELAY_RETURN_IF_ERROR(f.get_bool("normalized", &a.normalized));
  RELAY_RETURN_IF_ERROR(f.get_bool("lstrip", &a.lstrip));
  RELAY_RETURN_IF_ERROR(f.get_bool("rstrip", &a.rstrip));
  return a;
}

}  // namespace

struct BpeTokenizer::Impl {
  std::unordered_map<std::string, int64_t> vocab;
  std::vector<std::string> id_to_token;  // "" for ids with no vocab entry
  // (left id << 32 | right id) -> (rank, merged id)
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;
  bool ignore_merges = false;
  std::vector<AddedToken> added;    // longest first
  bool added_first_byte[256] = {};  // some added token starts with this byte
  std::unordered_map<int64_t, std::string> added_by_id;
  std::vector<Step> steps;
  bool maps_bytes = false;  // some step is ByteLevel; else map at the end
  int64_t vocab_size = 0, eos = -1, bos = -1, pad = -1;

  mutable std::mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<int64_t>> cache ABSL_GUARDED_BY(cache_mutex);
  static constexpr size_t kMaxCacheEntries = 1 << 16;

  std::vector<Segment> split_added(std::string_view text) const;
  void split_added_pass(std::vector<Segment>* segments, bool normalized) const;
  Status bpe(const std::string& word, size_t offset, std::vector<int64_t>* ids) const;
  // bpe()'s steps: a word seen before, its characters as symbols, the merges.
  bool append_cached(const std::string& word, std::vector<int64_t>* ids) const;
  Status to_symbols(const std::string& word, size_t offset, std::vector<Symbol>* symbols) const;
  void merge(std::vector<Symbol>& symbols) const;

  // from_json's steps, in the order the file's sections are checked.
  Status read_model(const Fields& m);
  Status read_vocab(const Fields& m);
  Status read_merges(const Fields& m);
  Status read_added_tokens(const Fields& top, const std::string& source);
  Status index_ids(const Fields& top, const Fields& m, const std::string& source);
  void pick_special_ids();
};

// Leftmost match first, the longest at that position; lstrip/rstrip take the
// whitespace beside the token with it. Hugging Face matches the tokens that
// skip normalization first, then the others on what is left; with a no-op
// normalizer only the order of these two passes differs.
void BpeTokenizer::Impl::split_added_pass(std::vector<Segment>* segments, bool normalized) const {
  std::vector<Segment> out;
  for (const Segment& seg : *segments) {
    if (seg.id >= 0) {
      out.push_back(seg);
      continue;
    }
    const std::string_view t = seg.text;
    size_t start = 0;  // of the pending text
    for (size_t i = 0; i < t.size();) {
      const AddedToken* hit = nullptr;
      if (!added_first_byte[static_cast<unsigned char>(t[i])]) {
        ++i;
        continue;
      }
      for (const AddedToken& a : added) {
        if (a.normalized == normalized && t.compare(i, a.content.size(), a.content) == 0) {
          hit = &a;
          break;
        }
      }
      if (hit == nullptr) {
        ++i;
        continue;
      }
      size_t begin = i, end = i + hit->content.size();
      uint32_t cp;
      if (hit->lstrip) {
        while (begin > start) {
          size_t k = begin - 1;
          while (k > start && (static_cast<unsigned char>(t[k]) & 0xC0) == 0x80) --k;
          if (utf8_next(t, k, &cp) == 0 || !is_unicode_space(cp)) break;
          begin = k;
        }
      }
      if (hit->rstrip) {
        while (end < t.size()) {
          const size_t n = utf8_next(t, end, &cp);
          if (n == 0 || !is_unicode_space(cp)) break;
          end += n;
        }
      }
      if (begin > start) out.push_back({t.substr(start, begin - start), -1});
      out.push_back({t.substr(begin, end - begin), hit->id});
      start = i = end;
    }
    if (start < t.size()) out.push_back({t.substr(start), -1});
  }
  *segments = std::move(out);
}

std::vector<Segment> BpeTokenizer::Impl::split_added(std::string_view text) const {
  std::vector<Segment> segments = {{text, -1}};
  if (added.empty()) return segments;
  split_added_pass(&segments, /*normalized=*/false);
  split_added_pass(&segments, /*normalized=*/true);
  return segments;
}

bool BpeTokenizer::Impl::append_cached(const std::string& word, std::vector<int64_t>* ids) const {
  std::lock_guard<std::mutex> lock(cache_mutex);
  auto it = cache.find(word);
  if (it == cache.end()) return false;
  ids->insert(ids->end(), it->second.begin(), it->second.end());
  return true;
}

// The word's UTF-8 characters (each a byte-level symbol), linked in order.
Status BpeTokenizer::Impl::to_symbols(const std::string& word, size_t offset,
                                      std::vector<Symbol>* symbols) const {
  for (size_t i = 0; i < word.size();) {
    uint32_t cp;
    const size_t n = std::max<size_t>(1, utf8_next(word, i, &cp));
    auto it = vocab.find(word.substr(i, n));
    if (it == vocab.end()) {
      return InvalidArgumentError(absl::StrCat(
          "bpe tokenizer: the byte at offset ", offset + symbols->size(), " maps to symbol \"",
          word.substr(i, n), "\", which is not in the vocabulary"));
    }
    const int k = static_cast<int>(symbols->size());
    symbols->push_back({it->second, k - 1, k + 1, true});
    i += n;
  }
  if (!symbols->empty()) symbols->back().next = -1;
  return OkStatus();
}

// Repeatedly merges the adjacent pair of lowest rank (leftmost on ties), as
// HF's BPE model does. A queue holds the candidate pairs; a merge makes the
// pairs around it stale, which are skipped when they come up.
void BpeTokenizer::Impl::merge(std::vector<Symbol>& symbols) const {
  struct Candidate {
    int32_t rank;
    int left, right;
    int64_t left_id, right_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  const auto push = [&](int left) {
    if (left < 0 || symbols[left].next < 0) return;
    const int right = symbols[left].next;
    const uint64_t key =
        (static_cast<uint64_t>(symbols[left].id) << 32) | static_cast<uint64_t>(symbols[right].id);
    if (auto it = merges.find(key); it != merges.end()) {
      queue.push({it->second.first, left, right, symbols[left].id, symbols[right].id});
    }
  };
  for (int i = 0; i + 1 < static_cast<int>(symbols.size()); ++i) push(i);
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& l = symbols[c.left];
    Symbol& r = symbols[c.right];
    if (!l.alive || !r.alive || l.next != c.right || l.id != c.left_id || r.id != c.right_id) {
      continue;  // stale: one side has merged since
    }
    const uint64_t key = (static_cast<uint64_t>(l.id) << 32) | static_cast<uint64_t>(r.id);
    l.id = merges.at(key).second;
    r.alive = false;
    l.next = r.next;
    if (r.next >= 0) symbols[r.next].prev = c.left;
    push(l.prev);
    push(c.left);
  }
}

// BPE on one byte-level word: start from its characters and merge. Words
// repeat, so results are cached (bounded: cleared when full).
Status BpeTokenizer::Impl::bpe(const std::string& word, size_t offset,
                               std::vector<int64_t>* ids) const {
  if (ignore_merges) {
    if (auto it = vocab.find(word); it != vocab.end()) {
      ids->push_back(it->second);
      return OkStatus();
    }
  }
  if (append_cached(word, ids)) return OkStatus();
  std::vector<Symbol> symbols;
  RELAY_RETURN_IF_ERROR(to_symbols(word, offset, &symbols));
  merge(symbols);
  std::vector<int64_t> result;
  for (int i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[i].next)
    result.push_back(symbols[i].id);
  ids->insert(ids->end(), result.begin(), result.end());
  std::lock_guard<std::mutex> lock(cache_mutex);
  if (cache.size() >= kMaxCacheEntries) cache.clear();
  cache.emplace(word, std::move(result));
  return OkStatus();
}

BpeTokenizer::BpeTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BpeTokenizer::BpeTokenizer(BpeTokenizer&&) noexcept = default;
BpeTokenizer& BpeTokenizer::operator=(BpeTokenizer&&) noexcept = default;
BpeTokenizer::~BpeTokenizer() = default;

// Model: a BPE without the options relay does not implement.
Status BpeTokenizer::Impl::read_model(const Fields& m) {
  if (m.at("type") != "BPE") {
    return m.error("type", absl::StrCat("expected \"BPE\", got ", shown(m.at("type"))));
  }
  for (const char* field : {"dropout", "continuing_subword_prefix", "end_of_word_suffix"}) {
    if (!m.at(field).is_null()) return m.error(field, "not supported");
  }
  bool byte_fallback = false;
  RELAY_RETURN_IF_ERROR(m.get_bool("byte_fallback", &byte_fallback));
  if (byte_fallback) return m.error("byte_fallback", "not supported");
  RELAY_RETURN_IF_ERROR(m.get_bool("ignore_merges", &ignore_merges));
  RELAY_RETURN_IF_ERROR(read_vocab(m));
  return read_merges(m);
}

Status BpeTokenizer::Impl::read_vocab(const Fields& m) {
  const json& v = m.at("vocab");
  if (!v.is_object()) return m.error("vocab", "expected an object of token -> id");
  for (const auto& [token, id] : v.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (1LL << 31)) {
      return m.error(absl::StrCat("vocab[", shown(json(token)), "]"),
                     absl::StrCat("expected an id in [0, 2^31), got ", shown(id)));
    }
    vocab[token] = id.get<int64_t>();
  }
  return OkStatus();
}

// Each merge "a b" (or ["a", "b"]) of rank i, keyed by the ids of a and b.
Status BpeTokenizer::Impl::read_merges(const Fields& m) {
  const json& list = m.at("merges");
  if (!list.is_array()) return m.error("merges", "expected an array");
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string path = absl::StrCat("merges[", i, "]");
    std::string a, b;
    if (list[i].is_string()) {
      const std::string s = list[i];
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        return m.error(path, absl::StrCat("expected \"a b\", got ", shown(list[i])));
      }
      a = s.substr(0, space), b = s.substr(space + 1);
    } else if (list[i].is_array() && list[i].size() == 2 && list[i][0].is_string() &&
               list[i][1].is_string()) {
      a = list[i][0], b = list[i][1];
    } else {
      return m.error(path,
                     absl::StrCat("expected \"a b\" or [\"a\", \"b\"], got ", shown(list[i])));
    }
    const auto ia = vocab.find(a), ib = vocab.find(b), iab = vocab.find(a + b);
    if (ia == vocab.end() || ib == vocab.end() || iab == vocab.end()) {
      return m.error(path, absl::StrCat("\"",
                                        ia == vocab.end()   ? a
                                        : ib == vocab.end() ? b
                                                            : a + b,
                                        "\" is not in model.vocab"));
    }
    const uint64_t key =
        (static_cast<uint64_t>(ia->second) << 32) | static_cast<uint64_t>(ib->second);
    merges.emplace(key, std::make_pair(static_cast<int32_t>(i), static_cast<int32_t>(iab->second)));
  }
  return OkStatus();
}

Status BpeTokenizer::Impl::read_added_tokens(const Fields& top, const std::string& source) {
  const json& list = top.at("added_tokens");
  if (!list.is_null() && !list.is_array()) return top.error("added_tokens", "expected an array");
  for (size_t i = 0; list.is_array() && i < list.size(); ++i) {
    const Fields f(list[i], absl::StrCat("added_tokens[", i, "]"), source);
    RELAY_ASSIGN_OR_RETURN(AddedToken a, parse_added_token(list[i], f));
    added.push_back(std::move(a));
  }
  return OkStatus();
}

// Ids index a table (id_to_token here, the embedding rows of a model built
// for this tokenizer), so they are bounded by the tokens the file defines:
// real files are dense (max id + 1 == tokens); the slack leaves room for a
// vocabulary with tokens removed, while an id of 2^30 in a small file is
// refused instead of allocating gigabytes. Then builds the id tables.
Status BpeTokenizer::Impl::index_ids(const Fields& top, const Fields& m,
                                     const std::string& source) {
  size_t tokens = vocab.size();
  {
    std::unordered_set<std::string_view> extra;
    for (const AddedToken& a : added) {
      if (vocab.count(a.content) == 0) extra.insert(a.content);
    }
    tokens += extra.size();
  }
  const int64_t id_limit = 2 * static_cast<int64_t>(tokens) + kIdSlack;
  const auto id_error = [&](const Fields& f, const std::string& key, int64_t id) {
    return f.error(key, absl::StrCat("id ", id, " is too large for the ", tokens,
                                     " tokens defined (ids must be < ", id_limit, ": 2 x tokens + ",
                                     kIdSlack, ")"));
  };
  int64_t max_id = -1;
  for (const auto& [token, id] : m.at("vocab").items()) {  // sorted by token
    if (id.get<int64_t>() >= id_limit) {
      return id_error(m, absl::StrCat("vocab[", shown(json(token)), "]"), id.get<int64_t>());
    }
    max_id = std::max(max_id, id.get<int64_t>());
  }
  for (size_t i = 0; i < added.size(); ++i) {
    const AddedToken& a = added[i];
    if (a.id >= id_limit) {
      return id_error(
          Fields(top.at("added_tokens")[i], absl::StrCat("added_tokens[", i, "]"), source), "id",
          a.id);
    }
    max_id = std::max(max_id, a.id);
    added_by_id[a.id] = a.content;
    added_first_byte[static_cast<unsigned char>(a.content[0])] = true;
  }
  id_to_token.resize(static_cast<size_t>(max_id + 1));
  for (const auto& [token, id] : vocab) id_to_token[static_cast<size_t>(id)] = token;
  std::stable_sort(added.begin(), added.end(), [](const AddedToken& x, const AddedToken& y) {
    return x.content.size() > y.content.size();
  });
  vocab_size = max_id + 1;
  return OkStatus();
}

// Special ids by name: the first name present wins.
void BpeTokenizer::Impl::pick_special_ids() {
  const auto pick = [&](std::initializer_list<const char*> names) -> int64_t {
    for (const char* name : names) {
      for (const AddedToken& a : added) {
        if (a.content == name) return a.id;
      }
    }
    return -1;
  };
  eos = pick({"<|endoftext|>", "<|im_end|>", "<|end_of_text|>", "<|eot_id|>", "</s>",
              "<｜end▁of▁sentence｜>"});
  bos = pick({"<|begin_of_text|>", "<s>", "<｜begin▁of▁sentence｜>"});
  pad = pick({"<|padding|>", "<pad>", "<|pad|>", "<|finetune_right_pad_id|>"});
}

StatusOr<BpeTokenizer> BpeTokenizer::from_json(const std::string& json_text,
                                               const std::string& source) {
  RELAY_RETURN_IF_ERROR(check_json_nesting(json_text, source));
  json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  }
  const Fields top(j, "", source);
  for (const auto& [section, children] : {std::pair{"normalizer", "normalizers"},
                                          {"pre_tokenizer", "pretokenizers"},
                                          {"decoder", "decoders"},
                                          {"post_processor", "processors"}}) {
    RELAY_RETURN_IF_ERROR(check_sequence_depth(top.at(section), section, children, 1, source));
  }
  // Every field below is read with a check of its type; the catch is a last
  // line in case one is not.
  try {
    auto impl = std::make_unique<Impl>();
    RELAY_RETURN_IF_ERROR(check_normalizer(top.at("normalizer"), source));
    const json& model = top.at("model");
    if (!model.is_object()) return top.error("model", "expected an object");
    const Fields m(model, "model", source);
    RELAY_RETURN_IF_ERROR(impl->read_model(m));
    RELAY_RETURN_IF_ERROR(impl->read_added_tokens(top, source));
    RELAY_RETURN_IF_ERROR(impl->index_ids(top, m, source));
    // Pre-tokenizer and decoder; post_processor is not used (encode() adds
    // no BOS/EOS).
    RELAY_RETURN_IF_ERROR(
        parse_pre_tokenizer(top.at("pre_tokenizer"), "pre_tokenizer", source, &impl->steps));
    for (const Step& s : impl->steps) impl->maps_bytes |= s.byte_level;
    RELAY_RETURN_IF_ERROR(check_decoder(top.at("decoder"), source));
    impl->pick_special_ids();
    return BpeTokenizer(std::move(impl));
  } catch (const json::exception& e) {
    return InvalidArgumentError(absl::StrCat(source, ": ", e.what()));
  }
}

StatusOr<std::vector<int64_t>> BpeTokenizer::encode(std::string_view text) const {
  for (size_t i = 0; i < text.size();) {
    uint32_t cp;
    const size_t n = utf8_next(text, i, &cp);
    if (n == 0) {
      return InvalidArgumentError(
          absl::StrCat("bpe tokenizer: invalid UTF-8 at offset ", i, " of the text"));
    }
    i += n;
  }
  std::vector<MatchData> match_data;
  for (const Step& s : impl_->steps) {
    match_data.emplace_back(s.regex ? pcre2_match_data_create_from_pattern(s.regex.get(), nullptr)
                                    : nullptr);
  }
  std::vector<int64_t> ids;
  std::vector<std::string> pieces, next;
  for (const Segment& seg : impl_->split_added(text)) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    pieces.assign(1, std::string(seg.text));
    for (size_t k = 0; k < impl_->steps.size(); ++k) {
      const Step& step = impl_->steps[k];
      if (step.add_prefix_space) {
        for (std::string& p : pieces) {
          if (p.empty() || p[0] != ' ') p.insert(0, " ");
        }
      }
      if (step.regex) {
        next.clear();
        for (const std::string& p : pieces) {
          RELAY_RETURN_IF_ERROR(split_piece(step, match_data[k].get(), p, &next));
        }
        pieces.swap(next);
      }
      if (step.byte_level) {
        for (std::string& p : pieces) p = bytes_to_unicode(p);
      }
    }
    // Each byte-level character stands for one input byte, so counting them
    // gives offsets into the text (exact unless a Removed split or
    // add_prefix_space changed the bytes).
    size_t at = static_cast<size_t>(seg.text.data() - text.data());
    for (std::string& p : pieces) {
      if (!impl_->maps_bytes) p = bytes_to_unicode(p);
      RELAY_RETURN_IF_ERROR(impl_->bpe(p, at, &ids));
      for (char c : p) at += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
    }
  }
  return ids;
}

StatusOr<std::string> BpeTokenizer::decode(const std::vector<int64_t>& ids) const {
  const ByteTable& table = byte_table();
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t id = ids[i];
    if (auto it = impl_->added_by_id.find(id); it != impl_->added_by_id.end()) {
      out += it->second;
      continue;
    }
    if (id < 0 || id >= static_cast<int64_t>(impl_->id_to_token.size()) ||
        impl_->id_to_token[static_cast<size_t>(id)].empty()) {
      return InvalidArgumentError(
          absl::StrCat("bpe tokenizer: ids[", i, "] = ", id, " is not in the vocabulary"));
    }
    const std::string& token = impl_->id_to_token[static_cast<size_t>(id)];
    for (size_t k = 0; k < token.size();) {
      uint32_t cp;
      const size_t n = std::max<size_t>(1, utf8_next(token, k, &cp));
      auto b = table.to_byte.find(cp);
      if (b != table.to_byte.end()) {
        out.push_back(static_cast<char>(b->second));
      } else {
        out.append(token, k, n);  // not a byte-level character: keep it as is (as HF does)
      }
      k += n;
    }
  }
  return out;
}

int64_t BpeTokenizer::vocab_size() const { return impl_->vocab_size; }
int64_t BpeTokenizer::eos_id() const { return impl_->eos; }
int64_t BpeTokenizer::bos_id() const { return impl_->bos; }
int64_t BpeTokenizer::pad_id() const { return impl_->pad; }

Status BpeTokenizer::use_special_tokens(const SpecialTokens& names, const std::string& source) {
  int64_t ids[3] = {impl_->eos, impl_->bos, impl_->pad};
  const std::optional<std::string>* given[3] = {&names.eos, &names.bos, &names.pad};
  const char* keys[3] = {"eos_token", "bos_token", "pad_token"};
  for (int i = 0; i < 3; ++i) {
    if (!given[i]->has_value()) continue;
    std::optional<int64_t> id = token_id(**given[i]);
    if (!id) {
      return InvalidArgumentError(absl::StrCat(source, ": ", keys[i], ": '", **given[i],
                                               "' is not a token of the tokenizer"));
    }
    ids[i] = *id;
  }
  impl_->eos = ids[0];
  impl_->bos = ids[1];
  impl_->pad = ids[2];
  return OkStatus();
}

std::optional<int64_t> BpeTokenizer::token_id(std::string_view token) const {
  for (const AddedToken& a : impl_->added) {
    if (a.content == token) return a.id;
  }
  if (auto it = impl_->vocab.find(std::string(token)); it != impl_->vocab.end()) return it->second;
  return std::nullopt;
}

}  // namespace relay::model
