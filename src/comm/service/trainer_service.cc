#include "relay/comm/service/trainer_service.h"

#include <spdlog/spdlog.h>

#include <set>

#include <grpcpp/grpcpp.h>
#include <xxhash.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "relay/comm/rpc/manifest_proto.h"
#include "relay/store/convert.h"
#include "relay/v1/admin.grpc.pb.h"
#include "relay/v1/worker.grpc.pb.h"

namespace relay::comm {
namespace {

int64_t system_now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

grpc::Status to_grpc(const Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

// The shared bearer token, when configured, on every call.
grpc::Status authorize(const grpc::ServerContext* context, const std::string& token) {
  if (token.empty()) return grpc::Status::OK;
  const auto& md = context->client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "authorization: missing bearer token");
  }
  const std::string got(it->second.data(), it->second.size());
  if (got != "Bearer " + token) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "authorization: wrong bearer token");
  }
  return grpc::Status::OK;
}

}  // namespace

class TrainerService::WorkerImpl final : public v1::Worker::Service {
 public:
  explicit WorkerImpl(TrainerService* s) : s_(s) {
    // Method 3 of relay.v1.Worker is SubmitGroups (proto order); the
    // malformed-bytes test fails if that ever changes.
    MarkMethodStreamed(
        3, new grpc::internal::BidiStreamingHandler<WorkerImpl, grpc::ByteBuffer, grpc::ByteBuffer>(
               [](WorkerImpl* self, grpc::ServerContext* context,
                  grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>* stream) {
                 return self->SubmitGroupsRaw(context, stream);
               },
               this));
  }

