#pragma once

// The trainer's side of asynchronous training (what `relay-trainer` runs
// between its gRPC services): wait until the store holds a step's worth of
// groups inside the staleness bound, take them, run Trainer::step, and
// publish the new version for the workers. Workers keep generating with the
// previous version meanwhile; the trainer never waits for them to apply it.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "relay/comm/service/submission.h"
#include "relay/comm/weight_sync/weight_publisher.h"
#include "relay/common/status.h"
#include "relay/store/rollout_store.h"
#include "relay/trainer/trainer.h"

namespace relay::comm {

struct TrainerHostOptions {
  int64_t groups_per_step = 1;
  // What a taken group must satisfy before it is trained on (the service's
  // checks on arrival, repeated for groups stored earlier); one that fails,
  // or that a step blames (Trainer::step_faults), is quarantined: REJECTED in
  // the store with its reason, logged, counted (store/rejected), and another
  // group takes its place.
  SubmissionLimits limits;
  int64_t max_staleness = 0;       // groups with tokens older than version - this expire
  int64_t group_wait_ms = 600000;  // no full batch in this long: DeadlineExceeded
  int compact_every = 10;          // store compaction every N steps; 0 = never
};

class TrainerHost {
 public:
  // The dependencies must outlive the host.
  TrainerHost(trainer::Trainer* trainer, store::RolloutStore* store, WeightPublisher* publisher,
              TrainerHostOptions options);

  // Publishes the trainer's current weights as its current version.
  Status publish_current();

  // One asynchronous step. Returns the step's metrics plus store/* ones
  // (seconds waited for groups, groups expired by the bound, groups
  // quarantined). No group stops it: see TrainerHostOptions::limits. Cancelled when
  // `stop` turns true while waiting (seen within 50 ms, at once when the
  // thread that set it calls RolloutStore::wake_waiters; it must be quick and
  // must not call the store); DeadlineExceeded after group_wait_ms. Groups
  // appended while it waits wake it at once. `workers_present`, when set, is
  // asked while waiting too, and its first error ends the wait
  // (TrainerService::check_workers_present: every worker is gone).
  StatusOr<trainer::StepMetrics> step(const std::function<bool()>& stop,
                                      const std::function<Status()>& workers_present = nullptr);

  // Compaction keeps every group consumed at `version` or later: the last
  // checkpoint's version, which a restart rewinds the store to.
  void set_compact_floor(int64_t version) { compact_floor_ = version; }

  // The published version (safe from any thread: what the services report).
  int64_t version() const { return version_.load(); }

  // The groups the last successful step() trained on (empty before one), for
  // showing what was sampled (comm/host/sample_records.h). Same thread as step().
  const std::vector<rollout::TrajectoryGroup>& last_groups() const { return last_groups_; }

 private:
  // Returns once `want` READY groups lie within `min_version` (`taken`
  // already held count in the messages); Cancelled when `stop` turns true,
  // workers_present's error, or DeadlineExceeded after `deadline`.
  Status wait_for_ready(int64_t want, int64_t taken, int64_t min_version,
                        std::chrono::steady_clock::time_point deadline,
                        const std::function<bool()>& stop,
                        const std::function<Status()>& workers_present) const;
  // The reason a taken group cannot be trained on, or OK.
  Status screen(const store::StoredGroup& g, int64_t version) const;
  // step()'s phases, over its state (defined in trainer_host.cc).
  struct StepState;
  Status fill(StepState& s, const std::function<bool()>& stop,
              const std::function<Status()>& workers_present);
  Status take(StepState& s, int64_t want);
  Status finish_step(StepState& s, std::vector<rollout::TrajectoryGroup> groups,
                     trainer::StepMetrics& m);
  StatusOr<bool> drop_blamed(StepState& s);
  Status quarantine(const store::StoredGroup& g, const std::string& reason, int64_t version);

  trainer::Trainer* trainer_;
  store::RolloutStore* store_;
  WeightPublisher* publisher_;
  std::optional<uint64_t> base_digest_;  // LoRA: the frozen base, hashed once
  double published_bytes_ = 0;           // the latest version's tensors
  TrainerHostOptions options_;
  std::atomic<int64_t> version_{-1};
  int64_t steps_ = 0;
  int64_t rejected_ = 0;  // groups this host quarantined
  int64_t compact_floor_ = INT64_MAX;
  std::vector<rollout::TrajectoryGroup> last_groups_;
};

}  // namespace relay::comm
