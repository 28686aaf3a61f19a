#include "relay/app/store_source.h"

#include <utility>

namespace relay::app {

StoreGroupSource::StoreGroupSource(comm::TrainerHost* host, comm::TrainerService* service,
                                   comm::RpcServer* server, comm::WeightBroadcaster* broadcaster,
                                   std::function<bool()> stop)
    : host_(host),
      service_(service),
      server_(server),
      broadcaster_(broadcaster),
      stop_(std::move(stop)),
      t0_(std::chrono::steady_clock::now()) {}

StatusOr<std::optional<trainer::StepMetrics>> StoreGroupSource::train_step(trainer::Trainer&,
                                                                           int64_t) {
  const auto step_start = std::chrono::steady_clock::now();
  RELAY_ASSIGN_OR_RETURN(trainer::StepMetrics m, host_->step(stop_, [this]() -> Status {
    Status st = service_->check_workers_present();
    workers_gone_ = !st.ok();
    return st;
  }));
  const auto now = std::chrono::steady_clock::now();
  const double step_s = std::chrono::duration<double>(now - step_start).count();
  m["time/elapsed_s"] = std::chrono::duration<double>(now - t0_).count();
  m["time/step_s"] = step_s;
  m["throughput/samples_per_s"] = step_s > 0 ? m.at("batch/trajectories") / step_s : 0.0;
  if (broadcaster_ != nullptr) {
    const comm::WeightBroadcasterStats bs = broadcaster_->stats();
    m["weight_sync/members"] = bs.members;
    m["weight_sync/broadcast_s"] = bs.last_seconds;
    m["weight_sync/gbps"] = bs.last_gbps;
    m["weight_sync/failures"] = static_cast<double>(bs.failures);
  }
  return std::optional<trainer::StepMetrics>(std::move(m));
}

void StoreGroupSource::finish(bool finished) {
  if (finished) {
    service_->finish();
    // Workers hear "the run is finished" on their next call (a heartbeat
    // interval at most); serving stops once each has, or after 10 s.
    service_->wait_for_workers_told(std::chrono::seconds(10));
  }
  server_->shutdown(2000);
}

}  // namespace relay::app
