#include "relay/common/dashboard.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/dashboard_page.h"
#include "relay/common/file_io.h"

namespace relay {
namespace {

using nlohmann::json;

// One non-blank line of a JSONL file.
struct LineSpan {
  int64_t number = 0;  // 1-based
  std::string_view text;
};

// The record lines of `text`, in order. A last line without its newline that
// does not parse is a write in progress (the trainer appends a line and then
// flushes): it is dropped rather than reported.
std::vector<LineSpan> record_lines(std::string_view text) {
  std::vector<LineSpan> lines;
  int64_t number = 0;
  size_t pos = 0;
  bool last_terminated = true;
  while (pos < text.size()) {
    ++number;
    size_t end = text.find('\n', pos);
    last_terminated = end != std::string_view::npos;
    if (!last_terminated) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) {
      last_terminated = true;  // a blank tail is nothing in progress
      continue;
    }
    lines.push_back({number, line});
  }
  if (!lines.empty() && !last_terminated &&
      !json::accept(lines.back().text.begin(), lines.back().text.end())) {
    lines.pop_back();
  }
  return lines;
}

Status line_error(const std::string& path, int64_t line, const std::string& what) {
  return InvalidArgumentError(absl::StrCat(path, ":", line, ": ", what));
}

StatusOr<json> parse_object(const std::string& path, const LineSpan& line) {
  json j;
  try {
    j = json::parse(line.text.begin(), line.text.end());
  } catch (const json::parse_error& e) {
    // e.what() is "[json.exception.parse_error.101] parse error at line 1, column 7: ...".
    std::string what = e.what();
    const size_t at = what.find("parse error");
    return line_error(path, line.number,
                      absl::StrCat("not JSON: ", at == std::string::npos ? what : what.substr(at)));
  }
  if (!j.is_object()) return line_error(path, line.number, "not a JSON object");
  if (!j.contains("step") || !j["step"].is_number_integer()) {
    return line_error(path, line.number, "\"step\": missing or not an integer");
  }
  return j;
}

Status check_metrics_record(const std::string& path, int64_t line, const json& j) {
  if (!j.contains("phase") || !j["phase"].is_string()) {
    return line_error(path, line, "\"phase\": missing or not a string");
  }
  for (const auto& [key, value] : j.items()) {
    if (key == "phase" || key == "step") continue;
    // The trainer writes NaN as null (JSON has no NaN).
    if (!value.is_number() && !value.is_null()) {
      return line_error(path, line, absl::StrCat("\"", key, "\": not a number or null"));
    }
  }
  return OkStatus();
}

Status check_samples_record(const std::string& path, int64_t line, const json& j) {
  if (!j.contains("samples") || !j["samples"].is_array()) {
    return line_error(path, line, "\"samples\": missing or not an array");
  }
  for (size_t i = 0; i < j["samples"].size(); ++i) {
    const json& s = j["samples"][i];
    const std::string where = absl::StrCat("samples[", i, "]");
    if (!s.is_object()) return line_error(path, line, absl::StrCat(where, ": not an object"));
    if (!s.contains("pieces") || !s["pieces"].is_array()) {
      return line_error(path, line, absl::StrCat(where, ".pieces: missing or not an array"));
    }
    if (!s.contains("logprobs") || !s["logprobs"].is_array()) {
      return line_error(path, line, absl::StrCat(where, ".logprobs: missing or not an array"));
    }
    if (s["pieces"].size() != s["logprobs"].size()) {
      return line_error(path, line,
                        absl::StrCat(where, ".logprobs: size ", s["logprobs"].size(),
                                     " != pieces size ", s["pieces"].size()));
    }
    for (const json& p : s["pieces"]) {
      if (!p.is_string()) return line_error(path, line, absl::StrCat(where, ".pieces: not text"));
    }
  }
  return OkStatus();
}

// Reads `path`; a missing file is nullopt, not an error.
StatusOr<std::optional<std::string>> read_optional(const std::string& path) {
  StatusOr<std::string> text = read_file(path);
  if (text.ok()) return std::optional<std::string>(*std::move(text));
  if (absl::IsNotFound(text.status())) return std::optional<std::string>();
  return text.status();
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string fill_page(const std::string& title, const std::string& mode, std::string_view data) {
  const std::string data_element =
      mode != "report" ? std::string()
                       : absl::StrCat("<script type=\"application/json\" id=\"run-data\">",
                                      script_safe_json(data), "</script>");
  const std::pair<std::string_view, std::string> fills[] = {
      {"@TITLE@", html_escape(title)}, {"@MODE@", mode}, {"@RUN_DATA@", data_element}};
  // One pass over the template: text filled in is never scanned for
  // placeholders (a response may well contain "@MODE@").
  const std::string_view page = kDashboardPage;
  std::string out;
  size_t pos = 0;
  while (pos < page.size()) {
    size_t at = page.find('@', pos);
    if (at == std::string_view::npos) break;
    out.append(page.substr(pos, at - pos));
    pos = at;
    bool filled = false;
    for (const auto& [placeholder, text] : fills) {
      if (page.substr(at, placeholder.size()) == placeholder) {
        out += text;
        pos += placeholder.size();
        filled = true;
        break;
      }
    }
    if (!filled) out.push_back(page[pos++]);
  }
  out.append(page.substr(pos));
  return out;
}

}  // namespace

RunFiles run_files(const std::string& run_dir) {
  namespace fs = std::filesystem;
  fs::path dir(run_dir);
  // "runs/arith/" names the run "arith", not "".
  std::string name =
      dir.has_filename() ? dir.filename().string() : dir.parent_path().filename().string();
  return {name, (dir / "metrics.jsonl").string(), (dir / "samples.jsonl").string(),
          (dir / "config.yaml").string()};
}

std::string samples_jsonl_line(int64_t step, int64_t version,
                               const std::vector<SampleRecord>& samples) {
  json list = json::array();
  for (const SampleRecord& s : samples) {
    json logprobs = json::array();
    // nlohmann writes a non-finite float as null, which is what the page expects.
    for (float lp : s.logprobs) logprobs.push_back(lp);
    list.push_back({{"group_id", s.group_id},
                    {"prompt", s.prompt},
                    {"reward", s.reward},
                    {"finish_reason", s.finish_reason},
                    {"pieces", s.pieces},
                    {"token_ids", s.token_ids},
                    {"logprobs", std::move(logprobs)},
                    {"versions", s.versions}});
    if (!s.routing.empty()) list.back()["routing"] = s.routing;
    if (!s.env_mask.empty()) list.back()["env_mask"] = s.env_mask;
  }
  return dump({{"step", step}, {"version", version}, {"samples", std::move(list)}});
}

StatusOr<std::string> run_data_json(const RunFiles& files, const RunDataOptions& options) {
  StatusOr<std::string> metrics_text = read_file(files.metrics);
  if (absl::IsNotFound(metrics_text.status())) {
    return NotFoundError(absl::StrCat(files.metrics, ": no such file (is this a run directory?)"));
  }
  RELAY_RETURN_IF_ERROR(metrics_text.status());
  const std::vector<LineSpan> metric_lines = record_lines(*metrics_text);
  const int64_t total = static_cast<int64_t>(metric_lines.size());
  const int64_t from =
      options.metrics_from >= 0 && options.metrics_from <= total ? options.metrics_from : 0;
  json metrics = json::array();
  for (int64_t i = from; i < total; ++i) {
    RELAY_ASSIGN_OR_RETURN(json j, parse_object(files.metrics, metric_lines[i]));
    RELAY_RETURN_IF_ERROR(check_metrics_record(files.metrics, metric_lines[i].number, j));
    metrics.push_back(std::move(j));
  }

  json samples = nullptr;
  RELAY_ASSIGN_OR_RETURN(std::optional<std::string> samples_text, read_optional(files.samples));
  if (samples_text) {
    samples = json::array();
    const std::vector<LineSpan> lines = record_lines(*samples_text);
    const size_t first =
        lines.size() > static_cast<size_t>(std::max<int64_t>(0, options.sample_steps))
            ? lines.size() - static_cast<size_t>(std::max<int64_t>(0, options.sample_steps))
            : 0;
    for (size_t i = first; i < lines.size(); ++i) {
      RELAY_ASSIGN_OR_RETURN(json j, parse_object(files.samples, lines[i]));
      RELAY_RETURN_IF_ERROR(check_samples_record(files.samples, lines[i].number, j));
      samples.push_back(std::move(j));
    }
  }
  RELAY_ASSIGN_OR_RETURN(std::optional<std::string> config, read_optional(files.config));

  json out = {{"run", files.name},
              {"metrics", std::move(metrics)},
              {"metrics_from", from},
              {"metrics_next", total},
              {"samples", std::move(samples)},
              {"config", config ? json(*config) : json(nullptr)},
              {"files",
               {{"metrics", files.metrics}, {"samples", files.samples}, {"config", files.config}}}};
  return dump(out);
}

std::string script_safe_json(std::string_view json_text) {
  std::string out;
  out.reserve(json_text.size());
  for (char c : json_text) {
    if (c == '<') {
      out += "\\u003c";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string html_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

std::string dashboard_live_html(const std::string& title) { return fill_page(title, "live", ""); }

std::string dashboard_report_html(const std::string& title, std::string_view run_data_json) {
  return fill_page(title, "report", run_data_json);
}

}  // namespace relay
