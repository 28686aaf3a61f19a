// The metrics of a trainer step and its last phase, finish_step
// (step_state.h): the update sums across ranks, the metrics, then the
// controllers, the reuse counter and the version.

#include <torch/torch.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "relay/model/cpu_memory.h"
#include "relay/model/device.h"
#include "relay/trainer/trainer.h"
#include "trainer/critic.h"
#include "trainer/fully_sharded.h"
#include "trainer/optimizer.h"
#include "trainer/step_state.h"

namespace relay::trainer {

Summary summarize(const at::Tensor& values, const at::Tensor& mask) {
  at::Tensor v = values.masked_select(mask.to(torch::kBool)).to(torch::kFloat64);
  Summary s;
  if (v.numel() == 0) return s;
  s.mean = v.mean().item<double>();
  s.std = v.numel() > 1 ? v.std().item<double>() : 0.0;
  s.min = v.min().item<double>();
  s.max = v.max().item<double>();
  return s;
}

void put(StepMetrics& m, const std::string& prefix, const Summary& s) {
  m[prefix + "/mean"] = s.mean;
  m[prefix + "/std"] = s.std;
  m[prefix + "/min"] = s.min;
  m[prefix + "/max"] = s.max;
}

void mismatch_metrics(const at::Tensor& old_logp, const at::Tensor& behavior,
                      const at::Tensor& valid, const RolloutCorrectionMetrics& rc, StepMetrics& m) {
  m["mismatch/logprob_abs_diff_mean"] = rc.all.abs_log_ratio_mean;
  m["mismatch/logprob_abs_diff_max"] = rc.all.abs_log_ratio_max;
  m["mismatch/k3"] = rc.all.k3;
  m["mismatch/engine_k3"] = rc.engine.k3;
  m["mismatch/staleness_k3"] = rc.staleness.k3;
  at::Tensor w = (old_logp - behavior).exp();
  put(m, "is_ratio", summarize(w, valid));
  at::Tensor ws = w.masked_select(valid).to(torch::kFloat64);
  const double sum = ws.sum().item<double>(), sq = ws.pow(2).sum().item<double>();
  m["is_ratio/ess"] = sq > 0 ? sum * sum / (sq * ws.numel()) : 1.0;
}

void data_metrics(const StepState& s, int64_t version, StepMetrics& m) {
  const TrainBatch& batch = s.batch;
  const int64_t B = batch.size();
  at::Tensor staleness = (version - batch.token_versions).to(torch::kFloat64);
  put(m, "staleness", summarize(staleness, s.mask));
  for (int64_t k = 0; k <= 4; ++k) {
    at::Tensor sel = staleness.eq(static_cast<double>(k)).logical_and(s.mask);
    m[absl::StrCat("staleness/frac_", k)] =
        sel.sum().item<double>() / std::max<double>(1, batch.num_tokens());
  }
  put(m, "advantages", summarize(s.adv.advantages, s.mask));
  put(m, "reward", summarize(batch.rewards, torch::ones({B}, torch::kBool)));
  put(m, "response_length",
      summarize(batch.response_lengths.to(torch::kFloat64), torch::ones({B}, torch::kBool)));
  m["offpolicy_token_fraction"] = batch.offpolicy_mask.logical_and(s.mask).sum().item<double>() /
                                  std::max<double>(1, batch.num_tokens());
  m["batch/trajectories"] = static_cast<double>(B);
  m["batch/tokens"] = static_cast<double>(batch.num_tokens());
}

void add_loss_metrics(const PolicyLossMetrics& r, double tokens, UpdateSums& sums) {
  PolicyLossMetrics& acc = sums.loss_metrics;
  acc.clip_fraction += r.clip_fraction * tokens;
  acc.clip_fraction_low += r.clip_fraction_low * tokens;
  acc.clip_fraction_high += r.clip_fraction_high * tokens;
  acc.dual_clip_fraction += r.dual_clip_fraction * tokens;
  acc.ppo_kl += r.ppo_kl * tokens;
  acc.mean_ratio += r.mean_ratio * tokens;
  acc.behav_imp_weight += r.behav_imp_weight * tokens;
  acc.behav_capped_fraction += r.behav_capped_fraction * tokens;
  sums.tokens += tokens;
}

Status sum_across_ranks(Collectives& group, UpdateSums& u) {
  // Each rank accumulated its own micro-batches: sum them, by name.
  PolicyLossMetrics& acc = u.loss_metrics;
  const std::pair<const char*, double*> summed[] = {{"loss", &u.loss},
                                                    {"pg", &u.pg},
                                                    {"kl", &u.kl},
                                                    {"distill", &u.distill},
                                                    {"tokens", &u.tokens},
                                                    {"clip", &acc.clip_fraction},
                                                    {"clip_low", &acc.clip_fraction_low},
                                                    {"clip_high", &acc.clip_fraction_high},
                                                    {"dual_clip", &acc.dual_clip_fraction},
                                                    {"ppo_kl", &acc.ppo_kl},
                                                    {"ratio", &acc.mean_ratio},
                                                    {"behav_w", &acc.behav_imp_weight},
                                                    {"behav_capped", &acc.behav_capped_fraction},
                                                    {"critic_loss", &u.critic_loss},
                                                    {"critic_tokens", &u.critic_tokens},
                                                    {"critic_clip", &u.critic_clip},
                                                    {"critic_value", &u.critic_value}};
  std::map<std::string, double> sums;
  for (const auto& [k, v] : u.extra) sums["extra:" + k] = v;
  for (const auto& [k, p] : summed) sums[k] = *p;
  RELAY_RETURN_IF_ERROR(all_reduce_named_sums(group, sums));
  u.extra.clear();
  for (const auto& [k, v] : sums) {
    if (k.rfind("extra:", 0) == 0) u.extra[k.substr(6)] = v;
  }
  for (const auto& [k, p] : summed) *p = sums.at(k);
  return OkStatus();
}

// After the updates: what they did, as metrics, then the step counts.
Status Trainer::finish_step(StepState& s) {
  if (dp_.active()) RELAY_RETURN_IF_ERROR(sum_across_ranks(*dp_.group, s.sums));
  update_metrics(s, s.metrics);
  memory_metrics(s.metrics, s.rss_at_start);
  commit_step(s);
  return OkStatus();
}

void Trainer::update_metrics(const StepState& s, StepMetrics& m) const {
  const TrainerOptions& o = options_;
  const UpdateSums& u = s.sums;
  const int updates = s.updates.applied;
  // A critic-warmup step (trainer.critic.warmup_steps) left the policy as
  // it was: it has no policy-update figures.
  if (!s.critic_warmup) {
    const PolicyLossMetrics& acc = u.loss_metrics;
    const double t = std::max(1.0, u.tokens);
    m["clip_fraction"] = acc.clip_fraction / t;
    m["clip_fraction/low"] = acc.clip_fraction_low / t;
    m["clip_fraction/high"] = acc.clip_fraction_high / t;
    m["clip_fraction/dual"] = acc.dual_clip_fraction / t;
    m["ppo_kl"] = acc.ppo_kl / t;
    m["mean_importance_ratio"] = acc.mean_ratio / t;
    if (o.loss.kind == PolicyLossKind::kDecoupledPpo) {
      m["proximal/behav_imp_weight"] = acc.behav_imp_weight / t;
      m["proximal/behav_capped_fraction"] = acc.behav_capped_fraction / t;
    }
    for (const auto& [k, v] : u.extra) m[k] = v / t;
    m["pg_loss"] = u.pg / updates;
    m["loss"] = u.loss / updates;
    if (reference_ && o.kl_coef > 0) m["kl_ref"] = u.kl / updates;
    if (o.distill.enabled() && o.distill.mode == DistillMode::kLoss) {
      m["distill/loss"] = u.distill / updates;
    }
    m["grad_norm"] = u.grad_norm / updates;
    m["lr"] = u.lr_last;
    m["optimizer_steps"] = static_cast<double>(updates);
  } else {
    m["optimizer_steps"] = 0;
  }
  if (reference_) {
    for (KlEstimator k : {KlEstimator::kK1, KlEstimator::kK2, KlEstimator::kK3}) {
      m[absl::StrCat("kl_ref/", kKlEstimatorNames.name(k))] =
          summarize(kl_penalty(s.before.logprobs, s.before.reference, k), s.mask).mean;
    }
  }
  if (critic_) {
    // verl's critic/* names; one critic update per mini-batch.
    const double ct = std::max(1.0, u.critic_tokens);
    m["critic/warmup"] = s.critic_warmup ? 1 : 0;
    m["critic/vf_loss"] = u.critic_loss / updates;
    m["critic/vf_clipfrac"] = u.critic_clip / ct;
    m["critic/vpred_mean"] = u.critic_value / ct;
    m["critic/grad_norm"] = u.critic_grad_norm / updates;
    m["critic/lr"] = u.critic_lr_last;
    put(m, "critic/values", summarize(s.before.values, s.mask));
    put(m, "critic/returns", summarize(s.adv.returns.cpu(), s.mask));
    m["critic/vf_explained_var"] = explained_variance(s.before.values, s.adv.returns.cpu(), s.mask);
  }
}

// The step happened: controllers and the reuse counter move on, and the
// weights are the next version. Last, so that any failure comes before the
// step counts.
void Trainer::commit_step(StepState& s) {
  if (critic_) critic_->count_step();
  if (reference_ && s.reward_beta > 0) reward_kl_->update(s.reward_kl_mean, s.batch.size());
  last_entropy_ = s.metrics.at("entropy");
  entropy_->update(last_entropy_);
  reuse_.record(s.reuse_keys, version_);
  if (options_.max_staleness >= 0) reuse_.forget_before(version_ - options_.max_staleness);
  ++version_;
  s.metrics["version"] = static_cast<double>(version_);
}

void Trainer::memory_metrics(StepMetrics& m, int64_t rss_at_start) const {
  constexpr double kGiB = 1ull << 30;
  auto bytes = [](const std::vector<at::Tensor>& tensors) {
    double total = 0;
    for (const at::Tensor& t : tensors) total += static_cast<double>(t.numel() * t.element_size());
    return total;
  };
  if (sharded_) {
    // This rank's shards between passes; the most it holds whole during one
    // (the root and the largest layer on top of its shards).
    m["memory/weights_gb"] = static_cast<double>(sharded_->shard_bytes()) / kGiB;
    m["memory/trainable_weights_gb"] = m["memory/weights_gb"];
    m["memory/weights_peak_gb"] = static_cast<double>(sharded_->peak_whole_bytes()) / kGiB;
    // Not memory, but the same component's: how often the next layer's
    // gather was done by the time the layer ran.
    m["sharding/prefetched_fraction"] = sharded_->prefetched_fraction();
  } else {
    m["memory/weights_gb"] = bytes(policy_->parameters()) / kGiB;
    std::vector<at::Tensor> trainable;
    for (const at::Tensor& p : policy_->parameters()) {
      if (p.requires_grad()) trainable.push_back(p);
    }
    m["memory/trainable_weights_gb"] = bytes(trainable) / kGiB;
  }
  const OptimizerMemory held = optimizer_->memory();
  m["memory/master_weights_gb"] = static_cast<double>(held.master) / kGiB;
  m["memory/gradients_gb"] = static_cast<double>(held.gradients) / kGiB;
  m["memory/optimizer_gb"] = static_cast<double>(held.moments) / kGiB;
  if (critic_) {
    const OptimizerMemory c = critic_->memory();
    m["memory/critic_weights_gb"] = static_cast<double>(critic_->weight_bytes()) / kGiB;
    m["memory/critic_optimizer_gb"] = static_cast<double>(c.moments + c.master) / kGiB;
    m["memory/critic_gradients_gb"] = static_cast<double>(c.gradients) / kGiB;
  }
  m["memory/reference_gb"] =
      sharded_reference_ ? static_cast<double>(sharded_reference_->shard_bytes()) / kGiB
      : reference_ && !reference_is_base_ ? bytes(reference_->parameters()) / kGiB
                                          : 0.0;
  // The process as the kernel sees it: resident after the step, its peak
  // during the step, and how far the step rose above what was in use where
  // it started (activations, gradients, LM-head chunks and other
  // temporaries). Resident includes the freed memory malloc keeps for the
  // next step (model/cpu_memory.h), reported on its own.
  const int64_t rss = model::current_rss_bytes(), peak = model::peak_rss_bytes();
  if (rss >= 0) m["memory/rss_gb"] = static_cast<double>(rss) / kGiB;
  if (const model::CpuMemoryStats heap = model::cpu_memory_stats(); heap.known) {
    m["memory/heap_free_gb"] = static_cast<double>(heap.free_bytes) / kGiB;
  }
  if (peak >= 0) m["memory/rss_peak_gb"] = static_cast<double>(peak) / kGiB;
  if (peak >= 0 && rss_at_start >= 0) {
    m["memory/step_peak_growth_gb"] =
        static_cast<double>(std::max<int64_t>(0, peak - rss_at_start)) / kGiB;
  }
  const int64_t device_peak = model::device_peak_bytes(policy_->parameters().front().device());
  if (device_peak >= 0) m["memory/device_peak_gb"] = static_cast<double>(device_peak) / kGiB;
}

}  // namespace relay::trainer
