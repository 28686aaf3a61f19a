#include "trainer/fully_sharded.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "relay/model/torch_error.h"

namespace relay::trainer {
namespace {

constexpr char kLayerPrefix[] = "model.layers.";

// The unit a parameter belongs to: 1 + its decoder layer, or 0 (the root).
int64_t unit_of(const std::string& name, int64_t num_layers) {
  if (!absl::StartsWith(name, kLayerPrefix)) return 0;
  const char* digits = name.c_str() + sizeof(kLayerPrefix) - 1;
  char* end = nullptr;
  const long layer = std::strtol(digits, &end, 10);
  if (end == digits || *end != '.' || layer < 0 || layer >= num_layers) return 0;
  return static_cast<int64_t>(layer) + 1;
}

// What a unit's gather carries: its own dtype, except bfloat16 and float16
// on the CPU, which Gloo in LibTorch 1.13 cannot all-gather (fp32 then;
// both convert exactly).
at::ScalarType wire_dtype(const FullyShardedModel::Unit& u) {
  if (u.local.is_cuda()) return u.dtype;
  return u.dtype == at::kDouble ? at::kDouble : at::kFloat;
}

void throw_if_error(const Status& s) {
  TORCH_CHECK(s.ok(), "trainer.sharding: full: ", std::string(s.message()));
}

}  // namespace

StatusOr<std::unique_ptr<FullyShardedModel>> FullyShardedModel::create(model::Policy policy,
                                                                       const DataParallel& dp,
                                                                       bool trainable) {
  if (!policy) return InvalidArgumentError("trainer.sharding: full: the policy is null");
  return create(policy.ptr(), policy->model, policy->config().num_hidden_layers, dp, trainable);
}

StatusOr<std::unique_ptr<FullyShardedModel>> FullyShardedModel::create(
    std::shared_ptr<torch::nn::Module> module, model::Decoder decoder, int64_t num_layers,
    const DataParallel& dp, bool trainable) {
  if (!module || !decoder) {
    return InvalidArgumentError("trainer.sharding: full: no model to shard");
  }
  if (!dp.active()) {
    return InvalidArgumentError("trainer.sharding: full: needs more than one trainer rank");
  }
  std::unique_ptr<FullyShardedModel> m(new FullyShardedModel(module, decoder, dp, trainable));
  m->units_.resize(static_cast<size_t>(num_layers + 1));
  m->units_[0].name = "root";
  for (int64_t i = 0; i < num_layers; ++i) {
    m->units_[static_cast<size_t>(i + 1)].name = absl::StrCat(kLayerPrefix, i);
  }
  const auto named = module->named_parameters();
  for (size_t i = 0; i < named.size(); ++i) {
    Param p;
    p.name = named[i].key();
    p.index = i;
    p.param = named[i].value();
    p.shape = p.param.sizes().vec();
    p.numel = p.param.numel();
    Unit& u = m->units_[static_cast<size_t>(unit_of(p.name, num_layers))];
    if (!u.params.empty() &&
        (p.param.scalar_type() != u.dtype || p.param.device() != u.params.front().param.device())) {
      return InvalidArgumentError(
          absl::StrCat("trainer.sharding: full: ", u.name,
                       " holds parameters of more than one dtype or device (",
                       u.params.front().name, " and ", p.name, ")"));
    }
    u.dtype = p.param.scalar_type();
    p.offset = u.numel;
    u.numel += p.numel;
    u.params.push_back(std::move(p));
  }
  const int64_t world = dp.world_size();
  torch::NoGradGuard no_grad;
  for (Unit& u : m->units_) {
    if (u.params.empty()) {
      return InvalidArgumentError(
          absl::StrCat("trainer.sharding: full: ", u.name, " has no parameters"));
    }
    u.shard = (u.numel + world - 1) / world;
    const auto options =
        torch::TensorOptions().dtype(u.dtype).device(u.params.front().param.device());
    at::Tensor flat = torch::zeros({world * u.shard}, options);
    for (const Param& p : u.params) {
      flat.narrow(0, p.offset, p.numel).copy_(p.param.detach().reshape({-1}));
    }
    u.local = flat.narrow(0, dp.rank() * u.shard, u.shard).clone();
    u.whole = true;
    m->release(u);
  }
  m->had_gradient_.assign(named.size(), false);
  decoder->set_layer_hooks(m.get());
  return m;
}

FullyShardedModel::~FullyShardedModel() {
  finish_prefetch().IgnoreError();
  decoder_->set_layer_hooks(nullptr);
}

void FullyShardedModel::start_prefetch(Unit& u) {
  if (u.whole) return;
  prefetch_ = std::thread([this, &u] {
    torch::NoGradGuard no_grad;  // grad mode is per thread; a new one has it on
    try {
      prefetch_status_ = gather(u);
    } catch (const std::exception& e) {  // out of memory, say: reported at the wait
      prefetch_status_ =
          InternalError(absl::StrCat("gathering ", u.name, ": ", model::exception_message(e)));
    }
  });
}

Status FullyShardedModel::finish_prefetch() {
  if (!prefetch_.joinable()) return OkStatus();
  prefetch_.join();
  Status s = prefetch_status_;
  prefetch_status_ = OkStatus();
  return s;
}

Status FullyShardedModel::gather(Unit& u) {
  if (u.whole) return OkStatus();
  torch::NoGradGuard no_grad;
  const at::ScalarType wire = wire_dtype(u);
  at::Tensor all = torch::empty({dp_.world_size() * u.shard}, u.local.options().dtype(wire));
  Status s = dp_.group->all_gather(u.local.to(wire), all);
  if (!s.ok()) return Status(s.code(), absl::StrCat("gathering ", u.name, ": ", s.message()));
  const at::Tensor flat = wire == u.dtype ? all : all.to(u.dtype);
  for (Param& p : u.params) p.param.set_data(flat.narrow(0, p.offset, p.numel).view(p.shape));
  u.whole = true;
  return OkStatus();
}

void FullyShardedModel::release(Unit& u) {
  if (!u.whole) return;
  for (Param& p : u.params) p.param.set_data(torch::empty({0}, u.local.options()));
  u.whole = false;
}

Status FullyShardedModel::reduce_gradients(Unit& u) {
  torch::NoGradGuard no_grad;
  const auto fp32 = torch::TensorOptions().dtype(torch::kFloat32).device(u.local.device());
  at::Tensor full = torch::zeros({dp_.world_size() * u.shard}, fp32);
  for (Param& p : u.params) {
    const at::Tensor& g = p.param.grad();
    if (!g.defined()) continue;
    full.narrow(0, p.offset, p.numel).copy_(g.reshape({-1}));
    if (counting_) had_gradient_[p.index] = true;
    p.param.mutable_grad().reset();
  }
  at::Tensor mine = torch::empty({u.shard}, fp32);
  Status s = dp_.group->reduce_scatter_sum(full, mine);
  if (!s.ok()) {
    return Status(s.code(), absl::StrCat("reducing the gradients of ", u.name, ": ", s.message()));
  }
  if (u.grad.defined()) {
    u.grad.add_(mine);
  } else {
    u.grad = mine;
  }
  return OkStatus();
}

void FullyShardedModel::acquire(int64_t layer) {
  Status s = finish_prefetch();  // normally this very layer
  Unit& u = units_.at(static_cast<size_t>(layer + 1));
  ++acquired_;
  if (u.whole) ++prefetched_;
  if (s.ok()) s = gather(u);
  throw_if_error(s);
  // The decoder acquires 0, 1, ..., L - 1 in a forward; a backward starts at
  // L - 1 again and goes down. Anything else prefetches nothing.
  const int64_t layers = static_cast<int64_t>(units_.size()) - 1;
  const bool backward = (layer == last_acquired_ && layer == layers - 1) ||
                        (backward_ && layer == last_acquired_ - 1);
  const bool forward = !backward && (layer == 0 || layer == last_acquired_ + 1);
  last_acquired_ = layer;
  backward_ = backward;
  const int64_t next = backward ? layer - 1 : forward ? layer + 1 : -1;
  if (next >= 0 && next < layers) start_prefetch(units_[static_cast<size_t>(next + 1)]);
}

void FullyShardedModel::release(int64_t layer) {
  release(units_.at(static_cast<size_t>(layer + 1)));
}

void FullyShardedModel::gradients_ready(int64_t layer) {
  Unit& u = units_.at(static_cast<size_t>(layer + 1));
  // The next layer's gather first: one collective at a time.
  Status s = finish_prefetch();
  if (s.ok() && trainable_) s = reduce_gradients(u);
  release(u);
  throw_if_error(s);
}

Status FullyShardedModel::acquire_root() {
  RELAY_RETURN_IF_ERROR(finish_prefetch());
  return gather(units_.front());
}

void FullyShardedModel::release_root() { release(units_.front()); }

Status FullyShardedModel::reduce_root_gradients() {
  Status s = finish_prefetch();
  if (s.ok() && trainable_) s = reduce_gradients(units_.front());
  release(units_.front());
  return s;
}

void FullyShardedModel::drop_gradients() {
  finish_prefetch().IgnoreError();  // a failed pass may have left one running
  for (Unit& u : units_) {
    u.grad = at::Tensor();
    for (Param& p : u.params) p.param.mutable_grad().reset();
    release(u);
  }
  std::fill(had_gradient_.begin(), had_gradient_.end(), false);
}

Status FullyShardedModel::gather_weights(torch::nn::Module* into) {
  RELAY_RETURN_IF_ERROR(finish_prefetch());
  torch::NoGradGuard no_grad;
  torch::OrderedDict<std::string, at::Tensor> theirs;
  if (into != nullptr) theirs = into->named_parameters();
  for (Unit& u : units_) {
    const bool was_whole = u.whole;
    RELAY_RETURN_IF_ERROR(gather(u));
    if (into != nullptr) {
      for (const Param& p : u.params) {
        at::Tensor* to = theirs.find(p.name);
        if (to == nullptr || to->numel() != p.numel) {
          release(u);
          return InternalError(absl::StrCat("trainer.sharding: full: the copy has no parameter ",
                                            p.name, " of ", p.numel, " elements"));
        }
        to->copy_(p.param);
      }
    }
    if (!was_whole) release(u);
  }
  return OkStatus();
}

void FullyShardedModel::restore_whole(const torch::nn::Module& from) {
  finish_prefetch().IgnoreError();
  torch::NoGradGuard no_grad;
  const auto theirs = from.named_parameters();
  for (Unit& u : units_) {
    for (Param& p : u.params) {
      const at::Tensor* src = theirs.find(p.name);
      TORCH_CHECK(src != nullptr && src->numel() == p.numel, "restore_whole: the copy has no ",
                  p.name, " of ", p.numel, " elements");
      p.param.set_data(src->detach()
                           .to(u.local.device(), u.dtype, /*non_blocking=*/false,
                               /*copy=*/true)
                           .view(p.shape));
    }
    u.whole = false;  // whole, but no longer this model's to release
  }
}

int64_t FullyShardedModel::shard_bytes() const {
  int64_t total = 0;
  for (const Unit& u : units_) total += bytes_of(u.local);
  return total;
}

int64_t FullyShardedModel::peak_whole_bytes() const {
  auto whole = [](const Unit& u) {
    return u.numel * static_cast<int64_t>(c10::elementSize(u.dtype));
  };
  // The layer running and the next one, prefetched: the two largest.
  std::vector<int64_t> layers;
  for (size_t i = 1; i < units_.size(); ++i) layers.push_back(whole(units_[i]));
  std::sort(layers.rbegin(), layers.rend());
  const int64_t two = layers.empty() ? 0 : layers[0] + (layers.size() > 1 ? layers[1] : 0);
  return shard_bytes() + whole(units_.front()) + two;
}

}  // namespace relay::trainer
