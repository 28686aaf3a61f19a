#pragma once

// Policy losses for the trainer: loss aggregation with a global normalizer,
// PPO (asymmetric, dual and delta clip), decoupled PPO (AReaL), GSPO, GMPO,
// CISPO, SAPO, Clip-Cov, KL-Cov, GPG / REINFORCE, SFT, the LUFFY mixed
// on/off-policy loss, and entropy from logits.
//
// Conventions: per-token tensors are response-aligned [B, L] fp32 (token j of
// trajectory b's response at [b, j]); `response_mask` [B, L] (bool or float,
// 1 = trained on). `logprobs` is the current policy and the only input a loss
// is differentiated through; every other tensor is treated as data (detached).
// Each loss returns a scalar and plain-double metrics; metric means run over
// the local (micro-batch) mask. Pure functions, thread-compatible.
//
// Formulas follow verl's core_algos.py (compute_policy_loss_*, agg_loss),
// AReaL's ppo_actor_loss_fn and LUFFY's compute_token_on_off_policy_loss; the
// differences are documented at each function.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "relay/common/status.h"
#include "relay/trainer/options.h"

namespace relay::trainer {

// ---------------------------------------------------------------- aggregation

// The denominators of aggregate_loss(), counted over the WHOLE optimizer step
// (all micro-batches on all ranks), so that summing the micro-batch losses
// (and their gradients) gives exactly the loss of the full batch however it is
// split. A field <= 0 means "count it locally from this call's mask", which is
// right only when the call sees the whole batch. With DDP gradient averaging
// across R ranks, multiply each rank's loss by R (verl's dp_size) or sum.
struct GlobalNormalizer {
  double num_tokens = 0;     // N_tokens: masked tokens in the step.
  double num_sequences = 0;  // N_seqs: sequences with at least one masked token.
  // C for seq-mean-token-sum-norm: a constant such as the max response length
  // (Dr. GRPO's generation budget). <= 0: the mask's width L (only
  // split-invariant if every micro-batch is padded to the same width).
  double loss_scale_factor = 0;
};

// Counts N_tokens and N_seqs over the masks of all micro-batches of one rank;
// sum the two counts across ranks (all-reduce) for multi-rank training.
GlobalNormalizer make_global_normalizer(const std::vector<at::Tensor>& response_masks,
                                        double loss_scale_factor = 0);

// Scalar loss from `loss_mat` [B, L]. Masked-out entries are excluded with
// where(), so NaN/inf there does not leak into the value. A zero denominator
// (empty mask, counted locally) gives 0, never NaN.
at::Tensor aggregate_loss(const at::Tensor& loss_mat, const at::Tensor& response_mask,
                          LossAggMode mode, const GlobalNormalizer& normalizer = {});

// ----------------------------------------------------------- inputs, metrics

struct PolicyLossInputs {
  at::Tensor logprobs;           // [B, L] current policy, differentiable.
  at::Tensor old_logprobs;       // [B, L] behavior policy (sampling time).
  at::Tensor advantages;         // [B, L]
  at::Tensor response_mask;      // [B, L]
  at::Tensor proximal_logprobs;  // [B, L] decoupled PPO only; undefined otherwise.
  // [B, L] rollout-correction weights (rollout_correction.h), data: every
  // loss multiplies its per-token loss by them before aggregation (GMPO, whose
  // objective is per sequence, by the sequence's mean weight). Undefined = 1.
  at::Tensor is_weights;
};

struct PolicyLossMetrics {
  double clip_fraction = 0;          // tokens whose PPO term is clipped (low + high).
  double clip_fraction_low = 0;      // A < 0 and ratio < 1 - clip_low.
  double clip_fraction_high = 0;     // A > 0 and ratio > 1 + clip_high.
  double dual_clip_fraction = 0;     // A < 0 and ratio > clip_c (or > clip_delta).
  double ppo_kl = 0;                 // mean(anchor - logp): anchor = old or proximal.
  double mean_ratio = 0;             // mean importance ratio (sequence ratio for GSPO/GMPO).
  double behav_imp_weight = 0;       // decoupled: mean exp(prox - behav) over kept tokens.
  double behav_capped_fraction = 0;  // decoupled: tokens dropped by behav_imp_weight_cap.
  double behav_kl = 0;               // decoupled: mean(behav - prox).
};

struct PolicyLossResult {
  at::Tensor loss;  // 0-dim, differentiable w.r.t. logprobs.
  PolicyLossMetrics metrics;
};

// --------------------------------------------------------------------- PPO

// PPO clipped surrogate with r = exp(logp - old):
//   l = max(-A r', -A clip(r, 1 - clip_low, 1 + clip_high)),  r' = min(r, clip_delta)
//   l = min(l, -A clip_c)  where A < 0 (dual clip)
// aggregated with options.agg_mode. Proximal log-probs are ignored.
PolicyLossResult ppo_clip_loss(const PolicyLossInputs& in, const PpoClipOptions& options,
                               const GlobalNormalizer& normalizer = {});

// Decoupled PPO (AReaL, arXiv 2505.24298): the trust region is centered on the
// proximal policy, the behavior policy is corrected by importance weighting:
//   l = w * PPO(r = exp(logp - prox)),  w = exp(prox - behav) (data, no gradient)
// and w = 0 where w > behav_imp_weight_cap. Equals ppo_clip_loss when
// prox == behav. REQUIRES: in.proximal_logprobs defined.
PolicyLossResult decoupled_ppo_loss(const PolicyLossInputs& in, const PpoClipOptions& options,
                                    const GlobalNormalizer& normalizer = {});

// AReaL's "loglinear" proximal approximation (prox_logp_method=loglinear),
// which skips the proximal forward pass by interpolating in log space between
// the behavior and the current policy by version distance:
//   alpha = clamp((v - b) / (v + 1 - b), 0, 1),  prox = behav + alpha (current - behav)
// where b = token_versions[b, j] (int64; < 0 = not generated: alpha = 0) and
// v = `trainer_version`, the version of the trainer's weights at the start of
// this optimizer step (the update publishes v + 1; AReaL's current_version is
// v + 1). Tokens with b >= v get prox = behav. Returns a detached [B, L] tensor.
at::Tensor loglinear_proximal_logprobs(const at::Tensor& behavior_logprobs,
                                       const at::Tensor& current_logprobs,
                                       const at::Tensor& token_versions, int64_t trainer_version);

// ------------------------------------------------------ sequence-level forms

// GSPO (arXiv 2507.18071), token-level gradient form (GSPO-token, verl):
//   log s_bj = sg(mean_j m (logp - old)) + logp - sg(logp), clamped to <= 10
//   l = max(-A s, -A clip(s, 1 - clip_low, 1 + clip_high))
// The value of s is the sequence ratio; its gradient is the token's. Always
// aggregated seq-mean-token-mean (as verl).
PolicyLossResult gspo_loss(const PolicyLossInputs& in, const GspoOptions& options,
                           const GlobalNormalizer& normalizer = {});

// GMPO (arXiv 2507.20673, verl compute_policy_loss_geo_mean): per sequence
//   d_j = sgn(A) min(sgn(A) d_j, sgn(A) clamp(d_j, -clip_low, clip_high)),  d = logp - old
//   loss_b = -mean_j(A) * exp(mean_j d_j)
//   loss = sum_b loss_b / N_seqs.
// verl takes torch.mean over the micro-batch rows; here the denominator is
// the normalizer's N_seqs (local count of non-empty rows if unset).
PolicyLossResult gmpo_loss(const PolicyLossInputs& in, const GmpoOptions& options,
                           const GlobalNormalizer& normalizer = {});

// CISPO (MiniMax-M1, arXiv 2506.13585): l = -sg(clip(r, 1 - clip_low, 1 + clip_high)) A logp.
// Every token keeps a gradient; clip_fraction counts tokens whose weight was clipped.
PolicyLossResult cispo_loss(const PolicyLossInputs& in, const CispoOptions& options,
                            const GlobalNormalizer& normalizer = {});

// SAPO (arXiv 2511.20347): soft sigmoid gate instead of the hard clip:
//   l = -A * (4 / tau) sigmoid(tau (r - 1)),  tau = tau_pos if A > 0 else tau_neg
// At r = 1 the gradient w.r.t. logp equals the PPO one (-A).
PolicyLossResult sapo_loss(const PolicyLossInputs& in, const SapoOptions& options,
                           const GlobalNormalizer& normalizer = {});

// --------------------------------------------------- covariance-based forms

// Clip-Cov (Cui et al. 2025, arXiv 2505.22617): cov_j = (A_j - mean A)(logp_j - mean logp)
// over masked tokens; among the tokens not already PPO-clipped with
// lb < cov < ub, max(1, floor(ratio * N)) random ones get zero loss (and gradient);
// the rest use the PPO clip loss (no dual clip). clip_fraction = detached fraction.
PolicyLossResult clip_cov_loss(const PolicyLossInputs& in, const ClipCovOptions& options,
                               const GlobalNormalizer& normalizer = {});

// KL-Cov (same paper): l = -A r, plus ppo_kl_coef |logp - old| on the top-k
// tokens by covariance (A_j - mean A)(logp_j - mean logp). metrics.ppo_kl is
// mean |logp - old| (as verl); clip_fraction is the penalized fraction.
PolicyLossResult kl_cov_loss(const PolicyLossInputs& in, const KlCovOptions& options,
                             const GlobalNormalizer& normalizer = {});

// ------------------------------------------------------- ratio-free forms

// REINFORCE: l = -A logp (no ratio, no clip); old_logprobs only feed ppo_kl.
PolicyLossResult reinforce_loss(const PolicyLossInputs& in, LossAggMode agg_mode,
                                const GlobalNormalizer& normalizer = {});
// GPG (arXiv 2504.02546): the same per-token loss -A logp; GPG differs from
// REINFORCE in its advantage estimator, not here.
PolicyLossResult gpg_loss(const PolicyLossInputs& in, LossAggMode agg_mode,
                          const GlobalNormalizer& normalizer = {});
// SFT: mean negative log-likelihood of the masked tokens, l = -logp.
at::Tensor sft_loss(const at::Tensor& logprobs, const at::Tensor& response_mask,
                    LossAggMode agg_mode = LossAggMode::kTokenMean,
                    const GlobalNormalizer& normalizer = {});

// -------------------------------------------------------------------- LUFFY

struct LuffyLossMetrics {
  // LUFFY's own definitions (its ppo_kl and on_pg_clipfrac): the on-policy
  // surrogate's clip fractions, ppo_kl = mean(old - logp) (log ratio not
  // clamped) and mean ratio over ALL masked response tokens, guidance tokens
  // included, each against its old log-prob (a NaN one counts as ratio 1).
  // The trainer reports these as ppo_kl, clip_fraction* and
  // luffy/on_pg_clipfrac.
  PolicyLossMetrics all_tokens;
  // relay's: the same over the on-policy tokens only, the tokens the PPO
  // term trains (luffy/on_policy_ppo_kl, luffy/on_policy_clip_fraction).
  PolicyLossMetrics on_policy;
  double on_loss = 0;         // token-mean of the on-policy loss (0 if none).
  double off_loss = 0;        // token-mean of the off-policy loss (0 if none).
  double off_ratio_mean = 0;  // mean shaped f(p) over off-policy tokens (0 if none).
  double off_max_clip_fraction = 0;
  double off_min_clip_fraction = 0;
  double off_policy_prob = 0;      // mean pi_theta over off-policy tokens.
  double off_policy_fraction = 0;  // off-policy share of the masked tokens.
  double sft_loss = 0;
};
struct LuffyLossResult {
  at::Tensor loss;
  LuffyLossMetrics metrics;
};

// LUFFY mixed loss (Yan et al. 2025, arXiv 2504.14945). `offpolicy_mask` [B, L]
// marks guidance (prefix) tokens, whose behavior log-probs may be NaN; they are
// not read for those tokens. Per token:
//   on-policy:  PPO clip loss with r = exp(logp - old)
//   off-policy: -A f(pi_theta), clamped to [off_min_clip, off_max_clip]
// and the combined per-token loss is aggregated over all masked tokens with
// on_policy.agg_mode and `normalizer`; + sft_coef * SFT over the off-policy
// tokens, normalized by `sft_normalizer` (counts of off-policy tokens).
// A micro-batch with no off-policy (or no on-policy) tokens gives finite values
// and gradients; the metrics of the empty part are 0.
LuffyLossResult luffy_loss(const PolicyLossInputs& in, const at::Tensor& offpolicy_mask,
                           const LuffyOptions& options, const GlobalNormalizer& normalizer = {},
                           const GlobalNormalizer& sft_normalizer = {});

// ---------------------------------------------------------------- selection

// Runs the selected loss. `offpolicy_mask` [B, L] (forced prefix tokens) is
// read by LUFFY only; `sft_normalizer` counts those tokens for LUFFY's SFT
// term. LUFFY's extra metrics (off-policy loss, shaped ratio, clip fractions)
// are added to `extra` under "luffy/..." when it is non-null; the returned
// metrics are those of its on-policy tokens.
PolicyLossResult compute_policy_loss(const PolicyLossInputs& in, const at::Tensor& offpolicy_mask,
                                     const PolicyLossOptions& options,
                                     const GlobalNormalizer& normalizer = {},
                                     const GlobalNormalizer& sft_normalizer = {},
                                     std::map<std::string, double>* extra = nullptr);

// ------------------------------------------------------------------ entropy

// Entropy of softmax(logits) per position, [B, L] from logits [B, L, V]:
//   H = logsumexp(z) - sum_v softmax(z)_v z_v
// computed only where response_mask is set (0 elsewhere), `chunk_size` rows at
// a time to bound the [rows, V] temporaries. Differentiable w.r.t. logits.
at::Tensor entropy_from_logits(const at::Tensor& logits, const at::Tensor& response_mask,
                               int64_t chunk_size = 1024);

// Entropy bonus as a loss term: -coef * aggregate(entropy). Add it to the
// policy loss; coef > 0 encourages exploration.
at::Tensor entropy_bonus_loss(const at::Tensor& entropy, const at::Tensor& response_mask,
                              double coef, LossAggMode agg_mode,
                              const GlobalNormalizer& normalizer = {});

// The controller of the entropy bonus's coefficient (EntropyControlOptions).

class EntropyController {
 public:
  explicit EntropyController(const EntropyControlOptions& options);
  // The coefficient to use for a step whose pre-update entropy is `entropy`:
  // 0 when adaptive and entropy >= target.
  double coef_for(double entropy) const;
  // After the step: move the coefficient toward holding `entropy` at target.
  void update(double entropy);
  double value() const { return value_; }
  void set_value(double value) { value_ = value; }  // from a checkpoint

 private:
  EntropyControlOptions options_;
  double value_;
};

}  // namespace relay::trainer
