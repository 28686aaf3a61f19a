#pragma once

// Downloads weight versions over gRPC (TrainerClient::fetch_weights) on a
// thread of its own, so that a rollout worker's loop goes on decoding the
// sequences it has while a version arrives. Fetching in the loop itself
// stopped every sequence for the whole download: 1.3-2.3 s per version for
// a 100M-parameter model on 2 cores (docs/BENCHMARKS.md, "What a worker's
// loop waits for"), seconds more for a 0.5B one.
//
// The loop says which version it wants (want(), non-blocking) and takes the
// result when it is there (take()). One download at a time: a newer version
// wanted meanwhile is fetched after it (the finished older one is still
// handed over; the loop decides whether to stage it). A version that fails
// its digest (DataLoss) is fetched once more, then the error is handed over;
// so is any other error. NotFound (the version was superseded while asked
// for) is not an error: nothing is handed over and the loop asks for the
// newer one it learns about next.
//
// A version taken is held by its taker until release(): the next download
// waits for that. A rollout worker stages the version it takes, and its
// engine keeps the staged copy beside the weights it replaces until its next
// step; a download started meanwhile would be a third copy of the weights
// (and could not receive into the last download's buffer, still referenced),
// so the worker releases once its engine has applied the version.
//
// The destructor cancels a download in progress (FetchCancel) and waits for
// its thread; the TrainerClient must outlive this. Thread-safe.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "relay/comm/rpc/trainer_client.h"
#include "relay/common/status.h"

namespace relay::comm {

// One download verified against its digest, fetched once more when it fails
// it (DataLoss); the errors are fetch_weights'.
StatusOr<FetchedWeights> fetch_verified(TrainerClient& client, const std::string& worker_id,
                                        int64_t version, uint64_t chunk_bytes,
                                        FetchCancel* cancel = nullptr);

class WeightFetcher {
 public:
  WeightFetcher(TrainerClient* client, std::string worker_id, uint64_t chunk_bytes);
  ~WeightFetcher();
  WeightFetcher(const WeightFetcher&) = delete;
  WeightFetcher& operator=(const WeightFetcher&) = delete;

  // Asks for `version` (>= 0) or newer. Returns at once; a version at or
  // below one already asked for changes nothing.
  void want(int64_t version);
  // The outcome of a download that ended since the last take(): the
  // verified version, or the error that ended it. nullopt while there is
  // none. After a verified version the next download waits for release().
  std::optional<StatusOr<FetchedWeights>> take();
  // The version taken last is no longer held beside the weights it replaced:
  // the next download may start. Nothing when none is held.
  void release();
  // Waits up to `timeout` for an outcome to take; whether there is one.
  bool wait(std::chrono::milliseconds timeout);
  // A version asked for whose outcome has not been taken yet.
  bool pending() const;
  // The newest version asked for (-1: none).
  int64_t wanted() const;

 private:
  void loop();

  TrainerClient* const client_;
  const std::string worker_id_;
  const uint64_t chunk_bytes_;
  FetchCancel cancel_;  // the destructor's
  mutable std::mutex mu_;
  std::condition_variable cv_;  // with mu_: wanted_, stop_ or outcome_ changed
  int64_t wanted_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t started_ ABSL_GUARDED_BY(mu_) = -1;  // the newest version a download began for
  bool downloading_ ABSL_GUARDED_BY(mu_) = false;
  bool held_ ABSL_GUARDED_BY(mu_) = false;  // a version taken and not released yet
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<StatusOr<FetchedWeights>> outcome_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace relay::comm
