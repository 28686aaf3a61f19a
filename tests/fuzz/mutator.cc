#include "fuzz/mutator.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <iterator>
#include <numeric>
#include <string_view>

#include "absl/strings/str_cat.h"

namespace relay::fuzz {
namespace {

constexpr size_t kNone = std::string::npos;

// Values that sit on the edges parsers check: int32/int64/uint64 limits,
// ids like 2^30, doubles out of range.
const std::vector<std::string> kNumbers = {"0",
                                           "1",
                                           "-1",
                                           "2",
                                           "32",
                                           "33",
                                           "255",
                                           "256",
                                           "65536",
                                           "1073741824",
                                           "2147483647",
                                           "2147483648",
                                           "-2147483649",
                                           "4294967295",
                                           "4294967296",
                                           "9223372036854775807",
                                           "9223372036854775808",
                                           "-9223372036854775808",
                                           "-9223372036854775809",
                                           "18446744073709551615",
                                           "18446744073709551616",
                                           "100000000000000000000000000000",
                                           "1e308",
                                           "-1e308",
                                           "1e999",
                                           "1e-999",
                                           "0.5",
                                           "-0.0",
                                           "3.0",
                                           "1E2"};

// A value of every JSON type, for a field that expects another.
const std::vector<std::string> kJsonValues = {"null",
                                              "true",
                                              "false",
                                              "\"\"",
                                              "\"x\"",
                                              "0",
                                              "-1",
                                              "1.5",
                                              "[]",
                                              "{}",
                                              "[null]",
                                              "[[]]",
                                              "[1, 2]",
                                              "{\"type\": null}",
                                              "{\"\": {}}",
                                              "\"\\u0000\"",
                                              "[\"a\", 1]",
                                              "{\"type\": 5}",
                                              "[\"a\", \"b\"]"};

// Strings parsers compare against (types, dtypes, behaviours, rope types),
// and ones that are awkward as regexes, paths or tokens. Escaped for JSON.
const std::vector<std::string> kStrings = {"",
                                           "Sequence",
                                           "BPE",
                                           "ByteLevel",
                                           "Split",
                                           "Digits",
                                           "Punctuation",
                                           "Metaspace",
                                           "NFC",
                                           "Regex",
                                           "String",
                                           "Isolated",
                                           "Removed",
                                           "Contiguous",
                                           "MergedWithPrevious",
                                           "MergedWithNext",
                                           "F32",
                                           "F16",
                                           "BF16",
                                           "I64",
                                           "BOOL",
                                           "U32",
                                           "F8_E4M3",
                                           "__metadata__",
                                           "llama",
                                           "qwen2",
                                           "qwen3",
                                           "qwen3_moe",
                                           "yarn",
                                           "llama3",
                                           "linear",
                                           "dynamic",
                                           "default",
                                           "longrope",
                                           "silu",
                                           "full_attention",
                                           "<|endoftext|>",
                                           "<|im_end|>",
                                           "<pad>",
                                           "\\u0000",
                                           "\\ud800",
                                           "(((((((((",
                                           "[",
                                           "\\\\p{",
                                           "(?<=a)b",
                                           "(a+)+$",
                                           "((a*)*)*b",
                                           "x y z",
                                           "\\u0120 \\u0120",
                                           " ",
                                           "a b",
                                           "..",
                                           "../x",
                                           "/etc/passwd",
                                           "\\u0085",
                                           "\\ud83d\\ude00",
                                           "\\\\",
                                           "\\\"",
                                           "\\\\Q",
                                           "(?i:'s)|\\\\p{L}+"};

// YAML scalars and small structures for a config value.
const std::vector<std::string> kYamlValues = {"-1",         "0",
                                              "2147483648", "9223372036854775808",
                                              "1e999",      ".nan",
                                              ".inf",       "-.inf",
                                              "~",          "null",
                                              "true",       "yes",
                                              "\"\"",       "''",
                                              "[]",         "{}",
                                              "[1, 2]",     "{a: 1}",
                                              "\"x\"",      "0x10",
                                              "0o17",       "1_000",
                                              "!!str 5",    "!!binary aGVsbG8=",
                                              "&a 5",       "*a",
                                              "*undefined", "|\n  block",
                                              "? complex",  "@",
                                              "`",          "%",
                                              "- item",     "[*a, *a]",
                                              "!<tag> x",   "\"\\x00\"",
                                              "'\\t'",      "1.0e-5",
                                              "+12",        "0.",
                                              "[[[[]]]]",   "{a: [b, {c: d}]}"};

const std::vector<std::string> kSequenceKeys = {"pretokenizers", "normalizers", "decoders",
                                                "processors"};

// One JSON value of an input: [begin, end), and where its key starts when
// it is an object member. Found by a forgiving scan, so mutated (invalid)
// inputs still have values to mutate.
struct JsonValue {
  size_t begin = 0, end = 0;
  size_t member = kNone;  // start of the member's key string
  char type = 0;          // '"' string, '0' number, 'l' literal, '{' object, '[' array
};

std::vector<JsonValue> scan_json(std::string_view s) {
  std::vector<JsonValue> values;
  std::vector<size_t> open;  // indices of unclosed containers
  size_t key = kNone;
  const auto add = [&](size_t begin, size_t end, char type) {
    values.push_back({begin, end, key, type});
    key = kNone;
  };
  for (size_t i = 0; i < s.size();) {
    const char c = s[i];
    if (c == '"') {
      size_t j = i + 1;
      while (j < s.size() && s[j] != '"') j += s[j] == '\\' ? 2 : 1;
      j = std::min(j + 1, s.size());
      size_t k = j;
      while (k < s.size() && std::isspace(static_cast<unsigned char>(s[k]))) ++k;
      if (k < s.size() && s[k] == ':') {
        key = i;
        i = k + 1;
        continue;
      }
      add(i, j, '"');
      i = j;
    } else if (c == '-' || std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i + 1;
      while (j < s.size() && std::strchr("0123456789+-.eE", s[j]) != nullptr && s[j] != 0) ++j;
      add(i, j, '0');
      i = j;
    } else if (std::isalpha(static_cast<unsigned char>(c))) {
      size_t j = i + 1;
      while (j < s.size() && std::isalpha(static_cast<unsigned char>(s[j]))) ++j;
      add(i, j, 'l');
      i = j;
    } else if (c == '{' || c == '[') {
      add(i, s.size(), c);
      open.push_back(values.size() - 1);
      ++i;
    } else if (c == '}' || c == ']') {
      if (!open.empty()) {
        values[open.back()].end = i + 1;
        open.pop_back();
      }
      ++i;
    } else {
      ++i;
    }
  }
  return values;
}

std::string repeat(std::string_view s, size_t n) {
  std::string out;
  out.reserve(s.size() * n);
  for (size_t i = 0; i < n; ++i) out.append(s);
  return out;
}

uint64_t read_u64(const std::string& s) {
  uint64_t v = 0;
  std::memcpy(&v, s.data(), 8);  // little-endian, as safetensors
  return v;
}

void write_u64(std::string* s, uint64_t v) { std::memcpy(s->data(), &v, 8); }

}  // namespace

Mutator::Mutator(InputKind kind, std::vector<std::string> corpus, uint64_t seed)
    : kind_(kind), corpus_(std::move(corpus)), rng_(seed) {}

size_t Mutator::below(size_t n) {
  return n == 0 ? 0 : std::uniform_int_distribution<size_t>(0, n - 1)(rng_);
}

bool Mutator::chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }

