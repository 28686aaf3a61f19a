// relay report RUN_DIR: the dashboard as one self-contained HTML file.

#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "bin/commands.h"
#include "relay/common/dashboard.h"
#include "relay/common/file_io.h"

namespace relay::cli {
namespace {

struct ReportArgs {
  std::string run_dir;       // holds metrics.jsonl; samples.jsonl and config.yaml if present
  std::string out;           // default: <run_dir>/report.html
  int64_t sample_steps = 4;  // the last N steps of samples.jsonl are shown
};

// Writes the run dashboard as one self-contained HTML file (docs/dashboard.md)
// and prints its path.
int report(const ReportArgs& args) {
  auto fail = [](const std::string& message) {
    std::fprintf(stderr, "relay report: %s\n", message.c_str());
    return 1;
  };
  if (args.sample_steps < 0) {
    return fail(absl::StrCat("--sample-steps: must be >= 0, got ", args.sample_steps));
  }
  std::error_code ec;
  if (!std::filesystem::is_directory(args.run_dir, ec)) {
    return fail(absl::StrCat(args.run_dir, ": not a run directory (no such directory)"));
  }
  const RunFiles files = run_files(args.run_dir);
  RunDataOptions options;
  options.sample_steps = args.sample_steps;
  StatusOr<std::string> data = run_data_json(files, options);
  if (!data.ok()) return fail(std::string(data.status().message()));
  const std::string out =
      args.out.empty() ? (std::filesystem::path(args.run_dir) / "report.html").string() : args.out;
  if (Status s = write_file_atomic(out, dashboard_report_html(files.name, *data)); !s.ok()) {
    return fail(std::string(s.message()));
  }
  std::printf("%s\n", out.c_str());
  return 0;
}

}  // namespace

Command add_report_command(CLI::App& relay) {
  auto args = std::make_shared<ReportArgs>();
  CLI::App* report = relay.add_subcommand(
      "report", "Write a run's dashboard (charts, latest samples) as one self-contained HTML file");
  report->add_option("run_dir", args->run_dir, "Run directory (holds metrics.jsonl)")->required();
  report->add_option("--out", args->out, "HTML file to write (default RUN_DIR/report.html)");
  report->add_option("--sample-steps", args->sample_steps,
                     "Show the sampled responses of the last N steps");
  return {report, [args] { return cli::report(*args); }};
}

}  // namespace relay::cli
