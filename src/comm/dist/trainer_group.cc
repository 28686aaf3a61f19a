// c10d for the data-parallel trainer (the other file that includes c10d
// headers is comm/weight_sync/sync_group.cc, for the weight sync). Every c10::Error and
// std::exception becomes a Status naming the operation and the rank. The
// process group is held by its concrete class: ProcessGroupGloo derives from
// ProcessGroup in LibTorch 1.13 and from Backend in 2.x.

#include "relay/comm/dist/trainer_group.h"

#include "comm/c10d.h"

#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "relay/model/torch_error.h"

namespace relay::comm {
namespace {

template <typename Fn>
Status guarded(const std::string& what, Fn&& fn) {
  try {
    fn();
    return OkStatus();
  } catch (const std::exception& e) {
    return UnavailableError(absl::StrCat(what, ": ", model::exception_message(e)));
  }
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

template <typename PG>
class C10dCollectives : public trainer::Collectives {
 public:
  C10dCollectives(TrainerRank rank, at::Device device, std::chrono::milliseconds timeout,
                  c10::intrusive_ptr<c10d::TCPStore> store, c10::intrusive_ptr<PG> group)
      : rank_(std::move(rank)),
        device_(device),
        timeout_(timeout),
        store_(std::move(store)),
        group_(std::move(group)) {}

  int rank() const override { return rank_.rank; }
  int world_size() const override { return rank_.world_size; }

  Status all_reduce_sum(at::Tensor& tensor) override {
    return run("all-reduce", tensor, [&](std::vector<at::Tensor>& t) {
      c10d::AllreduceOptions o;
      o.reduceOp = c10d::ReduceOp::SUM;
      return group_->allreduce(t, o);
    });
  }

  Status broadcast(at::Tensor& tensor, int root) override {
    return run(absl::StrCat("broadcast from rank ", root), tensor, [&](std::vector<at::Tensor>& t) {
      c10d::BroadcastOptions o;
      o.rootRank = root;
      o.rootTensor = 0;
      return group_->broadcast(t, o);
    });
  }

  Status all_gather(const at::Tensor& shard, at::Tensor& out) override {
    RELAY_RETURN_IF_ERROR(check_whole(what("all-gather"), "output", out, shard));
    return guarded(what("all-gather"), [&] {
      std::vector<at::Tensor> in{shard.contiguous().to(device_)};
      std::vector<std::vector<at::Tensor>> parts(1);
      for (int r = 0; r < rank_.world_size; ++r) parts[0].push_back(at::empty_like(in[0]));
      c10::intrusive_ptr<c10d::Work> work = group_->allgather(parts, in, c10d::AllgatherOptions());
      work->wait(timeout_);
      out.view({rank_.world_size, -1}).copy_(at::stack(parts[0]).view({rank_.world_size, -1}));
    });
  }

  Status reduce_scatter_sum(const at::Tensor& full, at::Tensor& shard) override {
    RELAY_RETURN_IF_ERROR(check_whole(what("reduce-scatter"), "input", full, shard));
    const int64_t n = shard.numel();
    if constexpr (std::is_same_v<PG, c10d::ProcessGroupGloo>) {
      at::Tensor copy = full.reshape({-1}).clone();
      RELAY_RETURN_IF_ERROR(all_reduce_sum(copy));
      shard.view({-1}).copy_(copy.narrow(0, rank_.rank * n, n));
      return OkStatus();
    } else {
      return guarded(what("reduce-scatter"), [&] {
        at::Tensor flat = full.reshape({-1}).contiguous().to(device_);
        std::vector<std::vector<at::Tensor>> in(1);
        for (int r = 0; r < rank_.world_size; ++r) in[0].push_back(flat.narrow(0, r * n, n));
        std::vector<at::Tensor> out{at::empty({n}, flat.options())};
        c10d::ReduceScatterOptions o;
        o.reduceOp = c10d::ReduceOp::SUM;
        c10::intrusive_ptr<c10d::Work> work = group_->reduce_scatter(out, in, o);
        work->wait(timeout_);
        shard.view({-1}).copy_(out[0]);
      });
    }
  }

  StatusOr<int64_t> add_counter(const std::string& key, int64_t delta) override {
    int64_t value = 0;
    RELAY_RETURN_IF_ERROR(guarded(what(absl::StrCat("store add ", key)), [&] {
      std::lock_guard<std::mutex> lock(store_mu_);
      value = store_->add(key, delta);
    }));
    return value;
  }

 private:
  std::string what(const std::string& op) const {
    return absl::StrCat("trainer group rank ", rank_.rank, " of ", rank_.world_size, " (",
                        rank_.host, ":", rank_.port, "): ", op);
  }

  // `whole` (all-gather's output, reduce-scatter's input) holds one `shard`
  // per rank, of the shard's dtype.
  Status check_whole(const std::string& op, const char* role, const at::Tensor& whole,
                     const at::Tensor& shard) const {
    if (whole.numel() == shard.numel() * rank_.world_size &&
        whole.scalar_type() == shard.scalar_type()) {
      return OkStatus();
    }
    return InvalidArgumentError(
        absl::StrCat(op, ": the ", role, " must hold world_size x ", shard.numel(), " ",
                     std::string(c10::toString(shard.scalar_type())), " elements, got ",
                     whole.numel(), " ", std::string(c10::toString(whole.scalar_type()))));
  }

  // Runs one collective on a contiguous tensor on the group's device, waits
  // for it (bounded by the group's timeout) and copies the result back.
  template <typename Op>
  Status run(const std::string& op, at::Tensor& tensor, Op&& start) {
    return guarded(what(op), [&] {
      const bool direct = tensor.device() == device_ && tensor.is_contiguous();
      std::vector<at::Tensor> wire{direct ? tensor : tensor.contiguous().to(device_)};
      c10::intrusive_ptr<c10d::Work> work = start(wire);
      work->wait(timeout_);
      if (!direct) tensor.copy_(wire[0]);
    });
  }

  TrainerRank rank_;
  at::Device device_;
  std::chrono::milliseconds timeout_;
  // One request at a time on the store's connection.
  std::mutex store_mu_;
  c10::intrusive_ptr<c10d::TCPStore> store_ ABSL_PT_GUARDED_BY(store_mu_);
  c10::intrusive_ptr<PG> group_;
};

}  // namespace

StatusOr<TrainerRank> trainer_rank_from_env(
    int config_world_size, const std::string& rendezvous,
    const std::function<std::optional<std::string>(const std::string&)>& getenv) {
  TrainerRank r;
  r.world_size = config_world_size;
  auto read_int = [&](const std::string& name, int* out) -> StatusOr<bool> {
    std::optional<std::string> v = getenv(name);
    if (!v || v->empty()) return false;
    if (!absl::SimpleAtoi(*v, out)) {
      return InvalidArgumentError(absl::StrCat("$", name, ": not an integer: '", *v, "'"));
    }
    return true;
  };
  int env_world = 0;
  RELAY_ASSIGN_OR_RETURN(bool has_world, read_int("WORLD_SIZE", &env_world));
  if (has_world && env_world != config_world_size) {
    return InvalidArgumentError(absl::StrCat(
        "$WORLD_SIZE is ", env_world, " but trainer.world_size is ", config_world_size,
        "; set trainer.world_size=", env_world, " (every rank reads the same config)"));
  }
  RELAY_ASSIGN_OR_RETURN(bool has_rank, read_int("RANK", &r.rank));
  RELAY_ASSIGN_OR_RETURN(bool has_local, read_int("LOCAL_RANK", &r.local_rank));
  if (!has_local) r.local_rank = r.rank;
  if (config_world_size == 1) {
    if (has_rank && r.rank != 0) {
      return InvalidArgumentError(absl::StrCat(
          "$RANK is ", r.rank, " but trainer.world_size is 1: set trainer.world_size"));
    }
    r.rank = 0;
    return r;
  }
  if (!has_rank) {
    return InvalidArgumentError(absl::StrCat("trainer.world_size is ", config_world_size,
                                             ": $RANK must say which rank this process is (0 to ",
                                             config_world_size - 1, ")"));
  }
  if (r.rank < 0 || r.rank >= config_world_size) {
    return InvalidArgumentError(absl::StrCat("$RANK is ", r.rank, ": must be in [0, ",
                                             config_world_size, ") for trainer.world_size ",
                                             config_world_size));
  }
  if (r.local_rank < 0) {
    return InvalidArgumentError(absl::StrCat("$LOCAL_RANK is ", r.local_rank, ": must be >= 0"));
  }
  std::string port_text;
  if (!rendezvous.empty()) {
    const size_t colon = rendezvous.rfind(':');
    if (colon == std::string::npos || colon == 0) {
      return InvalidArgumentError(
          absl::StrCat("trainer.rendezvous: expected host:port, got '", rendezvous, "'"));
    }
    r.host = rendezvous.substr(0, colon);
    port_text = rendezvous.substr(colon + 1);
  } else {
    std::optional<std::string> addr = getenv("MASTER_ADDR");
    std::optional<std::string> port = getenv("MASTER_PORT");
    if (!addr || addr->empty() || !port || port->empty()) {
      return InvalidArgumentError(absl::StrCat(
          "trainer.world_size is ", config_world_size,
          ": set trainer.rendezvous (host:port of rank 0) or $MASTER_ADDR and $MASTER_PORT"));
    }
    r.host = *addr;
    port_text = *port;
  }
  if (!absl::SimpleAtoi(port_text, &r.port) || r.port <= 0 || r.port > 65535) {
    return InvalidArgumentError(
        absl::StrCat(rendezvous.empty() ? "$MASTER_PORT" : "trainer.rendezvous", ": '", port_text,
                     "' is not a port (1-65535)"));
  }
  return r;
}

StatusOr<std::shared_ptr<trainer::Collectives>> join_trainer_group(const TrainerGroupOptions& o) {
  const TrainerRank& r = o.rank;
  const std::string what = absl::StrCat("trainer group rank ", r.rank, " of ", r.world_size,
                                        ": rendezvous at ", r.host, ":", r.port);
  c10::intrusive_ptr<c10d::TCPStore> store;
  std::shared_ptr<trainer::Collectives> group;
  std::optional<at::Device> device;
  RELAY_RETURN_IF_ERROR(guarded(what, [&] {
    device = at::Device(o.device);
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(r.port);
    so.isServer = r.rank == 0;
    so.waitWorkers = false;
    so.timeout = o.timeout;
    store = comm::make_tcp_store(r.host, so);
    // The process group gets its own key space; the counters stay outside it.
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>("pg", store);
    if (device->is_cuda()) {
#ifdef RELAY_WITH_CUDA
      auto options = c10d::ProcessGroupNCCL::Options::create();
      options->timeout = o.timeout;
      group = std::make_shared<C10dCollectives<c10d::ProcessGroupNCCL>>(
          r, *device, o.timeout, store,
          c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, r.rank, r.world_size, options));
#else
      TORCH_CHECK(false, "device '", o.device, "': this build of relay has no CUDA");
#endif
    } else {
      auto options = c10d::ProcessGroupGloo::Options::create();
      const std::string bind =
          !o.bind_host.empty() ? o.bind_host : (is_loopback(r.host) ? "127.0.0.1" : "");
      options->devices.push_back(bind.empty()
                                     ? c10d::ProcessGroupGloo::createDefaultDevice()
                                     : c10d::ProcessGroupGloo::createDeviceForHostname(bind));
      options->timeout = o.timeout;
      group = std::make_shared<C10dCollectives<c10d::ProcessGroupGloo>>(
          r, *device, o.timeout, store,
          c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, r.rank, r.world_size, options));
    }
  }));
  return group;
}

}  // namespace relay::comm
