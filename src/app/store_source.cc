#include "relay/app/store_source.h"

#include <thread>
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
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    // TrainerService has no event for "every worker told"; a short poll
    // bounded by the 10 s is what there is.
    while (!service_->all_workers_told() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  server_->shutdown(2000);
}

}  // namespace relay::app
