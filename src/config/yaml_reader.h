#pragma once

// The Reader of the config binding (yaml_binding.h): decodes a YAML tree
// into the option structs through their visit_fields schema, learning the
// known keys as it goes, and reports every problem (unknown or duplicate
// key, wrong type, out-of-range number) with its line, with the helpers
// that phrase those problems. yaml-cpp is included by src/config only.

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "relay/common/name_table.h"
#include "relay/common/problems.h"

namespace relay::config {

// ---------------------------------------------------------------------------
// Small helpers.

inline std::string join_path(const std::string& prefix, const std::string& key) {
  return prefix.empty() ? key : absl::StrCat(prefix, ".", key);
}

// What a node is, for "expected X, got <describe>".
inline std::string describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map:
      return "a map";
    case YAML::NodeType::Sequence:
      return "a sequence";
    case YAML::NodeType::Scalar:
      return quote(node.Scalar());
    default:
      return "null";
  }
}

inline size_t levenshtein(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];  // row[i-1][j-1]
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// "unknown key; did you mean 'x'?" when a known key is close enough (distance
// <= max(2, len/3)), else the list of known keys.
inline std::string unknown_key_message(const std::string& key,
                                       const std::vector<std::string>& known) {
  const std::string* best = nullptr;
  size_t best_distance = std::numeric_limits<size_t>::max();
  for (const std::string& k : known) {
    size_t d = levenshtein(key, k);
    if (d < best_distance) {
      best = &k;
      best_distance = d;
    }
  }
  if (best != nullptr && best_distance <= std::max<size_t>(2, key.size() / 3)) {
    return absl::StrCat("unknown key; did you mean '", *best, "'?");
  }
  return absl::StrCat("unknown key; known keys: ", absl::StrJoin(known, ", "));
}

// Parses all of `text` as a decimal number, as YAML's core schema writes it:
// an optional sign, no hex, no spaces. (from_chars alone rejects a '+'.)
template <class T>
inline bool parse_number(const std::string& text, T& out) {
  const char* begin = text.data();
  const char* end = begin + text.size();
  if (begin != end && *begin == '+') {
    ++begin;
    if (begin != end && *begin == '-') return false;
  }
  auto [ptr, ec] = std::from_chars(begin, end, out);
  return begin != end && ec == std::errc() && ptr == end;
}

// ---------------------------------------------------------------------------
// Reader: decodes a YAML tree into the structs. It records every problem
// (unknown or duplicate key, wrong type, out-of-range integer) rather than
// stopping at the first, each as "<source>[:<line>]: <path>: <what>".

class Reader {
 public:
  // `use_marks`: add line numbers (false when the tree holds override values,
  // whose marks point into the override string, not the file).
  Reader(std::string source, bool use_marks) : source_(std::move(source)), use_marks_(use_marks) {}

  const std::vector<std::string>& errors() const { return errors_; }

  // Reads the fields of `c` from `node`, a map or null (null = all defaults).
  template <class C>
  void read_map(const YAML::Node& node, const std::string& path, C& c) {
    Scope scope;
    scope.path = path;
    if (node.IsMap()) {
      for (auto it = node.begin(); it != node.end(); ++it) {
        if (!it->first.IsScalar()) {
          error(it->first, path, absl::StrCat("keys must be strings, got ", describe(it->first)));
          continue;
        }
        scope.entries.push_back({it->first.Scalar(), it->first, it->second});
      }
    }
    Scope* outer = scope_;
    scope_ = &scope;
    visit_fields(*this, c);
    scope_ = outer;
    check_keys(scope);
  }

  template <class C>
  void section(const char* key, C& c) {
    const Entry* entry = find(key);
    if (entry == nullptr) return;
    const YAML::Node& node = entry->value;
    std::string path = join_path(scope_->path, key);
    if (node.IsMap() || node.IsNull()) {
      read_map(node, path, c);
    } else {
      error(node, path, absl::StrCat("expected a map, got ", describe(node)));
    }
  }

  void field(const char* key, std::string& out) {
    const Entry* entry = find(key);
    if (entry == nullptr) return;
    const YAML::Node& node = entry->value;
    if (node.IsScalar()) {
      out = node.Scalar();
    } else {
      type_error(*entry, key, "a string");
    }
  }

  void field(const char* key, std::vector<std::string>& out) {
    const Entry* entry = find(key);
    if (entry == nullptr) return;
    const YAML::Node& node = entry->value;
    if (!node.IsSequence()) {
      type_error(*entry, key, "a sequence of strings");
      return;
    }
    std::vector<std::string> items;
    for (size_t i = 0; i < node.size(); ++i) {
      if (!node[i].IsScalar()) {
        error(node[i], absl::StrCat(join_path(scope_->path, key), "[", i, "]"),
              absl::StrCat("expected a string, got ", describe(node[i])));
        return;
      }
      items.push_back(node[i].Scalar());
    }
    out = std::move(items);
  }

