// docs/config.md is the config reference: for every key, a table row
//   | `section.key` | `default` | meaning |
// This test keeps it true to the config structs. The keys and defaults come
// from relay::config_fields() of a default-constructed ExperimentConfig (the
// same schema, visit_fields in src/common/config.cc, that reads and writes
// YAML), so a key added to the code without a row, a row whose key is gone,
// or a default changed on one side only fails here, naming each.

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "relay/config/config.h"

namespace relay {
namespace {

const char kDocPath[] = RELAY_SOURCE_DIR "/docs/config.md";

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

// The cells of a Markdown table row, split on '|' not escaped as "\|".
std::vector<std::string> split_cells(const std::string& line) {
  std::vector<std::string> cells;
  std::string cell;
  for (size_t i = 0; i < line.size(); ++i) {
    if (line[i] == '\\' && i + 1 < line.size() && line[i + 1] == '|') {
      cell += '|';
      ++i;
    } else if (line[i] == '|') {
      cells.push_back(trim(cell));
      cell.clear();
    } else {
      cell += line[i];
    }
  }
  cells.push_back(trim(cell));
  // "| a | b |" gives an empty first and last piece.
  if (!cells.empty() && cells.front().empty()) cells.erase(cells.begin());
  if (!cells.empty() && cells.back().empty()) cells.pop_back();
  return cells;
}

// `x` -> x; `""` -> the empty string.
std::string cell_value(const std::string& cell) {
  std::string v = cell;
  if (v.size() >= 2 && v.front() == '`' && v.back() == '`') v = v.substr(1, v.size() - 2);
  if (v == "\"\"") return "";
  return v;
}

bool is_dotted_key(const std::string& s) {
  if (s.empty() || s.find('.') == std::string::npos || s.front() == '.' || s.back() == '.') {
    return false;
  }
  for (char c : s) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '.')) return false;
  }
  return true;
}

std::optional<double> as_number(const std::string& s) {
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size()) return std::nullopt;
  return v;
}

// Documented and actual defaults agree: the same text, or the same number
// however it is written (1e-6 and 1e-06, 600 and 600.0).
bool same_default(const std::string& documented, const std::string& actual) {
  if (documented == actual) return true;
  const std::optional<double> a = as_number(documented), b = as_number(actual);
  return a && b && *a == *b;
}

std::string shown(const std::string& value) { return value.empty() ? "\"\"" : value; }

struct DocRow {
  std::string key;
  std::string default_value;
  int line = 0;
};

// The rows of every table whose header starts "| key | default |"; a row
// there whose first cell is not a dotted key in backticks is a problem too.
std::vector<DocRow> reference_rows(const std::string& doc, std::vector<std::string>* malformed) {
  std::vector<DocRow> rows;
  std::istringstream in(doc);
  std::string line;
  int number = 0;
  bool in_reference_table = false;
  bool in_table = false;
  while (std::getline(in, line)) {
    ++number;
    const std::string t = trim(line);
    if (t.empty() || t.front() != '|') {
      in_table = in_reference_table = false;
      continue;
    }
    const std::vector<std::string> cells = split_cells(t);
    if (!in_table) {  // the header row
      in_table = true;
      in_reference_table = cells.size() >= 2 && cells[0] == "key" && cells[1] == "default";
      continue;
    }
    if (!in_reference_table) continue;
    if (t.find_first_not_of("|-: ") == std::string::npos) continue;  // the separator row
    const std::string key = cells.empty() ? "" : cells[0];
    const bool code = key.size() >= 2 && key.front() == '`' && key.back() == '`';
    if (cells.size() < 3 || !code || !is_dotted_key(cell_value(key))) {
      malformed->push_back("docs/config.md:" + std::to_string(number) +
                           ": expected | `section.key` | `default` | meaning |, got: " + t);
      continue;
    }
    rows.push_back({cell_value(key), cell_value(cells[1]), number});
  }
  return rows;
}

