// The policy losses built on the ratio pi_theta / pi_old (or / pi_prox):
// PPO and decoupled PPO, the sequence-level and gated forms (GSPO, GMPO,
// CISPO, SAPO) and the covariance-based ones (Clip-Cov, KL-Cov). Declared
// in relay/trainer/policy_loss.h; the helpers they share are in
// policy_loss_internal.h.

#include <ATen/CPUGeneratorImpl.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>

#include "relay/trainer/policy_loss.h"
#include "trainer/policy_loss_internal.h"

namespace relay::trainer {

using internal::as_bool;
using internal::clipped_surrogate;
using internal::denominator;
using internal::fill_clip_metrics;
using internal::fraction;
using internal::is_weighted;
using internal::masked_mean;
using internal::Surrogate;
using internal::zeros_where_not;

// --------------------------------------------------------------------- PPO

PolicyLossResult ppo_clip_loss(const PolicyLossInputs& in, const PpoClipOptions& options,
                               const GlobalNormalizer& normalizer) {
  at::Tensor m = as_bool(in.response_mask);
  at::Tensor adv = in.advantages.detach();
  Surrogate s = clipped_surrogate(in.logprobs, in.old_logprobs.detach(), adv, options,
                                  1.0 + options.clip_high);
  PolicyLossResult r;
  r.loss = aggregate_loss(is_weighted(in, s.loss), m, options.agg_mode, normalizer);
  fill_clip_metrics(s, adv, m, &r.metrics);
  return r;
}

PolicyLossResult decoupled_ppo_loss(const PolicyLossInputs& in, const PpoClipOptions& options,
                                    const GlobalNormalizer& normalizer) {
  TORCH_CHECK(in.proximal_logprobs.defined(), "decoupled_ppo_loss: proximal_logprobs is undefined");
  at::Tensor m = as_bool(in.response_mask);
  at::Tensor adv = in.advantages.detach();
  at::Tensor prox = in.proximal_logprobs.detach();
  at::Tensor behav = in.old_logprobs.detach();
  Surrogate s = clipped_surrogate(in.logprobs, prox, adv, options, 1.0 + options.clip_high);
  at::Tensor weight = (prox - behav).exp();
  at::Tensor keep = torch::ones_like(m);
  if (options.behav_imp_weight_cap > 0) keep = weight.le(options.behav_imp_weight_cap);
  weight = zeros_where_not(keep, weight);
  PolicyLossResult r;
  r.loss = aggregate_loss(is_weighted(in, s.loss * weight), m, options.agg_mode, normalizer);
  fill_clip_metrics(s, adv, m, &r.metrics);
  at::Tensor kept = m.logical_and(keep);
  r.metrics.behav_imp_weight = masked_mean(weight, kept);
  r.metrics.behav_capped_fraction = fraction(keep.logical_not(), m);
  r.metrics.behav_kl = masked_mean(behav - prox, m);
  return r;
}

at::Tensor loglinear_proximal_logprobs(const at::Tensor& behavior_logprobs,
                                       const at::Tensor& current_logprobs,
                                       const at::Tensor& token_versions, int64_t trainer_version) {
  at::Tensor behav = behavior_logprobs.detach();
  at::Tensor cur = current_logprobs.detach();
  at::Tensor b = token_versions.to(torch::kFloat64);
  const double v = static_cast<double>(trainer_version);
  at::Tensor span = (v + 1.0) - b;  // version distance to the policy being trained
  at::Tensor valid = token_versions.ge(0).logical_and(span.gt(0));
  at::Tensor alpha = torch::where(valid, (v - b) / span.clamp_min(1.0), torch::zeros_like(b));
  alpha = alpha.clamp(0.0, 1.0).to(behav.scalar_type());
  return behav + alpha * (cur - behav);
}

// ------------------------------------------------------ sequence-level forms

PolicyLossResult gspo_loss(const PolicyLossInputs& in, const GspoOptions& options,
                           const GlobalNormalizer& normalizer) {
  at::Tensor m = as_bool(in.response_mask);
  at::Tensor adv = in.advantages.detach();
  at::Tensor logp = in.logprobs;
  at::Tensor d = zeros_where_not(m, logp.detach() - in.old_logprobs.detach());
  at::Tensor seq_len = m.sum(-1).to(d.scalar_type()).clamp_min(1.0);
  at::Tensor seq_log_ratio = d.sum(-1) / seq_len;  // [B], no gradient
  at::Tensor log_s = (logp - logp.detach() + seq_log_ratio.unsqueeze(-1)).clamp_max(10.0);
  at::Tensor s = log_s.exp();
  at::Tensor l1 = -adv * s;
  at::Tensor l2 = -adv * s.clamp(1.0 - options.clip_low, 1.0 + options.clip_high);
  at::Tensor clipped = l2.detach().gt(l1.detach());
  PolicyLossResult r;
  r.loss = aggregate_loss(is_weighted(in, torch::max(l1, l2)), m, LossAggMode::kSeqMeanTokenMean,
                          normalizer);
  r.metrics.clip_fraction = fraction(clipped, m);
  r.metrics.clip_fraction_high = fraction(clipped.logical_and(adv.gt(0)), m);
  r.metrics.clip_fraction_low = fraction(clipped.logical_and(adv.lt(0)), m);
  r.metrics.ppo_kl = masked_mean(-d, m);
  r.metrics.mean_ratio = masked_mean(seq_log_ratio.exp(), m.any(-1));
  return r;
}

PolicyLossResult gmpo_loss(const PolicyLossInputs& in, const GmpoOptions& options,
                           const GlobalNormalizer& normalizer) {
  at::Tensor m = as_bool(in.response_mask);
  at::Tensor adv = in.advantages.detach();
  at::Tensor d = in.logprobs - in.old_logprobs.detach();
  at::Tensor sgn = adv.sign();
  at::Tensor dc = d.clamp(-options.clip_low, options.clip_high);
  at::Tensor dmin = sgn * torch::min(sgn * d, sgn * dc);
  at::Tensor seq_tokens = m.sum(-1).to(d.scalar_type());
  at::Tensor denom = seq_tokens.clamp_min(1.0);
  at::Tensor seq_ratio = (zeros_where_not(m, dmin).sum(-1) / denom).exp();
  at::Tensor seq_adv = zeros_where_not(m, adv).sum(-1) / denom;
  at::Tensor nonempty = m.any(-1);
  at::Tensor seq_loss = zeros_where_not(nonempty, -seq_adv * seq_ratio);
  if (in.is_weights.defined()) {
    // One objective per sequence: weighted by its tokens' mean weight.
    seq_loss = seq_loss * (zeros_where_not(m, in.is_weights.detach()).sum(-1) / denom);
  }
  PolicyLossResult r;
  r.loss = seq_loss.sum() / denominator(normalizer.num_sequences, nonempty.sum());
  at::Tensor dd = d.detach();
  at::Tensor high = adv.gt(0).logical_and(dd.gt(options.clip_high));
  at::Tensor low = adv.lt(0).logical_and(dd.lt(-options.clip_low));
  r.metrics.clip_fraction_high = fraction(high, m);
  r.metrics.clip_fraction_low = fraction(low, m);
  r.metrics.clip_fraction = fraction(high.logical_or(low), m);
  r.metrics.ppo_kl = masked_mean(-dd, m);
  r.metrics.mean_ratio = masked_mean(seq_ratio, nonempty);
  return r;
}

PolicyLossResult cispo_loss(const PolicyLossInputs& in, const CispoOptions& options,
                            const GlobalNormalizer& normalizer) {
  at::Tensor m = as_bool(in.response_mask);
  at::Tensor adv = in.advantages.detach();
  at::Tensor d = (in.logprobs.detach() - in.old_logprobs.detach()).clamp(-20.0, 20.0);
  at::Tensor ratio = d.exp();
  at::Tensor weight = ratio.clamp(1.0 - options.clip_low, 1.0 + options.clip_high);
  PolicyLossResult r;
  r.loss =
      aggregate_loss(is_weighted(in, -weight * adv * in.logprobs), m, options.agg_mode, normalizer);
  at::Tensor high = ratio.gt(1.0 + options.clip_high);
  at::Tensor low = ratio.lt(1.0 - options.clip_low);
  r.metrics.clip_fraction = fraction(high.logical_or(low), m);
  r.metrics.clip_fraction_high = fraction(high, m);
  r.metrics.clip_fraction_low = fraction(low, m);
  r.metrics.ppo_kl = masked_mean(-d, m);
  r.metrics.mean_ratio = masked_mean(ratio, m);
  return r;
}

PolicyLossResult sapo_loss(const PolicyLossInputs& in, const SapoOptions& options,
                           const GlobalNormalizer& normalizer) {
  at::Tensor m = as_bool(in.response_mask);
  at::Tensor adv = in.advantages.detach();
  at::Tensor log_ratio = (in.logprobs - in.old_logprobs.detach()).clamp(-20.0, 20.0);
  at::Tensor ratio = log_ratio.exp();
  at::Tensor tau = torch::where(adv.gt(0), torch::full_like(adv, options.tau_pos),
                                torch::full_like(adv, options.tau_neg));
  at::Tensor gate = torch::sigmoid(tau * (ratio - 1.0)) * (4.0 / tau);
  PolicyLossResult r;
  r.loss = aggregate_loss(is_weighted(in, -gate * adv), m, options.agg_mode, normalizer);
  r.metrics.ppo_kl = masked_mean(-log_ratio, m);
  r.metrics.mean_ratio = masked_mean(ratio, m);
  return r;
}

// --------------------------------------------------- covariance-based forms

namespace {

// (A - mean A)(logp - mean logp) over the masked tokens (no gradient).
at::Tensor token_covariance(const at::Tensor& adv, const at::Tensor& logp, const at::Tensor& m) {
  at::Tensor lp = logp.detach().to(torch::kFloat64);
  at::Tensor a = adv.detach().to(torch::kFloat64);
  const double n = std::max(m.sum().item<double>(), 1.0);
  at::Tensor mean_a = zeros_where_not(m, a).sum() / n;
  at::Tensor mean_lp = zeros_where_not(m, lp).sum() / n;
  return (a - mean_a) * (lp - mean_lp);
}

}  // namespace

PolicyLossResult clip_cov_loss(const PolicyLossInputs& in, const ClipCovOptions& options,
                               const GlobalNormalizer& normalizer) {
  at::Tensor m = as_bool(in.response_mask);
  at::Tensor adv = in.advantages.detach();
  at::Tensor log_ratio = in.logprobs - in.old_logprobs.detach();
  at::Tensor ratio = log_ratio.exp();
  at::Tensor l1 = -adv * ratio;
  at::Tensor l2 = -adv * ratio.clamp(1.0 - options.clip_low, 1.0 + options.clip_high);
  at::Tensor clipped = l2.detach().gt(l1.detach()).logical_and(m);
  at::Tensor cov = token_covariance(adv, in.logprobs, m);
  at::Tensor candidates = cov.gt(options.clip_cov_lb)
                              .logical_and(cov.lt(options.clip_cov_ub))
                              .logical_and(m)
                              .logical_and(clipped.logical_not());
  const int64_t num =
      std::max<int64_t>(static_cast<int64_t>(options.clip_cov_ratio * m.sum().item<double>()), 1);
  at::Tensor idx = candidates.flatten().nonzero().squeeze(1);
  at::Tensor detach_flat = torch::zeros({m.numel()}, m.options());
  if (idx.numel() > 0) {
    at::Generator gen = at::detail::createCPUGenerator(options.seed);
    at::Tensor perm = torch::randperm(idx.numel(), gen, torch::kLong);
    at::Tensor chosen = idx.index_select(0, perm.slice(0, 0, std::min(num, idx.numel())));
    detach_flat.index_fill_(0, chosen, true);
  }
  at::Tensor dropped = detach_flat.view(m.sizes());
  at::Tensor loss_mat = zeros_where_not(dropped.logical_not(), torch::max(l1, l2));
  PolicyLossResult r;
  r.loss = aggregate_loss(is_weighted(in, loss_mat), m, options.agg_mode, normalizer);
  r.metrics.clip_fraction = fraction(dropped, m);
  r.metrics.ppo_kl = masked_mean(-log_ratio, m);
  r.metrics.mean_ratio = masked_mean(ratio, m);
  return r;
}

PolicyLossResult kl_cov_loss(const PolicyLossInputs& in, const KlCovOptions& options,
                             const GlobalNormalizer& normalizer) {
  at::Tensor m = as_bool(in.response_mask);
  at::Tensor adv = in.advantages.detach();
  at::Tensor log_ratio = in.logprobs - in.old_logprobs.detach();
  at::Tensor ratio = log_ratio.exp();
  at::Tensor l1 = -adv * ratio;
  at::Tensor penalized_flat = torch::zeros({m.numel()}, m.options());
  const int64_t valid = m.sum().item<int64_t>();
  if (valid > 0) {
    at::Tensor cov = token_covariance(adv, in.logprobs, m).flatten();
    at::Tensor idx = m.flatten().nonzero().squeeze(1);
    const int64_t k = std::max<int64_t>(
        static_cast<int64_t>(static_cast<double>(valid) * options.kl_cov_ratio), 1);
    at::Tensor top = std::get<1>(cov.index_select(0, idx).topk(std::min(k, valid)));
    penalized_flat.index_fill_(0, idx.index_select(0, top), true);
  }
  at::Tensor penalized = penalized_flat.view(m.sizes());
  at::Tensor loss_mat = torch::where(penalized, l1 + options.ppo_kl_coef * log_ratio.abs(), l1);
  PolicyLossResult r;
  r.loss = aggregate_loss(is_weighted(in, loss_mat), m, options.agg_mode, normalizer);
  r.metrics.clip_fraction = fraction(penalized, m);
  r.metrics.ppo_kl = masked_mean(log_ratio.abs(), m);
  r.metrics.mean_ratio = masked_mean(ratio, m);
  return r;
}

}  // namespace relay::trainer