  void field(const char* key, bool& out) {
    const Entry* entry = find(key);
    if (entry == nullptr) return;
    const YAML::Node& node = entry->value;
    // Only true/false: YAML 1.1's yes/no/on/off are too easy to write by accident.
    if (node.IsScalar() && node.Scalar() == "true") {
      out = true;
    } else if (node.IsScalar() && node.Scalar() == "false") {
      out = false;
    } else {
      type_error(*entry, key, "true or false");
    }
  }

  void field(const char* key, int& out) {
    const Entry* entry = find(key);
    if (entry == nullptr) return;
    const YAML::Node& node = entry->value;
    int64_t v = 0;
    if (!node.IsScalar() || !parse_number(node.Scalar(), v)) {
      type_error(*entry, key, "an integer");
    } else if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max()) {
      type_error(*entry, key,
                 absl::StrCat("an integer in [", std::numeric_limits<int>::min(), ", ",
                              std::numeric_limits<int>::max(), "]"));
    } else {
      out = static_cast<int>(v);
    }
  }

  void field(const char* key, int64_t& out) {
    const Entry* entry = find(key);
    if (entry == nullptr) return;
    const YAML::Node& node = entry->value;
    int64_t v = 0;
    if (node.IsScalar() && parse_number(node.Scalar(), v)) {
      out = v;
    } else {
      type_error(*entry, key, "an integer");
    }
  }

  // An enum by its names; an unknown name lists the known ones.
  template <class E>
  void field(const char* key, E& out, const NameTable<E>& names) {
    const Entry* entry = find(key);
    if (entry == nullptr) return;
    const YAML::Node& node = entry->value;
    if (!node.IsScalar()) {
      type_error(*entry, key, absl::StrCat("one of ", names.known()));
      return;
    }
    StatusOr<E> value = names.parse(node.Scalar());
    if (value.ok()) {
      out = *value;
    } else {
      error(node, join_path(scope_->path, key),
            absl::StrCat("must be one of ", names.known(), ", got ", quote(node.Scalar())));
    }
  }

  void field(const char* key, uint64_t& out) {
    const Entry* entry = find(key);
    if (entry == nullptr) return;
    const YAML::Node& node = entry->value;
    uint64_t v = 0;  // from_chars rejects a leading '-' for unsigned types
    if (node.IsScalar() && parse_number(node.Scalar(), v)) {
      out = v;
    } else {
      type_error(*entry, key,
                 absl::StrCat("an integer in [0, ", std::numeric_limits<uint64_t>::max(), "]"));
    }
  }

  void field(const char* key, double& out) {
    const Entry* entry = find(key);
    if (entry == nullptr) return;
    const YAML::Node& node = entry->value;
    double v = 0;
    if (node.IsScalar() && parse_number(node.Scalar(), v) && std::isfinite(v)) {
      out = v;
    } else {
      type_error(*entry, key, "a number");
    }
  }

 private:
  struct Entry {
    std::string key;
    YAML::Node key_node;
    YAML::Node value;
  };
  // The map being read: its entries, and the keys the schema asked for.
  struct Scope {
    std::string path;
    std::vector<Entry> entries;
    std::vector<std::string> known;
  };

  // Records `key` as known in the current map and returns its entry (the
  // first one if repeated), or nullptr when absent.
  const Entry* find(const char* key) {
    scope_->known.emplace_back(key);
    for (const Entry& e : scope_->entries) {
      if (e.key == key) return &e;
    }
    return nullptr;
  }

  void check_keys(const Scope& scope) {
    for (size_t i = 0; i < scope.entries.size(); ++i) {
      const Entry& e = scope.entries[i];
      std::string path = join_path(scope.path, e.key);
      bool known = std::find(scope.known.begin(), scope.known.end(), e.key) != scope.known.end();
      if (!known) {
        error(e.key_node, path, unknown_key_message(e.key, scope.known));
        continue;
      }
      for (size_t j = 0; j < i; ++j) {
        if (scope.entries[j].key == e.key) {
          error(e.key_node, path, "duplicate key");
          break;
        }
      }
    }
  }

  // Points at the value's line, or the key's when the value is null (a null
  // value's mark is wherever the parser went next).
  void type_error(const Entry& entry, const char* key, const std::string& expected) {
    const YAML::Node& at = entry.value.IsNull() ? entry.key_node : entry.value;
    error(at, join_path(scope_->path, key),
          absl::StrCat("expected ", expected, ", got ", describe(entry.value)));
  }

  void error(const YAML::Node& at, const std::string& path, const std::string& what) {
    std::string where = source_;
    YAML::Mark mark = at.Mark();
    if (use_marks_ && !mark.is_null()) absl::StrAppend(&where, ":", mark.line + 1);
    errors_.push_back(path.empty() ? absl::StrCat(where, ": ", what)
                                   : absl::StrCat(where, ": ", path, ": ", what));
  }

  std::string source_;
  bool use_marks_;
  Scope* scope_ = nullptr;
  std::vector<std::string> errors_;
};

}  // namespace relay::config
