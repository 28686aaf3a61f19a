// The advantage estimators' building blocks (relay/trainer/advantages.h):
// the outcome-reward estimators, [B] -> [B], and the token-level pieces,
// [B, L]: token rewards, discounted returns, whitening and GAE. Pure
// functions over validated tensors; compute_advantages (advantages.cc)
// checks the inputs and picks among them.

#include <torch/types.h>
#include <torch/utils.h>

#include <limits>
#include <utility>
#include <vector>

#include "relay/trainer/advantages.h"
#include "trainer/advantages_internal.h"

namespace relay::trainer {

using internal::as_f64;
using internal::mask_f64;

namespace {

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

ReturnsAndAdvantages remax_returns_advantages(const at::Tensor& token_rewards,
                                              const at::Tensor& baseline_rewards,
                                              const at::Tensor& response_mask) {
  torch::NoGradGuard no_grad;
  const at::Tensor m = mask_f64(response_mask);
  ReturnsAndAdvantages out;
  out.returns = discounted_returns(token_rewards, response_mask, /*gamma=*/1.0);
  const at::Tensor b = as_f64(baseline_rewards).to(m.device()).unsqueeze(1);
  out.advantages = ((as_f64(out.returns) - b) * m).to(torch::kFloat32);
  return out;
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
}  // namespace relay::trainer
