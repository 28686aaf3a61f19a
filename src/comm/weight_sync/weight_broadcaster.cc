#include "relay/comm/weight_sync/weight_broadcaster.h"

#include <spdlog/spdlog.h>

#include <chrono>

namespace relay::comm {

StatusOr<std::unique_ptr<WeightBroadcaster>> WeightBroadcaster::start(
    const WeightPublisher* publisher, const WeightSyncServerOptions& options) {
  if (publisher == nullptr) return InvalidArgumentError("WeightBroadcaster: publisher is null");
  RELAY_ASSIGN_OR_RETURN(std::unique_ptr<WeightSyncServer> server,
                         WeightSyncServer::start(options));
  return std::unique_ptr<WeightBroadcaster>(new WeightBroadcaster(publisher, std::move(server)));
}

WeightBroadcaster::WeightBroadcaster(const WeightPublisher* publisher,
                                     std::unique_ptr<WeightSyncServer> server)
    : publisher_(publisher), server_(std::move(server)), endpoint_(server_->endpoint()) {
  thread_ = std::thread([this] { loop(); });
}

WeightBroadcaster::~WeightBroadcaster() {
  stop_ = true;
  publisher_->wake_waiters();
  if (thread_.joinable()) thread_.join();
  server_.reset();  // closes the generation: members stop waiting at once
}

WeightBroadcasterStats WeightBroadcaster::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void WeightBroadcaster::loop() {
  int64_t sent = -1;
  while (!stop_) {
    // Wakes on a new version or on the destructor's stop; the timeout only
    // bounds how long a wake-up lost to a bug could hold the destructor.
    const int64_t latest = publisher_->wait_for_version(sent, std::chrono::seconds(10),
                                                        [this] { return stop_.load(); });
    if (latest <= sent) continue;
    StatusOr<std::shared_ptr<const WeightSnapshot>> snap = publisher_->snapshot(latest);
    if (!snap.ok()) continue;  // superseded while we looked: take the next one
    StatusOr<BroadcastReport> report = server_->broadcast(**snap);
    sent = latest;
    std::lock_guard<std::mutex> lock(mu_);
    stats_.last_version = latest;
    if (!report.ok()) {
      ++stats_.failures;
      spdlog::warn("weight sync: version {} not broadcast: {}; members fetch it instead", latest,
                   std::string(report.status().message()));
      continue;
    }
    stats_.members = report->members;
    stats_.last_seconds = report->seconds;
    if (report->members > 0) {
      ++stats_.versions_sent;
      stats_.last_gbps =
          report->seconds > 0 ? static_cast<double>(report->bytes) / report->seconds / 1e9 : 0;
      spdlog::debug("weight sync: version {} to {} members in generation {} in {:.3f} s", latest,
                    report->members, report->generation, report->seconds);
    }
  }
}

}  // namespace relay::comm
