#include "trainer/optimizer.h"

#include <cmath>
#include <sstream>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "relay/model/torch_error.h"
#include "trainer/adamw_internal.h"
#include "trainer/adamw_kernel.h"

namespace relay::trainer {
namespace {

// The key torch's optimizers file a parameter's state under: the address of
// its TensorImpl, printed (LibTorch 1.x) or as it is (2.x).
template <typename Map>
typename Map::key_type state_key(const at::Tensor& param) {
  using Key = typename Map::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream out;
    out << param.unsafeGetTensorImpl();
    return out.str();
  } else {
    return static_cast<Key>(param.unsafeGetTensorImpl());
  }
}

using StateMap = std::remove_reference_t<decltype(std::declval<torch::optim::AdamW&>().state())>;

}  // namespace

void adamw_update(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg,
                  at::Tensor& exp_avg_sq, int64_t step, const OptimizerOptions& o, double lr) {
  if (adamw_fusable(param, grad, exp_avg, exp_avg_sq)) {
    adamw_fused(param.data_ptr<float>(), grad.data_ptr<float>(), exp_avg.data_ptr<float>(),
                exp_avg_sq.data_ptr<float>(), param.numel(), adamw_constants(o, step, lr));
    // Written behind autograd's back: count the writes as in-place ops would.
    for (at::Tensor* t : {&param, &exp_avg, &exp_avg_sq}) t->unsafeGetTensorImpl()->bump_version();
    return;
  }
  if (o.weight_decay != 0) param.mul_(1 - lr * o.weight_decay);
  const double bias_correction1 = 1 - std::pow(o.beta1, static_cast<double>(step));
  const double bias_correction2 = 1 - std::pow(o.beta2, static_cast<double>(step));
  exp_avg.mul_(o.beta1).add_(grad, 1 - o.beta1);
  exp_avg_sq.mul_(o.beta2).addcmul_(grad, grad, 1 - o.beta2);
  const at::Tensor denom = (exp_avg_sq.sqrt() / std::sqrt(bias_correction2)).add_(o.eps);
  param.addcdiv_(exp_avg, denom, -lr / bias_correction1);
}

torch::optim::AdamWParamState* adamw_state(torch::optim::AdamW& optimizer,
                                           const at::Tensor& param) {
  auto it = optimizer.state().find(state_key<StateMap>(param));
  if (it == optimizer.state().end()) return nullptr;
  return static_cast<torch::optim::AdamWParamState*>(it->second.get());
}

void clear_adamw_state(torch::optim::AdamW& optimizer, const at::Tensor& param) {
  optimizer.state().erase(state_key<StateMap>(param));
}

void set_adamw_state(torch::optim::AdamW& optimizer, const at::Tensor& param, int64_t step,
                     const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq) {
  auto state = std::make_unique<torch::optim::AdamWParamState>();
  state->step(step);
  state->exp_avg(exp_avg);
  state->exp_avg_sq(exp_avg_sq);
  optimizer.state()[state_key<StateMap>(param)] = std::move(state);
}

torch::optim::AdamWOptions adamw_options(const OptimizerOptions& o) {
  return torch::optim::AdamWOptions(o.lr)
      .betas({o.beta1, o.beta2})
      .eps(o.eps)
      .weight_decay(o.weight_decay);
}

StatusOr<std::vector<at::Tensor>> read_master(torch::serialize::InputArchive& archive,
                                              const std::string& path,
                                              const std::vector<at::IntArrayRef>& expected) {
  std::vector<at::Tensor> master;
  try {
    at::Tensor count;
    archive.read("num_master", count);
    const int64_t n = count.item<int64_t>();
    for (int64_t i = 0; i < n; ++i) {
      at::Tensor t;
      archive.read("master/" + std::to_string(i), t);
      master.push_back(t);
    }
  } catch (const std::exception& e) {
    return DataLossError(absl::StrCat(
        path, ": not a relay trainer state, or a corrupt one: ", model::exception_message(e)));
  }
  if (master.size() != expected.size()) {
    return InvalidArgumentError(absl::StrCat(
        path, ": holds ", master.size(), " fp32 master weights, this trainer has ", expected.size(),
        " (optimizer.fp32_master_weights or the model's dtype changed)"));
  }
  for (size_t i = 0; i < master.size(); ++i) {
    if (!master[i].sizes().equals(expected[i])) {
      return InvalidArgumentError(absl::StrCat(path, ": master weight ", i, " has shape ",
                                               torch::str(master[i].sizes()), ", expected ",
                                               torch::str(expected[i])));
    }
  }
  return master;
}

void write_master(torch::serialize::OutputArchive& archive, const std::vector<at::Tensor>& master) {
  archive.write("num_master", torch::tensor({static_cast<int64_t>(master.size())}));
  for (size_t i = 0; i < master.size(); ++i) {
    archive.write("master/" + std::to_string(i), master[i].detach().cpu());
  }
}

