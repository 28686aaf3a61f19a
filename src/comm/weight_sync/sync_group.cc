// One of the two files of relay that include c10d headers (the other is
// trainer_group.cc): they are slow to parse, and their
// classes differ between LibTorch 1.13 and 2.x: ProcessGroupGloo derives from
// ProcessGroup in one and from Backend in the other, so the process group is
// held through a template below instead of a common base).

#include "comm/weight_sync/sync_group.h"

#include "comm/c10d.h"

#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "relay/model/torch_error.h"

namespace relay::comm::internal {
namespace {

std::vector<uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }
std::string string_of(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

// Runs fn; a thrown exception becomes Unavailable("<what>: <message>").
template <typename Fn>
auto guarded(const std::string& what, Fn&& fn) -> StatusOr<decltype(fn())> {
  try {
    return fn();
  } catch (const std::exception& e) {
    return UnavailableError(absl::StrCat(what, ": ", model::exception_message(e)));
  }
}

c10::intrusive_ptr<c10d::TCPStore> open_store(const std::string& host, int port,
                                              std::chrono::milliseconds timeout, bool is_server) {
  c10d::TCPStoreOptions o;
  o.port = static_cast<uint16_t>(port);
  o.isServer = is_server;
  o.waitWorkers = false;
  o.timeout = timeout;
  return comm::make_tcp_store(host, o);
}

// A process group of either backend, seen through the one call we need.
class Collective {
 public:
  virtual ~Collective() = default;
  virtual c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors) = 0;
};

template <typename PG>
class CollectiveOf : public Collective {
 public:
  explicit CollectiveOf(c10::intrusive_ptr<PG> pg) : pg_(std::move(pg)) {}
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors) override {
    c10d::BroadcastOptions o;
    o.rootRank = 0;
    o.rootTensor = 0;
    return pg_->broadcast(tensors, o);
  }

 private:
  c10::intrusive_ptr<PG> pg_;
};

}  // namespace

std::string request_key(int64_t id) { return absl::StrCat("req/", id); }
std::string placement_key(int64_t id) { return absl::StrCat("req/", id, "/gen"); }
std::string gen_key(int64_t generation, const char* leaf) {
  return absl::StrCat("gen/", generation, "/", leaf);
}

StatusOr<std::pair<std::string, int>> parse_endpoint(const std::string& endpoint) {
  const size_t colon = endpoint.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(endpoint.substr(colon + 1), &port) || port <= 0 || port > 65535) {
    return InvalidArgumentError(
        absl::StrCat("weight sync endpoint '", endpoint, "': expected host:port"));
  }
  return std::make_pair(endpoint.substr(0, colon), port);
}

StatusOr<std::string> backend_for(const std::string& device, const std::string& field) {
  StatusOr<at::Device> d = guarded(field, [&] { return at::Device(device); });
  if (!d.ok()) return InvalidArgumentError(std::string(d.status().message()));
  if (d->is_cpu()) return std::string("gloo");
#ifdef RELAY_WITH_CUDA
  if (d->is_cuda()) return std::string("nccl");
#endif
  return InvalidArgumentError(absl::StrCat(field, ": '", device,
                                           "' is not a device this build can sync weights on "
#ifdef RELAY_WITH_CUDA
                                           "(cpu or cuda[:i])"
#else
                                           "(cpu; this build has no CUDA)"
#endif
                                           ));
}

// ---- SyncStore ----

struct SyncStore::Impl {
  c10::intrusive_ptr<c10d::TCPStore> store;
};

SyncStore::SyncStore(std::unique_ptr<Impl> impl, std::string endpoint)
    : impl_(std::move(impl)), endpoint_(std::move(endpoint)) {}
SyncStore::~SyncStore() = default;

StatusOr<std::unique_ptr<SyncStore>> SyncStore::connect(const std::string& host, int port,
                                                        std::chrono::milliseconds timeout,
                                                        bool is_server) {
  const std::string what = absl::StrCat("weight sync store ", host, ":", port, ": ",
                                        is_server ? "cannot listen" : "cannot connect");
  auto impl = std::make_unique<Impl>();
  RELAY_ASSIGN_OR_RETURN(impl->store,
                         guarded(what, [&] { return open_store(host, port, timeout, is_server); }));
  const std::string endpoint = absl::StrCat(host, ":", impl->store->getPort());
  return std::unique_ptr<SyncStore>(new SyncStore(std::move(impl), endpoint));
}

int SyncStore::port() const { return impl_->store->getPort(); }

StatusOr<int64_t> SyncStore::add(const std::string& key, int64_t delta) {
  return guarded(absl::StrCat("weight sync store ", endpoint_, ": add ", key),
                 [&] { return impl_->store->add(key, delta); });
}

Status SyncStore::set(const std::string& key, const std::string& value) {
  return guarded(absl::StrCat("weight sync store ", endpoint_, ": set ", key),
                 [&] {
                   impl_->store->set(key, bytes_of(value));
                   return true;
                 })
      .status();
}

StatusOr<std::optional<std::string>> SyncStore::get_if_set(const std::string& key) {
  return guarded(absl::StrCat("weight sync store ", endpoint_, ": get ", key),
                 [&]() -> std::optional<std::string> {
                   if (!impl_->store->check({key})) return std::nullopt;
                   return string_of(impl_->store->get(key));
                 });
}