  grpc::Status RegisterWorker(grpc::ServerContext* context, const v1::RegisterWorkerRequest* req,
                              v1::RegisterWorkerResponse* resp) override {
    if (grpc::Status a = authorize(context, s_->options_.auth_token); !a.ok()) return a;
    if (req->worker_name().empty()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "worker_name: empty");
    }
    WorkerInfo w;
    w.worker_name = req->worker_name();
    w.device = req->capabilities().device();
    w.num_slots = req->capabilities().num_slots();
    w.weight_sync_group = req->capabilities().weight_sync_group();
    w.last_heartbeat_unix_ms = s_->options_.now_ms();
    {
      std::lock_guard<std::mutex> lock(s_->mu_);
      w.worker_id = absl::StrCat("w", s_->next_worker_++, "-", req->worker_name());
      s_->workers_[w.worker_id] = w;
      ++s_->presence_.registrations;
      s_->presence_.last_heard_unix_ms = w.last_heartbeat_unix_ms;
    }
    resp->set_worker_id(w.worker_id);
    resp->set_version(s_->version_());
    if (auto snap = s_->publisher_->snapshot(-1); snap.ok()) {
      to_proto((*snap)->manifest, resp->mutable_manifest());
    }
    resp->set_weight_sync_endpoint(s_->options_.weight_sync_endpoint);
    resp->set_heartbeat_interval_ms(s_->options_.heartbeat_interval_ms);
    resp->set_lease_timeout_ms(s_->dispenser_->options().lease_timeout_ms);
    resp->set_k(s_->dispenser_->options().k);
    return grpc::Status::OK;
  }

  grpc::Status Heartbeat(grpc::ServerContext* context, const v1::HeartbeatRequest* req,
                         v1::HeartbeatResponse* resp) override {
    if (grpc::Status a = authorize(context, s_->options_.auth_token); !a.ok()) return a;
    if (s_->finished_) return finished(req->worker_id());
    s_->reap_silent_workers();
    resp->set_latest_version(s_->version_());
    std::lock_guard<std::mutex> lock(s_->mu_);
    auto it = s_->workers_.find(req->worker_id());
    if (it == s_->workers_.end()) {
      resp->set_reregister(true);
      return grpc::Status::OK;
    }
    it->second.running_version = req->running_version();
    it->second.running_digest = req->running_digest();
    it->second.in_flight = req->in_flight();
    it->second.last_heartbeat_unix_ms = s_->options_.now_ms();
    s_->presence_.last_heard_unix_ms = it->second.last_heartbeat_unix_ms;
    return grpc::Status::OK;
  }

  grpc::Status LeasePrompts(grpc::ServerContext* context, const v1::LeasePromptsRequest* req,
                            v1::LeasePromptsResponse* resp) override {
    if (grpc::Status a = authorize(context, s_->options_.auth_token); !a.ok()) return a;
    if (s_->finished_) return finished(req->worker_id());
    s_->reap_silent_workers();
    if (grpc::Status k = known(req->worker_id()); !k.ok()) return k;
    if (req->max_prompts() < 1) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("max_prompts: must be >= 1, got ", req->max_prompts()));
    }
    const int64_t version = s_->version_();
    StatusOr<std::vector<store::Lease>> leases =
        s_->dispenser_->lease(req->worker_id(), req->max_prompts(), version);
    if (!leases.ok()) return to_grpc(leases.status());
    for (const store::Lease& l : *leases) {
      StatusOr<PromptContent> p = s_->prompts_(l);
      if (!p.ok()) {
        // The lease stays recorded and expires; say which prompt failed.
        return grpc::Status(
            grpc::StatusCode::INTERNAL,
            absl::StrCat("prompt ", l.prompt_index, ": ", std::string(p.status().message())));
      }
      v1::PromptLease* out = resp->add_leases();
      out->set_lease_id(l.id);
      out->set_group_id(p->group_id);
      out->set_prompt_index(l.prompt_index);
      out->mutable_prompt_tokens()->Add(p->prompt_tokens.begin(), p->prompt_tokens.end());
      out->mutable_target_tokens()->Add(p->target_tokens.begin(), p->target_tokens.end());
      out->set_k(l.k);
      out->set_seed(p->seed);
      out->set_greedy_baseline(s_->options_.greedy_baseline);
      out->set_leased_version(l.leased_version);
      out->set_deadline_unix_ms(l.deadline_unix_ms);
    }
    if (leases->empty()) resp->set_wait_for_version(version + 1);
    resp->set_latest_version(version);
    return grpc::Status::OK;
  }

  grpc::Status ReleaseLeases(grpc::ServerContext* context, const v1::ReleaseLeasesRequest* req,
                             v1::ReleaseLeasesResponse* resp) override {
    if (grpc::Status a = authorize(context, s_->options_.auth_token); !a.ok()) return a;
    if (grpc::Status k = known(req->worker_id()); !k.ok()) return k;
    int32_t released = 0;
    for (uint64_t id : req->lease_ids()) {
      // Only the holder may give a lease back; one already retired (submitted,
      // expired) is skipped, not an error: the worker cannot know.
      StatusOr<store::Lease> l = s_->dispenser_->find_lease(id);
      if (!l.ok() || l->worker_id != req->worker_id()) continue;
      if (s_->dispenser_->release(id).ok()) ++released;
    }
    resp->set_released(released);
    return grpc::Status::OK;
  }

  // SubmitGroups as raw bytes (installed in the constructor): a message that
  // does not parse ends the stream with INVALID_ARGUMENT instead of looking
  // like the client's half-close (the typed reader cannot tell them apart).
  grpc::Status SubmitGroupsRaw(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>* stream) {
    if (grpc::Status a = authorize(context, s_->options_.auth_token); !a.ok()) return a;
    grpc::ByteBuffer in;
    for (int64_t n = 0; stream->Read(&in); ++n) {
      v1::SubmitGroupRequest req;
      if (!grpc::SerializationTraits<v1::SubmitGroupRequest>::Deserialize(&in, &req).ok()) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            absl::StrCat("SubmitGroups message ", n,
                                         ": does not parse as relay.v1.SubmitGroupRequest; "
                                         "the groups before it were acknowledged"));
      }
      v1::SubmitGroupAck ack;
      ack.set_lease_id(req.lease_id());
      Status st = accept(req, &ack);
      if (!st.ok()) {
        ack.set_accepted(false);
        ack.set_error_code(static_cast<int32_t>(st.code()));
        ack.set_error_message(std::string(st.message()));
      }
      grpc::ByteBuffer out;
      bool own = false;
      if (!grpc::SerializationTraits<v1::SubmitGroupAck>::Serialize(ack, &out, &own).ok() ||
          !stream->Write(out)) {
        break;
      }
    }
    return grpc::Status::OK;
  }

  grpc::Status WatchVersions(grpc::ServerContext* context, const v1::WatchVersionsRequest* req,
                             grpc::ServerWriter<v1::VersionAnnouncement>* writer) override {
    if (grpc::Status a = authorize(context, s_->options_.auth_token); !a.ok()) return a;
    int64_t after = req->after_version();
    while (!context->IsCancelled()) {
      const int64_t v = s_->publisher_->wait_for_version(
          after, std::chrono::milliseconds(s_->options_.watch_poll_ms));
      if (v <= after) continue;
      StatusOr<std::shared_ptr<const WeightSnapshot>> snap = s_->publisher_->snapshot(v);
      if (!snap.ok()) continue;
      v1::VersionAnnouncement a;
      a.set_version(v);
      to_proto((*snap)->manifest, a.mutable_manifest());
      a.set_broadcast(!s_->options_.weight_sync_endpoint.empty());
      if (!writer->Write(a)) break;
      after = v;
    }
    return grpc::Status::OK;
  }

  grpc::Status FetchWeights(grpc::ServerContext* context, const v1::FetchWeightsRequest* req,
                            grpc::ServerWriter<v1::WeightChunk>* writer) override {
    if (grpc::Status a = authorize(context, s_->options_.auth_token); !a.ok()) return a;
    StatusOr<std::shared_ptr<const WeightSnapshot>> snap = s_->publisher_->snapshot(req->version());
    if (!snap.ok()) return to_grpc(snap.status());
    const uint64_t chunk =
        req->chunk_bytes() > 0 ? req->chunk_bytes() : s_->options_.default_chunk_bytes;
    bool first = true, ok = true;
    for_each_chunk(**snap, chunk, [&](uint64_t offset, const char* data, uint64_t size) {
      // A worker downloading is alive: a 2 GB version can take longer than
      // services.worker_timeout_s while the trainer is busy stepping.
      touch(req->worker_id());
      v1::WeightChunk c;
      if (first) to_proto((*snap)->manifest, c.mutable_manifest());
      first = false;
      c.set_offset(offset);
      c.set_data(data, size);
      c.set_chunk_digest(XXH3_64bits(data, size));
      ok = !context->IsCancelled() && writer->Write(c);
      return ok;
    });
    if (first) {  // no bytes at all: still send the manifest
      v1::WeightChunk c;
      to_proto((*snap)->manifest, c.mutable_manifest());
      writer->Write(c);
    }
    if (!ok) return grpc::Status(grpc::StatusCode::CANCELLED, "fetch cancelled");
    return grpc::Status::OK;
  }

 private:
  grpc::Status finished(const std::string& worker_id) {
    {
      std::lock_guard<std::mutex> lock(s_->mu_);
      s_->told_.insert(worker_id);
    }
    return grpc::Status(grpc::StatusCode::OUT_OF_RANGE, "the run is finished");
  }

  // Marks a registered worker alive; nothing for an unknown id.
  void touch(const std::string& worker_id) {
    std::lock_guard<std::mutex> lock(s_->mu_);
    auto it = s_->workers_.find(worker_id);
    if (it == s_->workers_.end()) return;
    it->second.last_heartbeat_unix_ms = s_->options_.now_ms();
    s_->presence_.last_heard_unix_ms = it->second.last_heartbeat_unix_ms;
  }

  // Also marks the worker alive.
  grpc::Status known(const std::string& worker_id) {
    std::lock_guard<std::mutex> lock(s_->mu_);
    auto it = s_->workers_.find(worker_id);
    if (it != s_->workers_.end()) {
      it->second.last_heartbeat_unix_ms = s_->options_.now_ms();
      s_->presence_.last_heard_unix_ms = it->second.last_heartbeat_unix_ms;
      return grpc::Status::OK;
    }
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("worker_id '", worker_id, "': unknown; register first"));
  }

  // Validates, stores and acknowledges one group; the error otherwise.
  // A group is bound to its lease: only the worker that holds the lease may
  // submit on it, with the leased group id and prompt. A malformed group
  // keeps the lease (the worker may correct and resubmit, or release it); a
  // stale one releases it, since no resubmission can make it fresh.
  Status accept(const v1::SubmitGroupRequest& req, v1::SubmitGroupAck* ack) {
    if (grpc::Status k = known(req.worker_id()); !k.ok()) {
      return FailedPreconditionError(k.error_message());
    }
    StatusOr<store::Lease> lease = s_->dispenser_->find_lease(req.lease_id());
    if (!lease.ok()) {
      // An expired lease was re-leased to another worker: the group is late.
      return FailedPreconditionError(std::string(lease.status().message()));
    }
    if (lease->worker_id != req.worker_id()) {
      return absl::PermissionDeniedError(absl::StrCat(
          "lease ", req.lease_id(), ": held by worker '", lease->worker_id, "', not '",
          req.worker_id(), "'; group '", req.group().group_id(), "' was not accepted"));
    }
    StatusOr<rollout::TrajectoryGroup> group = store::from_proto(req.group(), /*check=*/false);
    if (!group.ok()) return group.status();
    RELAY_RETURN_IF_ERROR(check_leased(*lease, *group));
    const int64_t version = s_->version_();
    SubmissionContext c;
    c.k = lease->k;
    c.trainer_version = version;
    c.oldest_version = std::max<int64_t>(0, version - s_->options_.max_staleness);
    if (Status v = validate_submission(*group, c, s_->options_.limits); !v.ok()) {
      return v.code() == absl::StatusCode::kFailedPrecondition ? release(req.lease_id(), v) : v;
    }
    normalize_submission(*group, s_->options_.limits);
    StatusOr<uint64_t> seq = s_->dispenser_->submit(req.lease_id(), *group, version);
    if (!seq.ok()) return seq.status();
    ack->set_accepted(true);
    ack->set_store_seq(*seq);
    return OkStatus();
  }

  // The group answers `lease`: the leased group id, and the leased prompt in
  // every trajectory (and the baseline). The prompt is derived again from the
  // lease (the same function LeasePrompts used), so this holds across a
  // trainer restart without remembering what was sent.
  Status check_leased(const store::Lease& lease, const rollout::TrajectoryGroup& group) {
    StatusOr<PromptContent> leased = s_->prompts_(lease);
    if (!leased.ok()) {
      return InternalError(absl::StrCat("lease ", lease.id,
                                        ": cannot derive its prompt: ", leased.status().message()));
    }
    if (group.group_id != leased->group_id) {
      return InvalidArgumentError(absl::StrCat("group_id: '", group.group_id, "', but lease ",
                                               lease.id, " is for group '", leased->group_id, "'"));
    }
    auto check = [&](const rollout::Trajectory& t, const std::string& where) -> Status {
      const std::vector<int64_t>& want = leased->prompt_tokens;
      if (t.prompt_tokens == want) return OkStatus();
      size_t j = 0;
      while (j < t.prompt_tokens.size() && j < want.size() && t.prompt_tokens[j] == want[j]) ++j;
      return InvalidArgumentError(
          absl::StrCat("group '", group.group_id, "' ", where, ".prompt_tokens: differ from lease ",
                       lease.id, "'s prompt (", t.prompt_tokens.size(), " tokens vs ", want.size(),
                       " leased; first ", "difference at position ", j, ")"));
    };
    for (size_t i = 0; i < group.trajectories.size(); ++i) {
      RELAY_RETURN_IF_ERROR(check(group.trajectories[i], absl::StrCat("trajectories[", i, "]")));
    }
    if (group.baseline) RELAY_RETURN_IF_ERROR(check(*group.baseline, "baseline"));
    return OkStatus();
  }

  // Releases the lease of a group that can never be accepted (stale), so its
  // prompt is leased again at once rather than at the deadline.
  Status release(uint64_t lease_id, const Status& why) {
    if (Status r = s_->dispenser_->release(lease_id); !r.ok()) {
      return Status(why.code(), absl::StrCat(why.message(), " (and releasing lease ", lease_id,
                                             " failed: ", r.message(), ")"));
    }
    return why;
  }

  TrainerService* s_;
};

