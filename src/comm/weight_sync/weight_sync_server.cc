// The trainer's side of the weight sync: requests, generations, and sending
// one version (protocol in include/relay/comm/weight_sync/weight_sync.h).

#include "relay/comm/weight_sync/weight_sync.h"

#include <spdlog/spdlog.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "comm/weight_sync/sync_group.h"
#include "relay/comm/weight_sync/weight_buckets.h"

namespace relay::comm {

using internal::close_generation;
using internal::gen_key;
using internal::kClosed;
using internal::SyncBroadcast;
using internal::SyncGroup;
using internal::SyncStore;
using Clock = std::chrono::steady_clock;

Status validate(const WeightSyncServerOptions& o) {
  if (o.host.empty()) return InvalidArgumentError("weight sync server: host: must not be empty");
  if (o.port < 0 || o.port > 65535) {
    return InvalidArgumentError(
        absl::StrCat("weight sync server: port: ", o.port, " out of range"));
  }
  if (o.bucket_bytes <= 0) {
    return InvalidArgumentError(
        absl::StrCat("weight sync server: bucket_bytes: must be > 0, got ", o.bucket_bytes));
  }
  if (o.timeout.count() <= 0) {
    return InvalidArgumentError("weight sync server: timeout: must be > 0");
  }
  return internal::backend_for(o.device, "weight sync server: device").status();
}

class WeightSyncServer::Impl {
 public:
  struct Member {
    int64_t id = 0;  // its join request
    std::string name;
  };

  WeightSyncServerOptions options;
  std::unique_ptr<SyncStore> store;
  int64_t gen = 0;
  std::vector<Member> members;   // of gen: rank i + 1
  std::vector<Member> joining;   // asked to join, not placed yet
  std::vector<int64_t> leaving;  // members that asked to leave
  int64_t requests_seen = 0;
  Clock::time_point stalled_since{};  // request requests_seen + 1 counted but not written
  int64_t announced = 0;              // broadcasts announced in gen
  std::unique_ptr<SyncGroup> group;