// Everything wrong with `doc` as the reference of `fields`; empty when it is
// right. Missing keys come as ready-to-paste table rows.
std::string check_reference(const std::string& doc,
                            const std::vector<std::pair<std::string, std::string>>& fields) {
  std::vector<std::string> malformed;
  const std::vector<DocRow> rows = reference_rows(doc, &malformed);
  std::map<std::string, std::string> actual(fields.begin(), fields.end());
  std::map<std::string, const DocRow*> documented;
  std::vector<std::string> unknown, duplicated, differing, missing;
  for (const DocRow& row : rows) {
    const std::string at = "docs/config.md:" + std::to_string(row.line) + ": `" + row.key + "`";
    if (!documented.emplace(row.key, &row).second) {
      duplicated.push_back(at + " (also on line " + std::to_string(documented[row.key]->line) +
                           ")");
      continue;
    }
    auto it = actual.find(row.key);
    if (it == actual.end()) {
      unknown.push_back(at);
    } else if (!same_default(row.default_value, it->second)) {
      differing.push_back(at + ": documented `" + shown(row.default_value) + "`, the code has `" +
                          shown(it->second) + "`");
    }
  }
  for (const auto& [key, value] : fields) {
    if (documented.count(key) == 0) {
      missing.push_back("| `" + key + "` | `" + shown(value) + "` | TODO |");
    }
  }
  std::string report;
  auto section = [&report](const std::string& title, const std::vector<std::string>& lines) {
    if (lines.empty()) return;
    report += title + " (" + std::to_string(lines.size()) + "):\n";
    for (const std::string& l : lines) report += "  " + l + "\n";
  };
  section("keys missing from docs/config.md; add these rows to their section's table", missing);
  section("documented keys the config does not have", unknown);
  section("documented defaults that differ from the code", differing);
  section("keys documented twice", duplicated);
  section("malformed rows in a | key | default | table", malformed);
  return report;
}

