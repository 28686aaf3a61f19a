#include "relay/comm/rpc/grpc_trainer_client.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "comm/rpc/submit_stream.h"
#include "comm/rpc/tls.h"
#include "comm/rpc/weight_chunk_wire.h"
#include "relay/comm/rpc/manifest_proto.h"
#include "relay/comm/weight_sync/weight_publisher.h"
#include "relay/common/xxh3.h"
#include "relay/store/convert.h"
#include "relay/v1/admin.grpc.pb.h"
#include "relay/v1/worker.grpc.pb.h"

namespace relay::comm {
namespace {

Status from_grpc(const char* call, const grpc::Status& s) {
  if (s.ok()) return OkStatus();
  return Status(static_cast<absl::StatusCode>(s.error_code()),
                absl::StrCat(call, ": ", s.error_message()));
}

// Cancels a stream that receives nothing for `idle`. A weight transfer is
// bounded by silence, not by its length: a 2 GB version on a slow link (or a
// 2-core machine) is not cut off half-way by a deadline sized for small
// calls, and a trainer that stops sending is still noticed within `idle`.
class StallWatchdog {
 public:
  StallWatchdog(grpc::ClientContext* context, std::chrono::milliseconds idle)
      : context_(context), idle_(idle), last_(std::chrono::steady_clock::now()) {
    thread_ = std::thread([this] { watch(); });
  }
  ~StallWatchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void progress() {
    std::lock_guard<std::mutex> lock(mu_);
    last_ = std::chrono::steady_clock::now();
  }
  bool fired() const {
    std::lock_guard<std::mutex> lock(mu_);
    return fired_;
  }

 private:
  void watch() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      const auto deadline = last_ + idle_;
      // Progress moves the deadline; the wait re-arms at the old one.
      if (cv_.wait_until(lock, deadline, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
            return stop_ || last_ + idle_ > deadline;
          })) {
        continue;
      }
      fired_ = true;
      context_->TryCancel();
      return;
    }
  }

  grpc::ClientContext* context_;
  const std::chrono::milliseconds idle_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::chrono::steady_clock::time_point last_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool fired_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

bool same_weights(const model::WeightManifest& a, const model::WeightManifest& b) {
  if (a.digest != b.digest || a.tensors.size() != b.tensors.size()) return false;
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const model::TensorSpec &x = a.tensors[i], &y = b.tensors[i];
    if (x.name != y.name || x.shape != y.shape || x.dtype != y.dtype) return false;
  }
  return true;
}

}  // namespace

class GrpcTrainerClient::Impl {
 public:
  Impl(ClientOptions o, std::shared_ptr<grpc::Channel> channel)
      : options(std::move(o)),
        channel(channel),
        fetch_method(absl::StrCat("/", v1::Worker::service_full_name(), "/FetchWeights")),
        worker(v1::Worker::NewStub(channel)),
        admin(v1::Admin::NewStub(channel)) {}

  // The last fetched version's payload, received into again once the caller
  // has dropped that version's tensors (WeightAssembler::create): a worker
  // fetching every version does not fault in fresh pages for each.
  at::Tensor take_spare() {
    std::lock_guard<std::mutex> lock(spare_mu);
    return std::exchange(spare, at::Tensor());
  }
  void keep_spare(at::Tensor payload) {
    std::lock_guard<std::mutex> lock(spare_mu);
    spare = std::move(payload);
  }

  // A context with the token and a deadline `ms` from now.
  std::unique_ptr<grpc::ClientContext> context(int64_t ms) const {
    auto c = std::make_unique<grpc::ClientContext>();
    if (!options.auth_token.empty())
      c->AddMetadata("authorization", "Bearer " + options.auth_token);
    c->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(ms));
    return c;
  }
  // The same without a deadline, for a stream a StallWatchdog bounds.
  std::unique_ptr<grpc::ClientContext> stream_context() const {
    auto c = std::make_unique<grpc::ClientContext>();
    if (!options.auth_token.empty())
      c->AddMetadata("authorization", "Bearer " + options.auth_token);
    return c;
  }

  ClientOptions options;
  std::mutex spare_mu;
  at::Tensor spare;  // take_spare()
  std::shared_ptr<grpc::Channel> channel;
  std::string fetch_method;  // "/relay.v1.Worker/FetchWeights", for the raw call
  std::unique_ptr<v1::Worker::Stub> worker;
  std::unique_ptr<v1::Admin::Stub> admin;
};

