#pragma once

// The trainer's options: every knob of the `trainer:` config section, as the
// typed structs the algorithm code reads, with each enum's names beside it
// and each rule stated once, in check(). No LibTorch here (only the
// ScalarType enum), so the config layer binds YAML to these structs directly.
//
// Paths in problems are the YAML keys under `trainer:` ("ppo.clip_low",
// "lr"), which is also how the fields are documented in docs/config.md. A
// struct's fields that have no key of their own are derived (see
// share_ppo_settings) or set by the process from other sections
// (temperature, autocast, vocab_limit, pad_token_id).

#include <cstdint>
#include <optional>
#include <string>

#include <c10/core/ScalarType.h>

#include "relay/common/name_table.h"
#include "relay/common/problems.h"
#include "relay/common/status.h"

namespace relay::trainer {

// ------------------------------------------------------------- advantages

enum class AdvantageEstimator {
  kGrpo,                       // "grpo": (r - group mean) / (group std + eps)
  kDrGrpo,                     // "dr_grpo": r - group mean (GRPO with norm_by_std = false)
  kRloo,                       // "rloo": r - mean of the other samples of the group
  kReinforcePlusPlus,          // "reinforce_plus_plus": whitened discounted returns
  kReinforcePlusPlusBaseline,  // "reinforce_plus_plus_baseline": r - group mean, whitened
  kOpo,                        // "opo": r - length-weighted group mean
  kGrpoPassK,                  // "grpo_passk": only each group's best sample, max - second max
  kGrpoSplit,                  // "grpo_split": GRPO with an on-policy-only baseline (LUFFY)
  kRemax,                      // "remax": r - reward of the greedy response
  kGae,                        // "gae": generalized advantage estimation with a critic
};
inline const NameTable<AdvantageEstimator> kAdvantageEstimatorNames{
    "advantage estimator",
    {{"grpo", AdvantageEstimator::kGrpo},
     {"dr_grpo", AdvantageEstimator::kDrGrpo},
     {"rloo", AdvantageEstimator::kRloo},
     {"reinforce_plus_plus", AdvantageEstimator::kReinforcePlusPlus},
     {"reinforce_plus_plus_baseline", AdvantageEstimator::kReinforcePlusPlusBaseline},
     {"opo", AdvantageEstimator::kOpo},
     {"grpo_passk", AdvantageEstimator::kGrpoPassK},
     {"grpo_split", AdvantageEstimator::kGrpoSplit},
     {"remax", AdvantageEstimator::kRemax},
     {"gae", AdvantageEstimator::kGae}}};

// What GRPO-family estimators divide (r - baseline) by when norm_by_std.
enum class StdScale {
  kNone,   // "none": no division (Dr. GRPO)
  kGroup,  // "group": the group's unbiased std (GRPO, verl's default)
  kBatch,  // "batch": the unbiased std of all B rewards of the batch, one number for
           // every group (TRL's scale_rewards="batch"): keeps the relative scale of
           // easy and hard prompts instead of blowing up near-uniform groups
};
inline const NameTable<StdScale> kStdScaleNames{
    "std scale",
    {{"none", StdScale::kNone}, {"group", StdScale::kGroup}, {"batch", StdScale::kBatch}}};

struct AdvantageOptions {
  AdvantageEstimator estimator = AdvantageEstimator::kGrpo;
  // GRPO, GRPO pass@k, GRPO-split: divide by a std. false = Dr. GRPO (the
  // kDrGrpo estimator sets this false whatever is written here).
  bool norm_by_std = true;
  // Which std when norm_by_std (GRPO only; pass@k and split use the group's).
  StdScale std_scale = StdScale::kGroup;
  double epsilon = 1e-6;  // > 0; added to the std before dividing
  double gamma = 1.0;     // discount in [0, 1], REINFORCE++ and GAE
  double lambda = 1.0;    // GAE lambda in [0, 1]
  // GRPO-split (LUFFY prefix_reward_weight_alpha / _beta): multiplies the
  // advantage of off-policy (forced prefix) tokens by alpha, of on-policy
  // tokens by beta. 1 / 1 = unweighted.
  double prefix_reward_weight_alpha = 1.0;
  double prefix_reward_weight_beta = 1.0;
};
void check(const AdvantageOptions& options, Problems problems);

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
  kTokenMean,           // "token-mean": sum(l m) / N_tokens
  kSeqMeanTokenSum,     // "seq-mean-token-sum": sum_b sum_j(l m) / N_seqs
  kSeqMeanTokenMean,    // "seq-mean-token-mean": sum_b [sum_j(l m) / sum_j m] / N_seqs
  kSeqMeanTokenSumNorm  // "seq-mean-token-sum-norm" (Dr. GRPO): sum(l m) / (N_seqs * C)
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

// ------------------------------------------------------ rollout correction

// For IS weights and the ratio criterion, with n_b the masked tokens of b:
//   token:     r_bj = exp(log r_bj)
//   sequence:  r_b = exp(sum_j log r_bj)          (the sequence's likelihood ratio)
//   geometric: r_b = exp(sum_j log r_bj / n_b)    (geo-mean, length-independent)
// For the divergence criteria, the per-token divergence d_bj is aggregated the
// same way: token d_bj, sequence sum_j d_bj, geometric sum_j d_bj / n_b.
enum class CorrectionLevel { kNone, kToken, kSequence, kGeometric };
inline const NameTable<CorrectionLevel> kCorrectionLevelNames{
    "correction level",
    {{"none", CorrectionLevel::kNone},
     {"token", CorrectionLevel::kToken},
     {"sequence", CorrectionLevel::kSequence},
     {"geometric", CorrectionLevel::kGeometric}}};

// What is done to an IS weight outside the band.
enum class IsWeightMode {
  kTruncate,  // "truncate" (TIS): w = min(w, is_threshold).
  kClip,      // "clip": w = clamp(w, is_threshold_lower, is_threshold).
};
inline const NameTable<IsWeightMode> kIsWeightModeNames{
    "IS weight mode", {{"truncate", IsWeightMode::kTruncate}, {"clip", IsWeightMode::kClip}}};

// The statistic a rejection test looks at. With l = log r (raw) and
// c = clamp(l, -log_clamp, log_clamp), per token (verl's token_k* estimators;
// all three estimate KL(pi_behav || pi_old), since tokens were drawn from
// pi_behav):
enum class RejectionCriterion {
  kRatio,  // "ratio": the aggregated ratio; rejected outside [rs_threshold_lower, rs_threshold].
  kK1,     // "k1": d = -l = log(pi_behav / pi_old). Signed, so rejected where
           //       |aggregate| > rs_threshold (a symmetric band in log space).
  kK2,     // "k2": d = l^2 / 2. Rejected where aggregate > rs_threshold.
  kK3,     // "k3": d = exp(c) - 1 - c >= 0. Rejected where aggregate > rs_threshold.
};
inline const NameTable<RejectionCriterion> kRejectionCriterionNames{
    "rejection criterion",
    {{"ratio", RejectionCriterion::kRatio},
     {"k1", RejectionCriterion::kK1},
     {"k2", RejectionCriterion::kK2},
     {"k3", RejectionCriterion::kK3}}};

struct RolloutCorrectionOptions {
  // Importance weights. kNone: every weight is 1 (rejection and veto still run).
  CorrectionLevel is_level = CorrectionLevel::kNone;
  IsWeightMode is_mode = IsWeightMode::kTruncate;
  double is_threshold = 2.0;  // upper bound C; > 1.
  // Clip mode's lower bound; 0 = 1 / is_threshold, else in (0, 1).
  double is_threshold_lower = 0;
  // Divide the weights by their mean over the kept units (tokens for the
  // token level, sequences otherwise), so the mean weight is exactly 1 and the
  // loss scale does not drift with the mismatch. Weights may then exceed C.
  bool is_batch_normalize = false;

