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
//
// The loss terms' options (KL, policy losses, entropy) are in loss_options.h
// and rollout correction's in rollout_correction_options.h, both included
// here: this header stays the one to include for the whole section.

#include <cstdint>
#include <optional>
#include <string>

#include <c10/core/ScalarType.h>

#include "relay/common/name_table.h"
#include "relay/common/problems.h"
#include "relay/common/status.h"
#include "relay/model/lora_config.h"
#include "relay/trainer/critic_options.h"
#include "relay/trainer/loss_options.h"
#include "relay/trainer/rollout_correction_options.h"

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
  kRemax,                      // "remax": reward-to-go - reward of the greedy response
  kGae,                        // "gae": generalized advantage estimation with a critic
  // "none": every advantage 0, the rewards only logged: pure on-policy
  // distillation, where trainer.distill's term is the whole signal (SkyRL's
  // "no_op"). Needs trainer.distill.
  kNone,
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
     {"gae", AdvantageEstimator::kGae},
     {"none", AdvantageEstimator::kNone}}};

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

// How the trainer ranks share the model and the optimizer's work
// (trainer.sharding; src/trainer/optimizer.h, src/trainer/fully_sharded.h,
// docs/cluster.md).
enum class Sharding {
  kNone,       // every rank holds the whole optimizer state (plain data parallelism)
  kOptimizer,  // ZeRO-1/2: each rank holds 1/world_size of the master weights, moments, fp32 grads
  kFull,       // ZeRO-3 / FSDP: the weights too; each decoder layer is gathered only to run
};
inline const NameTable<Sharding> kShardingNames{
    "sharding",
    {{"none", Sharding::kNone}, {"optimizer", Sharding::kOptimizer}, {"full", Sharding::kFull}}};

// MoE router replay (trainer.router_replay).
enum class RouterReplay { kOff, kReplay };
inline const NameTable<RouterReplay> kRouterReplayNames{
    "router replay mode", {{"off", RouterReplay::kOff}, {"replay", RouterReplay::kReplay}}};

// PPO's critic (advantage.estimator: gae): a value model with its own
// optimizer, updated on every mini-batch after the policy with verl's
// clipped value loss; its values before the update feed GAE.
struct CriticOptions {
  // A critic or causal-LM directory (value_model.h); empty = the policy's
  // weights at the start with a fresh head (verl's default). Read by the
  // trainer process, not by Trainer::step.
  std::string path;
  ValueLossOptions loss;       // clip_range (verl's cliprange_value), agg_mode
  OptimizerOptions optimizer;  // the critic's own lr (verl's default 1e-5), schedule, clip
  // verl's trainer.critic_warmup: the first this many RL steps train the
  // critic alone (the policy's weights do not change; each still counts as
  // a version). Counted in the trainer state, so a resume goes on counting.
  int64_t warmup_steps = 0;
};

// DAPO's soft overlong punishment (arXiv 2503.14476, eq. 13; verl's DAPO
// reward manager, reward_model.overlong_buffer): a response of R tokens gets
//   min(-(R - (L_max - length)) / length * penalty_factor, 0)
// added to its reward, with L_max = TrainerOptions::max_response_length
// (rollout.max_new_tokens): 0 up to L_max - length tokens, then falling
// linearly to -penalty_factor at L_max.
struct OverlongBufferOptions {
  int64_t length = 0;           // tokens of the budget the penalty spans; 0 = off
  double penalty_factor = 1.0;  // > 0: the penalty at L_max
};

// How on-policy distillation's teacher signal enters the update
// (trainer.distill; docs/algorithms.md).
enum class DistillMode {
  // Thinking Machines' on-policy distillation (tinker-cookbook's
  // incorporate_kl_penalty): each token's advantage gets
  //   -coef * (log pi_behavior(x_t) - log q_teacher(x_t)),
  // summed over later tokens with factor `discount` when it is > 0, added
  // to the estimator's advantages; the student's side is the recorded
  // behavior log-prob.
  kAdvantage,
  // A loss term coef * agg(kl(log pi_theta(x_t), log q_teacher(x_t))) with
  // `estimator`, aggregated as the policy loss: the reference-KL term
  // (trainer.kl_coef) with the teacher in the reference's place.
  kLoss,
};
inline const NameTable<DistillMode> kDistillModeNames{
    "distill mode", {{"advantage", DistillMode::kAdvantage}, {"loss", DistillMode::kLoss}}};