std::string Mutator::next() {
  std::string s = pick(corpus_);
  size_t n = 1;
  while (n < 5 && chance(0.45)) ++n;
  for (size_t i = 0; i < n; ++i) {
    std::string before = s;
    mutate(&s);
    if (s.size() > kMaxInputBytes) s = std::move(before);
    // Mutating a large input again (scanning it, copying it) would cost more
    // than the parse it is for.
    if (s.size() > (64 << 10)) break;
  }
  return s;
}

void Mutator::mutate(std::string* s) {
  switch (kind_) {
    case InputKind::kJson:
      return mutate_json(s);
    case InputKind::kYaml:
      return mutate_yaml(s);
    case InputKind::kSafetensors:
      return mutate_safetensors(s);
  }
}

void Mutator::mutate_bytes(std::string* s) {
  static const char kBytes[] = {'\0',   '\xff', '"', '{', '[', ']', '}',  ',', ':', '\\', '\n',
                                '\x80', '\xc3', '-', '0', '9', ' ', '\'', '&', '*', '\t'};
  const size_t at = below(s->size() + 1);
  switch (below(8)) {
    case 0:  // flip a bit
      if (!s->empty()) (*s)[below(s->size())] ^= static_cast<char>(1u << below(8));
      break;
    case 1:  // set a byte
      if (!s->empty()) {
        (*s)[below(s->size())] =
            chance(0.5) ? static_cast<char>(below(256)) : kBytes[below(sizeof(kBytes))];
      }
      break;
    case 2: {  // insert bytes
      std::string bytes;
      for (size_t n = 1 + below(16); n > 0; --n) {
        bytes.push_back(chance(0.5) ? static_cast<char>(below(256))
                                    : kBytes[below(sizeof(kBytes))]);
      }
      s->insert(at, bytes);
      break;
    }
    case 3:  // delete a range
      s->erase(at, 1 + below(chance(0.8) ? 16 : 4096));
      break;
    case 4: {  // copy a range elsewhere
      const size_t from = below(s->size() + 1);
      const std::string range = s->substr(from, 1 + below(256));
      s->insert(below(s->size() + 1), range);
      break;
    }
    case 5: {  // splice with another seed
      const std::string& other = pick(corpus_);
      *s = s->substr(0, at) + other.substr(below(other.size() + 1));
      break;
    }
    case 6:  // truncate
      s->resize(at);
      break;
    case 7: {  // overwrite with an interesting number
      const std::string& n = pick(kNumbers);
      s->replace(at, std::min(n.size(), s->size() - at), n);
      break;
    }
  }
}

