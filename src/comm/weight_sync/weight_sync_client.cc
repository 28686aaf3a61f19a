// A worker's side of the weight sync: joining, following regroups, and
// receiving one version (protocol in include/relay/comm/weight_sync/weight_sync.h).

#include "relay/comm/weight_sync/weight_sync.h"

#include <spdlog/spdlog.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <array>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "comm/weight_sync/sync_group.h"
#include "relay/comm/weight_sync/weight_buckets.h"

namespace relay::comm {

using internal::gen_key;
using internal::kClosed;
using internal::SyncBroadcast;
using internal::SyncGroup;
using internal::SyncStore;
using Clock = std::chrono::steady_clock;

Status validate(const WeightSyncClientOptions& o) {
  RELAY_RETURN_IF_ERROR(internal::parse_endpoint(o.endpoint).status());
  if (o.member_name.empty() || o.member_name.find('\n') != std::string::npos) {
    return InvalidArgumentError(
        "weight sync client: member_name: must be one non-empty line, got '" + o.member_name + "'");
  }
  if (o.timeout.count() <= 0) {
    return InvalidArgumentError("weight sync client: timeout: must be > 0");
  }
  if (o.poll_interval.count() <= 0) {
    return InvalidArgumentError("weight sync client: poll_interval: must be > 0");
  }
  return internal::backend_for(o.device, "weight sync client: device").status();
}

class WeightSyncClient::Impl {
 public:
  enum class State { kDetached, kJoining, kMember };

  WeightSyncClientOptions options;
  std::string host;
  int port = 0;
  std::unique_ptr<SyncStore> store;
  State state = State::kDetached;
  int64_t id = 0;   // our latest join request
  int64_t gen = 0;  // while a member
  int rank = 0;
  int64_t done = 0;  // broadcasts of gen received
  std::unique_ptr<SyncGroup> group;
  // The last version's payload: received into again once the caller has
  // dropped that version's tensors (VersionAssembler::create).
  at::Tensor payload;

  std::string who() const { return absl::StrCat(options.member_name, " (rank ", rank, ")"); }

  Status join() {
    RELAY_ASSIGN_OR_RETURN(id, store->add(internal::kRequestCountKey, 1));
    RELAY_RETURN_IF_ERROR(store->set(internal::request_key(id), "join " + options.member_name));
    state = State::kJoining;
    return OkStatus();
  }

  void leave() {
    if (state != State::kDetached) {
      StatusOr<int64_t> req = store->add(internal::kRequestCountKey, 1);
      if (req.ok()) (void)store->set(internal::request_key(*req), absl::StrCat("leave ", id));
    }
    group.reset();
    state = State::kDetached;
  }

  // Leaves the group after a failure, closing the generation so the trainer
  // and the other members stop using it. Returns Unavailable.
  Status detach(const Status& why) {
    if (state == State::kMember) {
      (void)internal::close_generation(*store, gen,
                                       absl::StrCat("broken ", who(), ": ", why.message()));
    }
    group.reset();
    state = State::kDetached;
    return UnavailableError(std::string(why.message()));
  }

  Status enter(int64_t g);
  StatusOr<ReceivedVersion> receive(const std::function<bool()>& stop);
  StatusOr<ReceivedVersion> receive_one();