// On-policy distillation: the student samples, a teacher model with the
// same tokenizer scores each sampled token (Trajectory::teacher_logprobs,
// scored by the rollout side: rollout/teacher.h), and the per-token reverse
// KL log pi - log q pulls the student towards the teacher.
struct DistillOptions {
  // The teacher's model directory. Read by the processes that sample (they
  // score), not by Trainer::step, which reads the trajectories' log-probs.
  std::string teacher;
  DistillMode mode = DistillMode::kAdvantage;
  // tinker-cookbook's kl_penalty_coef (its default is 1). 0 = off.
  double coef = 0.0;
  // tinker-cookbook's kl_discount_factor (advantage mode): 0 = each token's
  // own KL only.
  double discount = 0.0;
  // Loss mode's estimator of the per-token KL. k2's gradient,
  // (log pi - log q) grad log pi, is the policy gradient of the reverse KL
  // at each token; k1's is zero in expectation on the student's samples.
  KlEstimator estimator = KlEstimator::kK2;

  bool enabled() const { return coef > 0; }
};

struct TrainerOptions {
  AdvantageOptions advantage;
  PolicyLossOptions loss;  // kind and every loss's options
  ProximalSource proximal = ProximalSource::kRecorded;
  double loss_scale_factor = 0;  // seq-mean-token-sum-norm's constant; 0 = response width
  // Tokens per forward/backward pass: padded (rows x longest row), or the
  // rows' own tokens with pack_sequences.
  int64_t micro_batch_tokens = 8192;
  // Sequence packing: each micro-batch's rows laid end to end in rows of its
  // longest row's length (positions restart per sequence, attention stays
  // within it) instead of each padded to that length. The same log-probs and
  // gradients, less padding to compute (docs/trainer.md).
  bool pack_sequences = false;
  int ppo_epochs = 1;    // passes over each batch
  int mini_batches = 1;  // optimizer steps per epoch
  // Train on tokens of version >= v - max_staleness; 0 = synchronous. -1 =
  // no bound, for trainers built in code (a run's config must bound it: its
  // lease dispenser sizes the queue by it).
  int64_t max_staleness = 0;
  bool allow_missing_logprobs = false;    // train NaN behavior tokens on-policy (ratio 1)
  bool drop_equal_reward_groups = false;  // DAPO dynamic sampling
  bool mask_truncated = false;            // overlong filtering
  OverlongBufferOptions overlong_buffer;  // DAPO's length penalty on the reward
  CriticOptions critic;                   // read with advantage.estimator gae only
  DistillOptions distill;                 // on-policy distillation; off unless coef > 0
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
  // MiB of the LM head's fp32 log-softmax a forward pass with gradients may
  // keep for its backward (ScoreOptions::lm_head_keep_bytes), which then
  // skips recomputing those positions' logits: one GEMM of the head's four.
  // The head's chunks hold at most 256 MiB each, so the default keeps one.
  // 0 = recompute every chunk.
  int64_t lm_head_keep_mb = 256;
  // LoRA adapters (model/lora.h): only they train, the base is the KL
  // reference, and weight versions carry only them. rank 0 = off. A policy
  // given to Trainer::create without adapters gets them (seed 0); the
  // processes of a run attach them with run.seed when they build the model.
  model::LoraConfig lora;
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
  Sharding sharding = Sharding::kNone;

  // Set by the process from other sections, no trainer.* key:
  double temperature = 1.0;  // rollout.temperature: behavior log-probs were taken at it
  // rollout.max_new_tokens: L_max of overlong_buffer; 0 = unknown (the
  // penalty then needs it set in code).
  int64_t max_response_length = 0;
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