  // Rejection: failing tokens (token level) or whole sequences (sequence,
  // geometric) leave the response mask. kNone = off.
  CorrectionLevel rs_level = CorrectionLevel::kNone;
  RejectionCriterion rs_criterion = RejectionCriterion::kRatio;
  // ratio: upper ratio bound, > 1. k1 / k2 / k3: divergence bound, > 0.
  double rs_threshold = 2.0;
  // ratio only: lower ratio bound; 0 = 1 / rs_threshold, else in (0, 1).
  // Must stay 0 for k1 / k2 / k3, which have no lower bound.
  double rs_threshold_lower = 0;

  // Catastrophic-token veto: a sequence with any masked token whose ratio
  // r < veto_threshold is rejected whole, whatever rs_level says (one token
  // the trainer finds near-impossible poisons the sequence's gradient).
  // 0 = off, else in (0, 1) (verl suggests 1e-4).
  double veto_threshold = 0;

  // Bypass: skip the trainer's recompute pass and use pi_old := pi_behav, so
  // the PPO ratio pi_theta / pi_behav does the correction itself. Then every
  // weight is 1, nothing is rejected or vetoed (log r = 0 by definition), and
  // old_logprobs may be undefined. is_* / rs_* / veto_threshold are ignored.
  bool bypass = false;

