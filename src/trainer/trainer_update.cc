// The phases of Trainer::step and sft_step that change the weights
// (step_state.h): mini-batches of micro-batches, their forward passes, losses
// and backward passes, and the optimizer update.

#include <torch/torch.h>

#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "relay/model/core_share.h"
#include "relay/model/device.h"
#include "relay/trainer/trainer.h"
#include "trainer/critic.h"
#include "trainer/fully_sharded.h"
#include "trainer/optimizer.h"
#include "trainer/step_state.h"

namespace relay::trainer {

c10::DeviceType device_type_of(const model::Policy& policy) {
  return policy->parameters().front().device().type();
}

at::Tensor index_of(const std::vector<int64_t>& rows) { return torch::tensor(rows, torch::kInt64); }

void scatter_rows(at::Tensor& out, const std::vector<int64_t>& rows, const at::Tensor& part) {
  const int64_t pad = out.size(1) - part.size(1);
  out.index_copy_(0, index_of(rows),
                  torch::nn::functional::pad(part.detach().to(torch::kCPU, torch::kFloat32),
                                             torch::nn::functional::PadFuncOptions({0, pad})));
}

model::ScoreOptions Trainer::score_options(const TrainBatch& mb, model::MoeRouting* routing) const {
  model::ScoreOptions so;
  so.temperature = options_.temperature;
  so.vocab_limit = options_.vocab_limit;
  // Prompt, padding and environment positions are never read: the LM head
  // skips them.
  so.scored = response_positions(mb);
  so.lm_head_keep_bytes = options_.lm_head_keep_mb << 20;
  if (routing != nullptr && mb.routed_experts.defined()) {
    const at::Tensor& r = mb.routed_experts;
    routing->recorded = r.reshape({r.size(0) * r.size(1), r.size(2), r.size(3)});
    routing->replay = options_.router_replay == RouterReplay::kReplay;
    so.routing = routing;
  }
  return so;
}

model::ScoreOutput Trainer::score_rows(model::PolicyImpl& model, const TrainBatch& mb,
                                       model::ScoreOptions so, bool with_entropy) const {
  PackedRows packed;
  // Packing that saves no row would only add its copies and its mask.
  if (options_.pack_sequences) packed = pack_rows(mb, mb.input_ids.size(1), options_.pad_token_id);
  if (!options_.pack_sequences || packed.input_ids.size(0) == mb.size()) {
    if (with_entropy) return model.score_with_entropy(mb.input_ids, mb.lengths, so);
    return {model.score(mb.input_ids, mb.lengths, so), at::Tensor()};
  }
  model::MoeRouting* routing = so.routing;
  if (routing != nullptr && packed.routed_experts.defined()) {
    const at::Tensor& r = packed.routed_experts;
    routing->recorded = r.reshape({r.size(0) * r.size(1), r.size(2), r.size(3)});
  }
  so.sequence_starts = packed.sequence_starts;
  if (so.scored.defined()) so.scored = pack_positions(so.scored, packed, mb);
  model::ScoreOutput out;
  if (with_entropy) {
    out = model.score_with_entropy(packed.input_ids, packed.lengths, so);
    out.entropy = unpack_positions(out.entropy, packed, mb);
  } else {
    out.logprobs = model.score(packed.input_ids, packed.lengths, so);
  }
  out.logprobs = unpack_positions(out.logprobs, packed, mb);
  if (routing != nullptr) {
    // Per position of the packed rows -> per position of mb's rows.
    const int64_t R = packed.input_ids.size(0), W = packed.input_ids.size(1);
    for (at::Tensor& d : routing->differs) {
      d = unpack_positions(d.view({R, W}), packed, mb).reshape({-1});
    }
  }
  return out;
}

TokenBudget Trainer::token_budget() const {
  return options_.pack_sequences ? TokenBudget::kReal : TokenBudget::kPadded;
}

std::vector<int64_t> Trainer::my_shard(const TrainBatch& batch,
                                       const std::vector<int64_t>& rows) const {
  if (!dp_.active()) return rows;
  std::vector<int64_t> tokens;
  for (int64_t r : rows) tokens.push_back(batch.lengths[r].item<int64_t>());
  return shard_rows_by_tokens(rows, tokens, dp_.world_size())[static_cast<size_t>(dp_.rank())];
}

std::vector<std::vector<int64_t>> Trainer::my_micro_batches(
    const TrainBatch& batch, const std::vector<int64_t>& rows) const {
  const std::vector<int64_t> shard = my_shard(batch, rows);
  std::vector<std::vector<int64_t>> parts;
  if (shard.empty()) return parts;
  for (const auto& local : split_by_token_budget(select_rows(batch, shard),
                                                 options_.micro_batch_tokens, token_budget())) {
    std::vector<int64_t> part;
    for (int64_t r : local) part.push_back(shard[static_cast<size_t>(r)]);
    parts.push_back(std::move(part));
  }
  return parts;
}

size_t Trainer::most_micro_batches(const TrainBatch& batch,
                                   const std::vector<int64_t>& rows) const {
  if (!sharded_) return 0;
  std::vector<int64_t> tokens;
  for (int64_t r : rows) tokens.push_back(batch.lengths[r].item<int64_t>());
  size_t most = 0;
  for (const auto& shard : shard_rows_by_tokens(rows, tokens, dp_.world_size())) {
    if (shard.empty()) continue;
    most = std::max(most, split_by_token_budget(select_rows(batch, shard),
                                                options_.micro_batch_tokens, token_budget())
                              .size());
  }
  return most;
}

void Trainer::empty_pass(model::PolicyImpl& model, bool with_grad) {
  FullyShardedModel* sharded = &model == policy_.get() ? sharded_.get() : sharded_reference_.get();
  if (sharded == nullptr) return;
  const at::Tensor ids = torch::zeros({1, 2}, torch::kInt64);
  // Its zero gradients mark no parameter as trained by this rank.
  const UncountedPasses uncounted(sharded);
  if (with_grad) {
    at::Tensor logp;
    {
      const model::AutocastGuard autocast(device_type_of(policy_), options_.autocast);
      logp = model.score(ids);
    }
    (logp.sum() * 0).backward();
  } else {
    torch::NoGradGuard no_grad;
    const model::AutocastGuard autocast(device_type_of(policy_), options_.autocast);
    model.score(ids);
  }
}

void Trainer::plan_updates(StepState& s) const {
  // Rejected tokens leave the mask the loss and its normalizers see.
  s.batch.response_mask = s.train_mask;
  const int64_t B = s.batch.size();
  s.order.resize(static_cast<size_t>(B));
  std::iota(s.order.begin(), s.order.end(), 0);
  s.mini_batches = std::min<int>(options_.mini_batches, static_cast<int>(B));
  s.updates.planned = options_.ppo_epochs * s.mini_batches;
  s.critic_warmup = critic_ && critic_->warming_up();
}

MiniBatch Trainer::plan_minibatch(const StepState& s, int index, bool record) const {
  const TrainerOptions& o = options_;
  const int64_t B = s.batch.size();
  MiniBatch mb;
  mb.record = record;
  if (record) {
    mb.seen_logp = torch::zeros(s.mask.sizes(), torch::kFloat32);
    mb.seen_entropy = torch::zeros(s.mask.sizes(), torch::kFloat32);
    mb.seen_rows = torch::zeros({B}, torch::kBool);
  }
  mb.rows.assign(s.order.begin() + (B * index) / s.mini_batches,
                 s.order.begin() + (B * (index + 1)) / s.mini_batches);
  // The normalizers are counted over the micro-batches a single rank would
  // make: neither the split into micro-batches nor the one across ranks
  // changes the update.
  std::vector<at::Tensor> masks, forced_masks;
  for (const auto& local :
       split_by_token_budget(select_rows(s.batch, mb.rows), o.micro_batch_tokens, token_budget())) {
    std::vector<int64_t> rows;
    for (int64_t r : local) rows.push_back(mb.rows[r]);
    TrainBatch part = select_rows(s.batch, rows);
    masks.push_back(part.response_mask);
    forced_masks.push_back(part.offpolicy_mask.logical_and(part.response_mask));
  }
  mb.norm = make_global_normalizer(masks, o.loss_scale_factor);
  mb.forced_norm = make_global_normalizer(forced_masks);
  mb.parts = my_micro_batches(s.batch, mb.rows);
  return mb;
}

// One optimizer update: every micro-batch's gradients, then AdamW.
Status Trainer::update_minibatch(StepState& s, int epoch, int index) {
  // Without the pre-update pass, the first mini-batch records pi_old.
  MiniBatch mb = plan_minibatch(s, index, s.skip_pass && epoch == 0 && index == 0);
  if (s.critic_warmup) {
    // verl's critic warmup: the critic's update alone; it counts as one of
    // the step's updates (a failure after it leaves the critic half-updated).
    ++s.updates.applied;
    return update_critic(s, mb);
  }
  optimizer_->zero_grad();
  WholeRoot root(sharded_.get());
  RELAY_RETURN_IF_ERROR(root.acquire());
  for (const auto& rows : mb.parts) backward_micro_batch(s, mb, rows);
  const size_t most = most_micro_batches(s.batch, mb.rows);
  for (size_t k = mb.parts.size(); k < most; ++k) empty_pass(*policy_, /*with_grad=*/true);
  if (mb.record) RELAY_RETURN_IF_ERROR(diagnose_recorded(s, mb));
  RELAY_ASSIGN_OR_RETURN(const double grad_norm, apply_gradients(s.updates));
  s.sums.grad_norm += grad_norm;
  s.sums.lr_last = lr_at(options_.optimizer, optimizer_steps_ - 1);
  if (critic_) RELAY_RETURN_IF_ERROR(update_critic(s, mb));
  return OkStatus();
}

// verl updates the critic on the same data as the actor, with its own
// optimizer; here on the same mini-batches and micro-batches, right after the
// policy's update, against the values and returns fixed before the step.
Status Trainer::update_critic(StepState& s, const MiniBatch& mb) {
  const TrainingMode training(*critic_->model());
  critic_->zero_grad();
  WholeRoot root(critic_->sharded());
  RELAY_RETURN_IF_ERROR(root.acquire());
  if (critic_->sharded() != nullptr) {
    const size_t most = most_micro_batches(s.batch, mb.rows);
    for (size_t k = mb.parts.size(); k < most; ++k) {
      const model::AutocastGuard autocast(device_type_of(policy_), options_.autocast);
      critic_->empty_pass(/*with_grad=*/true);
    }
  }
  for (const auto& rows : mb.parts) {
    const TrainBatch part = select_rows(s.batch, rows);
    const at::Tensor index = index_of(rows);
    ValueLossResult r;
    {
      const model::AutocastGuard autocast(device_type_of(policy_), options_.autocast);
      r = critic_->backward(part, s.before.values.index_select(0, index),
                            s.adv.returns.cpu().index_select(0, index), mb.norm,
                            options_.pack_sequences, options_.pad_token_id);
    }
    const double tokens = part.response_mask.sum().item<double>();
    s.sums.critic_loss += r.loss.item<double>();
    s.sums.critic_tokens += tokens;
    s.sums.critic_clip += r.clip_fraction * tokens;
    s.sums.critic_value += r.value_mean * tokens;
  }
  RELAY_ASSIGN_OR_RETURN(const double norm, critic_->apply_gradients());
  s.sums.critic_grad_norm += norm;
  s.sums.critic_lr_last = critic_->last_lr();
  return OkStatus();
}

std::pair<at::Tensor, at::Tensor> Trainer::forward_with_grad(const TrainBatch& mb,
                                                             bool with_entropy) {
  // The forward pass only: backward replays its casts by itself.
  const model::AutocastGuard autocast(device_type_of(policy_), options_.autocast);
  model::MoeRouting routing;
  const model::ScoreOptions so =
      score_options(mb, options_.router_replay == RouterReplay::kReplay ? &routing : nullptr);
  model::ScoreOutput out = score_rows(*policy_, mb, so, with_entropy);
  if (with_entropy) return {gather_response(out.logprobs, mb), gather_response(out.entropy, mb)};
  return {gather_response(out.logprobs, mb), at::Tensor()};
}

// The loss of the micro-batch `rows` of `mini`: the policy loss, plus the
// reference KL, SFT and entropy terms that are on; its backward pass adds to
// the gradients, its values to s.sums.
void Trainer::backward_micro_batch(StepState& s, MiniBatch& mini,
                                   const std::vector<int64_t>& rows) {
  // A safe point: the machine's cores may have been re-divided (core_share.h).
  model::refresh_cores();
  const TrainerOptions& o = options_;
  const TrainBatch mb = select_rows(s.batch, rows);
  const at::Tensor index = index_of(rows);
  PolicyLossInputs in;
  at::Tensor entropy;
  std::tie(in.logprobs, entropy) = forward_with_grad(mb, s.entropy_coef > 0 || mini.record);
  if (mini.record) {
    scatter_rows(mini.seen_logp, rows, in.logprobs);
    scatter_rows(mini.seen_entropy, rows, entropy);
    mini.seen_rows.index_fill_(0, index, true);
  }
  const int64_t width = in.logprobs.size(1);
  const c10::Device dev = in.logprobs.device();
  auto take = [&](const at::Tensor& t) {
    return t.index_select(0, index).narrow(1, 0, width).to(dev);
  };
  in.old_logprobs = take(s.anchor);
  in.advantages = take(s.adv.advantages);
  in.response_mask = mb.response_mask.to(dev);
  if (s.proximal.defined()) in.proximal_logprobs = take(s.proximal);
  if (s.is_weights.defined()) in.is_weights = take(s.is_weights);
  const at::Tensor forced = mb.offpolicy_mask.to(dev).logical_and(in.response_mask);
  StepMetrics extra;
  PolicyLossResult r = compute_policy_loss(in, forced, o.loss, mini.norm, mini.forced_norm, &extra);
  const double tokens = mb.response_mask.sum().item<double>();
  for (const auto& [k, v] : extra) s.sums.extra[k] += v * tokens;
  at::Tensor loss = r.loss;
  s.sums.pg += r.loss.item<double>();
  if (reference_ && o.kl_coef > 0) {
    at::Tensor kl =
        aggregate_loss(kl_penalty(in.logprobs, take(s.before.reference), o.kl_estimator),
                       in.response_mask, o.loss.ppo.agg_mode, mini.norm);
    s.sums.kl += kl.item<double>();
    loss = loss + o.kl_coef * kl;
  }
  if (o.distill.enabled() && o.distill.mode == DistillMode::kLoss) {
    at::Tensor kl = aggregate_loss(
        kl_penalty(in.logprobs,
                   take(s.batch.teacher_logprobs).masked_fill(in.response_mask.logical_not(), 0),
                   o.distill.estimator),
        in.response_mask, o.loss.ppo.agg_mode, mini.norm);
    s.sums.distill += kl.item<double>();
    loss = loss + o.distill.coef * kl;
  }
  if (o.sft_coef > 0) {
    loss = loss +
           o.sft_coef * sft_loss(in.logprobs, forced, LossAggMode::kTokenMean, mini.forced_norm);
  }
  if (s.entropy_coef > 0) {
    loss = loss + entropy_bonus_loss(entropy, in.response_mask, s.entropy_coef, o.loss.ppo.agg_mode,
                                     mini.norm);
  }
  loss.backward();
  s.sums.loss += loss.item<double>();
  add_loss_metrics(r.metrics, tokens, s.sums);
}

// Without the pre-update pass: the diagnostics over what the first
// mini-batch's forward passes recorded (every rank diagnoses the whole
// mini-batch).
Status Trainer::diagnose_recorded(StepState& s, MiniBatch& mb) {
  Status st = OkStatus();
  if (dp_.active()) {
    at::Tensor seen = mb.seen_rows.to(torch::kFloat32);
    for (at::Tensor* t : {&mb.seen_logp, &mb.seen_entropy, &seen}) {
      if (st.ok()) st = dp_.group->all_reduce_sum(*t);
    }
    mb.seen_rows = seen.gt(0);
  }
  const at::Tensor rows_mask = s.mask.logical_and(mb.seen_rows.unsqueeze(1));
  if (st.ok()) st = diagnose(s, mb.seen_logp, mb.seen_entropy, rows_mask);
  if (!st.ok()) drop_gradients();
  return st;
}

StatusOr<double> Trainer::apply_gradients(UpdateCount& updates) {
  const OptimizerOptions& o = options_.optimizer;
  const double max_norm =
      o.max_grad_norm > 0 ? o.max_grad_norm : std::numeric_limits<double>::infinity();
  // From on_apply on the weights change: a failure leaves them half-updated.
  StatusOr<double> grad_norm =
      optimizer_->step(lr_at(o, optimizer_steps_), max_norm, [&updates] { ++updates.applied; });
  if (!grad_norm.ok()) {
    const Status& s = grad_norm.status();
    return Status(s.code(), absl::StrCat("trainer step at version ", version_, ": ", s.message()));
  }
  ++optimizer_steps_;
  return *grad_norm;
}

// ---------------------------------------------------------------------------
// sft_step

Status Trainer::prepare_sft(const std::vector<rollout::TrajectoryGroup>& groups,
                            SftStepState& s) const {
  BatchOptions bo;
  bo.trainer_version = version_;
  bo.pad_token_id = options_.pad_token_id;
  RELAY_ASSIGN_OR_RETURN(s.batch, build_batch(groups, bo));
  std::vector<at::Tensor> masks;
  for (const auto& rows :
       split_by_token_budget(s.batch, options_.micro_batch_tokens, token_budget())) {
    masks.push_back(select_rows(s.batch, rows).response_mask);
  }
  s.norm = make_global_normalizer(masks);
  std::vector<int64_t> all(static_cast<size_t>(s.batch.size()));
  std::iota(all.begin(), all.end(), 0);
  for (const auto& rows : my_micro_batches(s.batch, all)) {
    s.micro.push_back(select_rows(s.batch, rows));
  }
  s.updates.planned = 1;
  return OkStatus();
}

void Trainer::backward_sft(SftStepState& s) {
  for (const TrainBatch& mb : s.micro) {
    at::Tensor logp;
    {
      const model::AutocastGuard autocast(device_type_of(policy_), options_.autocast);
      logp = gather_response(
          score_rows(*policy_, mb, score_options(mb, nullptr), /*with_entropy=*/false).logprobs,
          mb);
    }
    at::Tensor loss =
        sft_loss(logp, mb.response_mask.to(logp.device()), LossAggMode::kTokenMean, s.norm);
    loss.backward();
    s.loss_sum += loss.item<double>();
  }
  std::vector<int64_t> all(static_cast<size_t>(s.batch.size()));
  std::iota(all.begin(), all.end(), 0);
  const size_t most = most_micro_batches(s.batch, all);
  for (size_t k = s.micro.size(); k < most; ++k) empty_pass(*policy_, /*with_grad=*/true);
}

}  // namespace relay::trainer
