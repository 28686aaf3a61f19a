#pragma once

// Resumable run checkpoints: <root>/v<version>/ holds the policy in HF layout
// (model/checkpoint.h), the trainer's state (Trainer::save_state) and
// checkpoint.json (version, RL step, when). A checkpoint directory appears
// whole or not at all (one staged rename), so the newest directory is always
// loadable after a crash.

#include <cstdint>
#include <optional>
#include <string>

#include "relay/common/status.h"
#include "relay/model/checkpoint.h"
#include "relay/trainer/trainer.h"

namespace relay::trainer {

inline constexpr char kTrainerStateFile[] = "trainer_state.pt";
inline constexpr char kCheckpointInfoFile[] = "checkpoint.json";

struct CheckpointInfo {
  std::string dir;
  int64_t version = 0;           // the trainer's version when it was written
  int64_t rl_step = 0;           // RL steps done (warm-start steps are not counted)
  int64_t rl_start_version = 0;  // version RL started from (after the warm start)
};

// Writes `trainer`'s policy and state as <root>/v<version>/ (replacing one
// of the same version), then deletes all but the newest `keep` checkpoints.
// `save_options.extra_files` (e.g. the tokenizer) go into the same directory.
StatusOr<CheckpointInfo> write_checkpoint(const std::string& root, const Trainer& trainer,
                                          int64_t rl_step, int64_t rl_start_version,
                                          model::SaveOptions save_options, int keep);

// The newest complete checkpoint under `root`, or nullopt when there is none
// (or `root` does not exist). DataLoss naming the file when the newest one's
// checkpoint.json does not parse.
StatusOr<std::optional<CheckpointInfo>> latest_checkpoint(const std::string& root);

// Reads the trainer state file of `info` into `trainer` (built over the
// policy loaded from info.dir).
Status restore_checkpoint(const CheckpointInfo& info, Trainer& trainer);

}  // namespace relay::trainer