GrpcTrainerClient::GrpcTrainerClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GrpcTrainerClient::~GrpcTrainerClient() = default;

StatusOr<std::unique_ptr<TrainerClient>> GrpcTrainerClient::connect(const ClientOptions& options) {
  if (options.address.empty()) return InvalidArgumentError("client: address is empty");
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (!options.tls.root_ca_file.empty()) {
    grpc::SslCredentialsOptions ssl;
    RELAY_ASSIGN_OR_RETURN(ssl.pem_root_certs,
                           read_pem(options.tls.root_ca_file, "tls root_ca_file"));
    RELAY_RETURN_IF_ERROR(
        check_certificates(options.tls.root_ca_file, ssl.pem_root_certs, "tls root_ca_file"));
    if (!options.tls.cert_file.empty()) {
      RELAY_ASSIGN_OR_RETURN(ssl.pem_cert_chain, read_pem(options.tls.cert_file, "tls cert_file"));
      RELAY_ASSIGN_OR_RETURN(ssl.pem_private_key, read_pem(options.tls.key_file, "tls key_file"));
      RELAY_RETURN_IF_ERROR(check_key_pair(options.tls.cert_file, ssl.pem_cert_chain,
                                           options.tls.key_file, ssl.pem_private_key));
    }
    creds = grpc::SslCredentials(ssl);
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  args.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
  // gRPC backs off reconnects up to 2 minutes by default; a worker waiting
  // for a restarting trainer should find it within a couple of seconds.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  auto channel = grpc::CreateCustomChannel(options.address, creds, args);
  return std::unique_ptr<TrainerClient>(
      new GrpcTrainerClient(std::make_unique<Impl>(options, std::move(channel))));
}

StatusOr<v1::RegisterWorkerResponse> GrpcTrainerClient::register_worker(
    const std::string& name, const v1::WorkerCapabilities& caps) {
  v1::RegisterWorkerRequest req;
  req.set_worker_name(name);
  *req.mutable_capabilities() = caps;
  v1::RegisterWorkerResponse resp;
  auto c = impl_->context(impl_->options.timeout_ms);
  RELAY_RETURN_IF_ERROR(
      from_grpc("RegisterWorker", impl_->worker->RegisterWorker(c.get(), req, &resp)));
  return resp;
}

StatusOr<v1::HeartbeatResponse> GrpcTrainerClient::heartbeat(const v1::HeartbeatRequest& req) {
  v1::HeartbeatResponse resp;
  auto c = impl_->context(impl_->options.timeout_ms);
  RELAY_RETURN_IF_ERROR(from_grpc("Heartbeat", impl_->worker->Heartbeat(c.get(), req, &resp)));
  return resp;
}

StatusOr<v1::LeasePromptsResponse> GrpcTrainerClient::lease_prompts(const std::string& worker_id,
                                                                    int max_prompts) {
  v1::LeasePromptsRequest req;
  req.set_worker_id(worker_id);
  req.set_max_prompts(max_prompts);
  v1::LeasePromptsResponse resp;
  auto c = impl_->context(impl_->options.timeout_ms);
  RELAY_RETURN_IF_ERROR(
      from_grpc("LeasePrompts", impl_->worker->LeasePrompts(c.get(), req, &resp)));
  return resp;
}

StatusOr<int32_t> GrpcTrainerClient::release_leases(const std::string& worker_id,
                                                    const std::vector<uint64_t>& lease_ids) {
  v1::ReleaseLeasesRequest req;
  req.set_worker_id(worker_id);
  req.mutable_lease_ids()->Add(lease_ids.begin(), lease_ids.end());
  v1::ReleaseLeasesResponse resp;
  auto c = impl_->context(impl_->options.timeout_ms);
  RELAY_RETURN_IF_ERROR(
      from_grpc("ReleaseLeases", impl_->worker->ReleaseLeases(c.get(), req, &resp)));
  return resp.released();
}

StatusOr<std::vector<v1::SubmitGroupAck>> GrpcTrainerClient::submit_groups(
    const std::string& worker_id,
    const std::vector<std::pair<uint64_t, rollout::TrajectoryGroup>>& groups) {
  auto c = impl_->context(impl_->options.timeout_ms);
  // Several groups go out ahead of their acks, at most kSubmitWindow
  // unacknowledged, so the trainer can make them durable in one write
  // (comm/rpc/submit_stream.h); a single group is sent the plain way.
  if (groups.size() > 1) c->AddMetadata(kSubmitAheadMetadata, "1");
  auto stream = impl_->worker->SubmitGroups(c.get());
  std::vector<v1::SubmitGroupAck> acks;
  auto read_ack = [&] {
    v1::SubmitGroupAck ack;
    if (!stream->Read(&ack)) return false;
    acks.push_back(std::move(ack));
    return true;
  };
  bool open = true;
  for (size_t i = 0; i < groups.size() && open; ++i) {
    v1::SubmitGroupRequest req;
    req.set_worker_id(worker_id);
    req.set_lease_id(groups[i].first);
    store::to_proto(groups[i].second, req.mutable_group());
    open = stream->Write(req);
    if (open && i + 1 - acks.size() >= kSubmitWindow) open = read_ack();
  }
  stream->WritesDone();
  while (open && acks.size() < groups.size()) open = read_ack();
  RELAY_RETURN_IF_ERROR(from_grpc("SubmitGroups", stream->Finish()));
  if (acks.size() != groups.size()) {
    return UnavailableError(absl::StrCat("SubmitGroups: the stream ended after ", acks.size(),
                                         " of ", groups.size(), " acks"));
  }
  return acks;
}

StatusOr<FetchedWeights> GrpcTrainerClient::fetch_weights(const std::string& worker_id,
                                                          int64_t version, uint64_t chunk_bytes,
                                                          const model::WeightManifest* held,
                                                          FetchCancel* cancel) {
  v1::FetchWeightsRequest req;
  req.set_worker_id(worker_id);
  req.set_version(version);
  req.set_chunk_bytes(chunk_bytes);
  auto c = impl_->stream_context();
  const std::chrono::milliseconds idle(impl_->options.timeout_ms);
  StallWatchdog watchdog(c.get(), idle);
  if (cancel != nullptr && !cancel->arm([ctx = c.get()] { ctx->TryCancel(); })) {
    return CancelledError("FetchWeights: cancelled");
  }
  // Disarmed before the context goes (declared after it: destroyed first).
  struct Disarm {
    FetchCancel* cancel;
    ~Disarm() {
      if (cancel != nullptr) cancel->clear();
    }
  } disarm{cancel};
  // The raw method (weight_chunk_wire.h): chunks are read straight from the
  // slices they arrive in, not parsed into a copy first.
  const grpc::internal::RpcMethod method(impl_->fetch_method.c_str(),
                                         grpc::internal::RpcMethod::SERVER_STREAMING);
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
      grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(impl_->channel.get(), method,
                                                                    c.get(), req));
  grpc::ByteBuffer message;
  std::vector<grpc::Slice> slices;
  FetchedWeights out;
  std::optional<WeightAssembler> assembler;
  Xxh3Stream digest;  // of one chunk
  auto fail = [&](Status s) {
    c->TryCancel();
    return s;
  };
  while (reader->Read(&message)) {
    watchdog.progress();
    slices.clear();
    if (!message.Dump(&slices).ok()) {
      return fail(DataLossError("FetchWeights: a chunk's bytes could not be read"));
    }
    StatusOr<WeightChunkView> chunk = read_weight_chunk(slices);
    if (!chunk.ok())
      return fail(DataLossError(absl::StrCat("FetchWeights: ", chunk.status().message())));
    if (!assembler) {
      if (!chunk->manifest) {
        return fail(DataLossError("FetchWeights: the first chunk has no manifest"));
      }
      model::WeightManifest m = from_proto(*chunk->manifest);
      if (held != nullptr && same_weights(m, *held)) {
        // The worker already holds these bytes (it loaded the same model
        // directory): the rest of the stream is not needed.
        c->TryCancel();
        out.manifest = std::move(m);
        out.already_held = true;
        return out;
      }
      StatusOr<WeightAssembler> a = WeightAssembler::create(std::move(m), impl_->take_spare());
      if (!a.ok()) return fail(a.status());
      assembler.emplace(*std::move(a));
    }
    // Copied into the version's payload span by span, hashed on the way;
    // a chunk that fails its digest fails the whole fetch (the caller
    // fetches again), so the bytes it left in the payload are never used.
    digest.reset();
    uint64_t offset = chunk->offset;
    for (const auto& [data, size] : chunk->data) {
      digest.update(data, size);
      if (Status s = assembler->add(offset, data, size); !s.ok()) {
        return fail(DataLossError(absl::StrCat("FetchWeights: ", s.message())));
      }
      offset += size;
    }
    if (digest.digest() != chunk->chunk_digest) {
      return fail(DataLossError(
          absl::StrCat("FetchWeights: chunk at offset ", chunk->offset, " fails its digest")));
    }
  }
  const grpc::Status finished = reader->Finish();
  if (watchdog.fired()) {
    return DeadlineExceededError(absl::StrCat(
        "FetchWeights: nothing arrived from the trainer for ", idle.count() / 1000.0,
        " s (services.rpc_timeout_s) after ", assembler ? assembler->received_bytes() : 0, " of ",
        assembler ? std::to_string(assembler->total_bytes()) : std::string("?"), " bytes"));
  }
  if (cancel != nullptr && cancel->cancelled()) {
    return CancelledError(absl::StrCat("FetchWeights: cancelled after ",
                                       assembler ? assembler->received_bytes() : 0, " bytes"));
  }
  RELAY_RETURN_IF_ERROR(from_grpc("FetchWeights", finished));
  if (!assembler) return DataLossError("FetchWeights: no manifest received");
  out.manifest = assembler->manifest();
  StatusOr<std::unordered_map<std::string, at::Tensor>> tensors = assembler->finish();
  impl_->keep_spare(assembler->payload());
  RELAY_ASSIGN_OR_RETURN(out.tensors, std::move(tensors));
  return out;
}

StatusOr<std::optional<v1::VersionAnnouncement>> GrpcTrainerClient::next_version(
    const std::string& worker_id, int64_t after_version, int64_t wait_ms) {
  v1::WatchVersionsRequest req;
  req.set_worker_id(worker_id);
  req.set_after_version(after_version);
  auto c = impl_->context(wait_ms);
  auto reader = impl_->worker->WatchVersions(c.get(), req);
  v1::VersionAnnouncement a;
  if (reader->Read(&a)) {
    c->TryCancel();
    reader->Finish();
    return std::optional<v1::VersionAnnouncement>(std::move(a));
  }
  grpc::Status s = reader->Finish();
  if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    return std::optional<v1::VersionAnnouncement>();
  }
  RELAY_RETURN_IF_ERROR(from_grpc("WatchVersions", s));
  return std::optional<v1::VersionAnnouncement>();
}

StatusOr<v1::StatsResponse> GrpcTrainerClient::stats() {
  v1::StatsRequest req;
  v1::StatsResponse resp;
  auto c = impl_->context(impl_->options.timeout_ms);
  RELAY_RETURN_IF_ERROR(from_grpc("Stats", impl_->admin->Stats(c.get(), req, &resp)));
  return resp;
}

}  // namespace relay::comm
