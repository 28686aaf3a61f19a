#pragma once

// The trainer's half of `services.weight_sync: broadcast | auto`: a thread
// that sends every version the WeightPublisher publishes to the workers of
// the c10d weight-sync group (comm/weight_sync/weight_sync.h). Training never waits for
// it: a slow or failed broadcast only delays the workers, which fetch over
// gRPC when the group breaks. When versions come faster than a broadcast
// takes, intermediate ones are skipped (workers only need the newest).

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "relay/comm/weight_sync/weight_publisher.h"
#include "relay/comm/weight_sync/weight_sync.h"
#include "relay/common/status.h"

namespace relay::comm {

struct WeightBroadcasterStats {
  int64_t versions_sent = 0;  // broadcasts that reached at least one member
  int64_t failures = 0;       // broadcasts that broke their generation
  int64_t last_version = -1;  // newest version broadcast (or tried)
  int members = 0;            // in the last broadcast
  double last_seconds = 0;    // duration of the last broadcast
  double last_gbps = 0;       // its payload / duration, GB/s (0 with no members)
};

class WeightBroadcaster {
 public:
  // Hosts the weight-sync store and starts the thread. `publisher` must
  // outlive the broadcaster.
  static StatusOr<std::unique_ptr<WeightBroadcaster>> start(const WeightPublisher* publisher,
                                                            const WeightSyncServerOptions& options);
  // Stops the thread and closes the group (members see "shutdown").
  ~WeightBroadcaster();

  std::string endpoint() const { return endpoint_; }
  WeightBroadcasterStats stats() const;

 private:
  WeightBroadcaster(const WeightPublisher* publisher, std::unique_ptr<WeightSyncServer> server);
  void loop();

  const WeightPublisher* publisher_;
  std::unique_ptr<WeightSyncServer> server_;
  std::string endpoint_;
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  WeightBroadcasterStats stats_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace relay::comm
