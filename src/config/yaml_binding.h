#pragma once

// The YAML side of the config binding: a Reader (YAML tree -> structs, which
// also learns the known keys and reports every problem with its line), a
// Writer (structs -> YAML) and a FieldLister (structs -> dotted key paths).
// All three walk the same visit_fields schema that each component declares
// beside its options (relay/trainer/option_keys.h, relay/rollout/option_keys.h,
// src/config/sections.h). yaml-cpp is included by src/config only.
//
// The Reader, the largest of the three, is in yaml_reader.h; this header
// includes it, so including yaml_binding.h gives all three.

#include <yaml-cpp/yaml.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "config/yaml_reader.h"
#include "relay/common/name_table.h"
#include "relay/common/problems.h"

namespace relay::config {

// ---------------------------------------------------------------------------
// Writer: prints the structs as block YAML through the same schema.

// A real number as the Writer prints it: "10000" -> "10000.0", so the file
// shows the field is a real number.
inline std::string real_text(double value) {
  std::string text = format_double(value);
  if (text.find_first_not_of("-0123456789") == std::string::npos) text += ".0";
  return text;
}

class Writer {
 public:
  explicit Writer(YAML::Emitter& out) : out_(out) {}

  template <class C>
  void section(const char* key, C& c) {
    out_ << YAML::Key << key << YAML::Value << YAML::BeginMap;
    visit_fields(*this, c);
    out_ << YAML::EndMap;
  }

  template <class T>
  void field(const char* key, T& value) {
    out_ << YAML::Key << key << YAML::Value << value;
  }

  void field(const char* key, std::vector<std::string>& value) {
    out_ << YAML::Key << key << YAML::Value << YAML::Flow << YAML::BeginSeq;
    for (const std::string& item : value) out_ << item;
    out_ << YAML::EndSeq;
  }

  void field(const char* key, double& value) {
    out_ << YAML::Key << key << YAML::Value << real_text(value);
  }

  template <class E>
  void field(const char* key, E& value, const NameTable<E>& names) {
    out_ << YAML::Key << key << YAML::Value << names.name(value);
  }

 private:
  YAML::Emitter& out_;
};

// ---------------------------------------------------------------------------
// FieldLister: the leaf keys as dotted paths with the values the Writer prints.

class FieldLister {
 public:
  template <class C>
  void section(const char* key, C& c) {
    const std::string outer = prefix_;
    prefix_ = join_path(prefix_, key);
    visit_fields(*this, c);
    prefix_ = outer;
  }
  void field(const char* key, std::string& value) { add(key, value); }
  void field(const char* key, bool& value) { add(key, value ? "true" : "false"); }
  void field(const char* key, int& value) { add(key, absl::StrCat(value)); }
  void field(const char* key, uint64_t& value) { add(key, absl::StrCat(value)); }
  void field(const char* key, int64_t& value) { add(key, absl::StrCat(value)); }
  template <class E>
  void field(const char* key, E& value, const NameTable<E>& names) {
    add(key, names.name(value));
  }
  void field(const char* key, double& value) { add(key, real_text(value)); }
  void field(const char* key, std::vector<std::string>& value) {
    add(key, absl::StrCat("[", absl::StrJoin(value, ", "), "]"));
  }

  std::vector<std::pair<std::string, std::string>> fields;

 private:
  void add(const char* key, std::string value) {
    fields.emplace_back(join_path(prefix_, key), std::move(value));
  }
  std::string prefix_;
};

}  // namespace relay::config
