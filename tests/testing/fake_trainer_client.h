#pragma once

// A trainer in memory behind the TrainerClient interface
// (relay/comm/rpc/trainer_client.h), for testing RolloutWorker without a
// server: the test fills FakeTrainer with leases and weight versions, says
// how submissions are judged and whether the trainer is down, and reads back
// what the worker sent. The worker's calls and the test's reads must not
// overlap (run the worker on the test's thread with a stop predicate), but
// for fetch_weights, which the worker makes on its fetch thread: it holds
// `mu` while it reads `versions` and writes `fetched`, and a test that
// publishes while the worker runs holds it too.

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "relay/comm/rpc/trainer_client.h"
#include "relay/v1/admin.pb.h"
#include "relay/v1/worker.pb.h"

namespace relay::testing {

struct FakeTrainer {
  // ---- Set by the test.
  int64_t version = 0;                               // the trainer's latest version
  std::map<int64_t, comm::FetchedWeights> versions;  // fetchable; others are NotFound
  std::deque<v1::PromptLease> to_lease;              // handed out in order
  // The ack of a submitted group; null = accepted (store_seq = arrival).
  std::function<v1::SubmitGroupAck(uint64_t lease_id, const rollout::TrajectoryGroup&)> judge;
  Status down;                 // not OK: every call fails with it (a dead trainer)
  bool forgot_worker = false;  // heartbeats answer "register again"
  // Each fetch first calls this with the version asked for (outside `mu`: a
  // test may hold a download here), then fails with the next of
  // fetch_errors if there is one (DataLoss: a version that failed its digest).
  std::function<void(int64_t version)> on_fetch;
  std::deque<Status> fetch_errors;
  std::mutex mu;  // fetch_weights' (see above)

  // ---- Read by the test.
  int registrations = 0;
  int heartbeats = 0;
  std::vector<int64_t> fetched;  // versions asked for (-1 = latest)
  std::vector<std::pair<uint64_t, rollout::TrajectoryGroup>> submitted;
  std::vector<v1::SubmitGroupAck> acks;
  std::vector<uint64_t> released;
};

class FakeTrainerClient final : public comm::TrainerClient {
 public:
  explicit FakeTrainerClient(FakeTrainer* trainer) : t_(trainer) {}

  StatusOr<v1::RegisterWorkerResponse> register_worker(const std::string& name,
                                                       const v1::WorkerCapabilities&) override {
    RELAY_RETURN_IF_ERROR(t_->down);
    ++t_->registrations;
    v1::RegisterWorkerResponse r;
    r.set_worker_id("w" + std::to_string(t_->registrations) + "-" + name);
    r.set_version(t_->version);
    r.set_heartbeat_interval_ms(2000);
    return r;
  }

  StatusOr<v1::HeartbeatResponse> heartbeat(const v1::HeartbeatRequest&) override {
    RELAY_RETURN_IF_ERROR(t_->down);
    ++t_->heartbeats;
    v1::HeartbeatResponse r;
    r.set_latest_version(t_->version);
    r.set_reregister(t_->forgot_worker);
    return r;
  }

  StatusOr<v1::LeasePromptsResponse> lease_prompts(const std::string&, int max_prompts) override {
    RELAY_RETURN_IF_ERROR(t_->down);
    v1::LeasePromptsResponse r;
    for (int i = 0; i < max_prompts && !t_->to_lease.empty(); ++i) {
      *r.add_leases() = t_->to_lease.front();
      t_->to_lease.pop_front();
    }
    if (r.leases_size() == 0) r.set_wait_for_version(t_->version + 1);
    r.set_latest_version(t_->version);
    return r;
  }

  StatusOr<int32_t> release_leases(const std::string&,
                                   const std::vector<uint64_t>& lease_ids) override {
    RELAY_RETURN_IF_ERROR(t_->down);
    t_->released.insert(t_->released.end(), lease_ids.begin(), lease_ids.end());
    return static_cast<int32_t>(lease_ids.size());
  }

  StatusOr<std::vector<v1::SubmitGroupAck>> submit_groups(
      const std::string&,
      const std::vector<std::pair<uint64_t, rollout::TrajectoryGroup>>& groups) override {
    RELAY_RETURN_IF_ERROR(t_->down);
    std::vector<v1::SubmitGroupAck> acks;
    for (const auto& [lease_id, group] : groups) {
      t_->submitted.emplace_back(lease_id, group);
      v1::SubmitGroupAck ack;
      if (t_->judge) {
        ack = t_->judge(lease_id, group);
      } else {
        ack.set_accepted(true);
        ack.set_store_seq(t_->submitted.size());
      }
      ack.set_lease_id(lease_id);
      acks.push_back(ack);
      t_->acks.push_back(ack);
    }
    return acks;
  }

  StatusOr<comm::FetchedWeights> fetch_weights(const std::string&, int64_t version, uint64_t,
                                               const model::WeightManifest* held,
                                               comm::FetchCancel* cancel) override {
    if (t_->on_fetch) t_->on_fetch(version);
    if (cancel != nullptr && cancel->cancelled()) return CancelledError("fake trainer: cancelled");
    std::lock_guard<std::mutex> lock(t_->mu);
    RELAY_RETURN_IF_ERROR(t_->down);
    t_->fetched.push_back(version);
    if (!t_->fetch_errors.empty()) {
      Status s = t_->fetch_errors.front();
      t_->fetch_errors.pop_front();
      return s;
    }
    auto it = t_->versions.find(version < 0 ? t_->version : version);
    if (it == t_->versions.end()) {
      return NotFoundError("fake trainer: version " + std::to_string(version) + " not published");
    }
    comm::FetchedWeights w = it->second;
    if (held != nullptr && held->digest == w.manifest.digest) {
      w.tensors.clear();
      w.already_held = true;
    }
    return w;
  }

  StatusOr<std::optional<v1::VersionAnnouncement>> next_version(const std::string&,
                                                                int64_t after_version,
                                                                int64_t) override {
    RELAY_RETURN_IF_ERROR(t_->down);
    if (t_->version <= after_version) return std::optional<v1::VersionAnnouncement>();
    v1::VersionAnnouncement a;
    a.set_version(t_->version);
    return std::optional<v1::VersionAnnouncement>(std::move(a));
  }

  StatusOr<v1::StatsResponse> stats() override {
    RELAY_RETURN_IF_ERROR(t_->down);
    v1::StatsResponse r;
    r.set_version(t_->version);
    return r;
  }

 private:
  FakeTrainer* t_;
};

}  // namespace relay::testing
