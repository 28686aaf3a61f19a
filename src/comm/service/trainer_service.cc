#include "relay/comm/service/trainer_service.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "comm/rpc/submit_stream.h"
#include "comm/rpc/weight_chunk_wire.h"
#include "relay/comm/rpc/manifest_proto.h"
#include "relay/common/xxh3.h"
#include "relay/v1/admin.grpc.pb.h"
#include "relay/v1/worker.grpc.pb.h"

namespace relay::comm {
namespace {

grpc::Status to_grpc(const Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

// The handler's answer in `out`, or its error as the call's status.
template <typename T>
grpc::Status reply(StatusOr<T> answer, T* out) {
  if (!answer.ok()) return to_grpc(answer.status());
  *out = *std::move(answer);
  return grpc::Status::OK;
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
  explicit WorkerImpl(TrainerHandlers* h) : h_(h) {
    // Method 3 of relay.v1.Worker is SubmitGroups (proto order); the
    // malformed-bytes test fails if that ever changes.
    MarkMethodStreamed(
        3, new grpc::internal::BidiStreamingHandler<WorkerImpl, grpc::ByteBuffer, grpc::ByteBuffer>(
               [](WorkerImpl* self, grpc::ServerContext* context,
                  grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>* stream) {
                 return self->SubmitGroupsRaw(context, stream);
               },
               this));
    // Method 6 is FetchWeights; every fetch test fails if that changes.
    MarkMethodStreamed(
        6,
        new grpc::internal::SplitServerStreamingHandler<v1::FetchWeightsRequest, grpc::ByteBuffer>(
            [this](grpc::ServerContext* context,
                   grpc::ServerSplitStreamer<v1::FetchWeightsRequest, grpc::ByteBuffer>* stream) {
              return FetchWeightsRaw(context, stream);
            }));
  }

  grpc::Status RegisterWorker(grpc::ServerContext* context, const v1::RegisterWorkerRequest* req,
                              v1::RegisterWorkerResponse* resp) override {
    if (grpc::Status a = authorize(context, token()); !a.ok()) return a;
    return reply(h_->register_worker(*req), resp);
  }

  grpc::Status Heartbeat(grpc::ServerContext* context, const v1::HeartbeatRequest* req,
                         v1::HeartbeatResponse* resp) override {
    if (grpc::Status a = authorize(context, token()); !a.ok()) return a;
    return reply(h_->heartbeat(*req), resp);
  }

  grpc::Status LeasePrompts(grpc::ServerContext* context, const v1::LeasePromptsRequest* req,
                            v1::LeasePromptsResponse* resp) override {
    if (grpc::Status a = authorize(context, token()); !a.ok()) return a;
    return reply(h_->lease_prompts(*req), resp);
  }

  grpc::Status ReleaseLeases(grpc::ServerContext* context, const v1::ReleaseLeasesRequest* req,
                             v1::ReleaseLeasesResponse* resp) override {
    if (grpc::Status a = authorize(context, token()); !a.ok()) return a;
    return reply(h_->release_leases(*req), resp);
  }

  // SubmitGroups as raw bytes (installed in the constructor): a message that
  // does not parse ends the stream with INVALID_ARGUMENT instead of looking
  // like the client's half-close (the typed reader cannot tell them apart).
  // A client that sends ahead of its acks (comm/rpc/submit_stream.h) is
  // read ahead of them; any other one group at a time.
  grpc::Status SubmitGroupsRaw(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>* stream) {
    if (grpc::Status a = authorize(context, token()); !a.ok()) return a;
    if (context->client_metadata().count(kSubmitAheadMetadata) != 0) {
      return submit_ahead(stream);
    }
    grpc::ByteBuffer in;
    for (int64_t n = 0; stream->Read(&in); ++n) {
      v1::SubmitGroupRequest req;
      if (!parse_submission(in, &req)) return unparsable(n);
      if (!write_ack(h_->submit_group(req), stream)) break;
    }
    return grpc::Status::OK;
  }

  // Up to kSubmitWindow groups of the stream in flight: this thread reads,
  // checks and queues each group's durable write while another writes the
  // acks in order, each once its group is durable (invariant 7), so the
  // stream's groups share store writes.
  grpc::Status submit_ahead(grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>* stream) {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<TrainerHandlers::PendingSubmit> pending;  // guarded by mu
    bool reading = true;                                 // guarded by mu
    bool writable = true;                                // guarded by mu
    std::thread acker([&] {
      std::unique_lock<std::mutex> lock(mu);
      while (true) {
        cv.wait(lock, [&] { return !pending.empty() || !reading; });
        if (pending.empty()) return;
        TrainerHandlers::PendingSubmit p = std::move(pending.front());
        pending.pop_front();
        const bool send = writable;
        lock.unlock();
        cv.notify_all();  // room in the window
        // Finished whether or not its ack can be sent: the write is queued.
        const v1::SubmitGroupAck ack = h_->finish_submit_group(p);
        const bool sent = send && write_ack(ack, stream);
        lock.lock();
        if (!sent) writable = false;  // the client is gone; the rest are not acked
      }
    });
    grpc::Status result = grpc::Status::OK;
    grpc::ByteBuffer in;
    for (int64_t n = 0; stream->Read(&in); ++n) {
      v1::SubmitGroupRequest req;
      if (!parse_submission(in, &req)) {
        result = unparsable(n);
        break;
      }
      TrainerHandlers::PendingSubmit p = h_->begin_submit_group(req);
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return pending.size() < kSubmitWindow || !writable; });
      if (!writable) break;  // p's write is waited for as it goes out of scope
      pending.push_back(std::move(p));
      lock.unlock();
      cv.notify_all();
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      reading = false;
    }
    cv.notify_all();
    acker.join();  // every group read is acked (or its client is gone) first
    return result;
  }