  // The steps of receive_one, in broadcast order. Each returns a transport
  // failure only after detaching (the group is then unusable); bad data is
  // kept in the Receipt instead, so the remaining collectives are still
  // joined and the group stays usable.
  struct Receipt {
    std::unique_ptr<VersionAssembler> assembler;  // null when the manifest is bad
    Status bad;                                   // the first data error
  };
  Status receive_into(at::Tensor& host, const std::string& label);
  StatusOr<SyncHeader> receive_header(const std::string& what);
  StatusOr<Receipt> receive_manifest(const SyncHeader& h, const std::string& what);
  Status receive_buckets(const SyncHeader& h, const std::string& what, Receipt& r);
  StatusOr<ReceivedVersion> assemble(const SyncHeader& h, Receipt& r);
};

// Becomes rank r of generation g, r from its member list.
Status WeightSyncClient::Impl::enter(int64_t g) {
  group.reset();
  state = State::kDetached;
  const std::string what = absl::StrCat("weight sync generation ", g, ": ", options.member_name);
  RELAY_ASSIGN_OR_RETURN(std::optional<std::string> list, store->get_if_set(gen_key(g, "members")));
  int found = 0, size = 1;
  for (absl::string_view line : absl::StrSplit(list.value_or(""), '\n', absl::SkipEmpty())) {
    int64_t member = 0;
    ++size;
    if (absl::SimpleAtoi(line.substr(0, line.find(' ')), &member) && member == id) found = size - 1;
  }
  if (found == 0) return UnavailableError(what + ": not a member of it; rejoin");
  RELAY_ASSIGN_OR_RETURN(int64_t closed, store->add(gen_key(g, "state"), 0));
  if (closed >= kClosed) return UnavailableError(what + ": closed before this member arrived");

  internal::SyncGroupOptions go;
  go.store_host = host;
  go.store_port = port;
  go.generation = g;
  go.rank = found;
  go.size = size;
  go.bind_host = options.bind_host;
  go.timeout = options.timeout;
  go.device = options.device;
  gen = g;
  rank = found;
  done = 0;
  state = State::kMember;
  StatusOr<std::unique_ptr<SyncGroup>> created = SyncGroup::create(go);
  if (!created.ok()) return detach(created.status());
  group = std::move(created).value();
  spdlog::info("weight sync: {} is rank {} of {} in generation {}", options.member_name, rank, size,
               g);
  return OkStatus();
}

// One broadcast into `host`, through a device buffer when the group is not on
// the CPU.
Status WeightSyncClient::Impl::receive_into(at::Tensor& host, const std::string& label) {
  at::Tensor wire = group->on_wire(host, false);
  RELAY_ASSIGN_OR_RETURN(auto op, group->start(wire, label));
  RELAY_RETURN_IF_ERROR(op->wait());
  group->to_host(wire, host);
  return OkStatus();
}

// Without a header the rest cannot be followed, so any failure here leaves
// the group.
StatusOr<SyncHeader> WeightSyncClient::Impl::receive_header(const std::string& what) {
  at::Tensor words = torch::zeros({kSyncHeaderWords}, torch::kInt64);
  if (Status s = receive_into(words, what + ": header"); !s.ok()) return detach(s);
  StatusOr<SyncHeader> header = decode_header(words.data_ptr<int64_t>());
  if (header.ok() && (header->generation != gen || header->seq != done)) {
    header = DataLossError(absl::StrCat("header of generation ", header->generation, " broadcast ",
                                        header->seq, ", expected broadcast ", done));
  }
  if (!header.ok()) {
    return detach(
        Status(header.status().code(), what + ": " + std::string(header.status().message())));
  }
  ++done;
  return header;
}

// The manifest and the block checksums, and an assembler that receives into
// the last version's payload when the caller has let go of it.
StatusOr<WeightSyncClient::Impl::Receipt> WeightSyncClient::Impl::receive_manifest(
    const SyncHeader& h, const std::string& what) {
  at::Tensor meta = torch::empty({static_cast<int64_t>(h.manifest_bytes)}, torch::kUInt8);
  if (Status s = receive_into(meta, what + ": manifest"); !s.ok()) return detach(s);
  std::vector<uint64_t> sums(h.block_count());
  if (!sums.empty()) {
    at::Tensor t =
        torch::from_blob(sums.data(), {static_cast<int64_t>(sums.size())}, torch::kInt64);
    if (Status s = receive_into(t, what + ": checksums"); !s.ok()) return detach(s);
  }
  Receipt r;
  StatusOr<model::WeightManifest> manifest =
      decode_manifest(std::string(static_cast<const char*>(meta.data_ptr()), h.manifest_bytes), h);
  if (manifest.ok()) {
    if (Status s = check_block_checksums(h, sums); !s.ok()) manifest = s;
  }
  StatusOr<std::unique_ptr<VersionAssembler>> a =
      manifest.ok() ? VersionAssembler::create(*std::move(manifest), h.bucket_bytes, h.block_bytes,
                                               std::move(sums), std::move(payload))
                    : StatusOr<std::unique_ptr<VersionAssembler>>(manifest.status());
  payload = at::Tensor();
  if (a.ok()) {
    r.assembler = std::move(a).value();
  } else {
    r.bad = DataLossError(std::string(a.status().message()));
  }
  return r;
}

Status WeightSyncClient::Impl::receive_buckets(const SyncHeader& h, const std::string& what,
                                               Receipt& r) {
  // Buckets land in the payload itself (through a device buffer with NCCL);
  // with a bad manifest they are received into a scratch buffer and dropped.
  at::Tensor scratch;
  auto target = [&](uint64_t k) -> at::Tensor {
    if (r.assembler) return r.assembler->bucket(k);
    if (!scratch.defined()) {
      scratch = torch::empty({static_cast<int64_t>(std::min(h.bucket_bytes, h.total_bytes))},
                             torch::kUInt8);
    }
    return scratch.narrow(
        0, 0, static_cast<int64_t>(std::min(h.bucket_bytes, h.total_bytes - k * h.bucket_bytes)));
  };
  struct InFlight {
    at::Tensor host, wire;
    std::unique_ptr<SyncBroadcast> op;
  };
  std::array<InFlight, 2> in_flight;
  auto post = [&](uint64_t k) -> Status {
    InFlight& f = in_flight[k % 2];
    f.host = target(k);
    f.wire = group->on_wire(f.host, false);
    RELAY_ASSIGN_OR_RETURN(
        f.op, group->start(f.wire, absl::StrCat(what, ": bucket ", k, " of ", h.bucket_count)));
    return OkStatus();
  };
  // Two in flight; without an assembler both share the scratch buffer, which
  // is harmless: its bytes are never read.
  for (uint64_t k = 0; k < std::min<uint64_t>(2, h.bucket_count); ++k) {
    if (Status s = post(k); !s.ok()) return detach(s);
  }
  for (uint64_t k = 0; k < h.bucket_count; ++k) {
    InFlight& f = in_flight[k % 2];
    if (Status s = f.op->wait(); !s.ok()) return detach(s);
    group->to_host(f.wire, f.host);
    if (r.bad.ok()) r.bad = r.assembler->add_bucket(k);
    if (k + 2 < h.bucket_count) {
      if (Status s = post(k + 2); !s.ok()) return detach(s);
    }
  }
  return OkStatus();
}

// Checks the received bytes and keeps the payload for the next version to
// receive into, whether or not they match.
StatusOr<ReceivedVersion> WeightSyncClient::Impl::assemble(const SyncHeader& h, Receipt& r) {
  StatusOr<std::unordered_map<std::string, at::Tensor>> tensors = r.assembler->finish();
  payload = r.assembler->payload();
  if (!tensors.ok()) return tensors.status();
  ReceivedVersion out;
  out.version = h.version;
  out.manifest = r.assembler->manifest();
  out.tensors = std::move(tensors).value();
  if (!group->device().is_cpu()) {
    for (auto& [name, t] : out.tensors) t = t.to(group->device());
  }
  out.bytes = h.total_bytes;
  out.generation = gen;
  return out;
}

StatusOr<ReceivedVersion> WeightSyncClient::Impl::receive_one() {
  const auto start = Clock::now();
  const std::string what = absl::StrCat("weight sync generation ", gen, ": ", who());
  RELAY_ASSIGN_OR_RETURN(const SyncHeader h, receive_header(what));
  RELAY_ASSIGN_OR_RETURN(Receipt r, receive_manifest(h, what));
  RELAY_RETURN_IF_ERROR(receive_buckets(h, what, r));
  if (!r.bad.ok()) {
    // Keep the payload for the next version, as assemble() does.
    if (r.assembler) payload = r.assembler->payload();
    return r.bad;
  }
  RELAY_ASSIGN_OR_RETURN(ReceivedVersion out, assemble(h, r));
  out.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return out;
}

WeightSyncClient::WeightSyncClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

WeightSyncClient::~WeightSyncClient() { impl_->leave(); }

StatusOr<std::unique_ptr<WeightSyncClient>> WeightSyncClient::connect(
    const WeightSyncClientOptions& options) {
  RELAY_RETURN_IF_ERROR(validate(options));
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  RELAY_ASSIGN_OR_RETURN(std::tie(impl->host, impl->port),
                         internal::parse_endpoint(options.endpoint));
  if (impl->options.bind_host.empty()) {
    const bool loopback = impl->host == "localhost" || absl::StartsWith(impl->host, "127.");
    // Empty: Gloo's default device (the address this host's name resolves to).
    impl->options.bind_host = loopback ? "127.0.0.1" : "";
  }
  RELAY_ASSIGN_OR_RETURN(impl->store,
                         SyncStore::connect(impl->host, impl->port, options.timeout, false));
  RELAY_ASSIGN_OR_RETURN(std::string mine,
                         internal::backend_for(options.device, "weight sync client: device"));
  RELAY_ASSIGN_OR_RETURN(std::optional<std::string> theirs,
                         impl->store->get_if_set(internal::kBackendKey));
  if (theirs != mine) {
    return FailedPreconditionError(absl::StrCat(
        "weight sync ", options.endpoint, ": the trainer sends with ", theirs.value_or("nothing"),
        ", device '", options.device, "' receives with ", mine));
  }
  RELAY_RETURN_IF_ERROR(impl->join());
  return std::unique_ptr<WeightSyncClient>(new WeightSyncClient(std::move(impl)));
}

StatusOr<ReceivedVersion> WeightSyncClient::receive(const std::function<bool()>& stop) {
  StatusOr<ReceivedVersion> r = impl_->receive(stop);
  if (r.status().code() == absl::StatusCode::kUnavailable) {
    // The store is gone or the group broke: either way this worker is out.
    impl_->group.reset();
    impl_->state = Impl::State::kDetached;
  }
  return r;
}

StatusOr<ReceivedVersion> WeightSyncClient::Impl::receive(const std::function<bool()>& stop) {
  Impl& c = *this;
  // Polls the store, backing off from 1 ms to poll_interval: there is no
  // event to wait on, because c10d 1.13's TCPStore::wait leaves its
  // connection out of step when it times out (weight_sync.h, "Waiting").
  auto wait = std::chrono::milliseconds(1);
  auto idle = [&] {
    std::this_thread::sleep_for(wait);
    wait = std::min(wait * 2, c.options.poll_interval);
  };
  while (true) {
    if (stop && stop()) return CancelledError("weight sync: receive stopped");
    switch (c.state) {
      case Impl::State::kDetached:
        return FailedPreconditionError("weight sync: not in a group; call rejoin()");
      case Impl::State::kJoining: {
        RELAY_ASSIGN_OR_RETURN(std::optional<std::string> placed,
                               c.store->get_if_set(internal::placement_key(c.id)));
        int64_t g = 0;
        if (!placed || !absl::SimpleAtoi(*placed, &g)) {
          idle();
          break;
        }
        RELAY_RETURN_IF_ERROR(c.enter(g));
        break;
      }
      case Impl::State::kMember: {
        RELAY_ASSIGN_OR_RETURN(int64_t state, c.store->add(gen_key(c.gen, "state"), 0));
        const int64_t announced = state % kClosed;
        std::string end;
        if (state >= kClosed) {
          RELAY_ASSIGN_OR_RETURN(std::optional<std::string> e,
                                 c.store->get_if_set(gen_key(c.gen, "end")));
          end = e.value_or("closed");
        }
        const bool regroup = absl::StartsWith(end, "regroup ");
        if (!end.empty() && !regroup) {
          c.group.reset();
          c.state = Impl::State::kDetached;
          return UnavailableError(absl::StrCat("weight sync generation ", c.gen, " ended: ", end));
        }
        if (announced > c.done) return c.receive_one();
        if (regroup) {
          RELAY_RETURN_IF_ERROR(c.enter(c.gen + 1));
          break;
        }
        idle();
        break;
      }
    }
  }
}

Status WeightSyncClient::rejoin() {
  impl_->leave();
  return impl_->join();
}

int64_t WeightSyncClient::generation() const {
  return impl_->state == Impl::State::kMember ? impl_->gen : 0;
}

}  // namespace relay::comm
