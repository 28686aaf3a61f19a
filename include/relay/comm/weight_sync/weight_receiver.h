#pragma once

// The worker's half of `services.weight_sync: broadcast | auto`: a thread
// that stays in the trainer's c10d weight-sync group (comm/weight_sync/weight_sync.h) and
// keeps the newest verified version it received for the worker loop to take.
// When the group breaks it rejoins (and reconnects when the trainer's store
// went away); meanwhile the worker fetches versions over gRPC.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "relay/comm/weight_sync/weight_sync.h"
#include "relay/common/status.h"

namespace relay::comm {

class WeightReceiver {
 public:
  // Connects to the trainer's weight-sync store and asks to join; errors as
  // WeightSyncClient::connect.
  static StatusOr<std::unique_ptr<WeightReceiver>> start(const WeightSyncClientOptions& options);
  // Stops the thread and leaves the group.
  ~WeightReceiver();

  // The newest version received since the last take() that is above
  // `after`, if any (older ones are dropped).
  std::optional<ReceivedVersion> take(int64_t after);
  // True while joined or joining and the group has not broken since: the
  // worker then waits (a bounded grace) for the next version to arrive by
  // broadcast instead of fetching it.
  bool healthy() const { return healthy_.load(); }
  int64_t received() const { return received_.load(); }
  int64_t failures() const { return failures_.load(); }

 private:
  WeightReceiver(WeightSyncClientOptions options, std::unique_ptr<WeightSyncClient> client);
  void loop();
  // Sleeps `d`, or less when the destructor asks the thread to stop.
  void pause(std::chrono::milliseconds d);

  WeightSyncClientOptions options_;
  std::unique_ptr<WeightSyncClient> client_;  // used by the thread only
  std::atomic<bool> stop_{false};
  std::atomic<bool> healthy_{true};
  std::atomic<int64_t> received_{0};
  std::atomic<int64_t> failures_{0};
  std::mutex mu_;
  std::condition_variable stop_cv_;  // with mu_: stop_ was set
  std::optional<ReceivedVersion> slot_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace relay::comm
