#pragma once

// Groups generated in the trainer's own process (`relay train-local`): the
// rollout engine samples the training prompts with its own copy of the
// weights, the verifier scores them, and after each step the engine takes
// the trainer's new weights, as a worker would.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "relay/app/setup.h"
#include "relay/app/training_loop.h"
#include "relay/rollout/engine.h"
#include "relay/trainer/batch_filler.h"

namespace relay::app {

struct InProcessSourceOptions {
  int64_t groups_per_step = 8;  // task prompts per step (rollout.n samples each)
  // DAPO dynamic sampling: groups whose rewards are all equal are dropped,
  // and up to max_extra_batches more generation batches refill the step.
  bool drop_equal_reward_groups = false;
  int64_t max_extra_batches = 0;
};

// " k=v" for each of `keys` that `m` holds (%.4g): train-local's lines.
std::string format_metrics(const trainer::StepMetrics& m, const std::vector<std::string>& keys);

class InProcessGroupSource : public GroupSource {
 public:
  // `s` and `verifier` must outlive the source; the engine starts from
  // `trainer`'s weights and version. With trainer.distill the source loads
  // the teacher (load_teacher) and scores every sample with it.
  static StatusOr<std::unique_ptr<InProcessGroupSource>> create(
      const RolloutSetup& s, const PromptSplit& split, rollout::SafeVerifier* verifier,
      const trainer::Trainer& trainer, const InProcessSourceOptions& options);

  // Prints one line per step: its main metrics, or that it was skipped
  // because no generation batch held a group with a learning signal.
  StatusOr<std::optional<trainer::StepMetrics>> train_step(trainer::Trainer& trainer,
                                                           int64_t rl_step) override;
  const std::vector<rollout::TrajectoryGroup>& last_groups() const override { return last_; }

 private:
  InProcessGroupSource(const RolloutSetup& s, const PromptSplit& split,
                       rollout::SafeVerifier* verifier, std::unique_ptr<rollout::Engine> engine,
                       std::unique_ptr<rollout::Teacher> teacher,
                       const InProcessSourceOptions& options);
  // One generation batch: groups_per_step prompts, sampled and scored.
  StatusOr<std::vector<rollout::TrajectoryGroup>> generate_batch();

  const RolloutSetup& s_;
  PromptSplit split_;
  rollout::SafeVerifier* verifier_;
  std::unique_ptr<rollout::Engine> engine_;
  std::unique_ptr<rollout::Teacher> teacher_;  // null without trainer.distill
  std::optional<uint64_t> base_digest_;        // LoRA: the frozen base, hashed once
  InProcessSourceOptions options_;
  trainer::BatchFiller filler_;
  // task.environment's driver (null without one); after engine_, so it goes
  // first.
  std::unique_ptr<rollout::EpisodeDriver> episodes_;
  int64_t generated_ = 0;  // generation batches so far: prompts and seeds move on
  std::vector<rollout::TrajectoryGroup> last_;
};

}  // namespace relay::app
