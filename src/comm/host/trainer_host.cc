#include "relay/comm/host/trainer_host.h"

#include <algorithm>
#include <chrono>

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "relay/comm/service/submission.h"
#include "relay/model/core_share.h"
#include "relay/model/lora.h"
#include "relay/model/policy.h"

namespace relay::comm {

TrainerHost::TrainerHost(trainer::Trainer* trainer, store::RolloutStore* store,
                         WeightPublisher* publisher, TrainerHostOptions options)
    : trainer_(trainer), store_(store), publisher_(publisher), options_(options) {}

Status TrainerHost::publish_current() {
  // Every parameter, or with LoRA the adapters alone (model::published_weights).
  RELAY_ASSIGN_OR_RETURN(auto weights,
                         model::published_weights(*trainer_->policy(), &base_digest_));
  RELAY_RETURN_IF_ERROR(publisher_->publish(trainer_->version(), weights));
  published_bytes_ = 0;
  for (const auto& [name, t] : weights) {
    published_bytes_ += static_cast<double>(t.numel() * t.element_size());
  }
  version_ = trainer_->version();
  return OkStatus();
}

Status TrainerHost::quarantine(const store::StoredGroup& g, const std::string& reason,
                               int64_t version) {
  RELAY_RETURN_IF_ERROR(store_->reject(g.seq, reason, version));
  ++rejected_;
  spdlog::warn("trainer at version {}: group '{}' (store seq {}) quarantined: {}", version,
               g.group.group_id, g.seq, reason);
  return OkStatus();
}

Status TrainerHost::screen(const store::StoredGroup& g, int64_t version) const {
  // What the service checks on arrival, again: a group stored before these
  // checks existed (or by another build) must not stop the trainer.
  SubmissionContext c;
  c.k = 0;  // the lease's k was checked on arrival
  c.trainer_version = version;
  c.oldest_version = 0;  // the staleness bound is the store's business
  return validate_submission(g.group, c, options_.limits);
}

Status TrainerHost::wait_for_ready(int64_t want, int64_t taken, int64_t min_version,
                                   std::chrono::steady_clock::time_point deadline,
                                   const std::function<bool()>& stop,
                                   const std::function<Status()>& workers_present) const {
  // New groups wake the wait at once (the store's ReadyCounts). `stop` and
  // `workers_present` have no event to wake it: the stop flag is set by a
  // signal handler, which may not touch a condition variable, and workers go
  // missing by the clock. They are looked at every kRecheck.
  constexpr auto kRecheck = std::chrono::milliseconds(50);
  const int64_t v = trainer_->version();
  for (;;) {
    const int64_t ready = store_->count_ready(min_version);
    if (ready >= want) return OkStatus();
    const int64_t have = ready + taken;
    if (stop && stop()) return CancelledError("trainer: stopped while waiting for groups");
    if (workers_present) {
      if (Status st = workers_present(); !st.ok()) {
        return Status(st.code(),
                      absl::StrCat("trainer at version ", v, " (", have, " of ",
                                   options_.groups_per_step, " groups ready): ", st.message()));
      }
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      return DeadlineExceededError(absl::StrCat(
          "trainer at version ", v, ": ", have, " of ", options_.groups_per_step,
          " groups ready after ", options_.group_wait_ms, " ms; are the rollout workers running?"));
    }
    store_->wait_for_ready(want, min_version, std::min(deadline, now + kRecheck), stop);
  }
}

// One step()'s state across its rounds of filling the batch and training.
struct TrainerHost::StepState {
  int64_t version = 0;      // the trainer's when the step began
  int64_t min_version = 0;  // the oldest token version the batch may hold
  std::chrono::steady_clock::time_point start, deadline;
  int64_t expired = 0;          // groups the store dropped as stale during the step
  int64_t rejected_before = 0;  // rejected_ when the step began
  // Seconds spent filling the batch and in Trainer::step, over every round:
  // store/wait_s must not count the training (it used to, and a run whose
  // trainer was the bottleneck read as one waiting for its workers).
  double wait_s = 0, train_s = 0;
  std::vector<store::StoredGroup> taken;
};

namespace {
double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
}  // namespace

// Fills the batch: waits for enough READY groups, takes them, quarantines the
// ones no step could train on, and takes more in their place.
Status TrainerHost::fill(StepState& s, const std::function<bool()>& stop,
                         const std::function<Status()>& workers_present) {
  const auto began = std::chrono::steady_clock::now();
  // The workers decode on the machine's cores meanwhile (core_share.h).
  const model::CoresWaiting waiting;
  while (static_cast<int64_t>(s.taken.size()) < options_.groups_per_step) {
    const int64_t want = options_.groups_per_step - static_cast<int64_t>(s.taken.size());
    RELAY_RETURN_IF_ERROR(wait_for_ready(want, static_cast<int64_t>(s.taken.size()), s.min_version,
                                         s.deadline, stop, workers_present));
    RELAY_RETURN_IF_ERROR(take(s, want));
  }
  s.wait_s += seconds_since(began);
  return OkStatus();
}

Status TrainerHost::take(StepState& s, int64_t want) {
  int64_t expired_take = 0;
  const uint64_t rejected_in_store = store_->rejected_total();
  RELAY_ASSIGN_OR_RETURN(std::vector<store::StoredGroup> got,
                         store_->take_ready(want, s.min_version, s.version, &expired_take));
  s.expired += expired_take;
  if (const uint64_t n = store_->rejected_total() - rejected_in_store; n > 0) {
    rejected_ += static_cast<int64_t>(n);
    spdlog::warn(
        "trainer at version {}: {} stored group(s) failed their checks on the way out and "
        "were quarantined (relay store inspect lists them)",
        s.version, n);
  }
  for (store::StoredGroup& g : got) {
    if (Status st = screen(g, s.version); !st.ok()) {
      RELAY_RETURN_IF_ERROR(quarantine(g, std::string(st.message()), s.version));
      continue;
    }
    s.taken.push_back(std::move(g));
  }
  return OkStatus();
}

// After a successful Trainer::step: the store's metrics, the new version out
// to the workers, and every compact_every steps a store compaction.
Status TrainerHost::finish_step(StepState& s, std::vector<rollout::TrajectoryGroup> groups,
                                trainer::StepMetrics& m) {
  double wait_versions = 0;
  for (const store::StoredGroup& g : s.taken) {
    wait_versions += static_cast<double>(s.version - g.arrival_version);
  }
  m.insert_or_assign("store/wait_s", s.wait_s);
  m.insert_or_assign("time/train_s", s.train_s);
  // With a core share (relay run's default), the threads the step trained on
  // last: the machine's cores when the workers were waiting.
  if (const int threads = model::core_share_threads(); threads > 0) {
    m.insert_or_assign("time/train_threads", static_cast<double>(threads));
  }
  m.insert_or_assign("store/expired", static_cast<double>(s.expired));
  m.insert_or_assign("store/rejected", static_cast<double>(rejected_ - s.rejected_before));
  m.insert_or_assign("store/rejected_total", static_cast<double>(store_->rejected_total()));
  m.insert_or_assign("store/wait_versions_mean",
                     s.taken.empty() ? 0.0 : wait_versions / static_cast<double>(s.taken.size()));
  RELAY_RETURN_IF_ERROR(publish_current());
  // What each worker receives of the new version (with LoRA, the adapters).
  m.insert_or_assign("weights/version_mb", published_bytes_ / (1 << 20));
  last_groups_ = std::move(groups);
  ++steps_;
  if (options_.compact_every > 0 && steps_ % options_.compact_every == 0) {
    RELAY_ASSIGN_OR_RETURN(int64_t compacted, store_->compact(trainer_->version(), compact_floor_));
    m.insert_or_assign("store/compacted", static_cast<double>(compacted));
  }
  return OkStatus();
}

// A step that blames groups changed nothing: quarantine them, so that the next
// round takes others in their place. False when there is nothing to retry:
// no blame (the failure is the trainer's, not the data's), a version that
// moved anyway, or blame on a group the step was not given.
StatusOr<bool> TrainerHost::drop_blamed(StepState& s) {
  const std::vector<trainer::Trainer::StepFault>& faults = trainer_->step_faults();
  if (faults.empty() || trainer_->version() != s.version) return false;
  const size_t before = s.taken.size();
  for (const trainer::Trainer::StepFault& f : faults) {
    for (auto it = s.taken.begin(); it != s.taken.end();) {
      if (it->group.group_id != f.group_id) {
        ++it;
        continue;
      }
      RELAY_RETURN_IF_ERROR(quarantine(*it, f.reason, s.version));
      it = s.taken.erase(it);
    }
  }
  return s.taken.size() != before;
}

StatusOr<trainer::StepMetrics> TrainerHost::step(const std::function<bool()>& stop,
                                                 const std::function<Status()>& workers_present) {
  StepState s;
  s.version = trainer_->version();
  s.min_version = s.version - options_.max_staleness;
  s.start = std::chrono::steady_clock::now();
  s.deadline = s.start + std::chrono::milliseconds(options_.group_wait_ms);
  // Groups that fell out of the bound when the version moved give their
  // place back now; new submissions are checked against the bound on arrival.
  RELAY_ASSIGN_OR_RETURN(s.expired, store_->expire_stale(s.min_version, s.version));
  s.rejected_before = rejected_;
  for (;;) {
    RELAY_RETURN_IF_ERROR(fill(s, stop, workers_present));
    std::vector<rollout::TrajectoryGroup> groups;
    for (const store::StoredGroup& g : s.taken) groups.push_back(g.group);
    const auto trained = std::chrono::steady_clock::now();
    StatusOr<trainer::StepMetrics> m = trainer_->step(groups);
    s.train_s += seconds_since(trained);
    if (m.ok()) {
      RELAY_RETURN_IF_ERROR(finish_step(s, std::move(groups), *m));
      return m;
    }
    RELAY_ASSIGN_OR_RETURN(const bool retry, drop_blamed(s));
    if (!retry) return m.status();
  }
}

}  // namespace relay::comm
