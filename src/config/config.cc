#include "relay/config/config.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "config/rules.h"
#include "config/sections.h"
#include "config/yaml_binding.h"

// yaml-cpp is used in src/config and nowhere else. It throws; every entry
// point below catches and returns a Status instead.

namespace relay {
namespace {

using config::describe;
using config::FieldLister;
using config::Reader;
using config::Writer;

// ---------------------------------------------------------------------------
// Overrides: "key.path=value", applied to the YAML tree before decoding.

struct Override {
  std::string text;               // as given, for messages
  std::string key;                // "rollout.n"
  std::vector<std::string> path;  // {"rollout", "n"}
  YAML::Node value;
};

std::string override_source(const std::string& text) {
  return absl::StrCat("override ", quote(text));
}

StatusOr<Override> parse_override(const std::string& text) {
  const std::string source = override_source(text);
  size_t eq = text.find('=');
  if (eq == std::string::npos) {
    return InvalidArgumentError(absl::StrCat(source, ": expected key.path=value"));
  }
  Override o;
  o.text = text;
  o.key = std::string(absl::StripAsciiWhitespace(text.substr(0, eq)));
  if (o.key.empty()) return InvalidArgumentError(absl::StrCat(source, ": empty key"));
  o.path = absl::StrSplit(o.key, '.');
  for (const std::string& part : o.path) {
    if (part.empty()) {
      return InvalidArgumentError(absl::StrCat(source, ": empty component in key ", quote(o.key)));
    }
  }
  std::string value = text.substr(eq + 1);
  if (absl::StripAsciiWhitespace(value).empty()) {
    o.value = YAML::Node(std::string());  // "key=" sets an empty string, not null
    return o;
  }
  try {
    o.value = YAML::Load(value);
  } catch (const YAML::Exception& e) {
    return InvalidArgumentError(absl::StrCat(source, ": malformed value: ", e.msg));
  }
  return o;
}

// Sets root[path...] = value, turning missing or non-map intermediates into
// maps (a non-map that was a leaf is then reported by the decoder as a type
// error at its path). Uses fresh Node handles per level: assigning to a
// yaml-cpp Node that refers into a tree rewrites the tree.
void set_path(YAML::Node map, const std::vector<std::string>& path, size_t i,
              const YAML::Node& value) {
  if (i + 1 == path.size()) {
    map[path[i]] = value;
    return;
  }
  YAML::Node child = map[path[i]];
  if (!child.IsMap()) child = YAML::Node(YAML::NodeType::Map);
  set_path(child, path, i + 1, value);
}

// ---------------------------------------------------------------------------

Status decode(const YAML::Node& root, const std::string& source, bool use_marks,
              ExperimentConfig& out) {
  ExperimentConfig config;
  Reader reader(source, use_marks);
  reader.read_map(root, "", config);
  if (!reader.errors().empty()) {
    return InvalidArgumentError(absl::StrJoin(reader.errors(), "\n"));
  }
  trainer::share_ppo_settings(config.trainer.loss);
  out = std::move(config);
  return OkStatus();
}

// Receives a document's events and ignores them: count_documents() only
// needs HandleNextDocument's answer.
class IgnoreEvents : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

// The documents in `yaml_text`, counted up to `limit`. Not YAML::LoadAll:
// in yaml-cpp 0.7 a stray ',' at the top level makes it return empty
// documents without end, until memory runs out (found by tests/fuzz).
// Throws YAML::ParserException.
size_t count_documents(const std::string& yaml_text, size_t limit) {
  std::istringstream in(yaml_text);
  YAML::Parser parser(in);
  IgnoreEvents ignore;
  size_t docs = 0;
  while (docs < limit && parser.HandleNextDocument(ignore)) ++docs;
  return docs;
}

// Parses the text into a map node (an empty document becomes an empty map).
StatusOr<YAML::Node> load_root(const std::string& yaml_text, const std::string& source) {
  constexpr size_t kCountUpTo = 16;
  YAML::Node root;
  try {
    const size_t docs = count_documents(yaml_text, kCountUpTo + 1);
    if (docs > 1) {
      return InvalidArgumentError(absl::StrCat(source, ": expected one YAML document, got ",
                                               docs > kCountUpTo ? "more than " : "",
                                               std::min(docs, kCountUpTo)));
    }
    if (docs == 1) root = YAML::Load(yaml_text);
  } catch (const YAML::ParserException& e) {
    return InvalidArgumentError(absl::StrCat(source, ":", e.mark.line + 1, ":", e.mark.column + 1,
                                             ": malformed YAML: ", e.msg));
  }
  if (!root.IsDefined() || root.IsNull()) return YAML::Node(YAML::NodeType::Map);
  if (!root.IsMap()) {
    std::string where = source;
    if (!root.Mark().is_null()) absl::StrAppend(&where, ":", root.Mark().line + 1);
    return InvalidArgumentError(
        absl::StrCat(where, ": expected a map at the top level, got ", describe(root)));
  }
  return root;
}

StatusOr<ExperimentConfig> parse_config_impl(const std::string& yaml_text,
                                             const std::string& source,
                                             const std::vector<std::string>& overrides) {
  RELAY_ASSIGN_OR_RETURN(YAML::Node root, load_root(yaml_text, source));
  ExperimentConfig config;
  RELAY_RETURN_IF_ERROR(decode(root, source, /*use_marks=*/true, config));
  // Decode again after each override: the tree decoded cleanly before it, so
  // any new error is that override's, and is reported under its name.
  std::vector<Override> applied;
  for (const std::string& text : overrides) {
    RELAY_ASSIGN_OR_RETURN(Override o, parse_override(text));
    set_path(root, o.path, 0, o.value);
    RELAY_RETURN_IF_ERROR(decode(root, override_source(text), /*use_marks=*/false, config));
    applied.push_back(std::move(o));
  }

  Problems problems;
  config::check(config, problems);
  if (problems.empty()) return config;
  std::vector<std::string> lines;
  for (const Problem& problem : problems.list()) {
    // Blame the last override that set this path or a section holding it.
    std::string blamed = source;
    for (auto it = applied.rbegin(); it != applied.rend(); ++it) {
      if (problem.path == it->key || absl::StartsWith(problem.path, it->key + ".")) {
        blamed = override_source(it->text);
        break;
      }
    }
    lines.push_back(absl::StrCat(blamed, ": ", problem.path, ": ", problem.what));
  }
  return InvalidArgumentError(absl::StrJoin(lines, "\n"));
}

}  // namespace

StatusOr<ExperimentConfig> load_config(const std::string& path,
                                       const std::vector<std::string>& overrides) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    return NotFoundError(absl::StrCat("config file not found: ", path));
  }
  if (std::filesystem::is_directory(path, ec)) {
    return InvalidArgumentError(absl::StrCat(path, ": is a directory, expected a YAML file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return InvalidArgumentError(absl::StrCat(path, ": cannot open file"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return InvalidArgumentError(absl::StrCat(path, ": cannot read file"));
  return parse_config(text, path, overrides);
}

StatusOr<ExperimentConfig> parse_config(const std::string& yaml_text, const std::string& source,
                                        const std::vector<std::string>& overrides) {
  try {
    return parse_config_impl(yaml_text, source, overrides);
  } catch (const YAML::Exception& e) {
    return InvalidArgumentError(absl::StrCat(source, ": ", e.what()));
  } catch (const std::exception& e) {
    return InternalError(absl::StrCat(source, ": ", e.what()));
  }
}

Status validate(const ExperimentConfig& config) {
  Problems problems;
  config::check(config, problems);
  return problems.status();
}

std::string to_yaml(const ExperimentConfig& config) {
  ExperimentConfig copy = config;  // the schema walks mutable structs
  YAML::Emitter out;
  out << YAML::BeginMap;
  Writer writer(out);
  visit_fields(writer, copy);
  out << YAML::EndMap;
  return absl::StrCat(out.c_str(), "\n");
}

std::vector<std::pair<std::string, std::string>> config_fields(const ExperimentConfig& config) {
  ExperimentConfig copy = config;  // the schema walks mutable structs
  FieldLister lister;
  visit_fields(lister, copy);
  return std::move(lister.fields);
}

}  // namespace relay
