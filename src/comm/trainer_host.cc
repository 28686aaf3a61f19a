#include "relay/comm/trainer_host.h"

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "relay/model/policy.h"

namespace relay::comm {

TrainerHost::TrainerHost(trainer::Trainer* trainer, store::RolloutStore* store,
                         WeightPublisher* publisher, TrainerHostOptions options)
    : trainer_(trainer), store_(store), publisher_(publisher), options_(options) {}

Status TrainerHost::publish_current() {
  RELAY_RETURN_IF_ERROR(
      publisher_->publish(trainer_->version(), model::parameter_tensors(*trainer_->policy())));
  version_ = trainer_->version();
  return OkStatus();
}

StatusOr<trainer::StepMetrics> TrainerHost::step(const std::function<bool()>& stop,
                                                 const std::function<Status()>& workers_present) {
  const int64_t v = trainer_->version();
  const int64_t min_version = v - options_.max_staleness;
  const auto t0 = std::chrono::steady_clock::now();
  const auto deadline = t0 + std::chrono::milliseconds(options_.group_wait_ms);
  // Groups that fell out of the bound when the version moved give their
  // place back now; new submissions are checked against the bound on arrival.
  RELAY_ASSIGN_OR_RETURN(int64_t expired_now, store_->expire_stale(min_version, v));
  for (;;) {
    RELAY_ASSIGN_OR_RETURN(int64_t ready, store_->count_ready(min_version));
    if (ready >= options_.groups_per_step) break;
    if (stop && stop()) return CancelledError("trainer: stopped while waiting for groups");
    if (workers_present) {
      if (Status st = workers_present(); !st.ok()) {
        return Status(st.code(),
                      absl::StrCat("trainer at version ", v, " (", ready, " of ",
                                   options_.groups_per_step, " groups ready): ", st.message()));
      }
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return DeadlineExceededError(absl::StrCat(
          "trainer at version ", v, ": ", ready, " of ", options_.groups_per_step,
          " groups ready after ", options_.group_wait_ms, " ms; are the rollout workers running?"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(options_.poll_ms));
  }
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int64_t expired = 0;
  RELAY_ASSIGN_OR_RETURN(std::vector<store::StoredGroup> taken,
                         store_->take_ready(options_.groups_per_step, min_version, v, &expired));
  std::vector<rollout::TrajectoryGroup> groups;
  double wait_versions = 0;
  for (store::StoredGroup& g : taken) {
    wait_versions += static_cast<double>(v - g.arrival_version);
    groups.push_back(std::move(g.group));
  }
  RELAY_ASSIGN_OR_RETURN(trainer::StepMetrics m, trainer_->step(groups));
  m["store/wait_s"] = waited;
  m["store/expired"] = static_cast<double>(expired + expired_now);
  m["store/wait_versions_mean"] = taken.empty() ? 0.0 : wait_versions / taken.size();
  RELAY_RETURN_IF_ERROR(publish_current());
  last_groups_ = std::move(groups);
  ++steps_;
  if (options_.compact_every > 0 && steps_ % options_.compact_every == 0) {
    RELAY_ASSIGN_OR_RETURN(int64_t compacted, store_->compact(trainer_->version(), compact_floor_));
    m["store/compacted"] = static_cast<double>(compacted);
  }
  return m;
}

}  // namespace relay::comm
