#pragma once

// The run dashboard (docs/dashboard.md): one self-contained HTML page (inline
// CSS and JS, nothing fetched from elsewhere) that draws a run's metrics and
// its latest sampled responses. The same page works two ways:
//   live:   served by relay-trainer at "/", it polls "api/run" (the JSON
//           below) every 2 s and redraws;
//   report: `relay report RUN_DIR` embeds that JSON in the file, which then
//           needs no server.
// The JSON is assembled from the run directory's files on every request, so
// the page shows whatever the trainer has flushed so far.

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "relay/common/status.h"

namespace relay {

// The files a dashboard reads.
struct RunFiles {
  std::string name;     // shown in the page's title (the run directory's name)
  std::string metrics;  // metrics.jsonl; required
  std::string samples;  // samples.jsonl; a missing file means "no samples recorded"
  std::string config;   // config.yaml; a missing file is reported as such on the page
};
// <run_dir>/{metrics.jsonl,samples.jsonl,config.yaml}, named after run_dir.
RunFiles run_files(const std::string& run_dir);

// One sampled response as the dashboard shows it. Per-token vectors have one
// entry per response token.
struct SampleRecord {
  std::string group_id;
  std::string prompt;               // the prompt, decoded
  std::vector<std::string> pieces;  // each response token decoded on its own
  std::vector<int64_t> token_ids;
  std::vector<float> logprobs;    // behavior log-prob (what the sampler drew it with)
  std::vector<int64_t> versions;  // policy version that sampled each token
  double reward = std::numeric_limits<double>::quiet_NaN();  // NaN = unscored
  std::string finish_reason;  // "stop" | "length" | "aborted" | "tool_budget" | "env_done" | ...
  // Episodes: 1 for a token the environment wrote (drawn apart on the page,
  // with no log-prob); empty for a single-turn response.
  std::vector<uint8_t> env_mask;
  // MoE models: per response token, the experts of each layer its
  // distribution came through ([R][layers][k], from the trajectory's
  // routed_experts); empty for dense models.
  std::vector<std::vector<std::vector<int32_t>>> routing;
};

// One line of samples.jsonl, without the newline:
//   {"step": S, "version": V, "samples": [{"group_id", "prompt", "reward",
//    "finish_reason", "pieces", "token_ids", "logprobs", "versions"
//    [, "routing"]}, ...]}
// NaN numbers become null; bytes that are not UTF-8 (a byte-level BPE token
// holding part of a character) become U+FFFD, as JSON must be UTF-8.
std::string samples_jsonl_line(int64_t step, int64_t version,
                               const std::vector<SampleRecord>& samples);

struct RunDataOptions {
  // Leave out the first N metrics records: a live page already holds them
  // and asks only for the rest. Past the end (the file was replaced) = 0.
  int64_t metrics_from = 0;
  // Only the last N lines of samples.jsonl are returned.
  int64_t sample_steps = 4;
};

// The JSON the page draws (what GET /api/run returns):
//   {"run": name,
//    "metrics": [records of metrics.jsonl from metrics_from on],
//    "metrics_from": F, "metrics_next": N (records in the file),
//    "samples": [the last sample_steps lines of samples.jsonl] | null (no file),
//    "config": the text of config.yaml | null (no file),
//    "files": {"metrics": path, "samples": path, "config": path}}
// Blank lines are skipped. A last line without its newline that does not
// parse is a write in progress and is left out. Errors: NotFound naming the
// metrics file when it is missing; InvalidArgument "PATH:LINE: ..." for a
// line that is not a JSON object with an integer "step" (metrics: also a
// string "phase", numbers or null elsewhere; samples: a "samples" array
// whose entries have as many "logprobs" as "pieces").
StatusOr<std::string> run_data_json(const RunFiles& files, const RunDataOptions& options = {});

// JSON text made safe to place inside a <script> element: every '<' becomes
// \u003c (only possible inside JSON strings, where it means the same), so no
// "</script>" or "<!--" in a response can end or alter the element.
std::string script_safe_json(std::string_view json);

// The live page: fetches "api/run" relative to its own URL.
std::string dashboard_live_html(const std::string& title);
// The report page with `run_data_json` (run_data_json()'s output) embedded
// as <script type="application/json" id="run-data">; fetches nothing.
std::string dashboard_report_html(const std::string& title, std::string_view run_data_json);

// HTML text escaping of &, <, >, " and '.
std::string html_escape(std::string_view text);

}  // namespace relay