class TrainerService::AdminImpl final : public v1::Admin::Service {
 public:
  explicit AdminImpl(TrainerService* s) : s_(s) {}

  grpc::Status Health(grpc::ServerContext* context, const v1::HealthRequest*,
                      v1::HealthResponse* resp) override {
    if (grpc::Status a = authorize(context, s_->options_.auth_token); !a.ok()) return a;
    resp->set_serving(true);
    resp->set_version(s_->version_());
    return grpc::Status::OK;
  }

  grpc::Status Stats(grpc::ServerContext* context, const v1::StatsRequest*,
                     v1::StatsResponse* resp) override {
    if (grpc::Status a = authorize(context, s_->options_.auth_token); !a.ok()) return a;
    const int64_t version = s_->version_();
    resp->set_version(version);
    StatusOr<store::StoreStats> st = s_->store_->stats();
    if (!st.ok()) return to_grpc(st.status());
    resp->set_store_ready(st->ready);
    resp->set_store_consumed(st->consumed);
    resp->set_store_expired(st->expired);
    const store::DispenserStats d = s_->dispenser_->stats();
    resp->set_accepted(d.accepted);
    resp->set_in_flight(d.in_flight);
    resp->set_retry_queue(d.retry_queue);
    resp->set_capacity(s_->dispenser_->capacity(version));
    for (const WorkerInfo& w : s_->workers()) {
      v1::WorkerState* out = resp->add_workers();
      out->set_worker_id(w.worker_id);
      out->set_worker_name(w.worker_name);
      out->set_running_version(w.running_version);
      out->set_running_digest(w.running_digest);
      out->set_in_flight(w.in_flight);
      out->set_last_heartbeat_unix_ms(w.last_heartbeat_unix_ms);
      out->set_in_weight_sync_group(w.weight_sync_group);
    }
    return grpc::Status::OK;
  }

