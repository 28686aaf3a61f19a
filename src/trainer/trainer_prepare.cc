// The phases of Trainer::step before any update (step_state.h): the batch
// and its checks, the pre-update pass, rollout correction and advantages.
// Nothing here changes what the trainer keeps, so a failure in any of them
// leaves the trainer as it was.

#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <numeric>
#include <optional>

#include "absl/strings/str_cat.h"
#include "relay/model/cpu_memory.h"
#include "relay/model/device.h"
#include "relay/model/lora.h"
#include "relay/trainer/trainer.h"
#include "trainer/critic.h"
#include "trainer/fully_sharded.h"
#include "trainer/step_state.h"

namespace relay::trainer {

const std::string& row_group(const TrainBatch& b, int64_t row) {
  return b.group_ids.at(static_cast<size_t>(b.group_index[row].item<int64_t>()));
}

void add_fault(std::vector<Trainer::StepFault>& faults, const std::string& group,
               std::string reason) {
  for (const Trainer::StepFault& f : faults) {
    if (f.group_id == group) return;
  }
  faults.push_back({group, std::move(reason)});
}

std::string describe(const std::vector<Trainer::StepFault>& faults) {
  std::string out;
  for (const Trainer::StepFault& f : faults) {
    absl::StrAppend(&out, out.empty() ? "" : "; ", "group '", f.group_id, "' (", f.reason, ")");
  }
  return out;
}

namespace {

// Rows whose inputs no step can train on: a reward that is not a finite
// float (1e300 arrives as a finite double), or, when they are required,
// missing or non-finite behavior log-probs on response tokens. Checked per
// row before anything mixes rows (group or batch normalisation), so one bad
// group is blamed alone.
std::vector<Trainer::StepFault> input_faults(const TrainBatch& b, bool require_behavior,
                                             bool require_teacher) {
  std::vector<Trainer::StepFault> out;
  at::Tensor bad_reward = b.rewards.isfinite().logical_not();
  at::Tensor bad_behavior =
      b.behavior_logprobs.isfinite().logical_not().logical_and(b.response_mask);
  at::Tensor bad_teacher = b.teacher_logprobs.isfinite().logical_not().logical_and(b.response_mask);
  at::Tensor bad_rows = require_behavior ? bad_reward.logical_or(bad_behavior.any(1)) : bad_reward;
  if (require_teacher) bad_rows = bad_rows.logical_or(bad_teacher.any(1));
  at::Tensor rows = bad_rows.nonzero().view(-1);
  for (int64_t i = 0; i < rows.numel(); ++i) {
    const int64_t r = rows[i].item<int64_t>();
    if (bad_reward[r].item<bool>()) {
      add_fault(out, row_group(b, r),
                absl::StrCat("batch row ", r, ": reward ", b.rewards[r].item<float>(),
                             " is not a finite float"));
    } else if (require_teacher && bad_teacher[r].any().item<bool>()) {
      const int64_t j = bad_teacher[r].nonzero()[0][0].item<int64_t>();
      add_fault(out, row_group(b, r),
                absl::StrCat("batch row ", r, ": teacher log-prob of response token ", j, " is ",
                             b.teacher_logprobs[r][j].item<float>(),
                             " and trainer.distill is on (the rollout side scores every response "
                             "with trainer.distill.teacher)"));
    } else {
      const int64_t j = bad_behavior[r].nonzero()[0][0].item<int64_t>();
      add_fault(out, row_group(b, r),
                absl::StrCat("batch row ", r, ": behavior log-prob of response token ", j, " is ",
                             b.behavior_logprobs[r][j].item<float>(),
                             " and trainer.allow_missing_logprobs is off"));
    }
  }
  return out;
}

// Rows where a per-token quantity the update would use is not finite on a
// response token (or a per-row one on the row).
void derived_faults(const TrainBatch& b, const at::Tensor& mask, const char* what,
                    const at::Tensor& values, std::vector<Trainer::StepFault>& out) {
  if (!values.defined()) return;
  at::Tensor v = values.detach().to(torch::kCPU);
  at::Tensor bad;
  if (v.dim() == 2 && v.sizes() == mask.sizes()) {
    bad = v.isfinite().logical_not().logical_and(mask).any(1);
  } else if (v.dim() == 1 && v.size(0) == mask.size(0)) {
    bad = v.isfinite().logical_not();
  } else {
    return;
  }
  at::Tensor rows = bad.nonzero().view(-1);
  for (int64_t i = 0; i < rows.numel(); ++i) {
    const int64_t r = rows[i].item<int64_t>();
    add_fault(out, row_group(b, r), absl::StrCat("batch row ", r, ": non-finite ", what));
  }
}

bool corrects(const RolloutCorrectionOptions& rc) {
  return !rc.bypass && (rc.is_level != CorrectionLevel::kNone ||
                        rc.rs_level != CorrectionLevel::kNone || rc.veto_threshold > 0);
}

// What the batch's episodes did with their tools, when it has episodes:
// model turns, tool calls that ran and calls refused per episode, and
// episode/tool_use, the fraction of episodes that called a tool at least once
// and had no call refused.
void add_episode_metrics(const std::vector<rollout::TrajectoryGroup>& groups,
                         std::map<std::string, double>& m) {
  double episodes = 0, turns = 0, calls = 0, errors = 0, used = 0;
  for (const rollout::TrajectoryGroup& g : groups) {
    for (const rollout::Trajectory& t : g.trajectories) {
      if (t.turns.empty()) continue;
      int64_t c = 0, e = 0;
      for (const rollout::EpisodeTurn& turn : t.turns) {
        c += turn.tool_calls;
        e += turn.tool_errors;
      }
      ++episodes;
      turns += static_cast<double>(t.turns.size());
      calls += static_cast<double>(c);
      errors += static_cast<double>(e);
      used += c > 0 && e == 0 ? 1 : 0;
    }
  }
  if (episodes == 0) return;
  m["episode/turns"] = turns / episodes;
  m["episode/tool_calls"] = calls / episodes;
  m["episode/tool_errors"] = errors / episodes;
  m["episode/tool_use"] = used / episodes;
}

}  // namespace

Status Trainer::prepare_step(const std::vector<rollout::TrajectoryGroup>& groups, StepState& s) {
  s.rss_at_start = model::current_rss_bytes();
  if (const model::CpuMemoryStats heap = model::cpu_memory_stats();
      heap.known && s.rss_at_start >= 0) {
    s.rss_at_start = std::max<int64_t>(0, s.rss_at_start - heap.free_bytes);
  }
  model::reset_peak_rss();
  model::reset_device_peak(policy_->parameters().front().device());
  RELAY_ASSIGN_OR_RETURN(s.batch, prepare_batch(groups, s.metrics, &s.reuse_keys, &step_faults_));
  s.mask = s.batch.response_mask;
  return OkStatus();
}

StatusOr<TrainBatch> Trainer::prepare_batch(const std::vector<rollout::TrajectoryGroup>& groups,
                                            StepMetrics& m, std::vector<uint64_t>* keys,
                                            std::vector<StepFault>* faults) const {
  const TrainerOptions& o = options_;
  // The reuse cap drops trajectories before anything else looks at them.
  const std::vector<rollout::TrajectoryGroup>* source = &groups;
  std::vector<rollout::TrajectoryGroup> fresh;
  int64_t dropped_reused = 0;
  if (o.max_reuse > 0) {
    for (const rollout::TrajectoryGroup& g : groups) {
      rollout::TrajectoryGroup kept = g;
      kept.trajectories.clear();
      for (size_t i = 0; i < g.trajectories.size(); ++i) {
        const uint64_t key = trajectory_key(g.group_id, i, g.trajectories[i]);
        if (reuse_.uses(key) >= o.max_reuse) {
          ++dropped_reused;
          continue;
        }
        kept.trajectories.push_back(g.trajectories[i]);
        keys->push_back(key);
      }
      if (!kept.trajectories.empty()) fresh.push_back(std::move(kept));
    }
    source = &fresh;
    if (fresh.empty()) {
      return FailedPreconditionError(
          absl::StrCat("trainer step: all ", dropped_reused, " trajectories were already trained ",
                       "on trainer.max_reuse = ", o.max_reuse, " times"));
    }
  }
  m["batch/dropped_reused"] = static_cast<double>(dropped_reused);

  BatchOptions bo;
  bo.trainer_version = version_;
  bo.max_staleness = o.max_staleness;
  bo.pad_token_id = o.pad_token_id;
  BatchStats bstats;
  RELAY_ASSIGN_OR_RETURN(TrainBatch batch, build_batch(*source, bo, &bstats));
  m["batch/dropped_stale"] = static_cast<double>(bstats.dropped_stale);

  // Invariant 5: missing behavior log-probs are refused unless allowed. A
  // row that cannot be trained on fails the step before anything changes,
  // naming its group (see step()).
  // Over the tokens the model sampled: an episode's environment tokens have
  // no behavior log-prob by design and are counted apart.
  m["frac_old_logprobs_valid"] = frac_behavior_logprobs_valid(batch);
  {
    const double env = batch.env_mask.sum().item<double>();
    m["episode/env_token_fraction"] = env / std::max(1.0, env + batch.num_tokens());
    add_episode_metrics(*source, m);
  }
  if (std::vector<StepFault> f =
          input_faults(batch, !o.allow_missing_logprobs, o.distill.enabled());
      !f.empty()) {
    *faults = f;
    return FailedPreconditionError(absl::StrCat("trainer step at version ", version_, ": ",
                                                f.size(),
                                                " group(s) cannot be trained on: ", describe(f)));
  }

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
  if (o.overlong_buffer.length > 0) {
    // After the equal-reward filter, which looks at the verifier's rewards
    // (DAPO filters groups by accuracy, then shapes the reward).
    RELAY_ASSIGN_OR_RETURN(
        at::Tensor penalty,
        overlong_penalty(batch.response_lengths, o.max_response_length, o.overlong_buffer.length,
                         o.overlong_buffer.penalty_factor));
    batch.rewards = batch.rewards + penalty;
    m["reward/overlong_penalty"] = penalty.to(torch::kFloat64).mean().item<double>();
    m["reward/overlong_penalized_fraction"] =
        penalty.lt(0).to(torch::kFloat64).mean().item<double>();
  }
  if (o.mask_truncated) {
    RELAY_ASSIGN_OR_RETURN(batch.response_mask,
                           overlong_mask(batch.response_mask, batch.truncated));
  }
  return batch;
}

// The trainer's log-probs before the update (and the reference's). In bypass
// mode without other needs, the first mini-batch's own forward pass (still
// under these weights) stands in for it, for the diagnostics only.
Status Trainer::score_step(StepState& s) {
  s.skip_pass = can_skip_pass(s.batch);
  s.metrics["pass/skipped"] = s.skip_pass ? 1 : 0;
  s.behavior = s.batch.behavior_logprobs;
  s.valid = s.mask;
  if (s.skip_pass) return OkStatus();
  RELAY_ASSIGN_OR_RETURN(s.before, score_before_update(s.batch));
  // Missing behavior log-probs (allowed only by config) become the
  // trainer's own: ratio 1, the on-policy fallback, and counted before.
  at::Tensor missing = s.behavior.isnan().logical_and(s.mask);
  s.behavior = torch::where(missing, s.before.logprobs, s.behavior);
  s.valid = s.mask.logical_and(missing.logical_not());
  return OkStatus();
}

// Whether the step can go without the pre-update pass: rollout correction's
// bypass mode, when nothing else needs pi_old for the whole batch first.
bool Trainer::can_skip_pass(const TrainBatch& batch) const {
  const TrainerOptions& o = options_;
  return o.rollout_correction.bypass && !reference_ && !critic_ &&
         o.loss.kind != PolicyLossKind::kDecoupledPpo &&
         !batch.behavior_logprobs.isnan().logical_and(batch.response_mask).any().item<bool>();
}

StatusOr<PreUpdateScores> Trainer::score_before_update(const TrainBatch& batch) {
  torch::NoGradGuard no_grad;
  const int64_t B = batch.size(), L = batch.response_mask.size(1);
  PreUpdateScores s;
  s.logprobs = torch::zeros({B, L}, torch::kFloat32);
  s.entropy = torch::zeros({B, L}, torch::kFloat32);
  if (reference_) s.reference = torch::zeros({B, L}, torch::kFloat32);
  if (critic_) s.values = torch::zeros({B, L}, torch::kFloat32);
  std::vector<int64_t> all(static_cast<size_t>(B));
  std::iota(all.begin(), all.end(), 0);
  WholeRoot root(sharded_.get()), reference_root(sharded_reference_.get()),
      critic_root(critic_ ? critic_->sharded() : nullptr);
  RELAY_RETURN_IF_ERROR(root.acquire());
  RELAY_RETURN_IF_ERROR(reference_root.acquire());
  RELAY_RETURN_IF_ERROR(critic_root.acquire());
  const std::vector<std::vector<int64_t>> parts = my_micro_batches(batch, all);
  const size_t most = most_micro_batches(batch, all);
  for (size_t k = parts.size(); k < most; ++k) {
    empty_pass(*policy_, /*with_grad=*/false);
    if (reference_) empty_pass(*reference_, /*with_grad=*/false);
    if (critic_) {
      const model::AutocastGuard autocast(device_type_of(policy_), options_.autocast);
      critic_->empty_pass(/*with_grad=*/false);
    }
  }
  for (const auto& rows : parts) {
    TrainBatch mb = select_rows(batch, rows);
    const model::AutocastGuard autocast(device_type_of(policy_), options_.autocast);
    model::MoeRouting routing;
    const model::ScoreOptions so = score_options(mb, &routing);
    model::ScoreOutput out = score_rows(*policy_, mb, so, /*with_entropy=*/true);
    scatter_rows(s.logprobs, rows, gather_response(out.logprobs, mb));
    scatter_rows(s.entropy, rows, gather_response(out.entropy, mb));
    if (!routing.differs.empty()) {
      // Per position [B, T]: how many MoE layers routed otherwise; then at
      // the positions that score response tokens.
      const int64_t T = mb.input_ids.size(1);
      at::Tensor layers = torch::stack(routing.differs, 1).to(torch::kFloat32).sum(1).view({-1, T});
      at::Tensor per_token = gather_response(layers.narrow(1, 0, T - 1), mb).cpu();
      at::Tensor mask = mb.response_mask;
      const double n_layers = static_cast<double>(routing.differs.size());
      s.routed_tokens += mask.sum().item<double>();
      s.routed_layers += mask.sum().item<double>() * n_layers;
      s.differing_layers += per_token.masked_select(mask).sum().item<double>();
      s.differing_tokens += per_token.gt(0).logical_and(mask).sum().item<double>();
    }
    if (reference_) {
      model::ScoreOptions ref = so;
      ref.routing = nullptr;  // the reference routes by itself
      std::optional<model::AdaptersDisabled> base;
      if (reference_is_base_) base.emplace(*reference_);
      scatter_rows(s.reference, rows,
                   gather_response(score_rows(*reference_, mb, ref, false).logprobs, mb));
    }
    if (critic_) {
      scatter_rows(s.values, rows,
                   critic_->response_values(mb, options_.pack_sequences, options_.pad_token_id));
    }
  }
  if (dp_.active()) {
    // Each row was scored on one rank and is zero on the others.
    for (at::Tensor* t : {&s.logprobs, &s.entropy, &s.reference, &s.values}) {
      if (t->defined()) RELAY_RETURN_IF_ERROR(dp_.group->all_reduce_sum(*t));
    }
    std::map<std::string, double> sums = {{"routed_tokens", s.routed_tokens},
                                          {"differing_tokens", s.differing_tokens},
                                          {"routed_layers", s.routed_layers},
                                          {"differing_layers", s.differing_layers}};
    RELAY_RETURN_IF_ERROR(all_reduce_named_sums(*dp_.group, sums));
    s.routed_tokens = sums["routed_tokens"];
    s.differing_tokens = sums["differing_tokens"];
    s.routed_layers = sums["routed_layers"];
    s.differing_layers = sums["differing_layers"];
  }
  return s;
}

// Rollout correction: IS weights and rejection for pi_old vs pi_behav, and
// the mismatch diagnostics. Without it (or in bypass) the PPO anchor is the
// behavior policy itself. Without the pass, the first mini-batch diagnoses
// (diagnose_recorded).
Status Trainer::correct_rollouts(StepState& s) {
  s.correcting = corrects(options_.rollout_correction);
  s.anchor = s.behavior;
  s.train_mask = s.mask;
  if (!s.skip_pass) RELAY_RETURN_IF_ERROR(diagnose(s, s.before.logprobs, s.before.entropy, s.mask));
  const PreUpdateScores& b = s.before;
  if (b.routed_tokens > 0) {
    // Router replay's diagnostic: where the trainer's own routers would take
    // other experts than the engine's did (with replay they do not).
    s.metrics["router/mismatch_token_fraction"] = b.differing_tokens / b.routed_tokens;
    s.metrics["router/mismatch_layer_fraction"] = b.differing_layers / b.routed_layers;
    s.metrics["router/replay"] = options_.router_replay == RouterReplay::kReplay ? 1 : 0;
  }
  return OkStatus();
}

Status Trainer::diagnose(StepState& s, const at::Tensor& old_logp, const at::Tensor& entropy,
                         const at::Tensor& rows_mask) {
  RolloutCorrectionInputs rci;
  rci.old_logprobs = old_logp;
  rci.behavior_logprobs = s.behavior;
  rci.response_mask = rows_mask;
  rci.token_versions = s.batch.token_versions;
  rci.trainer_version = version_;
  RolloutCorrectionOptions rco = options_.rollout_correction;
  rco.bypass = !s.correcting;
  RELAY_ASSIGN_OR_RETURN(RolloutCorrectionResult rc, rollout_correction(rci, rco));
  mismatch_metrics(old_logp, s.behavior, rows_mask.logical_and(s.valid), rc.metrics, s.metrics);
  s.metrics["entropy"] = summarize(entropy, rows_mask).mean;
  if (s.correcting) {
    append_metrics(rc.metrics, s.metrics);
    s.anchor = rc.anchor_logprobs;
    s.is_weights = rc.weights;
    s.train_mask = rc.response_mask;
  }
  return OkStatus();
}

// Advantages over the whole batch, after KL in the reward (r_t -= beta kl_t),
// then the decoupled loss's proximal policy.
Status Trainer::compute_step_advantages(StepState& s) {
  const TrainerOptions& o = options_;
  const TrainBatch& batch = s.batch;
  AdvantageInputs ai;
  ai.rewards = batch.rewards;
  ai.group_index = batch.group_index;
  ai.response_mask = s.mask;
  ai.offpolicy = batch.has_offpolicy;
  ai.offpolicy_mask = batch.offpolicy_mask;
  if (o.advantage.estimator == AdvantageEstimator::kRemax) {
    if (batch.baseline_rewards.isnan().any().item<bool>()) {
      const int64_t row = batch.baseline_rewards.isnan().nonzero()[0][0].item<int64_t>();
      return FailedPreconditionError(absl::StrCat(
          "trainer.advantage.estimator: remax needs each group's greedy baseline reward; group '",
          batch.group_ids.at(batch.group_index[row].item<int64_t>()),
          "' has none (the rollout adds it when the prompt group sets greedy_baseline)"));
    }
    ai.baseline_rewards = batch.baseline_rewards;
  }
  s.reward_beta = reward_kl_->value();
  if (reference_ && s.reward_beta > 0) {
    at::Tensor kl = kl_penalty(s.before.logprobs, s.before.reference, o.reward_kl.estimator)
                        .masked_fill(s.mask.logical_not(), 0);
    at::Tensor seq_tokens = s.mask.sum(-1).to(torch::kFloat32).clamp_min(1);
    s.reward_kl_mean = (kl.sum(-1) / seq_tokens).mean().item<double>();
    ai.rewards = batch.rewards - s.reward_beta * kl.sum(-1);
    ai.token_rewards = outcome_to_token_rewards(batch.rewards, s.mask) - s.reward_beta * kl;
    s.metrics["reward_kl/coef"] = s.reward_beta;
    s.metrics["reward_kl/kl"] = s.reward_kl_mean;
  }
  if (critic_) ai.values = s.before.values;
  RELAY_ASSIGN_OR_RETURN(s.adv, compute_advantages(ai, o.advantage));
  if (o.distill.enabled()) RELAY_RETURN_IF_ERROR(add_distillation(s));
  choose_proximal(s);
  return OkStatus();
}

// On-policy distillation's teacher signal: its metrics, and in advantage
// mode the per-token term added to the estimator's advantages (after any
// normalisation, as tinker-cookbook adds it to the finished advantages).
Status Trainer::add_distillation(StepState& s) {
  const DistillOptions& d = options_.distill;
  const at::Tensor teacher = s.batch.teacher_logprobs.masked_fill(s.mask.logical_not(), 0);
  const at::Tensor reverse_kl = (s.behavior - teacher).masked_fill(s.mask.logical_not(), 0);
  const double tokens = std::max<double>(1, s.mask.sum().item<double>());
  // tinker-cookbook's teacher_kl: the k1 estimate of KL(pi || q) per token.
  s.metrics["distill/reverse_kl"] = reverse_kl.sum().item<double>() / tokens;
  s.metrics["distill/teacher_logprob"] = teacher.sum().item<double>() / tokens;
  if (d.mode != DistillMode::kAdvantage) return OkStatus();
  RELAY_ASSIGN_OR_RETURN(const at::Tensor a,
                         distill_advantages(s.behavior, teacher, s.mask, d.coef, d.discount));
  s.adv.advantages = s.adv.advantages + a.to(s.adv.advantages.device());
  s.metrics["distill/advantage_mean"] = a.sum().item<double>() / tokens;
  return OkStatus();
}

// The proximal policy for the decoupled loss.
void Trainer::choose_proximal(StepState& s) {
  if (options_.loss.kind != PolicyLossKind::kDecoupledPpo) return;
  const TrainBatch& batch = s.batch;
  switch (options_.proximal) {
    case ProximalSource::kRecorded: {
      at::Tensor usable =
          batch.proximal_versions.eq(version_).logical_and(batch.proximal_logprobs.isfinite());
      s.proximal = torch::where(usable, batch.proximal_logprobs, s.before.logprobs);
      s.metrics["proximal/recorded_fraction"] =
          usable.logical_and(s.mask).sum().item<double>() / std::max<double>(1, batch.num_tokens());
      break;
    }
    case ProximalSource::kRecompute:
      s.proximal = s.before.logprobs;
      break;
    case ProximalSource::kLoglinear:
      s.proximal = loglinear_proximal_logprobs(s.behavior, s.before.logprobs, batch.token_versions,
                                               version_);
      break;
  }
}

// Nothing has changed yet: a row whose derived values are not finite fails
// the step here, naming its group, rather than as a NaN gradient norm after
// earlier mini-batches' updates.
Status Trainer::check_derived(StepState& s) {
  const at::Tensor cpu_mask = s.mask.to(torch::kCPU);
  std::vector<StepFault> f;
  if (!s.skip_pass) derived_faults(s.batch, cpu_mask, "trainer log-probs", s.before.logprobs, f);
  derived_faults(s.batch, cpu_mask, "advantages", s.adv.advantages, f);
  derived_faults(s.batch, cpu_mask, "critic values", s.before.values, f);
  derived_faults(s.batch, cpu_mask, "PPO anchor log-probs", s.anchor, f);
  derived_faults(s.batch, cpu_mask, "proximal log-probs", s.proximal, f);
  derived_faults(s.batch, s.train_mask.to(torch::kCPU), "IS weights", s.is_weights, f);
  if (f.empty()) return OkStatus();
  step_faults_ = f;
  return FailedPreconditionError(absl::StrCat("trainer step at version ", version_, ": ", f.size(),
                                              " group(s) give non-finite values before the "
                                              "update: ",
                                              describe(f)));
}

}  // namespace relay::trainer
