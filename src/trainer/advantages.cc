// compute_advantages (relay/trainer/advantages.h): checks the inputs, runs
// the configured estimator (advantage_estimators.cc) and broadcasts its
// result over the response tokens; and the data controls that drop
// equal-reward groups and truncated responses.

#include "relay/trainer/advantages.h"

#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <map>
#include <utility>

#include "trainer/advantages_internal.h"

namespace relay::trainer {

using internal::as_f64;
using internal::check_mask;
using internal::check_vector;
using internal::Kind;
using internal::mask_f64;
using internal::shape_str;
using internal::validate_inputs;

namespace {

// [B] per trajectory -> [B, L] over the mask, fp32.
at::Tensor broadcast(const at::Tensor& per_trajectory, const at::Tensor& mask) {
  return (as_f64(per_trajectory).unsqueeze(1) * mask_f64(mask)).to(torch::kFloat32);
}

// LUFFY prefix_reward_weight_alpha / _beta: alpha on forced tokens, beta on
// generated ones. Token-level when the forced-token mask is known (as LUFFY's
// prefix_mask), else per trajectory.
at::Tensor prefix_weights(const AdvantageInputs& in, const AdvantageOptions& o) {
  const at::Tensor& mask = in.response_mask;
  at::Tensor forced;
  if (in.offpolicy_mask.defined()) {
    forced = in.offpolicy_mask.to(mask.device());
  } else if (in.offpolicy.defined()) {
    forced = in.offpolicy.to(mask.device()).unsqueeze(1).expand(mask.sizes());
  } else {
    forced = torch::zeros(mask.sizes(), mask.options().dtype(torch::kBool));
  }
  const auto f64 = mask.options().dtype(torch::kFloat64);
  return torch::where(forced, torch::full({}, o.prefix_reward_weight_alpha, f64),
                      torch::full({}, o.prefix_reward_weight_beta, f64));
}

}  // namespace

// ---- Dispatch.

StatusOr<AdvantageOutputs> compute_advantages(const AdvantageInputs& in,
                                              const AdvantageOptions& options) {
  torch::NoGradGuard no_grad;
  RELAY_RETURN_IF_ERROR(check_options(options, "advantage"));
  const AdvantageEstimator e = options.estimator;
  RELAY_RETURN_IF_ERROR(validate_inputs(in, e));
  const at::Tensor& mask = in.response_mask;
  const auto dev = mask.device();
  const at::Tensor rewards = in.rewards.defined() ? in.rewards.to(dev) : at::Tensor();
  const at::Tensor groups = in.group_index.defined() ? in.group_index.to(dev) : at::Tensor();
  const StdScale scale = options.norm_by_std ? options.std_scale : StdScale::kNone;

  AdvantageOutputs out;
  switch (e) {
    case AdvantageEstimator::kGrpo:
      out.advantages =
          broadcast(grpo_outcome_advantages(rewards, groups, scale, options.epsilon), mask);
      break;
    case AdvantageEstimator::kDrGrpo:
      out.advantages = broadcast(
          grpo_outcome_advantages(rewards, groups, StdScale::kNone, options.epsilon), mask);
      break;
    case AdvantageEstimator::kRloo:
      out.advantages = broadcast(rloo_outcome_advantages(rewards, groups), mask);
      break;
    case AdvantageEstimator::kOpo: {
      const at::Tensor lengths = mask.ne(0).sum(1);
      out.advantages = broadcast(opo_outcome_advantages(rewards, groups, lengths), mask);
      break;
    }
    case AdvantageEstimator::kGrpoPassK:
      out.advantages = broadcast(
          grpo_passk_outcome_advantages(rewards, groups, options.norm_by_std, options.epsilon),
          mask);
      break;
    case AdvantageEstimator::kGrpoSplit: {
      at::Tensor offpolicy;
      if (in.offpolicy.defined()) {
        offpolicy = in.offpolicy.to(dev);
      } else if (in.offpolicy_mask.defined()) {
        offpolicy = in.offpolicy_mask.to(dev).logical_and(mask.ne(0)).any(1);
      } else {
        offpolicy = torch::zeros({mask.size(0)}, mask.options().dtype(torch::kBool));
      }
      const at::Tensor a = grpo_split_outcome_advantages(rewards, groups, offpolicy,
                                                         options.norm_by_std, options.epsilon);
      out.advantages =
          (as_f64(broadcast(a, mask)) * prefix_weights(in, options)).to(torch::kFloat32);
      break;
    }
    case AdvantageEstimator::kRemax: {
      const at::Tensor tr = in.token_rewards.defined() ? in.token_rewards.to(dev)
                                                       : outcome_to_token_rewards(rewards, mask);
      ReturnsAndAdvantages r = remax_returns_advantages(tr, in.baseline_rewards, mask);
      out.advantages = r.advantages;
      out.returns = r.returns;
      break;
    }
    case AdvantageEstimator::kReinforcePlusPlus: {
      const at::Tensor tr = in.token_rewards.defined() ? in.token_rewards.to(dev)
                                                       : outcome_to_token_rewards(rewards, mask);
      out.returns = discounted_returns(tr, mask, options.gamma);
      out.advantages = masked_whiten(out.returns, mask);
      break;
    }
    case AdvantageEstimator::kReinforcePlusPlusBaseline:
      out.advantages =
          masked_whiten(broadcast(group_mean_baseline_advantages(rewards, groups), mask), mask);
      break;
    case AdvantageEstimator::kGae: {
      const at::Tensor tr = in.token_rewards.defined() ? in.token_rewards.to(dev)
                                                       : outcome_to_token_rewards(rewards, mask);
      GaeResult gae =
          gae_advantages_returns(tr, in.values.to(dev), mask, options.gamma, options.lambda);
      out.returns = gae.returns;
      out.advantages = masked_whiten(gae.advantages, mask);
      break;
    }
    case AdvantageEstimator::kNone:
      out.advantages = torch::zeros(mask.sizes(), mask.options().dtype(torch::kFloat32));
      break;
  }
  if (!out.returns.defined()) out.returns = out.advantages;
  return out;
}

// ---- Data controls.

StatusOr<EqualRewardGroups> groups_with_equal_rewards(const at::Tensor& rewards,
                                                      const at::Tensor& group_index) {
  if (!rewards.defined()) return InvalidArgumentError("rewards: missing");
  if (rewards.dim() != 1) {
    return InvalidArgumentError(
        absl::StrCat("rewards: must be 1-D [B], got shape ", shape_str(rewards)));
  }
  const int64_t batch = rewards.size(0);
  RELAY_RETURN_IF_ERROR(check_vector("rewards", rewards, batch, Kind::kFloat));
  RELAY_RETURN_IF_ERROR(check_vector("group_index", group_index, batch, Kind::kInt));

  const at::Tensor r = as_f64(rewards).cpu().contiguous();
  const at::Tensor ids = group_index.to(torch::kInt64).cpu().contiguous();
  const auto rv = r.accessor<double, 1>();
  const auto iv = ids.accessor<int64_t, 1>();
  // Exact comparison: a group is dropped only when every reward is identical.
  std::map<int64_t, std::pair<double, double>> range;  // id -> (min, max)
  for (int64_t i = 0; i < batch; ++i) {
    auto [it, fresh] = range.try_emplace(iv[i], rv[i], rv[i]);
    if (!fresh) {
      it->second.first = std::min(it->second.first, rv[i]);
      it->second.second = std::max(it->second.second, rv[i]);
    }
  }
  EqualRewardGroups out;
  out.num_groups = static_cast<int64_t>(range.size());
  at::Tensor keep = torch::ones({batch}, torch::kBool);
  for (int64_t i = 0; i < batch; ++i) {
    const auto& [lo, hi] = range.at(iv[i]);
    if (lo == hi) keep[i] = false;
  }
  for (const auto& [id, lo_hi] : range) {
    if (lo_hi.first == lo_hi.second) ++out.num_dropped_groups;
  }
  out.keep = keep.to(rewards.device());
  return out;
}

StatusOr<at::Tensor> overlong_penalty(const at::Tensor& response_lengths, int64_t max_length,
                                      int64_t buffer, double penalty_factor) {
  if (!response_lengths.defined()) return InvalidArgumentError("response_lengths: missing");
  const int64_t batch = response_lengths.dim() == 1 ? response_lengths.size(0) : 0;
  RELAY_RETURN_IF_ERROR(check_vector("response_lengths", response_lengths, batch, Kind::kInt));
  if (buffer < 1 || buffer >= max_length) {
    return InvalidArgumentError(
        absl::StrCat("overlong_buffer.length: must be in [1, ", max_length, "), got ", buffer));
  }
  const at::Tensor len = response_lengths.to(torch::kFloat64);
  const double expected = static_cast<double>(max_length - buffer);
  const at::Tensor exceed = len - expected;
  return (-exceed / static_cast<double>(buffer) * penalty_factor)
      .clamp_max(0.0)
      .to(torch::kFloat32);
}

StatusOr<at::Tensor> overlong_mask(const at::Tensor& response_mask, const at::Tensor& truncated) {
  RELAY_RETURN_IF_ERROR(check_mask(response_mask));
  RELAY_RETURN_IF_ERROR(check_vector("truncated", truncated, response_mask.size(0), Kind::kBool));
  const at::Tensor keep = truncated.to(response_mask.device()).logical_not().unsqueeze(1);
  return torch::where(keep, response_mask, torch::zeros_like(response_mask));
}

StatusOr<at::Tensor> distill_advantages(const at::Tensor& student_logprobs,
                                        const at::Tensor& teacher_logprobs,
                                        const at::Tensor& response_mask, double coef,
                                        double discount) {
  RELAY_RETURN_IF_ERROR(check_mask(response_mask));
  for (const auto& [name, t] :
       {std::pair<const char*, const at::Tensor*>{"student_logprobs", &student_logprobs},
        {"teacher_logprobs", &teacher_logprobs}}) {
    if (!t->defined() || t->sizes() != response_mask.sizes()) {
      return InvalidArgumentError(absl::StrCat(name, ": must be ", shape_str(response_mask),
                                               " like response_mask, got ",
                                               t->defined() ? shape_str(*t) : "undefined"));
    }
  }
  const at::Tensor outside = response_mask.eq(0);
  at::Tensor a = (-coef * (as_f64(student_logprobs) - as_f64(teacher_logprobs)))
                     .masked_fill(outside.to(student_logprobs.device()), 0.0);
  if (discount > 0) {
    // Back to front: a_j += discount * a_{j+1}.
    const int64_t L = a.size(1);
    for (int64_t j = L - 2; j >= 0; --j) {
      a.select(1, j).add_(a.select(1, j + 1), discount);
    }
  }
  return a.to(torch::kFloat32);
}

}  // namespace relay::trainer
