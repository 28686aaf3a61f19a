#pragma once

// Resumable run checkpoints. <root>/step_<NNNNNN>/ (the RL step, zero-padded
// to six digits) is an HF-layout model directory (config.json, safetensors,
// the tokenizer files), so other tools load it as is, plus relay's own:
//   trainer_state.pt      Trainer::save_state_to_file(): AdamW moments, step
//                         count, fp32 masters, adaptive coefficients (streamed
//                         to the file, and back, never held whole in memory)
//   checkpoint.json       version, RL step, the version RL started from, the
//                         run seed, eval accuracy at this step (if evaluated),
//                         and the rollout store's position
//   dispenser_state.bin   the prompt dispenser's cursor and leases then
//   critic/               PPO's value model (advantage.estimator gae), a
//                         directory transformers loads as a token classifier
// A checkpoint directory appears whole or not at all (one staged rename), so
// the newest one is always loadable after a crash. Retention keeps the
// newest `keep_last` and, with keep_best, the best-by-eval one, which
// <root>/best (a symlink) names.
//
// There is no sampler RNG state to save: every random draw is a pure function
// of run.seed and a counter (a prompt's sampling seed of its position in
// the prompt stream, clip_cov's selection of the step), so the dispenser's
// cursor and the trainer's step are the RNG state.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "relay/common/status.h"
#include "relay/model/checkpoint.h"
#include "relay/trainer/trainer.h"

namespace relay::trainer {

inline constexpr char kTrainerStateFile[] = "trainer_state.pt";
inline constexpr char kCheckpointInfoFile[] = "checkpoint.json";
inline constexpr char kDispenserStateFile[] = "dispenser_state.bin";
inline constexpr char kBestCheckpointLink[] = "best";
inline constexpr char kCriticDir[] = "critic";

struct CheckpointInfo {
  std::string dir;                      // set by write_checkpoint / the readers
  int64_t version = 0;                  // the trainer's version when it was written
  int64_t rl_step = 0;                  // RL steps done (warm-start steps are not counted)
  int64_t rl_start_version = 0;         // version RL started from (after the warm start)
  uint64_t seed = 0;                    // run.seed of the run that wrote it
  std::optional<double> eval_accuracy;  // held-out greedy accuracy at this step
  // The rollout store then (store::StorePosition): 0 = not recorded (a
  // checkpoint written before the store was opened, i.e. an empty store).
  uint64_t store_next_seq = 0;
  std::string dispenser_state;  // opaque; empty = none yet
};

struct CheckpointRetention {
  int keep_last = 2;      // newest checkpoints kept, >= 1
  bool keep_best = true;  // also the one with the highest eval_accuracy
};

// "step_000100" for step 100.
std::string checkpoint_dir_name(int64_t rl_step);

// Writes `trainer`'s policy and state as <root>/step_<rl_step>/ (replacing
// one of the same step) with `meta`'s fields (dir and version are taken from
// where it goes and the trainer), then applies `retention` and points
// <root>/best at the best-by-eval checkpoint. `save_options.extra_files`
// (the tokenizer files) go into the same directory.
StatusOr<CheckpointInfo> write_checkpoint(const std::string& root, const Trainer& trainer,
                                          CheckpointInfo meta, model::SaveOptions save_options,
                                          const CheckpointRetention& retention);

// The checkpoint in `dir` (its checkpoint.json and dispenser state).
// DataLoss naming the file when one does not parse or lacks a field.
StatusOr<CheckpointInfo> read_checkpoint(const std::string& dir);

// The newest complete checkpoint under `root`, or nullopt when there is none
// (or `root` does not exist). Complete: it has every file a resume reads
// (checkpoint.json, trainer_state.pt, dispenser_state.bin, config.json and
// the weights). Newer step directories that lack one are passed over; with
// `skipped`, each gets a line there, newest first, naming the directory and
// the missing file ("<dir>: no trainer_state.pt"), so a caller can say why
// it did not resume from them. A file that is present but does not parse is
// an error (DataLoss naming it), not a reason to pass over.
StatusOr<std::optional<CheckpointInfo>> latest_checkpoint(
    const std::string& root, std::vector<std::string>* skipped = nullptr);

// The checkpoint with the highest eval accuracy under `root` (the earliest
// of equals), or nullopt when none was evaluated.
StatusOr<std::optional<CheckpointInfo>> best_checkpoint(const std::string& root);

// Reads the trainer state file of `info` into `trainer` (built over the
// policy loaded from info.dir), streamed from the file
// (Trainer::restore_state_from_file).
Status restore_checkpoint(const CheckpointInfo& info, Trainer& trainer);

}  // namespace relay::trainer