  static bool parse_submission(grpc::ByteBuffer& in, v1::SubmitGroupRequest* req) {
    return grpc::SerializationTraits<v1::SubmitGroupRequest>::Deserialize(&in, req).ok();
  }
  static grpc::Status unparsable(int64_t n) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("SubmitGroups message ", n,
                                     ": does not parse as relay.v1.SubmitGroupRequest; "
                                     "the groups before it were acknowledged"));
  }
  static bool write_ack(const v1::SubmitGroupAck& ack,
                        grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>* stream) {
    grpc::ByteBuffer out;
    bool own = false;
    return grpc::SerializationTraits<v1::SubmitGroupAck>::Serialize(ack, &out, &own).ok() &&
           stream->Write(out);
  }

  grpc::Status WatchVersions(grpc::ServerContext* context, const v1::WatchVersionsRequest* req,
                             grpc::ServerWriter<v1::VersionAnnouncement>* writer) override {
    if (grpc::Status a = authorize(context, token()); !a.ok()) return a;
    WeightPublisher* publisher = h_->publisher();
    int64_t after = req->after_version();
    while (!context->IsCancelled()) {
      const int64_t v = publisher->wait_for_version(
          after, std::chrono::milliseconds(h_->options().watch_poll_ms));
      if (v <= after) continue;
      StatusOr<std::shared_ptr<const WeightSnapshot>> snap = publisher->snapshot(v);
      if (!snap.ok()) continue;
      v1::VersionAnnouncement a;
      a.set_version(v);
      to_proto((*snap)->manifest, a.mutable_manifest());
      a.set_broadcast(!h_->options().weight_sync_endpoint.empty());
      if (!writer->Write(a)) break;
      after = v;
    }
    return grpc::Status::OK;
  }

  // FetchWeights with each chunk's bytes sent from the snapshot itself
  // (installed in the constructor; weight_chunk_wire.h).
  grpc::Status FetchWeightsRaw(
      grpc::ServerContext* context,
      grpc::ServerSplitStreamer<v1::FetchWeightsRequest, grpc::ByteBuffer>* stream) {
    if (grpc::Status a = authorize(context, token()); !a.ok()) return a;
    v1::FetchWeightsRequest req;
    if (!stream->Read(&req)) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "FetchWeights: no request, or one that does not parse as "
                          "relay.v1.FetchWeightsRequest");
    }
    StatusOr<std::shared_ptr<const WeightSnapshot>> snap = h_->publisher()->snapshot(req.version());
    if (!snap.ok()) return to_grpc(snap.status());
    const uint64_t chunk =
        req.chunk_bytes() > 0 ? req.chunk_bytes() : h_->options().default_chunk_bytes;
    v1::WeightManifest manifest;
    to_proto((*snap)->manifest, &manifest);
    bool first = true, ok = true;
    for_each_chunk(**snap, chunk, [&](uint64_t offset, const char* data, uint64_t size) {
      // A worker downloading is alive: a 2 GB version can take longer than
      // services.worker_timeout_s while the trainer is busy stepping.
      h_->touch(req.worker_id());
      const grpc::ByteBuffer message = weight_chunk_message(first ? &manifest : nullptr, offset,
                                                            xxh3_64(data, size), data, size, *snap);
      first = false;
      ok = !context->IsCancelled() && stream->Write(message);
      return ok;
    });
    if (first) {  // no bytes at all: still send the manifest
      stream->Write(weight_chunk_message(&manifest, 0, xxh3_64(nullptr, 0), nullptr, 0, nullptr));
    }
    if (!ok) return grpc::Status(grpc::StatusCode::CANCELLED, "fetch cancelled");
    return grpc::Status::OK;
  }

 private:
  const std::string& token() const { return h_->options().auth_token; }

  TrainerHandlers* h_;
};

class TrainerService::AdminImpl final : public v1::Admin::Service {
 public:
  explicit AdminImpl(TrainerHandlers* h) : h_(h) {}

  grpc::Status Health(grpc::ServerContext* context, const v1::HealthRequest*,
                      v1::HealthResponse* resp) override {
    if (grpc::Status a = authorize(context, h_->options().auth_token); !a.ok()) return a;
    *resp = h_->health();
    return grpc::Status::OK;
  }

  grpc::Status Stats(grpc::ServerContext* context, const v1::StatsRequest*,
                     v1::StatsResponse* resp) override {
    if (grpc::Status a = authorize(context, h_->options().auth_token); !a.ok()) return a;
    return reply(h_->stats(), resp);
  }

 private:
  TrainerHandlers* h_;
};

TrainerService::TrainerService(TrainerServiceOptions options, store::RolloutStore* store,
                               store::PromptDispenser* dispenser, WeightPublisher* publisher,
                               PromptSource prompts, std::function<int64_t()> version)
    : handlers_(std::move(options), store, dispenser, publisher, std::move(prompts),
                std::move(version)),
      worker_impl_(std::make_unique<WorkerImpl>(&handlers_)),
      admin_impl_(std::make_unique<AdminImpl>(&handlers_)) {}

TrainerService::~TrainerService() = default;

grpc::Service* TrainerService::worker_service() { return worker_impl_.get(); }
grpc::Service* TrainerService::admin_service() { return admin_impl_.get(); }

}  // namespace relay::comm
