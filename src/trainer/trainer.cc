#include "relay/trainer/trainer.h"

#include <torch/torch.h>

#include <cmath>
#include <numeric>

#include "relay/trainer/batch.h"

namespace relay::trainer {

double lr_at(const OptimizerOptions& o, int64_t step) {
  const bool warming = o.warmup_steps > 0 && step < o.warmup_steps;
  const double warm = warming ? static_cast<double>(step + 1) / o.warmup_steps : 1.0;
  switch (o.schedule) {
    case LrSchedule::kConstant:
      return o.lr;
    case LrSchedule::kLinearWarmup:
      return o.lr * warm;
    case LrSchedule::kCosine: {
      if (warming) return o.lr * warm;
      const int64_t span = std::max<int64_t>(1, o.total_steps - o.warmup_steps);
      const double progress = std::min(1.0, static_cast<double>(step - o.warmup_steps) / span);
      return o.lr * (o.min_lr_ratio + (1 - o.min_lr_ratio) * 0.5 * (1 + std::cos(M_PI * progress)));
    }
  }
  return o.lr;
}

namespace {

Status validate_options(const TrainerOptions& o) {
  auto bad = [](const std::string& field, const std::string& rule, double got) {
    return InvalidArgumentError(absl::StrCat(field, ": ", rule, ", got ", got));
  };
  if (!(o.temperature > 0)) return bad("trainer.temperature", "must be > 0", o.temperature);
  if (o.micro_batch_tokens < 1) {
    return bad("trainer.micro_batch_tokens", "must be >= 1", o.micro_batch_tokens);
  }
  if (o.ppo_epochs < 1) return bad("trainer.ppo_epochs", "must be >= 1", o.ppo_epochs);
  if (o.mini_batches < 1) return bad("trainer.mini_batches", "must be >= 1", o.mini_batches);
  if (!(o.optimizer.lr > 0)) return bad("trainer.lr", "must be > 0", o.optimizer.lr);
  if (!(o.kl_coef >= 0)) return bad("trainer.kl_coef", "must be >= 0", o.kl_coef);
  if (!(o.sft_coef >= 0)) return bad("trainer.sft_coef", "must be >= 0", o.sft_coef);
  RELAY_RETURN_IF_ERROR(validate(o.ppo, "trainer.ppo"));
  RELAY_RETURN_IF_ERROR(validate(o.advantage));
  return OkStatus();
}

// Masked statistics of a [B, L] tensor (or [B] with an all-true mask).
struct Summary {
  double mean = 0, std = 0, min = 0, max = 0;
};
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

// k3 estimate of KL(behavior || trainer) from tokens sampled by the behavior
// policy: r = p_trainer / p_behavior, k3 = r - 1 - log r.
double mismatch_k3(const at::Tensor& trainer, const at::Tensor& behavior, const at::Tensor& mask) {
  at::Tensor sel = mask.to(torch::kBool);
  if (sel.sum().item<int64_t>() == 0) return 0.0;
  at::Tensor log_r = (trainer - behavior).masked_select(sel).to(torch::kFloat64);
  return (log_r.exp() - 1 - log_r).mean().item<double>();
}

}  // namespace

Trainer::Trainer(model::Policy policy, TrainerOptions options, int64_t version)
    : policy_(std::move(policy)), options_(std::move(options)), version_(version) {
  const OptimizerOptions& o = options_.optimizer;
  optimizer_ = std::make_unique<torch::optim::AdamW>(policy_->parameters(),
                                                     torch::optim::AdamWOptions(o.lr)
                                                         .betas({o.beta1, o.beta2})
                                                         .eps(o.eps)
                                                         .weight_decay(o.weight_decay));
  if (options_.kl_coef > 0) {
    // The reference is the policy as it is now, frozen.
    reference_ = model::clone_policy(*policy_);
    for (auto& p : reference_->parameters()) p.set_requires_grad(false);
  }
}

Trainer::~Trainer() = default;

StatusOr<std::unique_ptr<Trainer>> Trainer::create(model::Policy policy, TrainerOptions options,
                                                   int64_t version) {
  if (!policy) return InvalidArgumentError("Trainer: policy is null");
  RELAY_RETURN_IF_ERROR(validate_options(options));
  return std::unique_ptr<Trainer>(new Trainer(std::move(policy), std::move(options), version));
}

StatusOr<StepMetrics> Trainer::step(const std::vector<rollout::TrajectoryGroup>& groups) {
  const TrainerOptions& o = options_;
  StepMetrics m;
  BatchOptions bo;
  bo.trainer_version = version_;
  bo.max_staleness = o.max_staleness;
  bo.pad_token_id = o.pad_token_id;
  BatchStats bstats;
  RELAY_ASSIGN_OR_RETURN(TrainBatch batch, build_batch(groups, bo, &bstats));
  m["batch/dropped_stale"] = static_cast<double>(bstats.dropped_stale);

  // Invariant 5: missing behavior log-probs are refused unless allowed.
  m["frac_old_logprobs_valid"] = frac_behavior_logprobs_valid(batch);
  if (!o.allow_missing_logprobs) RELAY_RETURN_IF_ERROR(check_behavior_logprobs(batch));

  if (o.drop_equal_reward_groups) {
    RELAY_ASSIGN_OR_RETURN(EqualRewardGroups eq,
                           groups_with_equal_rewards(batch.rewards, batch.group_index));
    m["batch/dropped_equal_reward_groups"] = static_cast<double>(eq.num_dropped_groups);
    at::Tensor keep = eq.keep.nonzero().view(-1).contiguous();
    if (keep.numel() == 0) {
      return FailedPreconditionError(
          absl::StrCat("trainer step: all ", eq.num_groups,
                       " groups have equal rewards (no learning signal); collect more groups"));
    }
    batch = select_rows(batch, std::vector<int64_t>(keep.data_ptr<int64_t>(),
                                                    keep.data_ptr<int64_t>() + keep.numel()));
  }
  m["response_length/clip_ratio"] = batch.truncated.to(torch::kFloat64).mean().item<double>();
  if (o.mask_truncated) {
    RELAY_ASSIGN_OR_RETURN(batch.response_mask,
                           overlong_mask(batch.response_mask, batch.truncated));
  }

  const int64_t B = batch.size();
  const int64_t L = batch.response_mask.size(1);
  const at::Tensor mask = batch.response_mask;

  AdvantageInputs ai;
  ai.rewards = batch.rewards;
  ai.group_index = batch.group_index;
  ai.response_mask = mask;
  ai.offpolicy = batch.has_offpolicy;
  ai.offpolicy_mask = batch.offpolicy_mask;
  RELAY_ASSIGN_OR_RETURN(AdvantageOutputs adv, compute_advantages(ai, o.advantage));

  model::ScoreOptions score_options;
  score_options.temperature = o.temperature;
  // Step 3: the trainer's log-probs before the update (and the reference's),
  // in the response layout [B, L], on the host.
  const std::vector<std::vector<int64_t>> all_parts =
      split_by_token_budget(batch, o.micro_batch_tokens);
  auto score_all = [&](model::PolicyImpl& scorer) {
    torch::NoGradGuard no_grad;
    at::Tensor out = torch::zeros({B, L}, torch::kFloat32);
    for (const auto& rows : all_parts) {
      TrainBatch mb = select_rows(batch, rows);
      at::Tensor lp = gather_response(scorer.score(mb.input_ids, mb.lengths, score_options), mb);
      out.index_copy_(
          0, torch::tensor(rows, torch::kInt64),
          torch::nn::functional::pad(lp.to(torch::kCPU), torch::nn::functional::PadFuncOptions(
                                                             {0, L - mb.response_mask.size(1)})));
    }
    return out;
  };
  const at::Tensor old_logp = score_all(*policy_);
  const at::Tensor ref_logp = reference_ ? score_all(*reference_) : at::Tensor();

  // Behavior log-probs; missing ones (allowed only by config) become the
  // trainer's own: ratio 1, the on-policy fallback, and counted above.
  at::Tensor behavior = batch.behavior_logprobs;
  at::Tensor missing = behavior.isnan().logical_and(mask);
  behavior = torch::where(missing, old_logp, behavior);

  // Diagnostics of the gap between the sampler and the trainer. Tokens of
  // the trainer's own version had the same weights: any gap is numerics
  // (engine mismatch); older tokens add staleness.
  at::Tensor valid = mask.logical_and(missing.logical_not());
  at::Tensor diff = (behavior - old_logp).abs().masked_fill(valid.logical_not(), 0);
  const double n_valid = std::max<double>(1, valid.sum().item<double>());
  m["mismatch/logprob_abs_diff_mean"] = diff.sum().item<double>() / n_valid;
  m["mismatch/logprob_abs_diff_max"] = diff.max().item<double>();
  m["mismatch/k3"] = mismatch_k3(old_logp, behavior, valid);
  at::Tensor same_version = batch.token_versions.eq(version_).logical_and(valid);
  m["mismatch/engine_k3"] = mismatch_k3(old_logp, behavior, same_version);
  m["mismatch/staleness_k3"] =
      mismatch_k3(old_logp, behavior, batch.token_versions.lt(version_).logical_and(valid));
  at::Tensor w = (old_logp - behavior).exp();
  put(m, "is_ratio", summarize(w, valid));
  {
    at::Tensor ws = w.masked_select(valid).to(torch::kFloat64);
    const double sum = ws.sum().item<double>(), sq = ws.pow(2).sum().item<double>();
    m["is_ratio/ess"] = sq > 0 ? sum * sum / (sq * ws.numel()) : 1.0;
  }

  // The proximal policy for the decoupled loss.
  at::Tensor proximal;
  if (o.loss == PolicyLossKind::kDecoupledPpo) {
    switch (o.proximal) {
      case ProximalSource::kRecorded: {
        at::Tensor usable =
            batch.proximal_versions.eq(version_).logical_and(batch.proximal_logprobs.isfinite());
        proximal = torch::where(usable, batch.proximal_logprobs, old_logp);
        m["proximal/recorded_fraction"] =
            usable.logical_and(mask).sum().item<double>() / std::max<double>(1, batch.num_tokens());
        break;
      }
      case ProximalSource::kRecompute:
        proximal = old_logp;
        break;
      case ProximalSource::kLoglinear:
        proximal = loglinear_proximal_logprobs(behavior, old_logp, batch.token_versions, version_);
        break;
    }
  }

  // Staleness and data metrics.
  at::Tensor staleness = (version_ - batch.token_versions).to(torch::kFloat64);
  put(m, "staleness", summarize(staleness, mask));
  for (int64_t k = 0; k <= 4; ++k) {
    at::Tensor sel = staleness.eq(static_cast<double>(k)).logical_and(mask);
    m[absl::StrCat("staleness/frac_", k)] =
        sel.sum().item<double>() / std::max<double>(1, batch.num_tokens());
  }
  put(m, "advantages", summarize(adv.advantages, mask));
  put(m, "reward", summarize(batch.rewards, torch::ones({B}, torch::kBool)));
  put(m, "response_length",
      summarize(batch.response_lengths.to(torch::kFloat64), torch::ones({B}, torch::kBool)));
  m["offpolicy_token_fraction"] = batch.offpolicy_mask.logical_and(mask).sum().item<double>() /
                                  std::max<double>(1, batch.num_tokens());
  m["batch/trajectories"] = static_cast<double>(B);
  m["batch/tokens"] = static_cast<double>(batch.num_tokens());

  // Step 4: epochs x mini-batches x micro-batches.
  std::vector<int64_t> order(B);
  std::iota(order.begin(), order.end(), 0);
  const int n_mini = std::min<int>(o.mini_batches, static_cast<int>(B));
  double loss_sum = 0, pg_sum = 0, kl_sum = 0, grad_norm_sum = 0, lr_last = 0;
  PolicyLossMetrics acc;
  double acc_tokens = 0;
  int updates = 0;
  policy_->train();
  for (int epoch = 0; epoch < o.ppo_epochs; ++epoch) {
    for (int mb_i = 0; mb_i < n_mini; ++mb_i) {
      std::vector<int64_t> mini(order.begin() + (B * mb_i) / n_mini,
                                order.begin() + (B * (mb_i + 1)) / n_mini);
      TrainBatch mini_batch = select_rows(batch, mini);
      std::vector<std::vector<int64_t>> parts;
      std::vector<at::Tensor> masks;
      for (const auto& local : split_by_token_budget(mini_batch, o.micro_batch_tokens)) {
        std::vector<int64_t> rows;
        for (int64_t r : local) rows.push_back(mini[r]);
        masks.push_back(select_rows(batch, rows).response_mask);
        parts.push_back(std::move(rows));
      }
      const GlobalNormalizer norm = make_global_normalizer(masks, o.loss_scale_factor);
      optimizer_->zero_grad();
      for (const auto& rows : parts) {
        TrainBatch mb = select_rows(batch, rows);
        at::Tensor index = torch::tensor(rows, torch::kInt64);
        PolicyLossInputs in;
        in.logprobs = gather_response(policy_->score(mb.input_ids, mb.lengths, score_options), mb);
        const int64_t width = in.logprobs.size(1);
        const c10::Device dev = in.logprobs.device();
        auto take = [&](const at::Tensor& t) {
          return t.index_select(0, index).narrow(1, 0, width).to(dev);
        };
        in.old_logprobs = take(behavior);
        in.advantages = take(adv.advantages);
        in.response_mask = mb.response_mask.to(dev);
        if (proximal.defined()) in.proximal_logprobs = take(proximal);
        PolicyLossResult r = o.loss == PolicyLossKind::kPpo ? ppo_clip_loss(in, o.ppo, norm)
                                                            : decoupled_ppo_loss(in, o.ppo, norm);
        at::Tensor loss = r.loss;
        pg_sum += r.loss.item<double>();
        if (reference_) {
          at::Tensor kl = aggregate_loss(kl_penalty(in.logprobs, take(ref_logp), o.kl_estimator),
                                         in.response_mask, o.ppo.agg_mode, norm);
          kl_sum += kl.item<double>();
          loss = loss + o.kl_coef * kl;
        }
        if (o.sft_coef > 0) {
          at::Tensor forced = mb.offpolicy_mask.to(dev).logical_and(in.response_mask);
          loss = loss + o.sft_coef * sft_loss(in.logprobs, forced, LossAggMode::kTokenMean);
        }
        loss.backward();
        loss_sum += loss.item<double>();
        const double tokens = mb.response_mask.sum().item<double>();
        acc.clip_fraction += r.metrics.clip_fraction * tokens;
        acc.clip_fraction_low += r.metrics.clip_fraction_low * tokens;
        acc.clip_fraction_high += r.metrics.clip_fraction_high * tokens;
        acc.dual_clip_fraction += r.metrics.dual_clip_fraction * tokens;
        acc.ppo_kl += r.metrics.ppo_kl * tokens;
        acc.mean_ratio += r.metrics.mean_ratio * tokens;
        acc_tokens += tokens;
      }
      RELAY_ASSIGN_OR_RETURN(const double grad_norm, apply_gradients());
      grad_norm_sum += grad_norm;
      lr_last = lr_at(o.optimizer, optimizer_steps_ - 1);
      ++updates;
    }
  }
  policy_->eval();

  const double t = std::max(1.0, acc_tokens);
  m["clip_fraction"] = acc.clip_fraction / t;
  m["clip_fraction/low"] = acc.clip_fraction_low / t;
  m["clip_fraction/high"] = acc.clip_fraction_high / t;
  m["clip_fraction/dual"] = acc.dual_clip_fraction / t;
  m["ppo_kl"] = acc.ppo_kl / t;
  m["mean_importance_ratio"] = acc.mean_ratio / t;
  m["pg_loss"] = pg_sum / updates;
  m["loss"] = loss_sum / updates;
  if (reference_) {
    m["kl_ref"] = kl_sum / updates;
    for (KlEstimator k : {KlEstimator::kK1, KlEstimator::kK2, KlEstimator::kK3}) {
      m[absl::StrCat("kl_ref/", kl_estimator_name(k))] =
          summarize(kl_penalty(old_logp, ref_logp, k), mask).mean;
    }
  }
  m["grad_norm"] = grad_norm_sum / updates;
  m["lr"] = lr_last;
  m["optimizer_steps"] = static_cast<double>(updates);
  ++version_;
  m["version"] = static_cast<double>(version_);
  return m;
}

StatusOr<double> Trainer::apply_gradients() {
  const OptimizerOptions& o = options_.optimizer;
  const double max_norm =
      o.max_grad_norm > 0 ? o.max_grad_norm : std::numeric_limits<double>::infinity();
  const double grad_norm = torch::nn::utils::clip_grad_norm_(policy_->parameters(), max_norm);
  if (!std::isfinite(grad_norm)) {
    optimizer_->zero_grad();
    return InternalError(absl::StrCat("trainer step at version ", version_, ": gradient norm is ",
                                      grad_norm, "; the update was not applied"));
  }
  const double lr = lr_at(o, optimizer_steps_);
  for (auto& group : optimizer_->param_groups()) {
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  }
  optimizer_->step();
  ++optimizer_steps_;
  return grad_norm;
}

StatusOr<StepMetrics> Trainer::sft_step(const std::vector<rollout::TrajectoryGroup>& groups) {
  BatchOptions bo;
  bo.trainer_version = version_;
  bo.pad_token_id = options_.pad_token_id;
  RELAY_ASSIGN_OR_RETURN(TrainBatch batch, build_batch(groups, bo));
  model::ScoreOptions score_options;
  score_options.temperature = options_.temperature;
  std::vector<std::vector<int64_t>> parts =
      split_by_token_budget(batch, options_.micro_batch_tokens);
  std::vector<TrainBatch> micro;
  std::vector<at::Tensor> masks;
  for (const auto& rows : parts) {
    micro.push_back(select_rows(batch, rows));
    masks.push_back(micro.back().response_mask);
  }
  const GlobalNormalizer norm = make_global_normalizer(masks);
  policy_->train();
  optimizer_->zero_grad();
  double loss_sum = 0;
  for (const TrainBatch& mb : micro) {
    at::Tensor logp = gather_response(policy_->score(mb.input_ids, mb.lengths, score_options), mb);
    at::Tensor loss =
        sft_loss(logp, mb.response_mask.to(logp.device()), LossAggMode::kTokenMean, norm);
    loss.backward();
    loss_sum += loss.item<double>();
  }
  StatusOr<double> grad_norm = apply_gradients();
  policy_->eval();
  RELAY_RETURN_IF_ERROR(grad_norm.status());
  ++version_;
  return StepMetrics{{"sft_loss", loss_sum},
                     {"grad_norm", *grad_norm},
                     {"lr", lr_at(options_.optimizer, optimizer_steps_ - 1)},
                     {"batch/tokens", static_cast<double>(batch.num_tokens())},
                     {"version", static_cast<double>(version_)}};
}

}  // namespace relay::trainer
