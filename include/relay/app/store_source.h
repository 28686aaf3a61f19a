#pragma once

// Groups from the rollout store (relay-trainer): workers generate them over
// gRPC and the TrainerHost takes a step's worth within the staleness bound,
// trains on them and publishes the new version. This source adds the step's
// timing and weight-sync figures, knows when every worker is gone, and at
// the end tells the workers to exit and stops serving.

#include <chrono>
#include <functional>

#include "relay/app/training_loop.h"
#include "relay/comm/host/trainer_host.h"
#include "relay/comm/rpc/server.h"
#include "relay/comm/service/trainer_service.h"
#include "relay/comm/weight_sync/weight_broadcaster.h"

namespace relay::app {

class StoreGroupSource : public GroupSource {
 public:
  // Everything must outlive the source; `broadcaster` may be null (workers
  // fetch weights). `stop` is asked while waiting for groups.
  StoreGroupSource(comm::TrainerHost* host, comm::TrainerService* service, comm::RpcServer* server,
                   comm::WeightBroadcaster* broadcaster, std::function<bool()> stop);

  StatusOr<std::optional<trainer::StepMetrics>> train_step(trainer::Trainer& trainer,
                                                           int64_t rl_step) override;
  const std::vector<rollout::TrajectoryGroup>& last_groups() const override {
    return host_->last_groups();
  }
  // After a finished run, workers are told so on their next call (they exit
  // rather than wait for a restart): serves on until each has made one, for
  // at most 10 s, then stops serving.
  void finish(bool finished) override;
  // Workers that registered and then all went silent (killed, out of
  // memory) fail the wait for groups; the trainer itself is fine.
  bool trainer_sound_after(const Status&) const override { return workers_gone_; }

 private:
  comm::TrainerHost* host_;
  comm::TrainerService* service_;
  comm::RpcServer* server_;
  comm::WeightBroadcaster* broadcaster_;
  std::function<bool()> stop_;
  std::chrono::steady_clock::time_point t0_;
  bool workers_gone_ = false;
};

}  // namespace relay::app