 private:
  TrainerService* s_;
};

TrainerService::TrainerService(TrainerServiceOptions options, store::RolloutStore* store,
                               store::PromptDispenser* dispenser, WeightPublisher* publisher,
                               PromptSource prompts, std::function<int64_t()> version)
    : options_(std::move(options)),
      store_(store),
      dispenser_(dispenser),
      publisher_(publisher),
      prompts_(std::move(prompts)),
      version_(std::move(version)),
      worker_impl_(std::make_unique<WorkerImpl>(this)),
      admin_impl_(std::make_unique<AdminImpl>(this)) {
  if (!options_.now_ms) options_.now_ms = system_now_ms;
}

TrainerService::~TrainerService() = default;

void TrainerService::finish() { finished_ = true; }

bool TrainerService::all_workers_told() const {
  // A worker silent for two heartbeat intervals is probably gone: not
  // waited for.
  const int64_t quiet_ms = options_.now_ms() - 2 * options_.heartbeat_interval_ms - 1000;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, w] : workers_) {
    if (told_.count(id) == 0 && w.last_heartbeat_unix_ms > quiet_ms) return false;
  }
  return true;
}

int TrainerService::reap_silent_workers() {
  if (options_.worker_timeout_ms <= 0) return 0;
  const int64_t now = options_.now_ms();
  std::set<std::string> silent;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = workers_.begin(); it != workers_.end();) {
      if (now - it->second.last_heartbeat_unix_ms > options_.worker_timeout_ms) {
        silent.insert(it->first);
        it = workers_.erase(it);
      } else {
        ++it;
      }
    }
  }
  if (silent.empty()) return 0;
  int64_t released = 0;
  for (const store::Lease& l : dispenser_->leases()) {
    if (silent.count(l.worker_id) > 0 && dispenser_->release(l.id).ok()) ++released;
  }
  spdlog::warn("trainer: {} worker(s) silent for over {} ms ({}); {} leases go back to the queue",
               silent.size(), options_.worker_timeout_ms, absl::StrJoin(silent, ", "), released);
  return static_cast<int>(silent.size());
}

WorkerPresence TrainerService::presence() const {
  std::lock_guard<std::mutex> lock(mu_);
  return presence_;
}

Status TrainerService::check_workers_present() const {
  return check_worker_presence(presence(), options_.now_ms(), options_.worker_timeout_ms);
}

grpc::Service* TrainerService::worker_service() { return worker_impl_.get(); }
grpc::Service* TrainerService::admin_service() { return admin_impl_.get(); }

std::vector<WorkerInfo> TrainerService::workers() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<WorkerInfo> out;
  for (const auto& [id, w] : workers_) out.push_back(w);
  return out;
}

}  // namespace relay::comm
