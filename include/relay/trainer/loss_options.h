#pragma once

// The options of the loss terms, as read from the `trainer:` section: the
// KL estimators and controllers, every policy loss's clip ranges and
// aggregation (PolicyLossOptions, trainer.loss and its per-loss keys), and
// the entropy bonus. Split from options.h, which includes it, so the loss
// knobs can be read on their own; the rules they obey are in options.cc.

#include <cstdint>

#include "relay/common/name_table.h"
#include "relay/common/problems.h"

namespace relay::trainer {

// -------------------------------------------------------------------- KL

// With d = logp - ref (log pi_theta - log pi_ref of the sampled token):
enum class KlEstimator {
  kK1,       // "k1" / "kl": d. Unbiased for KL(pi_theta || pi_ref), high variance.
  kAbs,      // "abs": |d|.
  kK2,       // "k2" / "mse": 0.5 d^2. Its gradient is the unbiased KL gradient.
  kK3,       // "k3" / "low_var_kl": exp(-d) - 1 + d, with -d clamped to [-20, 20] and
             // the result clamped to [-10, 10] (as verl). Unbiased, low variance, >= 0.
  kK1Plus,   // "k1+" / "kl+": value of k1, gradient of k2 (straight-through).
  kAbsPlus,  // "abs+": value of |d|, gradient of k2.
  kK3Plus,   // "k3+" / "low_var_kl+": value of k3, gradient of k2.
};
// verl's names are accepted too; "k2+" and "mse+" mean plain k2, as in verl.
inline const NameTable<KlEstimator> kKlEstimatorNames{"KL estimator",
                                                      {{"k1", KlEstimator::kK1},
                                                       {"abs", KlEstimator::kAbs},
                                                       {"k2", KlEstimator::kK2},
                                                       {"k3", KlEstimator::kK3},
                                                       {"k1+", KlEstimator::kK1Plus},
                                                       {"abs+", KlEstimator::kAbsPlus},
                                                       {"k3+", KlEstimator::kK3Plus},
                                                       {"kl", KlEstimator::kK1},
                                                       {"mse", KlEstimator::kK2},
                                                       {"low_var_kl", KlEstimator::kK3},
                                                       {"kl+", KlEstimator::kK1Plus},
                                                       {"mse+", KlEstimator::kK2},
                                                       {"k2+", KlEstimator::kK2},
                                                       {"low_var_kl+", KlEstimator::kK3Plus}}};

enum class KlControllerType { kFixed, kAdaptive };
inline const NameTable<KlControllerType> kKlControllerNames{
    "KL controller",
    {{"fixed", KlControllerType::kFixed}, {"adaptive", KlControllerType::kAdaptive}}};

struct KlControllerOptions {
  KlControllerType type = KlControllerType::kFixed;
  double kl_coef = 0.001;    // initial (fixed: constant) coefficient beta; >= 0.
  double target_kl = 0.1;    // adaptive only: KL the controller steers toward; > 0.
  double horizon = 10000.0;  // adaptive only: steps over which an error is corrected; > 0.
};
// Keys as under trainer.reward_kl: coef, target_kl, horizon.
void check(const KlControllerOptions& options, Problems problems);

// ------------------------------------------------------------ policy loss

// verl's loss_agg_mode names. With m the mask and l the per-token loss:
enum class LossAggMode {
  kTokenMean,         // "token-mean": sum(l m) / N_tokens
  kSeqMeanTokenSum,   // "seq-mean-token-sum": sum_b sum_j(l m) / N_seqs
  kSeqMeanTokenMean,  // "seq-mean-token-mean": sum_b [sum_j(l m) / sum_j m] / N_seqs
  // "seq-mean-token-sum-norm" (Dr. GRPO, as verl computes it): sum(l m) / C,
  // C = loss_scale_factor. No division by the number of sequences (the Dr.
  // GRPO authors' code also averages over responses; verl does not), so the
  // loss grows with the batch: its learning rate is not token-mean's.
  kSeqMeanTokenSumNorm
};
inline const NameTable<LossAggMode> kLossAggModeNames{
    "loss aggregation mode",
    {{"token-mean", LossAggMode::kTokenMean},
     {"seq-mean-token-sum", LossAggMode::kSeqMeanTokenSum},
     {"seq-mean-token-mean", LossAggMode::kSeqMeanTokenMean},
     {"seq-mean-token-sum-norm", LossAggMode::kSeqMeanTokenSumNorm}}};

struct PpoClipOptions {
  double clip_low = 0.2;   // ratio lower bound 1 - clip_low (DAPO: asymmetric); in [0, 1).
  double clip_high = 0.2;  // ratio upper bound 1 + clip_high (DAPO uses 0.28); >= 0.
  // Dual clip (Ye et al. 2019, arXiv 1912.09729): for A < 0 the loss is capped at
  // -A * clip_c, so ratios above clip_c give no gradient. 0 = off; else > 1.
  double clip_c = 3.0;
  // Two-sided delta clip (INTELLECT-2, arXiv 2505.07291): the unclipped ratio
  // term uses min(ratio, clip_delta) for every token. For A > 0 it changes
  // nothing (clip_delta > 1 + clip_high is required, and such ratios are already
  // clipped); for A < 0 it caps the ratio as dual clip does, so with both set
  // the smaller bound wins. 0 = off.
  double clip_delta = 0;
  // logp - anchor is clamped to [-log_ratio_clamp, log_ratio_clamp] before exp()
  // (verl: 20). 0 = no clamp.
  double log_ratio_clamp = 20.0;
  // Decoupled PPO only (AReaL): tokens with exp(prox - behav) > cap are dropped
  // from the loss (they still count in the denominator). 0 = no cap; else > 1.
  double behav_imp_weight_cap = 0;
  LossAggMode agg_mode = LossAggMode::kTokenMean;
};
void check(const PpoClipOptions& options, Problems problems);

struct GspoOptions {
  double clip_low = 3e-4;  // GSPO paper's sequence-ratio clip range.
  double clip_high = 4e-4;
};
struct GmpoOptions {
  double clip_low = 0.4;  // token log-ratio clipped to [-clip_low, clip_high] (GMPO: e^{+-0.4}).
  double clip_high = 0.4;
};
struct CispoOptions {
  double clip_low = 0.2;
  double clip_high = 0.2;
  LossAggMode agg_mode = LossAggMode::kTokenMean;
};
struct SapoOptions {
  double tau_pos = 1.0;   // gate temperature for A > 0 (AReaL default).
  double tau_neg = 1.05;  // for A <= 0.
  LossAggMode agg_mode = LossAggMode::kSeqMeanTokenMean;  // verl forces this mode.
};
struct ClipCovOptions {
  double clip_low = 0.2;
  double clip_high = 0.2;
  double clip_cov_ratio = 2e-4;  // fraction of masked tokens to detach (at least 1).
  double clip_cov_lb = 1.0;      // candidates have lb < cov < ub.
  double clip_cov_ub = 5.0;
  uint64_t seed = 0;  // for the random choice among candidates (verl: randperm).
  LossAggMode agg_mode = LossAggMode::kTokenMean;
};
struct KlCovOptions {
  double kl_cov_ratio = 2e-4;  // fraction of masked tokens that get the KL penalty (at least 1).
  double ppo_kl_coef = 1.0;    // coefficient of |logp - old| on those tokens.
  LossAggMode agg_mode = LossAggMode::kTokenMean;
};

// Policy shaping f(p) of LUFFY's off-policy (guidance) tokens, p = pi_theta(token).
enum class OffPolicyShaping {
  kPDivP,       // "p_div_p": p / (p + gamma)  (LUFFY's regularized IS)
  kPDivP01,     // "p_div_p_0.1": p / (p + 0.1), LUFFY's name with its gamma in it
  kPDivP03,     // "p_div_p_0.3"
  kPDivP05,     // "p_div_p_0.5"
  kNoReshape,   // "no_reshape": p (importance ratio against a pi_off = 1 target)
  kLogp,        // "logp": weight * logp (SFT-like)
  kPLogp,       // "p_logp": p + weight * logp
  kSquareRoot,  // "square_root": sqrt(p)
  kPow,         // "pow": p^exponent
};
inline const NameTable<OffPolicyShaping> kOffPolicyShapingNames{
    "policy shaping",
    {{"p_div_p", OffPolicyShaping::kPDivP},
     {"p_div_p_0.1", OffPolicyShaping::kPDivP01},
     {"p_div_p_0.3", OffPolicyShaping::kPDivP03},
     {"p_div_p_0.5", OffPolicyShaping::kPDivP05},
     {"no_reshape", OffPolicyShaping::kNoReshape},
     {"logp", OffPolicyShaping::kLogp},
     {"p_logp", OffPolicyShaping::kPLogp},
     {"square_root", OffPolicyShaping::kSquareRoot},
     {"pow", OffPolicyShaping::kPow}}};
// The gamma of f(p) = p / (p + gamma) for the p_div_p forms: the one in the
// name, else `gamma`. Only meaningful for those forms.
double p_div_p_gamma(OffPolicyShaping shaping, double gamma);

struct LuffyOptions {
  // PPO clip of the on-policy tokens; dual clip off, as in LUFFY. The config
  // takes it from trainer.ppo (share_ppo_settings).
  PpoClipOptions on_policy = [] {
    PpoClipOptions o;
    o.clip_c = 0;
    return o;
  }();
  // LUFFY's clip_upper_bound: the on-policy upper ratio bound is
  // max(clip_upper_bound, 1 + clip_high). 0 = just 1 + clip_high.
  double clip_upper_bound = 0;
  bool loss_remove_clip = false;  // on-policy tokens use -A r, unclipped.
  OffPolicyShaping shaping = OffPolicyShaping::kPDivP;
  double gamma = 0.1;           // p_div_p (both shapings): f(p) = p / (p + gamma); > 0.
  double shaping_weight = 1.0;  // logp, p_logp: weight of logp.
  double pow_exponent = 0.5;    // pow: exponent.
  double off_max_clip = 0;      // f(p) clamped to <= this; 0 = off.
  double off_min_clip = 0;      // f(p) clamped to >= this; 0 = off (LUFFY: -1 / None).
  // Optional shaping of the on-policy ratio r = exp(logp - old) before its
  // clip (LUFFY's on_policy_reshape): kNoReshape r; kLogp logp - old; kPLogp
  // r + weight (logp - old); kSquareRoot sqrt(r); kPow r^exponent; p_div_p
  // forms f(p) / f(p_old) with f(p) = p / (p + gamma).
  OffPolicyShaping on_policy_shaping = OffPolicyShaping::kNoReshape;
  double on_policy_shaping_weight = 1.0;
  double on_policy_pow_exponent = 0.5;
  // Optional SFT multitask term: + sft_coef * NLL of the off-policy tokens
  // (aggregated token-mean over them). 0 = off; the trainer's own sft_coef
  // covers it in relay's configs.
  double sft_coef = 0;
};
// Keys as under trainer.luffy (on_policy is trainer.ppo's and not checked here).
void check(const LuffyOptions& options, Problems problems);

// The trainer's `trainer.loss` choice.
enum class PolicyLossKind {
  kPpo,           // "ppo"
  kDecoupledPpo,  // "decoupled_ppo" (needs proximal log-probs)
  kGspo,          // "gspo"
  kGmpo,          // "gmpo"
  kCispo,         // "cispo"
  kSapo,          // "sapo"
  kClipCov,       // "clip_cov"
  kKlCov,         // "kl_cov"
  kGpg,           // "gpg"
  kReinforce,     // "reinforce"
  kLuffy,         // "luffy" (on-policy PPO + shaped off-policy prefix tokens)
};
inline const NameTable<PolicyLossKind> kPolicyLossNames{
    "policy loss",
    {{"ppo", PolicyLossKind::kPpo},
     {"decoupled_ppo", PolicyLossKind::kDecoupledPpo},
     {"gspo", PolicyLossKind::kGspo},
     {"gmpo", PolicyLossKind::kGmpo},
     {"cispo", PolicyLossKind::kCispo},
     {"sapo", PolicyLossKind::kSapo},
     {"clip_cov", PolicyLossKind::kClipCov},
     {"kl_cov", PolicyLossKind::kKlCov},
     {"gpg", PolicyLossKind::kGpg},
     {"reinforce", PolicyLossKind::kReinforce},
     {"luffy", PolicyLossKind::kLuffy}}};

// Every loss's options; only the selected kind's are read. REINFORCE and GPG
// aggregate with ppo.agg_mode.
struct PolicyLossOptions {
  PolicyLossKind kind = PolicyLossKind::kPpo;
  PpoClipOptions ppo;
  GspoOptions gspo;
  GmpoOptions gmpo;
  CispoOptions cispo;
  SapoOptions sapo;
  ClipCovOptions clip_cov;
  KlCovOptions kl_cov;
  LuffyOptions luffy;
};

// trainer.ppo's clip range and aggregation are also those of the losses that
// have no keys of their own for them: CISPO, Clip-Cov and KL-Cov aggregate
// with ppo.agg_mode, Clip-Cov clips with ppo's range, and LUFFY's on-policy
// tokens use ppo's clip without the dual clip. GSPO and SAPO fix their own
// aggregation. The config binding applies it after reading the section.
void share_ppo_settings(PolicyLossOptions& options);

// Entropy bonus -coef x H, adaptive when target > 0 (Skywork-OR1's adaptive
// entropy control, arXiv 2505.22312): after each step, coef += delta when the
// measured entropy is below the target and coef -= delta when above, clamped
// to [0, max_coef]; the bonus is applied only while entropy < target.
struct EntropyControlOptions {
  double coef = 0.0;    // initial (fixed: constant) coefficient; >= 0
  double target = 0.0;  // target entropy (nats per token); <= 0 = fixed coefficient
  double delta = 1e-4;  // step of the adaptive coefficient; > 0 when adaptive
  double max_coef = 1e-2;
};
void check(const EntropyControlOptions& options, Problems problems);

}  // namespace relay::trainer