std::string read_doc() {
  std::ifstream in(kDocPath, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(ConfigReferenceTest, DocsConfigMdDocumentsEveryKeyWithItsDefault) {
  const std::string doc = read_doc();
  ASSERT_FALSE(doc.empty()) << "cannot read " << kDocPath;
  const std::string report = check_reference(doc, config_fields(ExperimentConfig{}));
  EXPECT_TRUE(report.empty()) << "docs/config.md disagrees with the config structs "
                                 "(include/relay/config/config.h):\n"
                              << report;
}

// The checker itself: each kind of drift is reported, and only that.
TEST(ConfigReferenceTest, ReportsMissingUnknownChangedAndDuplicatedKeys) {
  const std::vector<std::pair<std::string, std::string>> fields = {
      {"rollout.n", "8"},
      {"rollout.stop", "[]"},
      {"model.path", ""},
      {"trainer.lr", "1e-05"},
      {"services.group_wait_s", "600.0"},
      {"rollout.new_key", "3"}};
  const std::string doc =
      "# Config\n"
      "\n"
      "| key | default | meaning |\n"
      "|---|---|---|\n"
      "| `rollout.n` | `4` | responses per prompt |\n"
      "| `rollout.stop` | `[]` | extra stop strings \\| one token each |\n"
      "| `model.path` | `\"\"` | model directory |\n"
      "| `trainer.lr` | `1e-5` | learning rate |\n"
      "| `services.group_wait_s` | `600` | seconds |\n"
      "| `rollout.gone` | `1` | removed |\n"
      "| `rollout.stop` | `[]` | again |\n"
      "\n"
      "| value | meaning |\n"
      "|---|---|\n"
      "| `a.b` | not a reference table, not checked |\n";
  const std::string report = check_reference(doc, fields);
  EXPECT_NE(report.find("| `rollout.new_key` | `3` | TODO |"), std::string::npos) << report;
  EXPECT_NE(report.find("docs/config.md:10: `rollout.gone`"), std::string::npos) << report;
  EXPECT_NE(report.find("docs/config.md:5: `rollout.n`: documented `4`, the code has `8`"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("docs/config.md:11: `rollout.stop` (also on line 6)"), std::string::npos)
      << report;
  // Numbers written differently, an empty string as "" and an escaped pipe
  // are not drift.
  EXPECT_EQ(report.find("trainer.lr"), std::string::npos) << report;
  EXPECT_EQ(report.find("group_wait_s"), std::string::npos) << report;
  EXPECT_EQ(report.find("model.path"), std::string::npos) << report;
  EXPECT_EQ(report.find("a.b"), std::string::npos) << report;

  const std::string fixed =
      "| key | default | meaning |\n|---|---|---|\n"
      "| `rollout.n` | `8` | x |\n| `rollout.stop` | `[]` | x |\n| `model.path` | `\"\"` | x |\n"
      "| `trainer.lr` | `1e-5` | x |\n| `services.group_wait_s` | `600` | x |\n"
      "| `rollout.new_key` | `3` | x |\n";
  EXPECT_EQ(check_reference(fixed, fields), "");
}

TEST(ConfigReferenceTest, MalformedRowsInAReferenceTableAreReported) {
  const std::string doc =
      "| key | default | meaning |\n|---|---|---|\n| rollout.n | `8` | no backticks |\n";
  EXPECT_NE(check_reference(doc, {{"rollout.n", "8"}}).find("docs/config.md:3: expected"),
            std::string::npos);
}

TEST(ConfigReferenceTest, ConfigFieldsListsEveryLeafOnceWithToYamlValues) {
  const std::vector<std::pair<std::string, std::string>> fields = config_fields(ExperimentConfig{});
  std::set<std::string> keys;
  for (const auto& [key, value] : fields) {
    EXPECT_TRUE(keys.insert(key).second) << "listed twice: " << key;
    EXPECT_TRUE(is_dotted_key(key)) << key;
  }
  const std::map<std::string, std::string> m(fields.begin(), fields.end());
  EXPECT_EQ(m.at("rollout.n"), "8");
  EXPECT_EQ(m.at("rollout.stop"), "[]");
  EXPECT_EQ(m.at("model.path"), "");
  EXPECT_EQ(m.at("model.init.tie_embeddings"), "true");
  EXPECT_EQ(m.at("model.init.rope_theta"), "10000.0");
  EXPECT_EQ(m.at("trainer.advantage.epsilon"), "1e-06");
  EXPECT_EQ(m.at("services.tls.mutual"), "false");
  EXPECT_EQ(m.at("experiment.warm_start.sft_lr"), "0.001");
  // Sections are not leaves.
  EXPECT_EQ(m.count("trainer.ppo"), 0u);
  EXPECT_EQ(m.count("services.tls"), 0u);
}

// config_fields reports the values a config holds, in a form the override
// syntax reads back: every field of configs/arith.yaml, re-applied as
// key=value overrides to an empty file, gives the same list.
TEST(ConfigReferenceTest, ConfigFieldsRoundTripThroughOverrides) {
  StatusOr<ExperimentConfig> arith = load_config(RELAY_SOURCE_DIR "/configs/arith.yaml");
  ASSERT_TRUE(arith.ok()) << arith.status();
  const auto fields = config_fields(*arith);
  std::vector<std::string> overrides;
  for (const auto& [key, value] : fields) overrides.push_back(key + "=" + shown(value));
  StatusOr<ExperimentConfig> rebuilt = parse_config("", "empty", overrides);
  ASSERT_TRUE(rebuilt.ok()) << rebuilt.status();
  EXPECT_EQ(config_fields(*rebuilt), fields);
  const std::map<std::string, std::string> m(fields.begin(), fields.end());
  EXPECT_EQ(m.at("experiment.name"), "arith");
  EXPECT_EQ(m.at("rollout.workers"), "2");
}

}  // namespace
}  // namespace relay