void Mutator::mutate_json(std::string* s) {
  const std::vector<JsonValue> values = scan_json(*s);
  if (values.empty() || chance(0.15)) return mutate_bytes(s);
  // Values of one type, or any value when there is none of it.
  const auto pick_of = [&](char type) -> const JsonValue& {
    std::vector<size_t> of;
    for (size_t i = 0; i < values.size(); ++i) {
      if (values[i].type == type) of.push_back(i);
    }
    return of.empty() ? pick(values) : values[pick(of)];
  };
  const auto replace = [&](const JsonValue& v, const std::string& text) {
    s->replace(v.begin, v.end - v.begin, text);
  };
  // Weighted: the mutations that make inputs of hundreds of kilobytes (deep
  // nesting, many copies, large values) are rarer, or they would set the
  // pace of the whole run.
  static const int kWeights[] = {3, 3, 2, 2, 3, 2, 2, 2, 2, 1, 2};
  int roll = static_cast<int>(
      below(static_cast<size_t>(std::accumulate(std::begin(kWeights), std::end(kWeights), 0))));
  int choice = 0;
  while (roll >= kWeights[choice]) roll -= kWeights[choice++];
  switch (choice) {
    case 0:
      replace(pick_of('0'), pick(kNumbers));
      break;
    case 1:
      replace(pick(values), pick(kJsonValues));
      break;
    case 2: {  // deep array nesting
      static const size_t kDepths[] = {3, 40, 129, 130, 1000, 5000, 5000, 200000};
      const JsonValue& v = pick(values);
      const size_t n = kDepths[below(std::size(kDepths))];
      replace(v, repeat("[", n) + s->substr(v.begin, v.end - v.begin) + repeat("]", n));
      break;
    }
    case 3: {  // an object wrapped in Sequence nodes
      static const size_t kDepths[] = {1, 2, 31, 32, 33, 64, 200, 20000};
      const JsonValue& v = pick_of('{');
      const size_t n = kDepths[below(std::size(kDepths))];
      const std::string open =
          absl::StrCat(R"({"type": "Sequence", ")", pick(kSequenceKeys), R"(": [)");
      replace(v, repeat(open, n) + s->substr(v.begin, v.end - v.begin) + repeat("]}", n));
      break;
    }
    case 4:
      replace(pick_of('"'), absl::StrCat("\"", pick(kStrings), "\""));
      break;
    case 5: {  // delete a member or element, with a comma beside it
      const JsonValue& v = pick(values);
      size_t begin = v.member != kNone ? v.member : v.begin, end = v.end;
      size_t after = end;
      while (after < s->size() && std::isspace(static_cast<unsigned char>((*s)[after]))) ++after;
      if (after < s->size() && (*s)[after] == ',') {
        end = after + 1;
      } else {
        size_t before = begin;
        while (before > 0 && std::isspace(static_cast<unsigned char>((*s)[before - 1]))) --before;
        if (before > 0 && (*s)[before - 1] == ',') begin = before - 1;
      }
      s->erase(begin, end - begin);
      break;
    }
    case 6: {  // duplicate a member (a repeated key) or an element, 1 to 1000 times
      const JsonValue& v = pick(values);
      const size_t begin = v.member != kNone ? v.member : v.begin;
      const std::string item = ", " + s->substr(begin, v.end - begin);
      static const size_t kCounts[] = {1, 1, 2, 2, 3, 1000};
      s->insert(v.end, repeat(item, kCounts[below(std::size(kCounts))]));
      break;
    }
    case 7: {  // a value from this input or another seed
      const std::string& other = chance(0.5) ? *s : pick(corpus_);
      const std::vector<JsonValue> theirs = &other == s ? values : scan_json(other);
      if (theirs.empty()) return mutate_bytes(s);
      const JsonValue& from = pick(theirs);
      replace(pick(values), other.substr(from.begin, from.end - from.begin));
      break;
    }
    case 8: {  // rename a member's key to another string of the input
      std::vector<size_t> members;
      for (size_t i = 0; i < values.size(); ++i) {
        if (values[i].member != kNone) members.push_back(i);
      }
      if (members.empty()) return mutate_bytes(s);
      const JsonValue& v = values[pick(members)];
      const size_t key_end = s->find('"', v.member + 1);  // keys seldom hold escapes
      if (key_end == kNone || key_end >= v.begin) return mutate_bytes(s);
      const JsonValue& name = pick_of('"');
      s->replace(v.member, key_end + 1 - v.member, s->substr(name.begin, name.end - name.begin));
      break;
    }
    case 9: {  // a large value
      const JsonValue& v = pick(values);
      if (chance(0.5)) {
        replace(v, "[" + repeat("1073741824, ", 20000) + "0]");
      } else {
        replace(v, "\"" + repeat("a(", 10000) + "\"");
      }
      break;
    }
    default:
      mutate_bytes(s);
      break;
  }
}