  Status read_requests();
  Status form_generation(int64_t version);
  Status send(const WeightSnapshot& snapshot);
  void drop_generation() {
    group.reset();
    members.clear();
    announced = 0;
  }
  std::string member_names() const {
    std::string s;
    for (const Member& m : members) absl::StrAppend(&s, s.empty() ? "" : ", ", m.name);
    return s;
  }
};

// New requests since the last call. A request whose counter was taken but
// whose key is not written yet is read next time, or skipped once it has been
// missing for a whole timeout (its worker died between add and set).
Status WeightSyncServer::Impl::read_requests() {
  RELAY_ASSIGN_OR_RETURN(int64_t count, store->add(internal::kRequestCountKey, 0));
  while (requests_seen < count) {
    const int64_t id = requests_seen + 1;
    RELAY_ASSIGN_OR_RETURN(std::optional<std::string> req,
                           store->get_if_set(internal::request_key(id)));
    if (!req) {
      const auto now = Clock::now();
      if (stalled_since == Clock::time_point{}) stalled_since = now;
      if (now - stalled_since < options.timeout) break;
      spdlog::warn("weight sync: request {} was never written; skipped", id);
      req = "";
    }
    stalled_since = Clock::time_point{};
    requests_seen = id;
    if (absl::StartsWith(*req, "join ")) {
      joining.push_back(Member{id, req->substr(5)});
    } else if (absl::StartsWith(*req, "leave ")) {
      int64_t who = 0;
      if (!absl::SimpleAtoi(req->substr(6), &who)) continue;
      auto same = [who](const Member& m) { return m.id == who; };
      const size_t before = joining.size();
      joining.erase(std::remove_if(joining.begin(), joining.end(), same), joining.end());
      if (joining.size() == before && std::any_of(members.begin(), members.end(), same)) {
        leaving.push_back(who);
      }
    }
  }
  return OkStatus();
}

// Closes the current generation with "regroup" (if it has one) and builds
// the next from its members that stay plus the joiners.
Status WeightSyncServer::Impl::form_generation(int64_t version) {
  std::vector<Member> next;
  for (const Member& m : members) {
    if (std::find(leaving.begin(), leaving.end(), m.id) == leaving.end()) next.push_back(m);
  }
  size_t carried = next.size();  // next[carried...] are the joiners
  next.insert(next.end(), joining.begin(), joining.end());
  joining.clear();
  leaving.clear();
  const int64_t previous = gen;
  const int64_t g = ++gen;

  auto write_members = [&] {
    std::string list;
    for (const Member& m : next) absl::StrAppend(&list, m.id, " ", m.name, "\n");
    return store->set(gen_key(g, "members"), list);
  };
  // The list is written before the old generation closes, so members that
  // follow the regroup find it at once.
  RELAY_RETURN_IF_ERROR(write_members());
  if (group) {
    const std::string regroup = absl::StrCat("regroup ", announced);
    RELAY_ASSIGN_OR_RETURN(std::string winner, close_generation(*store, previous, regroup));
    if (winner != regroup) {
      // It broke meanwhile: its members saw that and will ask to join again.
      spdlog::warn("weight sync: generation {} {}", previous, winner);
      next.erase(next.begin(), next.begin() + static_cast<std::ptrdiff_t>(carried));
      carried = 0;
      RELAY_RETURN_IF_ERROR(write_members());
    }
  }
  drop_generation();
  // Joiners poll for this; members carried over follow the regroup instead.
  for (size_t i = carried; i < next.size(); ++i) {
    RELAY_RETURN_IF_ERROR(store->set(internal::placement_key(next[i].id), absl::StrCat(g)));
  }
  members = std::move(next);
  if (members.empty()) return OkStatus();

  internal::SyncGroupOptions go;
  go.store_host = options.host;
  go.store_port = store->port();
  go.generation = g;
  go.rank = 0;
  go.size = static_cast<int>(members.size()) + 1;
  go.bind_host = options.host;
  go.timeout = options.timeout;
  go.device = options.device;
  StatusOr<std::unique_ptr<SyncGroup>> created = SyncGroup::create(go);
  if (!created.ok()) {
    const std::string why =
        absl::StrCat("members [", member_names(), "]: ", std::string(created.status().message()));
    spdlog::warn("weight sync: generation {}: {}; its members rejoin", g, why);
    (void)close_generation(*store, g, "broken rendezvous: " + why);
    drop_generation();
    return UnavailableError(absl::StrCat("weight sync: version ", version, ": ", why));
  }
  group = std::move(created).value();
  spdlog::info("weight sync: generation {}: {} members ({})", g, members.size(), member_names());
  return OkStatus();
}

Status WeightSyncServer::Impl::send(const WeightSnapshot& snapshot) {
  const uint64_t bucket_bytes = static_cast<uint64_t>(options.bucket_bytes);
  const std::string manifest = encode_manifest(snapshot.manifest);
  const SyncHeader h = make_header(snapshot, manifest, bucket_bytes, gen, announced);
  const std::string what =
      absl::StrCat("weight sync generation ", gen, " [", member_names(), "]: version ", h.version);

  // Announce, then enter the collective. The state also tells whether a
  // member closed the generation since broadcast() looked.
  RELAY_ASSIGN_OR_RETURN(int64_t state, store->add(gen_key(gen, "state"), 1));
  if (state != announced + 1) {
    return UnavailableError(absl::StrCat(what, ": the generation was closed by a member"));
  }
  ++announced;

  auto run = [&](at::Tensor host, const std::string& piece) -> Status {
    RELAY_ASSIGN_OR_RETURN(auto op, group->start(group->on_wire(host, true), what + ": " + piece));
    return op->wait();
  };
  at::Tensor header = torch::empty({kSyncHeaderWords}, torch::kInt64);
  encode_header(h, header.data_ptr<int64_t>());
  RELAY_RETURN_IF_ERROR(run(header, "header"));
  at::Tensor meta = torch::empty({static_cast<int64_t>(manifest.size())}, torch::kUInt8);
  std::memcpy(meta.data_ptr(), manifest.data(), manifest.size());
  RELAY_RETURN_IF_ERROR(run(meta, "manifest"));
  if (!snapshot.block_checksums.empty()) {
    // The publisher's: nothing is hashed here (weight_buckets.h).
    std::vector<uint64_t> sums = snapshot.block_checksums;
    RELAY_RETURN_IF_ERROR(
        run(torch::from_blob(sums.data(), {static_cast<int64_t>(sums.size())}, torch::kInt64),
            "checksums"));
  }

  BucketReader reader(snapshot, bucket_bytes);
  std::array<std::unique_ptr<SyncBroadcast>, 2> in_flight;
  for (uint64_t k = 0; k < h.bucket_count; ++k) {
    auto& op = in_flight[k % 2];
    if (op) RELAY_RETURN_IF_ERROR(op->wait());  // two in flight (with NCCL, two device copies)
    // A slice of the snapshot's payload: nothing is copied on the CPU.
    RELAY_ASSIGN_OR_RETURN(
        op, group->start(group->on_wire(reader.view(k), true),
                         absl::StrCat(what, ": bucket ", k, " of ", h.bucket_count)));
  }
  for (auto& op : in_flight) {
    if (op) RELAY_RETURN_IF_ERROR(op->wait());
  }
  return OkStatus();
}

WeightSyncServer::WeightSyncServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

WeightSyncServer::~WeightSyncServer() {
  if (impl_->group) (void)close_generation(*impl_->store, impl_->gen, "shutdown");
  impl_->drop_generation();
}

StatusOr<std::unique_ptr<WeightSyncServer>> WeightSyncServer::start(
    const WeightSyncServerOptions& options) {
  RELAY_RETURN_IF_ERROR(validate(options));
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  RELAY_ASSIGN_OR_RETURN(impl->store, SyncStore::connect(options.host, options.port,
                                                         options.timeout, /*is_server=*/true));
  RELAY_ASSIGN_OR_RETURN(std::string backend,
                         internal::backend_for(options.device, "weight sync server: device"));
  RELAY_RETURN_IF_ERROR(impl->store->set(internal::kBackendKey, backend));
  spdlog::info("weight sync: store at {} ({})", impl->store->endpoint(), backend);
  return std::unique_ptr<WeightSyncServer>(new WeightSyncServer(std::move(impl)));
}

std::string WeightSyncServer::endpoint() const { return impl_->store->endpoint(); }
int64_t WeightSyncServer::generation() const { return impl_->group ? impl_->gen : 0; }
int WeightSyncServer::members() const { return static_cast<int>(impl_->members.size()); }

StatusOr<BroadcastReport> WeightSyncServer::broadcast(const WeightSnapshot& snapshot) {
  Impl& s = *impl_;
  const auto start = Clock::now();
  BroadcastReport report;
  RELAY_RETURN_IF_ERROR(s.read_requests());
  if (s.group) {
    // A member that saw a collective fail closed the generation.
    RELAY_ASSIGN_OR_RETURN(int64_t state, s.store->add(gen_key(s.gen, "state"), 0));
    if (state >= kClosed) {
      spdlog::warn("weight sync: generation {} was closed by a member; its members rejoin", s.gen);
      s.drop_generation();
    }
  }
  if (!s.joining.empty() || !s.leaving.empty()) {
    RELAY_RETURN_IF_ERROR(s.form_generation(snapshot.manifest.version));
    report.regrouped = true;
  }
  if (s.group) {
    Status sent = s.send(snapshot);
    if (!sent.ok()) {
      spdlog::warn("{}; the generation is broken, its members rejoin", std::string(sent.message()));
      (void)close_generation(*s.store, s.gen, absl::StrCat("broken ", sent.message()));
      s.drop_generation();
      return sent;
    }
    report.generation = s.gen;
    report.members = static_cast<int>(s.members.size());
    report.bytes = snapshot.total_bytes;
  }
  report.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return report;
}

}  // namespace relay::comm