Status read_adamw(torch::serialize::InputArchive& archive, const std::string& path,
                  torch::optim::AdamW& into) {
  try {
    torch::serialize::InputArchive opt;
    archive.read("optimizer", opt);
    into.load(opt);
  } catch (const std::exception& e) {
    return InvalidArgumentError(absl::StrCat(
        path, ": optimizer state does not fit this model: ", model::exception_message(e)));
  }
  return OkStatus();
}

namespace {
// Tensors of `shapes` and `dtypes` that only key torch's AdamW state: no
// storage.
std::vector<at::Tensor> state_keys(const std::vector<std::vector<int64_t>>& shapes,
                                   const std::vector<at::ScalarType>& dtypes) {
  std::vector<at::Tensor> keys;
  for (size_t i = 0; i < shapes.size(); ++i) {
    keys.push_back(torch::zeros({}, torch::TensorOptions().dtype(dtypes[i])).expand(shapes[i]));
  }
  return keys;
}
}  // namespace

void write_whole_adamw(torch::serialize::OutputArchive& archive, const WholeAdamWState& state,
                       const std::vector<std::vector<int64_t>>& shapes,
                       const std::vector<at::ScalarType>& dtypes, const OptimizerOptions& options,
                       double lr) {
  std::vector<at::Tensor> keys = state_keys(shapes, dtypes);
  torch::optim::AdamW scratch(keys, adamw_options(options).lr(lr));
  for (size_t i = 0; i < keys.size(); ++i) {
    if (state.steps[i] == 0) continue;  // never stepped: torch holds no state for it
    set_adamw_state(scratch, keys[i], state.steps[i], state.exp_avg[i].to(dtypes[i]),
                    state.exp_avg_sq[i].to(dtypes[i]));
  }
  write_master(archive, state.master);
  torch::serialize::OutputArchive opt;
  scratch.save(opt);
  archive.write("optimizer", opt);
}

StatusOr<WholeAdamWState> read_whole_adamw(torch::serialize::InputArchive& archive,
                                           const std::string& path,
                                           const std::vector<std::vector<int64_t>>& shapes,
                                           const std::vector<at::ScalarType>& dtypes,
                                           bool use_master) {
  WholeAdamWState state;
  std::vector<at::IntArrayRef> expected;
  if (use_master) {
    for (const auto& s : shapes) expected.emplace_back(s);
  }
  RELAY_ASSIGN_OR_RETURN(state.master, read_master(archive, path, expected));
  std::vector<at::Tensor> keys = state_keys(shapes, dtypes);
  torch::optim::AdamW probe(keys, torch::optim::AdamWOptions(1));
  RELAY_RETURN_IF_ERROR(read_adamw(archive, path, probe));
  for (size_t i = 0; i < keys.size(); ++i) {
    torch::optim::AdamWParamState* st = adamw_state(probe, keys[i]);
    if (st != nullptr &&
        (!st->exp_avg().sizes().equals(shapes[i]) || !st->exp_avg_sq().sizes().equals(shapes[i]))) {
      return InvalidArgumentError(absl::StrCat(path, ": optimizer state of parameter ", i,
                                               " has shape ", torch::str(st->exp_avg().sizes()),
                                               ", expected ",
                                               torch::str(at::IntArrayRef(shapes[i]))));
    }
    state.steps.push_back(st != nullptr ? st->step() : 0);
    state.exp_avg.push_back(st != nullptr ? st->exp_avg() : at::Tensor());
    state.exp_avg_sq.push_back(st != nullptr ? st->exp_avg_sq() : at::Tensor());
  }
  return state;
}

void take_state_slice(const WholeAdamWState& whole, size_t param, int64_t offset, int64_t length,
                      at::Tensor& exp_avg, at::Tensor& exp_avg_sq, at::Tensor& master) {
  torch::NoGradGuard no_grad;
  auto slice_of = [&](const at::Tensor& t) { return t.reshape({-1}).narrow(0, offset, length); };
  if (whole.steps[param] > 0) {
    exp_avg.copy_(slice_of(whole.exp_avg[param]));
    exp_avg_sq.copy_(slice_of(whole.exp_avg_sq[param]));
  } else {
    exp_avg.zero_();
    exp_avg_sq.zero_();
  }
  if (master.defined()) master.copy_(slice_of(whole.master[param]));
}

StatusOr<std::unique_ptr<Optimizer>> make_optimizer(const std::vector<at::Tensor>& params,
                                                    const OptimizerOptions& options,
                                                    Sharding sharding, const DataParallel& dp) {
  if (params.empty()) return InvalidArgumentError("optimizer: the policy has no parameters");
  // sharding: full makes its optimizer over its shards (fully_sharded.h);
  // over one rank it is the replicated one.
  if (sharding == Sharding::kOptimizer && dp.active()) {
    return make_sharded_adamw(params, options, dp);
  }
  return make_replicated_adamw(params, options, dp);
}

}  // namespace relay::trainer