void Mutator::mutate_yaml(std::string* s) {
  std::vector<std::string> lines;
  for (size_t start = 0; start <= s->size();) {
    const size_t end = std::min(s->find('\n', start), s->size());
    lines.push_back(s->substr(start, end - start));
    start = end + 1;
  }
  const auto join = [&] {
    std::string out;
    for (size_t i = 0; i < lines.size(); ++i) absl::StrAppend(&out, i ? "\n" : "", lines[i]);
    *s = std::move(out);
  };
  // Lines with "key:" and where their value starts (after ": ").
  std::vector<std::pair<size_t, size_t>> keyed;
  for (size_t i = 0; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon != kNone && lines[i].find('#') > colon) keyed.emplace_back(i, colon + 1);
  }
  if (keyed.empty() || chance(0.15)) return mutate_bytes(s);
  const auto set_value = [&](const std::pair<size_t, size_t>& k, const std::string& value) {
    lines[k.first] = lines[k.first].substr(0, k.second) + " " + value;
  };
  switch (below(9)) {
    case 0:
    case 1:
      set_value(pick(keyed), pick(kYamlValues));
      break;
    case 2:
      lines.erase(lines.begin() + static_cast<std::ptrdiff_t>(pick(keyed).first));
      break;
    case 3: {
      const size_t i = pick(keyed).first;
      lines.insert(lines.begin() + static_cast<std::ptrdiff_t>(i), lines[i]);
      break;
    }
    case 4: {  // re-indent
      std::string& line = lines[pick(keyed).first];
      if (chance(0.5)) {
        line.insert(0, chance(0.8) ? "  " : "\t");
      } else if (line.size() >= 2 && line[0] == ' ') {
        line.erase(0, 2);
      }
      break;
    }
    case 5: {  // deep flow nesting (yaml-cpp refuses beyond 2000 levels)
      static const size_t kDepths[] = {10, 100, 1999, 2100, 100000};
      const size_t n = kDepths[below(std::size(kDepths))];
      if (chance(0.5)) {
        set_value(pick(keyed), repeat("[", n) + "1" + repeat("]", n));
      } else {
        set_value(pick(keyed), repeat("{a: ", n) + "1" + repeat("}", n));
      }
      break;
    }
    case 6: {  // an anchor on one value, aliases to it elsewhere
      const auto& k = pick(keyed);
      const std::string value = lines[k.first].substr(k.second);
      set_value(k, "&a " + value);
      set_value(pick(keyed), chance(0.5) ? "*a" : "[*a, *a, *a, *a]");
      if (chance(0.3)) {
        // Nine levels of ten aliases each: 10^9 leaves if expanded.
        std::string laughs = "laughs:\n  l0: &l0 [x, x, x, x, x, x, x, x, x, x]";
        for (int l = 1; l < 9; ++l) {
          absl::StrAppend(&laughs, "\n  l", l, ": &l", l, " [",
                          repeat(absl::StrCat("*l", l - 1, ", "), 9), "*l", l - 1, "]");
        }
        lines.insert(lines.begin(), laughs);
        set_value(pick(keyed), "*l8");
      }
      break;
    }
    case 7: {  // a line of another seed
      const std::string& other = pick(corpus_);
      const size_t at = below(other.size() + 1);
      const size_t start = other.rfind('\n', at) == kNone ? 0 : other.rfind('\n', at) + 1;
      const size_t end = std::min(other.find('\n', at), other.size());
      lines.insert(lines.begin() + static_cast<std::ptrdiff_t>(below(lines.size() + 1)),
                   other.substr(start, end - start));
      break;
    }
    case 8: {  // directives and document markers
      static const char* kMarkers[] = {
          "---", "...", "%YAML 1.2", "%TAG ! tag:x,2000:", "--- |", "? x", ": y", "\t"};
      lines.insert(lines.begin() + static_cast<std::ptrdiff_t>(below(lines.size() + 1)),
                   kMarkers[below(std::size(kMarkers))]);
      break;
    }
  }
  join();
}

