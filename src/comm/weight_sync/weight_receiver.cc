#include "relay/comm/weight_sync/weight_receiver.h"

#include <spdlog/spdlog.h>

#include <chrono>

namespace relay::comm {

StatusOr<std::unique_ptr<WeightReceiver>> WeightReceiver::start(
    const WeightSyncClientOptions& options) {
  RELAY_ASSIGN_OR_RETURN(std::unique_ptr<WeightSyncClient> client,
                         WeightSyncClient::connect(options));
  return std::unique_ptr<WeightReceiver>(new WeightReceiver(options, std::move(client)));
}

WeightReceiver::WeightReceiver(WeightSyncClientOptions options,
                               std::unique_ptr<WeightSyncClient> client)
    : options_(std::move(options)), client_(std::move(client)) {
  thread_ = std::thread([this] { loop(); });
}

WeightReceiver::~WeightReceiver() {
  stop_ = true;
  // Under the lock, so that a pause() that has not seen stop_ yet is asleep
  // and gets the notify.
  { std::lock_guard<std::mutex> lock(mu_); }
  stop_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void WeightReceiver::pause(std::chrono::milliseconds d) {
  std::unique_lock<std::mutex> lock(mu_);
  stop_cv_.wait_for(lock, d, [this] { return stop_.load(); });
}

std::optional<ReceivedVersion> WeightReceiver::take(int64_t after) {
  std::lock_guard<std::mutex> lock(mu_);
  std::optional<ReceivedVersion> out;
  if (slot_ && slot_->version > after) out = std::move(slot_);
  slot_.reset();
  return out;
}

void WeightReceiver::loop() {
  while (!stop_) {
    if (!client_) {
      // The trainer's store went away (restart): connect again, once a
      // second. Nothing announces that the trainer is back; meanwhile the
      // worker fetches over gRPC, so a slow retry costs nothing but log lines.
      StatusOr<std::unique_ptr<WeightSyncClient>> c = WeightSyncClient::connect(options_);
      if (!c.ok()) {
        pause(std::chrono::seconds(1));
        continue;
      }
      client_ = *std::move(c);
      healthy_ = true;
    }
    StatusOr<ReceivedVersion> v = client_->receive([this] { return stop_.load(); });
    if (v.ok()) {
      healthy_ = true;
      ++received_;
      std::lock_guard<std::mutex> lock(mu_);
      slot_ = *std::move(v);
      continue;
    }
    if (v.status().code() == absl::StatusCode::kCancelled) break;
    ++failures_;
    if (v.status().code() == absl::StatusCode::kDataLoss) {
      // Still a member; that version is fetched over gRPC instead.
      spdlog::warn("weight sync: {}", std::string(v.status().message()));
      continue;
    }
    healthy_ = false;
    spdlog::info("weight sync: {}; fetching over gRPC until the group is re-formed",
                 std::string(v.status().message()));
    // A deliberate pause before rejoining, so that a group that keeps
    // breaking (a trainer on its way down, a peer that fails every
    // broadcast) is not rejoined in a tight loop; the worker fetches over
    // gRPC meanwhile.
    pause(std::chrono::milliseconds(200));
    if (client_->rejoin().ok()) {
      healthy_ = true;
    } else {
      client_.reset();
    }
  }
}

}  // namespace relay::comm