  // Safety bound: the argument of every exp() (token or aggregated log ratio)
  // is clamped to [-log_clamp, log_clamp] (verl: 20, e^20 ~ 4.9e8). > 0.
  double log_clamp = 20.0;
};
// Checks the fields in use (is_* when is_level != none, rs_* when rs_level != none).
void check(const RolloutCorrectionOptions& options, Problems problems);

// -------------------------------------------------------------- optimizer

enum class LrSchedule { kConstant, kLinearWarmup, kCosine };
inline const NameTable<LrSchedule> kLrScheduleNames{"schedule",
                                                    {{"constant", LrSchedule::kConstant},
                                                     {"linear_warmup", LrSchedule::kLinearWarmup},
                                                     {"cosine", LrSchedule::kCosine}}};

struct OptimizerOptions {
  double lr = 1e-5;           // the config's trainer.lr
  double weight_decay = 0.0;  // decoupled (AdamW)
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double max_grad_norm = 1.0;  // global L2 clip; <= 0 = off
  LrSchedule schedule = LrSchedule::kConstant;
  int64_t warmup_steps = 0;   // linear warmup from 0 (linear_warmup, cosine)
  int64_t total_steps = 0;    // cosine: steps to decay over
  double min_lr_ratio = 0.0;  // cosine floor, as a fraction of lr
  // Parameters held in bf16/fp16 get fp32 master copies: gradients are cast
  // up, AdamW steps the fp32 copy, the result is cast back. Without them an
  // update smaller than the parameter's bf16 spacing (~0.4% of its value) is
  // lost entirely. No effect on fp32 parameters.
  bool fp32_master_weights = true;
};
// Keys as under trainer.optimizer (lr is checked by the trainer's check).
void check(const OptimizerOptions& options, Problems problems);

// Learning rate at optimizer step `step` (0-based).
double lr_at(const OptimizerOptions& options, int64_t step);

// ---------------------------------------------------------------- trainer

// Where the decoupled loss's proximal log-probs come from.
enum class ProximalSource {
  kRecorded,   // the worker's value where proximal_versions == trainer version, else recompute
  kRecompute,  // the trainer's forward pass before the update
  kLoglinear,  // AReaL's interpolation between behavior and current by version distance
};
inline const NameTable<ProximalSource> kProximalSourceNames{
    "proximal source",
    {{"recorded", ProximalSource::kRecorded},
     {"recompute", ProximalSource::kRecompute},
     {"loglinear", ProximalSource::kLoglinear}}};

// KL to the reference policy folded into the reward (verl's use_kl_in_reward):
// per token r_t -= beta * kl_t, so outcome estimators see r - beta * sum_t kl_t.
struct RewardKlOptions {
  // controller.kl_coef = beta; 0 = off (the default, unlike KlControllerOptions').
  KlControllerOptions controller = [] {
    KlControllerOptions c;
    c.kl_coef = 0;
    return c;
  }();
  KlEstimator estimator = KlEstimator::kK1;
};

// The trainer ranks' data parallelism (docs/cluster.md): world_size ranks,
// one process each; rank 0 serves workers and owns the store; each step's
// batch is split across the ranks by tokens and gradients summed over them.
struct DataParallelOptions {
  int world_size = 1;
  // host:port of the c10d TCPStore rank 0 opens for the rendezvous; empty =
  // $MASTER_ADDR:$MASTER_PORT (torchrun / Slurm style).
  std::string rendezvous;
  int allreduce_bucket_mb = 25;       // gradients are all-reduced in buckets of this size
  double collective_timeout_s = 300;  // a collective (or a rank) silent this long fails the run
};

// MoE router replay (trainer.router_replay).
enum class RouterReplay { kOff, kReplay };
inline const NameTable<RouterReplay> kRouterReplayNames{
    "router replay mode", {{"off", RouterReplay::kOff}, {"replay", RouterReplay::kReplay}}};

struct TrainerOptions {
  AdvantageOptions advantage;
  PolicyLossOptions loss;  // kind and every loss's options
  ProximalSource proximal = ProximalSource::kRecorded;
  double loss_scale_factor = 0;       // seq-mean-token-sum-norm's constant; 0 = response width
  int64_t micro_batch_tokens = 8192;  // padded tokens per forward/backward pass
  int ppo_epochs = 1;                 // passes over each batch
  int mini_batches = 1;               // optimizer steps per epoch
  // Train on tokens of version >= v - max_staleness; 0 = synchronous. -1 =
  // no bound, for trainers built in code (a run's config must bound it: its
  // lease dispenser sizes the queue by it).
  int64_t max_staleness = 0;
  bool allow_missing_logprobs = false;    // train NaN behavior tokens on-policy (ratio 1)
  bool drop_equal_reward_groups = false;  // DAPO dynamic sampling
  bool mask_truncated = false;            // overlong filtering
  // Steps one trajectory may be trained in (a group handed to step() twice,
  // or replayed from the store). Over the cap it is dropped and counted.
  // 0 = no cap.
  int max_reuse = 0;
  double kl_coef = 0.0;  // > 0: KL to the reference policy in the loss
  KlEstimator kl_estimator = KlEstimator::kK3;
  RewardKlOptions reward_kl;
  EntropyControlOptions entropy;  // entropy bonus (coef > 0), optionally adaptive
  // Importance weights / rejection for pi_old vs pi_behav. When any of it is
  // on (and not bypass), the PPO ratio is taken against the trainer's pi_old
  // and the weights correct for the sampler; otherwise the anchor is the
  // behavior log-prob itself. bypass also skips the pre-update pass when
  // nothing else (reference, decoupled proximal, missing log-probs) needs it.
  RolloutCorrectionOptions rollout_correction;
  double sft_coef = 0.0;  // > 0: + coef x NLL of the off-policy (forced) tokens
  OptimizerOptions optimizer;
  // Recompute each decoder layer's activations in backward instead of keeping them.
  bool activation_checkpointing = false;
  // MoE models: route every position that carries recorded routing to the
  // engine's experts; the router's own weights over them keep their gradient.
  RouterReplay router_replay = RouterReplay::kOff;

