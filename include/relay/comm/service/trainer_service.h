#pragma once

// The trainer's gRPC services (proto/relay/v1/worker.proto, admin.proto):
// grpc::Service adapters over TrainerHandlers (comm/service/trainer_handlers.h),
// which decide every answer. The adapters check the shared bearer token,
// translate Status to grpc::Status, and run the two streams that stay
// transport-bound: version announcements and chunked weight downloads from
// the publisher. TLS is the server's (comm/rpc/server.h).

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "relay/comm/service/trainer_handlers.h"
#include "relay/common/status.h"

namespace grpc {
class Service;
}

namespace relay::comm {

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
  void finish() { handlers_.finish(); }
  // After finish(): whether every registered worker has been told (made a
  // call since), and waiting for that, bounded (TrainerHandlers).
  bool all_workers_told() const { return handlers_.all_workers_told(); }
  bool wait_for_workers_told(std::chrono::milliseconds timeout) const {
    return handlers_.wait_for_workers_told(timeout);
  }
  // Forgets workers silent for options.worker_timeout_ms and releases their
  // leases; how many workers. Called on every LeasePrompts and Heartbeat.
  int reap_silent_workers() { return handlers_.reap_silent_workers(); }
  // Registrations and the latest call of any registered worker (any thread).
  WorkerPresence presence() const { return handlers_.presence(); }
  // check_worker_presence() now, with options.worker_timeout_ms: what the
  // trainer asks while it waits for groups (TrainerHost::step).
  Status check_workers_present() const { return handlers_.check_workers_present(); }
  std::vector<WorkerInfo> workers() const { return handlers_.workers(); }

  TrainerHandlers& handlers() { return handlers_; }
  grpc::Service* worker_service();
  grpc::Service* admin_service();

 private:
  class WorkerImpl;
  class AdminImpl;

  TrainerHandlers handlers_;
  std::unique_ptr<WorkerImpl> worker_impl_;
  std::unique_ptr<AdminImpl> admin_impl_;
};

}  // namespace relay::comm
