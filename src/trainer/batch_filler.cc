#include "relay/trainer/batch_filler.h"

#include <utility>

namespace relay::trainer {

bool has_learning_signal(const rollout::TrajectoryGroup& group) {
  // A group of one has no baseline to differ from, scored or not. In larger
  // groups an unscored (NaN) reward differs from everything, so the group is
  // kept and build_batch refuses it loudly instead of it vanishing here.
  if (group.trajectories.size() < 2) return false;
  for (const rollout::Trajectory& t : group.trajectories) {
    if (t.reward != group.trajectories.front().reward) return true;
  }
  return false;
}

BatchFiller::BatchFiller(BatchFillerOptions options) : options_(options) {}

void BatchFiller::add(std::vector<rollout::TrajectoryGroup> groups) {
  ++stats_.generated_batches;
  for (rollout::TrajectoryGroup& g : groups) {
    ++stats_.groups_seen;
    if (options_.drop_equal_reward_groups && !has_learning_signal(g)) {
      ++stats_.dropped_equal_reward;
      continue;
    }
    if (full()) {
      ++stats_.surplus;
      continue;
    }
    kept_.push_back(std::move(g));
  }
}

bool BatchFiller::full() const {
  return static_cast<int64_t>(kept_.size()) >= options_.groups_per_batch;
}

bool BatchFiller::wants_more() const {
  return !full() && stats_.generated_batches < 1 + options_.max_extra_batches;
}

std::vector<rollout::TrajectoryGroup> BatchFiller::take(BatchFillerStats* stats) {
  if (stats != nullptr) *stats = stats_;
  stats_ = BatchFillerStats{};
  std::vector<rollout::TrajectoryGroup> out = std::move(kept_);
  kept_.clear();
  return out;
}

}  // namespace relay::trainer
