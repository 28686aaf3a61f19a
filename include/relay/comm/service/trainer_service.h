#pragma once

// The trainer's gRPC services (proto/relay/v1/worker.proto, admin.proto):
// worker registration and heartbeats, prompt leases from the dispenser,
// streamed group submission (validated, durable in the store before each
// ack), version announcements and chunked weight downloads from the
// publisher. A shared bearer token, when configured, is checked on every
// call; TLS is the server's (comm/rpc/server.h).

#include <atomic>
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

namespace grpc {
class Service;
}

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
  int64_t max_staleness = 0;         // submissions older than version - this are refused
  SubmissionLimits limits;
  uint64_t default_chunk_bytes = 4 << 20;
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

class TrainerService {
 public:
  // The dependencies must outlive the service. `version` returns the
  // trainer's current policy version.
  TrainerService(TrainerServiceOptions options, store::RolloutStore* store,
                 store::PromptDispenser* dispenser, WeightPublisher* publisher,
                 PromptSource prompts, std::function<int64_t()> version);
  ~TrainerService();

  // The run is over: from now on LeasePrompts and Heartbeat answer
  // OUT_OF_RANGE "the run is finished", which workers take as their cue to
  // exit instead of waiting for the trainer to come back.
  void finish();
  // After finish(): whether every registered worker has been told (made a
  // call since). The trainer waits for this, bounded, before it stops serving.
  bool all_workers_told() const;

  // Forgets workers silent for options.worker_timeout_ms and releases their
  // leases; how many workers. Called on every LeasePrompts and Heartbeat.
  int reap_silent_workers();

  // Registrations and the latest call of any registered worker (any thread).
  WorkerPresence presence() const;
  // check_worker_presence() now, with options.worker_timeout_ms: what the
  // trainer asks while it waits for groups (TrainerHost::step).
  Status check_workers_present() const;

  grpc::Service* worker_service();
  grpc::Service* admin_service();

  std::vector<WorkerInfo> workers() const;

 private:
  class WorkerImpl;
  class AdminImpl;
  friend class WorkerImpl;
  friend class AdminImpl;

  TrainerServiceOptions options_;
  store::RolloutStore* store_;
  store::PromptDispenser* dispenser_;
  WeightPublisher* publisher_;
  PromptSource prompts_;
  std::function<int64_t()> version_;
  std::atomic<bool> finished_{false};
  mutable std::mutex mu_;
  std::set<std::string> told_ ABSL_GUARDED_BY(mu_);  // workers that heard "finished"
  std::map<std::string, WorkerInfo> workers_ ABSL_GUARDED_BY(mu_);
  WorkerPresence presence_ ABSL_GUARDED_BY(mu_);
  int64_t next_worker_ ABSL_GUARDED_BY(mu_) = 1;
  std::unique_ptr<WorkerImpl> worker_impl_;
  std::unique_ptr<AdminImpl> admin_impl_;
};

}  // namespace relay::comm