StatusOr<std::string> SyncStore::set_if_unset(const std::string& key, const std::string& desired) {
  return guarded(absl::StrCat("weight sync store ", endpoint_, ": compareSet ", key),
                 [&] { return string_of(impl_->store->compareSet(key, {}, bytes_of(desired))); });
}

StatusOr<std::string> close_generation(SyncStore& store, int64_t generation,
                                       const std::string& reason) {
  RELAY_ASSIGN_OR_RETURN(std::string winner,
                         store.set_if_unset(gen_key(generation, "end"), reason));
  RELAY_RETURN_IF_ERROR(store.add(gen_key(generation, "state"), kClosed).status());
  return winner;
}

// ---- SyncGroup ----

struct SyncGroup::Impl {
  at::Device device{at::kCPU};
  std::chrono::milliseconds timeout{0};
  c10::intrusive_ptr<c10d::Store> store;  // the group's own connection, prefixed
  std::unique_ptr<Collective> collective;
};

struct SyncBroadcast::Impl {
  c10::intrusive_ptr<c10d::Work> work;
  std::vector<at::Tensor> tensors;  // kept alive until the work is done
  std::string what;
  std::chrono::milliseconds timeout{0};
};

SyncGroup::SyncGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

SyncGroup::~SyncGroup() {
  // Destroying a process group waits for its queued work; each piece fails
  // by its own timeout, so this is bounded.
  try {
    impl_->collective.reset();
  } catch (const std::exception& e) {
    (void)e;  // a destructor reports nothing; the failure was reported by wait()
  }
}

StatusOr<std::unique_ptr<SyncGroup>> SyncGroup::create(const SyncGroupOptions& o) {
  const std::string what = absl::StrCat("weight sync generation ", o.generation, ": rank ", o.rank,
                                        " of ", o.size, ": rendezvous");
  auto impl = std::make_unique<Impl>();
  impl->timeout = o.timeout;
  RELAY_ASSIGN_OR_RETURN(impl->device, guarded(what, [&] { return at::Device(o.device); }));
  Status built =
      guarded(what, [&] {
        auto connection = open_store(o.store_host, o.store_port, o.timeout, false);
        impl->store =
            c10::make_intrusive<c10d::PrefixStore>(gen_key(o.generation, "pg"), connection);
        if (impl->device.is_cuda()) {
#ifdef RELAY_WITH_CUDA
          auto options = c10d::ProcessGroupNCCL::Options::create();
          options->timeout = o.timeout;
          impl->collective = std::make_unique<CollectiveOf<c10d::ProcessGroupNCCL>>(
              c10::make_intrusive<c10d::ProcessGroupNCCL>(impl->store, o.rank, o.size, options));
#else
                     TORCH_CHECK(false, "this build of relay has no CUDA");
#endif
        } else {
          auto options = c10d::ProcessGroupGloo::Options::create();
          options->devices.push_back(
              o.bind_host.empty() ? c10d::ProcessGroupGloo::createDefaultDevice()
                                  : c10d::ProcessGroupGloo::createDeviceForHostname(o.bind_host));
          options->timeout = o.timeout;
          impl->collective = std::make_unique<CollectiveOf<c10d::ProcessGroupGloo>>(
              c10::make_intrusive<c10d::ProcessGroupGloo>(impl->store, o.rank, o.size, options));
        }
        return true;
      }).status();
  RELAY_RETURN_IF_ERROR(built);
  return std::unique_ptr<SyncGroup>(new SyncGroup(std::move(impl)));
}

const at::Device& SyncGroup::device() const { return impl_->device; }

StatusOr<std::unique_ptr<SyncBroadcast>> SyncGroup::start(at::Tensor wire, std::string what) {
  auto op = std::make_unique<SyncBroadcast::Impl>();
  op->tensors.push_back(std::move(wire));
  op->what = std::move(what);
  op->timeout = impl_->timeout;
  RELAY_ASSIGN_OR_RETURN(
      op->work, guarded(op->what, [&] { return impl_->collective->broadcast(op->tensors); }));
  return std::unique_ptr<SyncBroadcast>(new SyncBroadcast(std::move(op)));
}

at::Tensor SyncGroup::on_wire(const at::Tensor& host, bool copy) const {
  if (impl_->device.is_cpu()) return host;
  return copy ? host.to(impl_->device)
              : torch::empty_like(host, host.options().device(impl_->device));
}

void SyncGroup::to_host(const at::Tensor& wire, at::Tensor& host) const {
  if (!wire.is_same(host)) host.copy_(wire);
}

SyncBroadcast::SyncBroadcast(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SyncBroadcast::~SyncBroadcast() = default;

Status SyncBroadcast::wait() {
  // The operation carries the group's timeout itself; the extra second lets
  // its own error (which names the peer) arrive before ours.
  StatusOr<bool> done = guarded(
      impl_->what, [&] { return impl_->work->wait(impl_->timeout + std::chrono::seconds(1)); });
  if (done.ok() && !*done) return UnavailableError(impl_->what + ": timed out");
  return done.status();
}

}  // namespace relay::comm::internal