void Mutator::mutate_safetensors(std::string* s) {
  const bool framed = s->size() >= 8 && read_u64(*s) <= s->size() - 8;
  if (!framed || chance(0.1)) return mutate_bytes(s);
  const uint64_t length = read_u64(*s);
  switch (below(8)) {
    case 0:
    case 1:
    case 2:
    case 3: {  // the header as JSON; usually with its length fixed up
      std::string header = s->substr(8, length);
      mutate_json(&header);
      const std::string data = s->substr(8 + length);
      *s = s->substr(0, 8) + header + data;
      if (chance(0.9)) write_u64(s, header.size());
      break;
    }
    case 4: {
      const uint64_t kLengths[] = {0,
                                   1,
                                   2,
                                   7,
                                   length - 1,
                                   length + 1,
                                   s->size() - 8,
                                   s->size() - 7,
                                   100ull << 20,
                                   (100ull << 20) + 1,
                                   1ull << 32,
                                   1ull << 63,
                                   ~0ull};
      write_u64(s, kLengths[below(std::size(kLengths))]);
      break;
    }
    case 5:  // cut the data section short
      s->resize(8 + length + below(s->size() - 8 - length + 1));
      break;
    case 6:  // extend it
      s->append(1 + below(64), static_cast<char>(below(256)));
      break;
    case 7:
      mutate_bytes(s);
      break;
  }
}

}  // namespace relay::fuzz
