// The LUFFY mixed on/off-policy loss (relay/trainer/policy_loss.h): PPO on
// the tokens the policy sampled, a shaped -A f(pi_theta) on the guidance
// (forced prefix) tokens, and the optional SFT term on the latter.

#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>

#include "relay/trainer/policy_loss.h"
#include "trainer/policy_loss_internal.h"

namespace relay::trainer {

using internal::as_bool;
using internal::clipped_surrogate;
using internal::fill_clip_metrics;
using internal::fraction;
using internal::is_weighted;
using internal::masked_mean;
using internal::Surrogate;

namespace {

at::Tensor shape_off_policy(const at::Tensor& logp, const LuffyOptions& o) {
  at::Tensor p = logp.exp();
  switch (o.shaping) {
    case OffPolicyShaping::kPDivP:
    case OffPolicyShaping::kPDivP01:
    case OffPolicyShaping::kPDivP03:
    case OffPolicyShaping::kPDivP05: {
      const double gamma = p_div_p_gamma(o.shaping, o.gamma);
      return p / (p + gamma);
    }
    case OffPolicyShaping::kNoReshape:
      return p;
    case OffPolicyShaping::kLogp:
      return o.shaping_weight * logp;
    case OffPolicyShaping::kPLogp:
      return p + o.shaping_weight * logp;
    case OffPolicyShaping::kSquareRoot:
      return p.sqrt();
    case OffPolicyShaping::kPow:
      return p.pow(o.pow_exponent);
  }
  return p;
}

// LUFFY's on-policy ratio shaping, from d = clamped logp - anchor.
at::Tensor shape_on_policy(const at::Tensor& d, const at::Tensor& logp, const at::Tensor& anchor,
                           const LuffyOptions& o) {
  switch (o.on_policy_shaping) {
    case OffPolicyShaping::kNoReshape:
      return d.exp();
    case OffPolicyShaping::kLogp:
      return d;
    case OffPolicyShaping::kPLogp:
      return d.exp() + o.on_policy_shaping_weight * d;
    case OffPolicyShaping::kSquareRoot:
      return d.exp().sqrt();
    case OffPolicyShaping::kPow:
      return d.exp().pow(o.on_policy_pow_exponent);
    case OffPolicyShaping::kPDivP:
    case OffPolicyShaping::kPDivP01:
    case OffPolicyShaping::kPDivP03:
    case OffPolicyShaping::kPDivP05: {
      const double gamma = p_div_p_gamma(o.on_policy_shaping, o.gamma);
      at::Tensor p = logp.exp(), p_old = anchor.exp();
      return (p / (p + gamma)) / (p_old / (p_old + gamma));
    }
  }
  return d.exp();
}

// The on-policy surrogate around `anchor`, with LUFFY's ratio shaping when
// one is set (the clip then bounds the shaped ratio, and there is no dual clip).
Surrogate on_policy_surrogate(const at::Tensor& logp, const at::Tensor& anchor,
                              const at::Tensor& adv, const LuffyOptions& o, double upper) {
  Surrogate s = clipped_surrogate(logp, anchor, adv, o.on_policy, upper);
  if (o.on_policy_shaping == OffPolicyShaping::kNoReshape) return s;
  s.ratio = shape_on_policy(s.log_ratio, logp, anchor, o);
  at::Tensor l1 = -adv * s.ratio;
  at::Tensor l2 = -adv * s.ratio.clamp(1.0 - o.on_policy.clip_low, upper);
  s.loss = torch::max(l1, l2);
  s.clipped = l2.detach().gt(l1.detach());
  s.dual = torch::zeros_like(s.clipped);
  return s;
}

// LUFFY's own ppo_kl and on_pg_clipfrac: over every masked response token,
// guidance tokens included, each against its old log-prob (`old`, where
// finite; a token without one counts as ratio 1). No gradient.
void fill_luffy_metrics(const PolicyLossInputs& in, const at::Tensor& m, const at::Tensor& adv,
                        const LuffyOptions& o, double upper, PolicyLossMetrics* out) {
  torch::NoGradGuard no_grad;
  at::Tensor logp = in.logprobs.detach();
  at::Tensor old = in.old_logprobs.detach();
  at::Tensor anchor = torch::where(m.logical_and(old.isfinite()), old, logp);
  Surrogate all = on_policy_surrogate(logp, anchor, adv, o, upper);
  fill_clip_metrics(all, adv, m, out);
  out->ppo_kl = masked_mean(anchor - logp, m);  // LUFFY does not clamp the log ratio
  if (o.loss_remove_clip) {
    // LUFFY reports no clipping then.
    out->clip_fraction = out->clip_fraction_low = out->clip_fraction_high = 0;
    out->dual_clip_fraction = 0;
  }
}

}  // namespace

LuffyLossResult luffy_loss(const PolicyLossInputs& in, const at::Tensor& offpolicy_mask,
                           const LuffyOptions& options, const GlobalNormalizer& normalizer,
                           const GlobalNormalizer& sft_normalizer) {
  at::Tensor m = as_bool(in.response_mask);
  at::Tensor off = as_bool(offpolicy_mask).logical_and(m);
  at::Tensor on = m.logical_and(off.logical_not());
  at::Tensor adv = in.advantages.detach();
  at::Tensor logp = in.logprobs;

  // On-policy part. Elsewhere the anchor is logp itself (ratio 1), so NaN
  // behavior log-probs of guidance tokens never enter the graph.
  at::Tensor anchor = torch::where(on, in.old_logprobs.detach(), logp.detach());
  const double upper = std::max(options.clip_upper_bound, 1.0 + options.on_policy.clip_high);
  Surrogate s = on_policy_surrogate(logp, anchor, adv, options, upper);
  at::Tensor on_loss = options.loss_remove_clip ? -adv * s.ratio : s.loss;

  // Off-policy part, computed on logp where off and on 0 elsewhere (p = 1),
  // so sqrt/pow/log never see values whose gradient would be inf.
  at::Tensor logp_off = torch::where(off, logp, torch::zeros_like(logp));
  at::Tensor f = shape_off_policy(logp_off, options);
  at::Tensor max_clipped = torch::zeros_like(off);
  at::Tensor min_clipped = torch::zeros_like(off);
  if (options.off_max_clip > 0) {
    max_clipped = f.detach().ge(options.off_max_clip);
    f = f.clamp_max(options.off_max_clip);
  }
  if (options.off_min_clip > 0) {
    min_clipped = f.detach().le(options.off_min_clip);
    f = f.clamp_min(options.off_min_clip);
  }
  at::Tensor off_loss = -adv * f;

  at::Tensor loss_mat = torch::where(off, off_loss, on_loss);
  LuffyLossResult r;
  r.loss = aggregate_loss(is_weighted(in, loss_mat), m, options.on_policy.agg_mode, normalizer);
  if (options.sft_coef > 0) {
    at::Tensor sft = aggregate_loss(-logp_off, off, LossAggMode::kTokenMean, sft_normalizer);
    r.loss = r.loss + options.sft_coef * sft;
    r.metrics.sft_loss = sft.item<double>();
  }

  LuffyLossMetrics& mt = r.metrics;
  fill_luffy_metrics(in, m, adv, options, upper, &mt.all_tokens);
  if (options.loss_remove_clip) {
    mt.on_policy.ppo_kl = masked_mean(-s.log_ratio, on);
    mt.on_policy.mean_ratio = masked_mean(s.ratio, on);
  } else {
    fill_clip_metrics(s, adv, on, &mt.on_policy);
  }
  mt.on_loss = masked_mean(on_loss, on);
  mt.off_loss = masked_mean(off_loss, off);
  mt.off_ratio_mean = masked_mean(f, off);
  mt.off_max_clip_fraction = fraction(max_clipped, off);
  mt.off_min_clip_fraction = fraction(min_clipped, off);
  mt.off_policy_prob = masked_mean(logp_off.exp(), off);
  mt.off_policy_fraction = fraction(off, m);
  return r;
}

}  // namespace relay::trainer
