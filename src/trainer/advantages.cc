#include "relay/trainer/advantages.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <sstream>
#include <utility>
#include <vector>

namespace relay::trainer {
namespace {

// ---- Estimator names.

struct EstimatorName {
  AdvantageEstimator estimator;
  const char* name;
};
constexpr EstimatorName kEstimatorNames[] = {
    {AdvantageEstimator::kGrpo, "grpo"},
    {AdvantageEstimator::kDrGrpo, "dr_grpo"},
    {AdvantageEstimator::kRloo, "rloo"},
    {AdvantageEstimator::kReinforcePlusPlus, "reinforce_plus_plus"},
    {AdvantageEstimator::kReinforcePlusPlusBaseline, "reinforce_plus_plus_baseline"},
    {AdvantageEstimator::kOpo, "opo"},
    {AdvantageEstimator::kGrpoPassK, "grpo_passk"},
    {AdvantageEstimator::kGrpoSplit, "grpo_split"},
    {AdvantageEstimator::kRemax, "remax"},
    {AdvantageEstimator::kGae, "gae"},
};

// ---- Groups: arbitrary int64 ids -> dense 0..G-1.

struct Groups {
  at::Tensor inverse;  // [B] int64: dense group of each row
  at::Tensor sizes;    // [G] fp64
  int64_t count = 0;   // G
};

Groups make_groups(const at::Tensor& group_index) {
  auto [unique, inverse, counts] =
      at::_unique2(group_index.to(torch::kInt64), /*sorted=*/true, /*return_inverse=*/true,
                   /*return_counts=*/true);
  Groups g;
  g.inverse = inverse.reshape({-1});
  g.sizes = counts.to(torch::kFloat64);
  g.count = unique.numel();
  return g;
}

// Sum of x [B] over each group -> [G].
at::Tensor group_sum(const at::Tensor& x, const Groups& g) {
  return torch::zeros({g.count}, x.options()).index_add_(0, g.inverse, x);
}

// Per group: mean and unbiased std of x over the rows with w = 1 (w [B] of
// 0/1). A group with fewer than two such rows gets std 0 (mean 0 when it has
// none), for the caller to override.
std::pair<at::Tensor, at::Tensor> group_mean_std(const at::Tensor& x, const at::Tensor& w,
                                                 const Groups& g) {
  at::Tensor n = group_sum(w, g);
  at::Tensor mean = group_sum(x * w, g) / n.clamp_min(1.0);
  at::Tensor dev = (x - mean.index_select(0, g.inverse)) * w;
  at::Tensor var = group_sum(dev * dev, g) / (n - 1.0).clamp_min(1.0);
  return {mean, var.sqrt()};
}

at::Tensor as_f64(const at::Tensor& t) { return t.to(torch::kFloat64); }
at::Tensor mask_f64(const at::Tensor& mask) { return mask.ne(0).to(torch::kFloat64); }

// ---- Validation.

std::string shape_str(const at::Tensor& t) {
  std::ostringstream os;
  os << t.sizes();
  return os.str();
}

std::string dtype_str(const at::Tensor& t) { return std::string(c10::toString(t.scalar_type())); }

enum class Kind { kFloat, kInt, kBool, kMask };

Status check_kind(const char* name, const at::Tensor& t, Kind kind) {
  const bool ok = kind == Kind::kFloat ? t.is_floating_point()
                  : kind == Kind::kInt
                      ? !t.is_floating_point() && !t.is_complex() && t.scalar_type() != torch::kBool
                  : kind == Kind::kBool ? t.scalar_type() == torch::kBool
                                        : !t.is_complex();
  if (ok) return OkStatus();
  const char* want = kind == Kind::kFloat  ? "floating point"
                     : kind == Kind::kInt  ? "an integer type"
                     : kind == Kind::kBool ? "bool"
                                           : "bool or numeric";
  return InvalidArgumentError(absl::StrCat(name, ": must be ", want, ", got ", dtype_str(t)));
}

Status check_finite(const char* name, const at::Tensor& t) {
  at::Tensor bad = t.isfinite().logical_not().reshape({-1});
  if (!bad.any().item<bool>()) return OkStatus();
  const int64_t at_flat = bad.to(torch::kInt64).argmax().item<int64_t>();
  return InvalidArgumentError(absl::StrCat(name, ": not finite at flat index ", at_flat, " (",
                                           t.reshape({-1})[at_flat].item<double>(), ")"));
}

// A per-trajectory tensor [B].
Status check_vector(const char* name, const at::Tensor& t, int64_t batch, Kind kind) {
  if (!t.defined()) return InvalidArgumentError(absl::StrCat(name, ": missing"));
  if (t.dim() != 1) {
    return InvalidArgumentError(absl::StrCat(name, ": must be 1-D [B], got shape ", shape_str(t)));
  }
  if (t.size(0) != batch) {
    return InvalidArgumentError(
        absl::StrCat(name, ": ", t.size(0), " entries for ", batch, " trajectories"));
  }
  RELAY_RETURN_IF_ERROR(check_kind(name, t, kind));
  if (kind == Kind::kFloat) RELAY_RETURN_IF_ERROR(check_finite(name, t));
  return OkStatus();
}

// A per-token tensor [B, L] shaped like the response mask.
Status check_matrix(const char* name, const at::Tensor& t, const at::Tensor& mask, Kind kind) {
  if (!t.defined()) return InvalidArgumentError(absl::StrCat(name, ": missing"));
  if (t.sizes() != mask.sizes()) {
    return InvalidArgumentError(
        absl::StrCat(name, ": shape ", shape_str(t), " != response_mask's ", shape_str(mask)));
  }
  RELAY_RETURN_IF_ERROR(check_kind(name, t, kind));
  // Padding may hold anything finite; NaN/inf anywhere would leak through 0 * x.
  if (kind == Kind::kFloat) RELAY_RETURN_IF_ERROR(check_finite(name, t));
  return OkStatus();
}

Status check_mask(const at::Tensor& mask) {
  if (!mask.defined()) return InvalidArgumentError("response_mask: missing");
  if (mask.dim() != 2) {
    return InvalidArgumentError(
        absl::StrCat("response_mask: must be 2-D [B, L], got shape ", shape_str(mask)));
  }
  return check_kind("response_mask", mask, Kind::kMask);
}

Status require(const char* name, const at::Tensor& t, AdvantageEstimator e) {
  if (t.defined()) return OkStatus();
  return InvalidArgumentError(
      absl::StrCat(name, ": required by ", kAdvantageEstimatorNames.name(e)));
}

bool uses_groups(AdvantageEstimator e) {
  switch (e) {
    case AdvantageEstimator::kGrpo:
    case AdvantageEstimator::kDrGrpo:
    case AdvantageEstimator::kRloo:
    case AdvantageEstimator::kReinforcePlusPlusBaseline:
    case AdvantageEstimator::kOpo:
    case AdvantageEstimator::kGrpoPassK:
    case AdvantageEstimator::kGrpoSplit:
      return true;
    default:
      return false;
  }
}

bool whitens(AdvantageEstimator e) {
  return e == AdvantageEstimator::kReinforcePlusPlus ||
         e == AdvantageEstimator::kReinforcePlusPlusBaseline || e == AdvantageEstimator::kGae;
}

bool takes_token_rewards(AdvantageEstimator e) {
  return e == AdvantageEstimator::kReinforcePlusPlus || e == AdvantageEstimator::kGae;
}

Status validate_inputs(const AdvantageInputs& in, AdvantageEstimator e) {
  RELAY_RETURN_IF_ERROR(check_mask(in.response_mask));
  const at::Tensor& mask = in.response_mask;
  const int64_t batch = mask.size(0);
  if (batch == 0) return InvalidArgumentError("response_mask: empty batch (0 trajectories)");

  // Outcome rewards: everything but REINFORCE++ / GAE given token rewards.
  if (!(takes_token_rewards(e) && in.token_rewards.defined())) {
    RELAY_RETURN_IF_ERROR(require("rewards", in.rewards, e));
  }
  if (in.rewards.defined()) {
    RELAY_RETURN_IF_ERROR(check_vector("rewards", in.rewards, batch, Kind::kFloat));
  }
  if (uses_groups(e)) RELAY_RETURN_IF_ERROR(require("group_index", in.group_index, e));
  if (in.group_index.defined()) {
    RELAY_RETURN_IF_ERROR(check_vector("group_index", in.group_index, batch, Kind::kInt));
  }
  if (in.offpolicy.defined()) {
    RELAY_RETURN_IF_ERROR(check_vector("offpolicy", in.offpolicy, batch, Kind::kBool));
  }
  if (in.offpolicy_mask.defined()) {
    RELAY_RETURN_IF_ERROR(check_matrix("offpolicy_mask", in.offpolicy_mask, mask, Kind::kBool));
  }
  if (in.token_rewards.defined()) {
    RELAY_RETURN_IF_ERROR(check_matrix("token_rewards", in.token_rewards, mask, Kind::kFloat));
  }
  if (e == AdvantageEstimator::kGae) RELAY_RETURN_IF_ERROR(require("values", in.values, e));
  if (in.values.defined()) {
    RELAY_RETURN_IF_ERROR(check_matrix("values", in.values, mask, Kind::kFloat));
  }
  if (e == AdvantageEstimator::kRemax) {
    RELAY_RETURN_IF_ERROR(require("baseline_rewards", in.baseline_rewards, e));
  }
  if (in.baseline_rewards.defined()) {
    RELAY_RETURN_IF_ERROR(
        check_vector("baseline_rewards", in.baseline_rewards, batch, Kind::kFloat));
  }

  if (whitens(e)) {
    const int64_t tokens = mask.ne(0).sum().item<int64_t>();
    if (tokens < 2) {
      return InvalidArgumentError(absl::StrCat("response_mask: ", kAdvantageEstimatorNames.name(e),
                                               " whitens over the batch and needs >= 2 response "
                                               "tokens, got ",
                                               tokens));
    }
  }
  if (e == AdvantageEstimator::kGrpoPassK) {
    auto [unique, inverse, counts] =
        at::_unique2(in.group_index.cpu(), /*sorted=*/true, false, /*return_counts=*/true);
    const at::Tensor small = counts.lt(2);
    if (small.any().item<bool>()) {
      const int64_t g = small.to(torch::kInt64).argmax().item<int64_t>();
      return InvalidArgumentError(absl::StrCat("group_index: group ", unique[g].item<int64_t>(),
                                               " has ", counts[g].item<int64_t>(),
                                               " sample; grpo_passk needs >= 2 per group"));
    }
  }
  return OkStatus();
}

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

// ---- Outcome-reward estimators, [B] -> [B].

at::Tensor grpo_outcome_advantages(const at::Tensor& rewards, const at::Tensor& group_index,
                                   StdScale std_scale, double epsilon) {
  const at::Tensor r = as_f64(rewards);
  const Groups g = make_groups(group_index.to(r.device()));
  auto [mean, sd] = group_mean_std(r, torch::ones_like(r), g);
  const at::Tensor single = g.sizes.eq(1.0);
  mean = torch::where(single, torch::zeros_like(mean), mean);
  sd = torch::where(single, torch::ones_like(sd), sd);
  at::Tensor a = r - mean.index_select(0, g.inverse);
  if (std_scale == StdScale::kGroup) {
    a = a / (sd.index_select(0, g.inverse) + epsilon);
  } else if (std_scale == StdScale::kBatch) {
    const double s = r.numel() > 1 ? r.std().item<double>() : 1.0;  // unbiased, as torch.std
    a = a / (s + epsilon);
  }
  return a.to(torch::kFloat32);
}

at::Tensor rloo_outcome_advantages(const at::Tensor& rewards, const at::Tensor& group_index) {
  const at::Tensor r = as_f64(rewards);
  const Groups g = make_groups(group_index.to(r.device()));
  const at::Tensor k = g.sizes.index_select(0, g.inverse);
  const at::Tensor mean = (group_sum(r, g) / g.sizes).index_select(0, g.inverse);
  // r_i - (K mean - r_i) / (K - 1) = K / (K - 1) (r_i - mean).
  const at::Tensor a = k / (k - 1.0).clamp_min(1.0) * (r - mean);
  return torch::where(k.gt(1.0), a, torch::zeros_like(a)).to(torch::kFloat32);
}

at::Tensor opo_outcome_advantages(const at::Tensor& rewards, const at::Tensor& group_index,
                                  const at::Tensor& lengths) {
  const at::Tensor r = as_f64(rewards);
  const at::Tensor len = as_f64(lengths).to(r.device());
  const Groups g = make_groups(group_index.to(r.device()));
  const at::Tensor len_sum = group_sum(len, g);
  at::Tensor b = group_sum(len * r, g) / len_sum.clamp_min(1.0);  // all-empty group: 0
  b = torch::where(g.sizes.eq(1.0), torch::zeros_like(b), b);
  return (r - b.index_select(0, g.inverse)).to(torch::kFloat32);
}

at::Tensor grpo_passk_outcome_advantages(const at::Tensor& rewards, const at::Tensor& group_index,
                                         bool norm_by_std, double epsilon) {
  const at::Tensor r = as_f64(rewards).cpu().contiguous();
  const Groups g = make_groups(group_index.cpu());
  auto [mean, sd] = group_mean_std(r, torch::ones_like(r), g);
  const at::Tensor inv = g.inverse.contiguous();
  const auto rv = r.accessor<double, 1>();
  const auto gv = inv.accessor<int64_t, 1>();
  const int64_t batch = r.size(0);
  constexpr double kLowest = -std::numeric_limits<double>::infinity();
  std::vector<int64_t> best(g.count, -1);
  std::vector<double> first(g.count, kLowest), second(g.count, kLowest);
  for (int64_t i = 0; i < batch; ++i) {
    const int64_t k = gv[i];
    if (best[k] < 0 || rv[i] > first[k]) {  // strict: ties keep the lowest row
      second[k] = first[k];
      first[k] = rv[i];
      best[k] = i;
    } else if (rv[i] > second[k]) {
      second[k] = rv[i];
    }
  }
  at::Tensor a = torch::zeros({batch}, torch::kFloat64);
  for (int64_t k = 0; k < g.count; ++k) {
    double adv = first[k] - second[k];
    if (norm_by_std) adv /= sd[k].item<double>() + epsilon;
    a[best[k]] = adv;
  }
  return a.to(torch::kFloat32).to(rewards.device());
}

at::Tensor grpo_split_outcome_advantages(const at::Tensor& rewards, const at::Tensor& group_index,
                                         const at::Tensor& offpolicy, bool norm_by_std,
                                         double epsilon) {
  const at::Tensor r = as_f64(rewards);
  const Groups g = make_groups(group_index.to(r.device()));
  const at::Tensor on = offpolicy.to(r.device()).logical_not().to(torch::kFloat64);
  auto [mean, sd] = group_mean_std(r, on, g);
  const at::Tensor few = group_sum(on, g).le(1.0);  // 0 or 1 on-policy samples
  mean = torch::where(few, torch::zeros_like(mean), mean);
  sd = torch::where(few.logical_or(sd.eq(0.0)), torch::ones_like(sd), sd);
  at::Tensor a = r - mean.index_select(0, g.inverse);
  if (norm_by_std) a = a / (sd.index_select(0, g.inverse) + epsilon);
  return a.to(torch::kFloat32);
}

at::Tensor group_mean_baseline_advantages(const at::Tensor& rewards,
                                          const at::Tensor& group_index) {
  return grpo_outcome_advantages(rewards, group_index, StdScale::kNone, 1.0);
}

// ---- Token-level pieces, [B, L].

at::Tensor outcome_to_token_rewards(const at::Tensor& rewards, const at::Tensor& response_mask) {
  const at::Tensor m = mask_f64(response_mask);
  const int64_t len = m.size(1);
  // 1-based position of the last masked token, 0 for an empty row.
  const at::Tensor pos = torch::arange(1, len + 1, m.options());
  const at::Tensor last = (m * pos).amax(1);
  const at::Tensor r = as_f64(rewards).to(m.device()) * last.gt(0).to(torch::kFloat64);
  const at::Tensor col = (last - 1).clamp_min(0).to(torch::kInt64).unsqueeze(1);
  return torch::zeros_like(m).scatter_(1, col, r.unsqueeze(1)).to(torch::kFloat32);
}

at::Tensor discounted_returns(const at::Tensor& token_rewards, const at::Tensor& response_mask,
                              double gamma) {
  torch::NoGradGuard no_grad;
  const at::Tensor m = mask_f64(response_mask);
  const at::Tensor tr = as_f64(token_rewards).to(m.device());
  at::Tensor out = torch::zeros_like(m);
  at::Tensor running = torch::zeros({m.size(0)}, m.options());
  for (int64_t t = m.size(1) - 1; t >= 0; --t) {
    const at::Tensor mt = m.select(1, t);
    running = mt * (tr.select(1, t) + gamma * running) + (1.0 - mt) * running;
    out.select(1, t).copy_(running * mt);
  }
  return out.to(torch::kFloat32);
}

at::Tensor masked_whiten(const at::Tensor& values, const at::Tensor& response_mask) {
  torch::NoGradGuard no_grad;
  const at::Tensor m = mask_f64(response_mask);
  const at::Tensor x = as_f64(values).to(m.device());
  const at::Tensor n = m.sum();
  const at::Tensor mean = (x * m).sum() / n;
  const at::Tensor centered = x - mean;
  const at::Tensor var = (centered * centered * m).sum() / (n - 1.0);  // Bessel, as verl
  return (centered * torch::rsqrt(var + 1e-8) * m).to(torch::kFloat32);
}

GaeResult gae_advantages_returns(const at::Tensor& token_rewards, const at::Tensor& values,
                                 const at::Tensor& response_mask, double gamma, double lambda) {
  torch::NoGradGuard no_grad;
  const at::Tensor m = mask_f64(response_mask);
  const at::Tensor tr = as_f64(token_rewards).to(m.device());
  const at::Tensor v = as_f64(values).to(m.device());
  const int64_t batch = m.size(0);
  at::Tensor adv = torch::zeros_like(m);
  at::Tensor next_value = torch::zeros({batch}, m.options());
  at::Tensor last_gae = torch::zeros({batch}, m.options());
  for (int64_t t = m.size(1) - 1; t >= 0; --t) {
    const at::Tensor mt = m.select(1, t);
    const at::Tensor vt = v.select(1, t);
    const at::Tensor delta = tr.select(1, t) + gamma * next_value - vt;
    const at::Tensor gae = delta + gamma * lambda * last_gae;
    // A masked-out token keeps the next token's value and advantage.
    next_value = mt * vt + (1.0 - mt) * next_value;
    last_gae = mt * gae + (1.0 - mt) * last_gae;
    adv.select(1, t).copy_(last_gae);
  }
  GaeResult out;
  out.returns = ((adv + v) * m).to(torch::kFloat32);
  out.advantages = (adv * m).to(torch::kFloat32);
  return out;
}

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
    case AdvantageEstimator::kRemax:
      out.advantages = broadcast(as_f64(rewards) - as_f64(in.baseline_rewards.to(dev)), mask);
      out.returns = broadcast(rewards, mask);
      break;
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

StatusOr<at::Tensor> overlong_mask(const at::Tensor& response_mask, const at::Tensor& truncated) {
  RELAY_RETURN_IF_ERROR(check_mask(response_mask));
  RELAY_RETURN_IF_ERROR(check_vector("truncated", truncated, response_mask.size(0), Kind::kBool));
  const at::Tensor keep = truncated.to(response_mask.device()).logical_not().unsqueeze(1);
  return torch::where(keep, response_mask, torch::zeros_like(response_mask));
}

}  // namespace relay::trainer
