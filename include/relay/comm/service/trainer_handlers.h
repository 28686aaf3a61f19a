#pragma once

// What the trainer answers to each worker and admin call
// (proto/relay/v1/worker.proto, admin.proto), free of gRPC: registration and
// heartbeats, prompt leases from the dispenser, groups validated and made
// durable in the store before they are acknowledged, and the run's stats.
// Requests and answers are the proto messages (plain data, no gRPC types);
// errors are Status values whose code and message the gRPC adapter
// (comm/service/trainer_service.h) sends unchanged. Tests call it directly.
// Thread-safe: gRPC calls it from many threads at once.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "relay/comm/service/submission.h"
#include "relay/comm/service/worker_presence.h"
#include "relay/comm/weight_sync/weight_publisher.h"
#include "relay/common/status.h"
#include "relay/store/dispenser.h"
#include "relay/store/rollout_store.h"

namespace relay::v1 {
class RegisterWorkerRequest;
class RegisterWorkerResponse;
class HeartbeatRequest;
class HeartbeatResponse;
class LeasePromptsRequest;
class LeasePromptsResponse;
class ReleaseLeasesRequest;
class ReleaseLeasesResponse;
class SubmitGroupRequest;
class SubmitGroupAck;
class HealthResponse;
class StatsResponse;
}  // namespace relay::v1

namespace relay::comm {

// What a leased prompt carries: the caller maps a lease (prompt index, its
// occurrence in the prompt stream, attempt) to a group id, tokens and a
// sampling seed. It must be a pure function of the lease's prompt_index,
// occurrence and attempt: submissions are checked against it again.
// relay-trainer derives the group id and seed from the occurrence, so every
// epoch of a finite task gets its own, and a re-leased prompt samples what it
// would have the first time.
struct PromptContent {
  std::string group_id;
  std::vector<int64_t> prompt_tokens;
  std::vector<int64_t> target_tokens;  // empty = no prefix guidance
  uint64_t seed = 0;
};
using PromptSource = std::function<StatusOr<PromptContent>(const store::Lease& lease)>;

struct TrainerServiceOptions {
  std::string auth_token;  // empty = no check; else "authorization: Bearer <token>"
  int64_t heartbeat_interval_ms = 2000;
  // A worker not heard from (any call) for this long is taken for dead: it
  // is forgotten (its next call is told to register again) and its leases
  // go back to the queue at once instead of holding the staleness bound
  // until their deadlines. 0 = never.
  int64_t worker_timeout_ms = 30000;
  std::string weight_sync_endpoint;  // empty = workers fetch weights
  bool greedy_baseline = false;      // ReMax: leases ask for a greedy sample
  // rollout.agent: agents choose what an episode starts from (a system
  // prompt, their tools), so a group need not carry the leased prompt, only
  // the leased group id and one prompt shared by its trajectories.
  bool agent_prompts = false;
  int64_t max_staleness = 0;  // submissions older than version - this are refused
  SubmissionLimits limits;
  // FetchWeights' chunk when the worker names none. Small enough that each
  // chunk's copies (message, serialization, parse, assembly) stay in cache:
  // 256 KiB fetched a 400 MB version 1.3-1.6x as fast as 4 MiB here
  // (weight_sync_bench --fetch-chunk-kb).
  uint64_t default_chunk_bytes = 256 << 10;
  // How often a version stream checks for cancellation: gRPC's synchronous
  // API has no event for it.
  int64_t watch_poll_ms = 200;
  // The clock workers are timed by (Unix ms); null = the system clock. Tests
  // pass a fake one, so that "silent for worker_timeout_ms" is not a race.
  std::function<int64_t()> now_ms;
};

struct WorkerInfo {
  std::string worker_id;
  std::string worker_name;
  std::string device;
  int32_t num_slots = 0;
  bool weight_sync_group = false;
  int64_t running_version = -1;
  uint64_t running_digest = 0;
  int32_t in_flight = 0;
  int64_t last_heartbeat_unix_ms = 0;  // last call of any kind from this worker
};

class TrainerHandlers {
 public:
  // The dependencies must outlive the handlers. `version` returns the
  // trainer's current policy version.
  TrainerHandlers(TrainerServiceOptions options, store::RolloutStore* store,
                  store::PromptDispenser* dispenser, WeightPublisher* publisher,
                  PromptSource prompts, std::function<int64_t()> version);

