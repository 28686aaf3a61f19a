// The policy losses' common ground (relay/trainer/policy_loss.h): the
// helpers every loss uses (policy_loss_internal.h), aggregation with a
// global normalizer, the ratio-free forms (REINFORCE, GPG, SFT) and the
// selection of a loss by kind. The ratio-based losses are in
// ratio_losses.cc, LUFFY in luffy_loss.cc, the entropy bonus in
// entropy_bonus.cc.

#include "relay/trainer/policy_loss.h"

#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>

#include "trainer/policy_loss_internal.h"

namespace relay::trainer {
namespace internal {

at::Tensor as_bool(const at::Tensor& mask) {
  return mask.scalar_type() == torch::kBool ? mask : mask.ne(0);
}

at::Tensor zeros_where_not(const at::Tensor& mask, const at::Tensor& x) {
  return torch::where(mask, x, torch::zeros_like(x));
}

double masked_mean(const at::Tensor& x, const at::Tensor& mask) {
  const double n = mask.sum().item<double>();
  if (n <= 0) return 0.0;
  return zeros_where_not(mask, x.detach().to(torch::kFloat64)).sum().item<double>() / n;
}

double fraction(const at::Tensor& flag, const at::Tensor& mask) {
  return masked_mean(flag.logical_and(mask).to(torch::kFloat64), mask);
}

at::Tensor is_weighted(const PolicyLossInputs& in, const at::Tensor& loss_mat) {
  return in.is_weights.defined() ? loss_mat * in.is_weights.detach() : loss_mat;
}

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

}  // namespace internal

using internal::as_bool;
using internal::denominator;
using internal::fraction;
using internal::is_weighted;
using internal::masked_mean;
using internal::zeros_where_not;

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
      // verl's value: no division by the number of sequences.
      const double c = normalizer.loss_scale_factor > 0 ? normalizer.loss_scale_factor
                                                        : static_cast<double>(l.size(1));
      return l.sum() / c;
    }
    case LossAggMode::kTokenMean:
      break;
  }
  return l.sum();
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
        (*extra)["luffy/on_pg_clipfrac"] = m.all_tokens.clip_fraction;
        (*extra)["luffy/on_policy_ppo_kl"] = m.on_policy.ppo_kl;
        (*extra)["luffy/on_policy_clip_fraction"] = m.on_policy.clip_fraction;
      }
      return PolicyLossResult{l.loss, l.metrics.all_tokens};
    }
  }
  TORCH_CHECK(false, "compute_policy_loss: unknown loss kind");
}

}  // namespace relay::trainer
