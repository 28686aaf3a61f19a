#pragma once

// relay-trainer's run on rank 0, in parts (src/app/trainer_run.cc puts them
// together): what the parts share, the checkpointer, and resume-or-start.

#include <functional>
#include <memory>
#include <optional>

#include "relay/app/evaluation.h"
#include "relay/app/run_directory.h"
#include "relay/app/setup.h"
#include "relay/app/training_loop.h"
#include "relay/comm/dist/trainer_ranks.h"
#include "relay/comm/host/metrics_endpoint.h"
#include "relay/common/metrics.h"
#include "relay/store/rollout_store.h"
#include "relay/trainer/options.h"
#include "relay/trainer/run_checkpoint.h"

namespace relay::app::internal {

// What rank 0's run holds from its setup to its end.
struct TrainerContext {
  RolloutSetup s;
  trainer::TrainerOptions options;
  RunLayout run;
  PromptSplit split;
  model::SaveOptions save_options;
  std::unique_ptr<comm::RankLeader> leader;  // null: a single rank
  int64_t bucket_bytes = 0;                  // the ranks' all-reduce buckets
  std::unique_ptr<rollout::SafeVerifier> verifier;
  FanOutMetricsSink metrics;
  std::unique_ptr<comm::MetricsEndpoint> endpoint;  // null: no services.http_listen
  std::unique_ptr<Evaluator> evaluator;
  // Opens first: a checkpoint records where it stood, and a resumed run
  // puts it back there.
  std::unique_ptr<store::RolloutStore> store;

  trainer::DataParallel data_parallel() const {
    return leader ? leader->data_parallel(bucket_bytes) : trainer::DataParallel{};
  }
};

// Checkpoints of the run: the trainer, the store's position now and the
// eval accuracy of the step when it was evaluated.
class RunCheckpointer : public Checkpointer {
 public:
  RunCheckpointer(TrainerContext* c, int64_t rl_start_version)
      : c_(c), rl_start_version_(rl_start_version) {}
  Status write(const trainer::Trainer& trainer, int64_t rl_step,
               std::optional<double> eval_accuracy) override;
  // Told each written checkpoint's version (compaction must keep what a
  // rewind to it needs).
  void on_written(std::function<void(int64_t)> f) { on_written_ = std::move(f); }

 private:
  TrainerContext* c_;
  int64_t rl_start_version_;
  std::function<void(int64_t)> on_written_;
};

struct Started {
  std::unique_ptr<trainer::Trainer> trainer;
  int64_t rl_start_version = 0;  // the version RL started from (after the warm start)
  LoopState state;
};
// From `checkpoint` (the trainer, the other ranks and the store put back
// where they stood), or fresh: evaluation, warm start, the RL trainer and
// checkpoint zero, so that a restart never repeats the warm start.
StatusOr<Started> resume_or_start(TrainerContext& c,
                                  const std::optional<trainer::CheckpointInfo>& checkpoint);

}  // namespace relay::app::internal