  // Read by the trainer process, not by Trainer::step.
  // KL reference: an HF-layout model directory; empty = the initial policy, frozen.
  std::string reference;
  // With drop_equal_reward_groups: extra rollout batches collected per step to
  // refill the groups dropped (DAPO); 0 = train on what is left.
  int max_extra_batches = 0;
  DataParallelOptions data_parallel;

  // Set by the process from other sections, no trainer.* key:
  double temperature = 1.0;  // rollout.temperature: behavior log-probs were taken at it
  // run.autocast: forward passes under autocast in this precision; the
  // weights, gradients and optimizer keep their own dtypes.
  std::optional<c10::ScalarType> autocast;
  // Ids [0, vocab_limit) are the distribution's support: the tokenizer's
  // vocabulary, which is what the rollout engine samples from when the
  // model's embedding is padded past it. 0 = every id of the model.
  int64_t vocab_limit = 0;
  int64_t pad_token_id = 0;

  // True when the options need a reference policy (KL in the loss or reward).
  bool needs_reference() const { return kl_coef > 0 || reward_kl.controller.kl_coef > 0; }
};

// Every rule on the trainer's options, reported with trainer.* key paths
// relative to `problems`. The config binding runs it when a config is
// loaded; Trainer::create runs it again for options built in code.
void check(const TrainerOptions& options, Problems problems);
// check() under "trainer", as one status.
Status validate(const TrainerOptions& options);

}  // namespace relay::trainer
