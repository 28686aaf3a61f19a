#include "relay/comm/worker/weight_fetcher.h"

#include <spdlog/spdlog.h>

#include <utility>

namespace relay::comm {

StatusOr<FetchedWeights> fetch_verified(TrainerClient& client, const std::string& worker_id,
                                        int64_t version, uint64_t chunk_bytes,
                                        FetchCancel* cancel) {
  StatusOr<FetchedWeights> w =
      client.fetch_weights(worker_id, version, chunk_bytes, nullptr, cancel);
  if (!w.ok() && w.status().code() == absl::StatusCode::kDataLoss) {
    spdlog::warn("worker {}: {}; fetching again", worker_id, std::string(w.status().message()));
    w = client.fetch_weights(worker_id, version, chunk_bytes, nullptr, cancel);
  }
  return w;
}

WeightFetcher::WeightFetcher(TrainerClient* client, std::string worker_id, uint64_t chunk_bytes)
    : client_(client), worker_id_(std::move(worker_id)), chunk_bytes_(chunk_bytes) {
  thread_ = std::thread([this] { loop(); });
}

WeightFetcher::~WeightFetcher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  // A download of a version nobody will stage ends now, not when its last
  // byte arrives (seconds for a large model on a slow link).
  cancel_.cancel();
  cv_.notify_all();
  thread_.join();
}

void WeightFetcher::want(int64_t version) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (version <= wanted_) return;
    wanted_ = version;
  }
  cv_.notify_all();
}

std::optional<StatusOr<FetchedWeights>> WeightFetcher::take() {
  std::optional<StatusOr<FetchedWeights>> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    out = std::exchange(outcome_, std::nullopt);
    if (out && out->ok()) held_ = true;
  }
  // The thread may be waiting for the slot to start the next download.
  if (out) cv_.notify_all();
  return out;
}

void WeightFetcher::release() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!held_) return;
    held_ = false;
  }
  cv_.notify_all();
}

bool WeightFetcher::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return outcome_.has_value(); });
}

bool WeightFetcher::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return downloading_ || outcome_.has_value() || wanted_ > started_;
}

int64_t WeightFetcher::wanted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return wanted_;
}

void WeightFetcher::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    // One outcome at a time: the next download waits until the loop took
    // the last one, so a version is never dropped unseen (nor held twice),
    // and until it released it (the header's "held").
    cv_.wait(lock, [&] { return stop_ || (wanted_ > started_ && !outcome_ && !held_); });
    if (stop_) return;
    const int64_t version = wanted_;
    started_ = version;
    downloading_ = true;
    lock.unlock();
    StatusOr<FetchedWeights> w =
        fetch_verified(*client_, worker_id_, version, chunk_bytes_, &cancel_);
    lock.lock();
    downloading_ = false;
    // Superseded while asked for: the loop names the newer version next.
    if (!w.ok() && w.status().code() == absl::StatusCode::kNotFound) continue;
    outcome_ = std::move(w);
    cv_.notify_all();
  }
}

}  // namespace relay::comm
