// relay report RUN_DIR: the dashboard as one self-contained HTML file.

#include <cstdio>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "bin/commands.h"
#include "relay/common/dashboard.h"
#include "relay/common/file_io.h"

namespace relay::cli {

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

}  // namespace relay::cli
