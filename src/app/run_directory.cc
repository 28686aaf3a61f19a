#include "relay/app/run_directory.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "relay/common/file_io.h"

namespace relay::app {

RunLayout run_layout(const std::string& dir, const std::string& metrics, const std::string& store) {
  RunLayout r;
  r.dir = dir;
  r.config = dir + "/config.yaml";
  r.metrics = metrics.empty() ? dir + "/metrics.jsonl" : metrics;
  r.samples = dir + "/samples.jsonl";
  r.tensorboard = dir + "/tensorboard";
  r.checkpoints = dir + "/checkpoints";
  r.reference = r.checkpoints + "/reference";
  r.store = store.empty() ? dir + "/store" : store;
  return r;
}

Status record_config(const RunLayout& run, const std::string& resolved, int64_t now_unix_s) {
  if (StatusOr<std::string> previous = read_file(run.config);
      previous.ok() && *previous != resolved) {
    const std::string kept = absl::StrCat(run.dir, "/config.before-", now_unix_s, ".yaml");
    RELAY_RETURN_IF_ERROR(write_file_atomic(kept, *previous));
    std::printf("config differs from this run directory's previous start; that one is kept as %s\n",
                kept.c_str());
  }
  return write_file_atomic(run.config, resolved);
}

Status truncate_records_after(const std::string& path, int64_t rl_step) {
  StatusOr<std::string> text = read_file(path);
  if (!text.ok()) return OkStatus();
  std::string kept;
  int64_t dropped = 0;
  size_t begin = 0;
  while (begin < text->size()) {
    size_t end = text->find('\n', begin);
    if (end == std::string::npos) end = text->size();
    const std::string line = text->substr(begin, end - begin);
    begin = end + 1;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    const bool later =
        !j.is_object() || (j.value("phase", "") != "sft" && j.value("step", int64_t{0}) > rl_step);
    if (later) {
      ++dropped;
      continue;
    }
    kept += line;
    kept += '\n';
  }
  if (dropped == 0) return OkStatus();
  std::printf("%s: dropped %lld records after step %lld (they will be redone)\n", path.c_str(),
              static_cast<long long>(dropped), static_cast<long long>(rl_step));
  return write_file_atomic(path, kept);
}

StatusOr<ResumePoint> choose_resume_point(const RunLayout& run, bool require) {
  // A step directory missing a file (emptied, or cut short outside relay's
  // staged writes) is passed over for the one before it, out loud: the run
  // goes back further than its newest directory suggests.
  std::vector<std::string> skipped;
  RELAY_ASSIGN_OR_RETURN(std::optional<trainer::CheckpointInfo> latest,
                         trainer::latest_checkpoint(run.checkpoints, &skipped));
  if (require && !latest) {
    if (!skipped.empty()) {
      return FailedPreconditionError(absl::StrCat("--resume: ", run.checkpoints,
                                                  " holds no usable checkpoint; tried ",
                                                  absl::StrJoin(skipped, "; ")));
    }
    return FailedPreconditionError(
        absl::StrCat("--resume: ", run.checkpoints, " holds no checkpoint to resume from"));
  }
  ResumePoint p;
  p.checkpoint = std::move(latest);
  const std::string instead = p.checkpoint ? absl::StrCat("resuming from ", p.checkpoint->dir)
                                           : std::string("no complete checkpoint before it");
  for (const std::string& why : skipped) {
    p.warnings.push_back(absl::StrCat("skipping checkpoint ", why, "; ", instead));
  }
  return p;
}

StatusOr<ResumePoint> prepare_run_directory(const RunLayout& run, const std::string& resolved,
                                            bool require_resume) {
  std::error_code ec;
  std::filesystem::create_directories(run.dir, ec);
  if (ec) return InternalError(absl::StrCat("cannot create ", run.dir, ": ", ec.message()));
  const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  RELAY_RETURN_IF_ERROR(record_config(run, resolved, now));
  RELAY_ASSIGN_OR_RETURN(ResumePoint p, choose_resume_point(run, require_resume));
  for (const std::string& w : p.warnings) std::fprintf(stderr, "warning: %s\n", w.c_str());
  if (p.checkpoint) {
    for (const std::string& f : {run.metrics, run.samples}) {
      RELAY_RETURN_IF_ERROR(truncate_records_after(f, p.checkpoint->rl_step));
    }
  }
  return p;
}

}  // namespace relay::app
