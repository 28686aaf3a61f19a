#pragma once

// A run directory (docs/services.md): what a run leaves behind and what a
// restart on the same directory reads back.
//   config.yaml           the resolved config of the latest start
//   config.before-<t>.yaml  a previous start's, when the config changed
//   metrics.jsonl         one record per RL step, evaluation, warm-start step
//   samples.jsonl         a few responses of every RL step (the dashboard's)
//   tensorboard/          TensorBoard event files of the same records
//   checkpoints/          step_NNNNNN/ (trainer/run_checkpoint.h), reference/
//   store/                the rollout store
// Preparing one for a start: the config is recorded, the newest usable
// checkpoint chosen, and the records after its step dropped, since a resumed
// run does those steps again.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "relay/common/status.h"
#include "relay/trainer/run_checkpoint.h"

namespace relay::app {

struct RunLayout {
  std::string dir;
  std::string config;       // <dir>/config.yaml
  std::string metrics;      // <dir>/metrics.jsonl, or --metrics-out
  std::string samples;      // <dir>/samples.jsonl
  std::string tensorboard;  // <dir>/tensorboard
  std::string checkpoints;  // <dir>/checkpoints
  std::string reference;    // <dir>/checkpoints/reference: the KL reference RL started from
  std::string store;        // <dir>/store, or --store
};
// The default layout of `dir`; empty `metrics` or `store` take their defaults.
RunLayout run_layout(const std::string& dir, const std::string& metrics = "",
                     const std::string& store = "");

// Writes `resolved` (the config as YAML) as config.yaml. When the previous
// start's config.yaml differs, it is kept as config.before-<now_unix_s>.yaml
// (and a line says so), so the history of what a run was trained with is
// not lost.
Status record_config(const RunLayout& run, const std::string& resolved, int64_t now_unix_s);

// Drops the records of RL steps after `rl_step` (and their evaluations)
// from a metrics.jsonl or samples.jsonl, saying how many: a run resumed
// from the checkpoint of step `rl_step` does those steps again, and each
// step should appear once. Warm-start records stay; a torn last line (the
// process died mid-write) goes too. Rewritten atomically; a missing file
// is fine.
Status truncate_records_after(const std::string& path, int64_t rl_step);

// Where a start goes on from.
struct ResumePoint {
  // The newest complete checkpoint; nullopt = a fresh start.
  std::optional<trainer::CheckpointInfo> checkpoint;
  // One line per newer step directory passed over (it lacks a file), saying
  // what is done instead: "skipping checkpoint <why>; resuming from <dir>".
  std::vector<std::string> warnings;
};
// The newest usable checkpoint under run.checkpoints. With `require` (the
// --resume flag), having none is FailedPrecondition naming the directory
// (and every directory tried).
StatusOr<ResumePoint> choose_resume_point(const RunLayout& run, bool require);

// A start on `run`: creates the directory, records the config, chooses the
// resume point (its warnings printed on stderr) and truncates metrics and
// samples after its step.
StatusOr<ResumePoint> prepare_run_directory(const RunLayout& run, const std::string& resolved,
                                            bool require_resume);

}  // namespace relay::app
