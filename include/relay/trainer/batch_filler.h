#pragma once

// DAPO dynamic sampling at the batch level (arXiv 2503.14476): groups whose
// rewards are all equal carry no GRPO signal, so the driver keeps generating
// until a step has `groups_per_batch` groups with signal, up to a bounded
// number of extra generation batches. No LibTorch: it works on scored groups.

#include <cstdint>
#include <vector>

#include "relay/rollout/trajectory.h"

namespace relay::trainer {

// True when the group's rewards are not all equal. A group of one never has
// a signal; an unscored (NaN) reward in a larger group counts as differing, so
// the group reaches build_batch, which reports it.
bool has_learning_signal(const rollout::TrajectoryGroup& group);

struct BatchFillerOptions {
  int64_t groups_per_batch = 1;           // >= 1
  bool drop_equal_reward_groups = false;  // off: every group counts
  int max_extra_batches = 0;              // generation batches beyond the first
};

struct BatchFillerStats {
  int64_t generated_batches = 0;  // add() calls for the current batch
  int64_t groups_seen = 0;
  int64_t dropped_equal_reward = 0;
  int64_t surplus = 0;  // kept groups beyond groups_per_batch, discarded
};

// One step's worth of groups. Not thread-safe.
class BatchFiller {
 public:
  explicit BatchFiller(BatchFillerOptions options);

  // One generation batch of scored groups.
  void add(std::vector<rollout::TrajectoryGroup> groups);
  bool full() const;
  // Another generation batch is worth running: not full and the budget of
  // extra batches is not spent.
  bool wants_more() const;
  // The collected groups (at most groups_per_batch; fewer when the budget ran
  // out) and the counts; resets for the next step.
  std::vector<rollout::TrajectoryGroup> take(BatchFillerStats* stats = nullptr);

 private:
  BatchFillerOptions options_;
  BatchFillerStats stats_;
  std::vector<rollout::TrajectoryGroup> kept_;
};

}  // namespace relay::trainer
