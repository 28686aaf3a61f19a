#include "relay/trainer/policy_loss.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>

namespace relay::trainer {
namespace {

at::Tensor as_bool(const at::Tensor& mask) {
  return mask.scalar_type() == torch::kBool ? mask : mask.ne(0);
}

at::Tensor zeros_where_not(const at::Tensor& mask, const at::Tensor& x) {
  return torch::where(mask, x, torch::zeros_like(x));
}

// Mean of x over the true entries of `mask` (bool); 0 when there are none.
double masked_mean(const at::Tensor& x, const at::Tensor& mask) {
  const double n = mask.sum().item<double>();
  if (n <= 0) return 0.0;
  return zeros_where_not(mask, x.detach().to(torch::kFloat64)).sum().item<double>() / n;
}

double fraction(const at::Tensor& flag, const at::Tensor& mask) {
  return masked_mean(flag.logical_and(mask).to(torch::kFloat64), mask);
}

// The per-token loss times the rollout-correction weights, when given.
at::Tensor is_weighted(const PolicyLossInputs& in, const at::Tensor& loss_mat) {
  return in.is_weights.defined() ? loss_mat * in.is_weights.detach() : loss_mat;
}

// The PPO clipped surrogate around `anchor` (old or proximal log-probs).
struct Surrogate {
  at::Tensor loss;  // [B, L] per-token loss.
  at::Tensor log_ratio;
  at::Tensor ratio;
  at::Tensor clipped;  // l2 > l1 (the clip is active).
  at::Tensor dual;     // A < 0 and the dual or delta cap is active.
};

Surrogate clipped_surrogate(const at::Tensor& logp, const at::Tensor& anchor, const at::Tensor& adv,
                            const PpoClipOptions& o, double upper) {
  Surrogate s;
  s.log_ratio = logp - anchor;
  if (o.log_ratio_clamp > 0) s.log_ratio = s.log_ratio.clamp(-o.log_ratio_clamp, o.log_ratio_clamp);
  s.ratio = s.log_ratio.exp();
  at::Tensor r1 = o.clip_delta > 0 ? s.ratio.clamp_max(o.clip_delta) : s.ratio;
  at::Tensor l1 = -adv * r1;
  at::Tensor l2 = -adv * s.ratio.clamp(1.0 - o.clip_low, upper);
  s.loss = torch::max(l1, l2);
  s.clipped = l2.detach().gt(l1.detach());
  at::Tensor negative = adv.lt(0);
  s.dual = torch::zeros_like(negative);
  if (o.clip_delta > 0) s.dual = negative.logical_and(s.ratio.detach().gt(o.clip_delta));
  if (o.clip_c > 0) {
    at::Tensor l3 = -adv * o.clip_c;
    s.dual = s.dual.logical_or(negative.logical_and(s.loss.detach().gt(l3)));
    s.loss = torch::where(negative, torch::min(s.loss, l3), s.loss);
  }
  return s;
}

void fill_clip_metrics(const Surrogate& s, const at::Tensor& adv, const at::Tensor& m,
                       PolicyLossMetrics* out) {
  out->clip_fraction = fraction(s.clipped, m);
  out->clip_fraction_high = fraction(s.clipped.logical_and(adv.gt(0)), m);
  out->clip_fraction_low = fraction(s.clipped.logical_and(adv.lt(0)), m);
  out->dual_clip_fraction = fraction(s.dual, m);
  out->ppo_kl = masked_mean(-s.log_ratio, m);
  out->mean_ratio = masked_mean(s.ratio, m);
}

double denominator(double global, const at::Tensor& local_count) {
  if (global > 0) return global;
  return std::max(local_count.item<double>(), 1.0);
}

}  // namespace

// ---------------------------------------------------------------- aggregation

GlobalNormalizer make_global_normalizer(const std::vector<at::Tensor>& response_masks,
                                        double loss_scale_factor) {
  GlobalNormalizer n;
  n.loss_scale_factor = loss_scale_factor;
  for (const at::Tensor& mask : response_masks) {
    at::Tensor m = as_bool(mask);
    n.num_tokens += m.sum().item<double>();
    n.num_sequences += m.any(-1).sum().item<double>();
  }
  return n;
}

at::Tensor aggregate_loss(const at::Tensor& loss_mat, const at::Tensor& response_mask,
                          LossAggMode mode, const GlobalNormalizer& normalizer) {
  TORCH_CHECK(loss_mat.dim() == 2 && loss_mat.sizes() == response_mask.sizes(),
              "aggregate_loss: loss_mat ", loss_mat.sizes(), " and response_mask ",
              response_mask.sizes(), " must both be [B, L]");
  at::Tensor m = as_bool(response_mask);
  at::Tensor l = zeros_where_not(m, loss_mat);
  if (mode == LossAggMode::kTokenMean) {
    return l.sum() / denominator(normalizer.num_tokens, m.sum());
  }
  const double n_seqs = denominator(normalizer.num_sequences, m.any(-1).sum());
  switch (mode) {
    case LossAggMode::kSeqMeanTokenSum:
      return l.sum() / n_seqs;
    case LossAggMode::kSeqMeanTokenMean: {
      at::Tensor seq_tokens = m.sum(-1).to(l.scalar_type()).clamp_min(1.0);
      return (l.sum(-1) / seq_tokens).sum() / n_seqs;
    }
    case LossAggMode::kSeqMeanTokenSumNorm: {
      const double c = normalizer.loss_scale_factor > 0 ? normalizer.loss_scale_factor
                                                        : static_cast<double>(l.size(1));
      return l.sum() / (n_seqs * c);
    }
    case LossAggMode::kTokenMean:
      break;
  }
  return l.sum();
}

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

// ------------------------------------------------------- ratio-free forms

PolicyLossResult reinforce_loss(const PolicyLossInputs& in, LossAggMode agg_mode,
                                const GlobalNormalizer& normalizer) {
  at::Tensor m = as_bool(in.response_mask);
  PolicyLossResult r;
  r.loss = aggregate_loss(is_weighted(in, -in.advantages.detach() * in.logprobs), m, agg_mode,
                          normalizer);
  if (in.old_logprobs.defined()) {
    r.metrics.ppo_kl = masked_mean(in.old_logprobs - in.logprobs, m);
    r.metrics.mean_ratio = masked_mean((in.logprobs - in.old_logprobs).exp(), m);
  }
  return r;
}

PolicyLossResult gpg_loss(const PolicyLossInputs& in, LossAggMode agg_mode,
                          const GlobalNormalizer& normalizer) {
  return reinforce_loss(in, agg_mode, normalizer);
}

at::Tensor sft_loss(const at::Tensor& logprobs, const at::Tensor& response_mask,
                    LossAggMode agg_mode, const GlobalNormalizer& normalizer) {
  return aggregate_loss(-logprobs, response_mask, agg_mode, normalizer);
}

// -------------------------------------------------------------------- LUFFY

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
  Surrogate s = clipped_surrogate(logp, anchor, adv, options.on_policy, upper);
  if (options.on_policy_shaping != OffPolicyShaping::kNoReshape) {
    // The clip bounds the shaped ratio instead (no dual clip, as LUFFY).
    s.ratio = shape_on_policy(s.log_ratio, logp, anchor, options);
    at::Tensor l1 = -adv * s.ratio;
    at::Tensor l2 = -adv * s.ratio.clamp(1.0 - options.on_policy.clip_low, upper);
    s.loss = torch::max(l1, l2);
    s.clipped = l2.detach().gt(l1.detach());
    s.dual = torch::zeros_like(s.clipped);
  }
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

// ------------------------------------------------------------------ entropy

at::Tensor entropy_from_logits(const at::Tensor& logits, const at::Tensor& response_mask,
                               int64_t chunk_size) {
  TORCH_CHECK(logits.dim() == 3, "entropy_from_logits: logits must be [B, L, V], got ",
              logits.sizes());
  TORCH_CHECK(chunk_size > 0, "entropy_from_logits: chunk_size must be > 0");
  const int64_t b = logits.size(0), l = logits.size(1), v = logits.size(2);
  at::Tensor flat = logits.reshape({b * l, v});
  at::Tensor idx = as_bool(response_mask).reshape({b * l}).nonzero().squeeze(1);
  at::Tensor out = torch::zeros({b * l}, logits.options().dtype(torch::kFloat32));
  if (idx.numel() == 0) return out.reshape({b, l}) + 0.0 * logits.sum(-1).to(torch::kFloat32);
  std::vector<at::Tensor> parts;
  for (int64_t start = 0; start < idx.numel(); start += chunk_size) {
    at::Tensor rows = idx.slice(0, start, std::min(start + chunk_size, idx.numel()));
    at::Tensor z = flat.index_select(0, rows).to(torch::kFloat32);
    at::Tensor log_p = torch::log_softmax(z, -1);
    // H = logsumexp(z) - sum p z = -sum p log p.
    parts.push_back(-(log_p.exp() * log_p).sum(-1));
  }
  return out.scatter(0, idx, torch::cat(parts)).reshape({b, l});
}

at::Tensor entropy_bonus_loss(const at::Tensor& entropy, const at::Tensor& response_mask,
                              double coef, LossAggMode agg_mode,
                              const GlobalNormalizer& normalizer) {
  return -coef * aggregate_loss(entropy, response_mask, agg_mode, normalizer);
}

// ---------------------------------------------------------------- selection

PolicyLossResult compute_policy_loss(const PolicyLossInputs& in, const at::Tensor& offpolicy_mask,
                                     const PolicyLossOptions& o, const GlobalNormalizer& normalizer,
                                     const GlobalNormalizer& sft_normalizer,
                                     std::map<std::string, double>* extra) {
  switch (o.kind) {
    case PolicyLossKind::kPpo:
      return ppo_clip_loss(in, o.ppo, normalizer);
    case PolicyLossKind::kDecoupledPpo:
      return decoupled_ppo_loss(in, o.ppo, normalizer);
    case PolicyLossKind::kGspo:
      return gspo_loss(in, o.gspo, normalizer);
    case PolicyLossKind::kGmpo:
      return gmpo_loss(in, o.gmpo, normalizer);
    case PolicyLossKind::kCispo:
      return cispo_loss(in, o.cispo, normalizer);
    case PolicyLossKind::kSapo:
      return sapo_loss(in, o.sapo, normalizer);
    case PolicyLossKind::kClipCov:
      return clip_cov_loss(in, o.clip_cov, normalizer);
    case PolicyLossKind::kKlCov:
      return kl_cov_loss(in, o.kl_cov, normalizer);
    case PolicyLossKind::kGpg:
      return gpg_loss(in, o.ppo.agg_mode, normalizer);
    case PolicyLossKind::kReinforce:
      return reinforce_loss(in, o.ppo.agg_mode, normalizer);
    case PolicyLossKind::kLuffy: {
      TORCH_CHECK(offpolicy_mask.defined(), "compute_policy_loss: luffy needs offpolicy_mask");
      LuffyLossResult l = luffy_loss(in, offpolicy_mask, o.luffy, normalizer, sft_normalizer);
      if (extra != nullptr) {
        const LuffyLossMetrics& m = l.metrics;
        (*extra)["luffy/on_loss"] = m.on_loss;
        (*extra)["luffy/off_loss"] = m.off_loss;
        (*extra)["luffy/off_ratio_mean"] = m.off_ratio_mean;
        (*extra)["luffy/off_max_clip_fraction"] = m.off_max_clip_fraction;
        (*extra)["luffy/off_min_clip_fraction"] = m.off_min_clip_fraction;
        (*extra)["luffy/off_policy_prob"] = m.off_policy_prob;
        (*extra)["luffy/off_policy_fraction"] = m.off_policy_fraction;
        (*extra)["luffy/sft_loss"] = m.sft_loss;
      }
      return PolicyLossResult{l.loss, l.metrics.on_policy};
    }
  }
  TORCH_CHECK(false, "compute_policy_loss: unknown loss kind");
}

// ------------------------------------------------------------ entropy control

EntropyController::EntropyController(const EntropyControlOptions& options)
    : options_(options), value_(options.coef) {}

double EntropyController::coef_for(double entropy) const {
  if (options_.target <= 0) return value_;
  return entropy < options_.target ? value_ : 0.0;
}

void EntropyController::update(double entropy) {
  if (options_.target <= 0) return;
  const double step = entropy < options_.target ? options_.delta : -options_.delta;
  value_ = std::clamp(value_ + step, 0.0, options_.max_coef);
}

}  // namespace relay::trainer
