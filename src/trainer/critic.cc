// The critic's own pieces for PPO with a value model (critic.h).

#include "trainer/critic.h"

#include <torch/serialize.h>
#include <torch/torch.h>

#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace relay::trainer {

StatusOr<std::unique_ptr<Critic>> Critic::create(model::ValueModel model,
                                                 const CriticOptions& options, Sharding sharding,
                                                 const DataParallel& dp) {
  if (!model) return InvalidArgumentError("Critic: value model is null");
  std::unique_ptr<Critic> c(new Critic(std::move(model), options));
  if (sharding == Sharding::kFull && dp.active()) {
    RELAY_ASSIGN_OR_RETURN(c->sharded_,
                           FullyShardedModel::create(c->model_.ptr(), c->model_->model,
                                                     c->model_->config().num_hidden_layers, dp,
                                                     /*trainable=*/true));
    RELAY_ASSIGN_OR_RETURN(c->optimizer_,
                           make_fully_sharded_adamw(*c->sharded_, options.optimizer));
    return c;
  }
  std::vector<at::Tensor> params;
  for (const at::Tensor& p : c->model_->parameters()) {
    if (p.requires_grad()) params.push_back(p);
  }
  // Full sharding on one rank is no sharding.
  const Sharding kind = sharding == Sharding::kFull ? Sharding::kNone : sharding;
  RELAY_ASSIGN_OR_RETURN(c->optimizer_, make_optimizer(params, options.optimizer, kind, dp));
  return c;
}

at::Tensor Critic::response_values(const TrainBatch& mb, bool pack, int64_t pad_token_id) {
  model::ValueModelImpl& m = *model_;
  if (pack) {
    const PackedRows packed = pack_rows(mb, mb.input_ids.size(1), pad_token_id);
    if (packed.input_ids.size(0) < mb.size()) {
      const at::Tensor v = m.values(packed.input_ids, packed.lengths, packed.sequence_starts);
      return gather_response(unpack_positions(v, packed, mb), mb);
    }
  }
  return gather_response(m.values(mb.input_ids, mb.lengths), mb);
}

ValueLossResult Critic::backward(const TrainBatch& mb, const at::Tensor& old_values,
                                 const at::Tensor& returns, const GlobalNormalizer& normalizer,
                                 bool pack, int64_t pad_token_id) {
  const at::Tensor v = response_values(mb, pack, pad_token_id);
  const c10::Device dev = v.device();
  const int64_t width = v.size(1);
  ValueLossResult r =
      value_loss(v, old_values.narrow(1, 0, width).to(dev), returns.narrow(1, 0, width).to(dev),
                 mb.response_mask.to(dev), options_.loss, normalizer);
  r.loss.backward();
  return r;
}

void Critic::empty_pass(bool with_grad) {
  if (!sharded_) return;
  const at::Tensor ids = torch::zeros({1, 2}, torch::kInt64);
  const UncountedPasses uncounted(sharded_.get());
  if (with_grad) {
    (model_->values(ids).sum() * 0).backward();
  } else {
    torch::NoGradGuard no_grad;
    model_->values(ids);
  }
}

StatusOr<double> Critic::apply_gradients() {
  const OptimizerOptions& o = options_.optimizer;
  const double max_norm =
      o.max_grad_norm > 0 ? o.max_grad_norm : std::numeric_limits<double>::infinity();
  StatusOr<double> norm = optimizer_->step(lr_at(o, optimizer_steps_), max_norm, [] {});
  if (!norm.ok()) {
    return Status(norm.status().code(), absl::StrCat("critic update: ", norm.status().message()));
  }
  ++optimizer_steps_;
  return *norm;
}

double Critic::last_lr() const {
  return lr_at(options_.optimizer, std::max<int64_t>(0, optimizer_steps_ - 1));
}

Status Critic::save(torch::serialize::OutputArchive& archive) const {
  if (sharded_) {
    // Rank 0 keeps the whole critic on the host, in its dtype, for the
    // checkpoint's critic/ directory; every rank takes part in the gather.
    const bool lead = sharded_->data_parallel().rank() == 0;
    if (lead && !saved_) {
      saved_ = model::ValueModel(model_->config());
      saved_->to(sharded_->units().front().dtype);
      saved_->eval();
    }
    RELAY_RETURN_IF_ERROR(sharded_->gather_weights(lead ? saved_.get() : nullptr));
  }
  archive.write("optimizer_steps", torch::tensor({optimizer_steps_}, torch::kInt64));
  archive.write("rl_steps", torch::tensor({rl_steps_}, torch::kInt64));
  return optimizer_->save(archive);
}

StatusOr<std::function<void()>> Critic::read_state(torch::serialize::InputArchive& archive,
                                                   const std::string& path) {
  int64_t steps = 0, rl_steps = 0;
  try {
    at::Tensor t;
    archive.read("optimizer_steps", t);
    steps = t.item<int64_t>();
    archive.read("rl_steps", t);
    rl_steps = t.item<int64_t>();
  } catch (const std::exception& e) {
    return DataLossError(absl::StrCat(path, ": no critic step counts: ", e.what()));
  }
  RELAY_ASSIGN_OR_RETURN(std::function<void()> install, optimizer_->read_state(archive, path));
  return std::function<void()>([this, install = std::move(install), steps, rl_steps] {
    install();
    optimizer_steps_ = steps;
    rl_steps_ = rl_steps;
  });
}

int64_t Critic::weight_bytes() const {
  if (sharded_) return sharded_->shard_bytes();
  int64_t total = 0;
  for (const at::Tensor& p : model_->parameters()) total += p.numel() * p.element_size();
  return total;
}

}  // namespace relay::trainer