  // ---- Worker calls. After finish(), Heartbeat and LeasePrompts answer
  // OutOfRange "the run is finished".
  StatusOr<v1::RegisterWorkerResponse> register_worker(const v1::RegisterWorkerRequest& req);
  // An unknown worker (forgotten, or the trainer restarted) is told to
  // register again (reregister), not refused.
  StatusOr<v1::HeartbeatResponse> heartbeat(const v1::HeartbeatRequest& req);
  // No leases (the staleness bound says wait) is an answer, not an error:
  // wait_for_version says which version to ask again at.
  StatusOr<v1::LeasePromptsResponse> lease_prompts(const v1::LeasePromptsRequest& req);
  StatusOr<v1::ReleaseLeasesResponse> release_leases(const v1::ReleaseLeasesRequest& req);
  // One group of a SubmitGroups stream: accepted with its store sequence, or
  // refused with the reason's status code and message.
  v1::SubmitGroupAck submit_group(const v1::SubmitGroupRequest& req);
  // submit_group in two halves, for a stream with several groups in flight:
  // begin_submit_group checks the group and queues its durable write
  // (store::PromptDispenser::begin_submit); finish_submit_group returns its
  // ack once the write is durable (invariant 7) or failed. Groups begun
  // before the first finish share one WAL fsync.
  struct PendingSubmit {
    uint64_t lease_id = 0;
    Status refused;  // begin's refusal; then there is no submission
    std::unique_ptr<store::PromptDispenser::Submission> submission;
  };
  PendingSubmit begin_submit_group(const v1::SubmitGroupRequest& req);
  v1::SubmitGroupAck finish_submit_group(PendingSubmit& pending);
  // Marks a registered worker alive (a weight download in progress);
  // nothing for an unknown id.
  void touch(const std::string& worker_id);

  // ---- Admin calls.
  v1::HealthResponse health() const;
  StatusOr<v1::StatsResponse> stats() const;

  // ---- The trainer's side.
  // The run is over: workers are told so on their next call, which they take
  // as their cue to exit instead of waiting for the trainer to come back.
  void finish() { finished_ = true; }
  // After finish(): whether every registered worker has been told (made a
  // call since), or has been silent for two heartbeat intervals (probably
  // gone: not waited for).
  bool all_workers_told() const;
  // After finish(): waits until all_workers_told() or `timeout` passes, and
  // says which. The trainer calls it before it stops serving. Woken by each
  // worker told; a worker falling silent is noticed at the next look, a
  // heartbeat interval later at most.
  bool wait_for_workers_told(std::chrono::milliseconds timeout) const;
  // Forgets workers silent for options.worker_timeout_ms and releases their
  // leases; how many workers. Called on every LeasePrompts and Heartbeat.
  int reap_silent_workers();
  // Registrations and the latest call of any registered worker.
  WorkerPresence presence() const;
  // check_worker_presence() now, with options.worker_timeout_ms.
  Status check_workers_present() const;
  std::vector<WorkerInfo> workers() const;

  const TrainerServiceOptions& options() const { return options_; }
  WeightPublisher* publisher() const { return publisher_; }

 private:
  Status finished(const std::string& worker_id);
  bool all_told_locked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Status known(const std::string& worker_id);
  // Checks `req` and begins its submission into `p` (begin_submit_group).
  Status begin_accept(const v1::SubmitGroupRequest& req, PendingSubmit& p);
  Status check_leased(const store::Lease& lease, const rollout::TrajectoryGroup& group) const;
  Status release(uint64_t lease_id, const Status& why);

  TrainerServiceOptions options_;
  store::RolloutStore* store_;
  store::PromptDispenser* dispenser_;
  WeightPublisher* publisher_;
  PromptSource prompts_;
  std::function<int64_t()> version_;
  std::atomic<bool> finished_{false};
  mutable std::mutex mu_;
  std::set<std::string> told_ ABSL_GUARDED_BY(mu_);  // workers that heard "finished"
  mutable std::condition_variable told_cv_;          // notified when told_ grows
  std::map<std::string, WorkerInfo> workers_ ABSL_GUARDED_BY(mu_);
  WorkerPresence presence_ ABSL_GUARDED_BY(mu_);
  int64_t next_worker_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace relay::comm
