#include "relay/trainer/trainer.h"

#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <numeric>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "relay/model/device.h"
#include "relay/model/torch_error.h"
#include "relay/trainer/batch.h"
#include "relay/trainer/data_parallel.h"
#include "relay/trainer/rollout_correction.h"

namespace relay::trainer {

namespace {

// The group of batch row `row`.
const std::string& row_group(const TrainBatch& b, int64_t row) {
  return b.group_ids.at(static_cast<size_t>(b.group_index[row].item<int64_t>()));
}

// One fault per group, the first reason found; in row order.
void add_fault(std::vector<Trainer::StepFault>& faults, const std::string& group,
               std::string reason) {
  for (const Trainer::StepFault& f : faults) {
    if (f.group_id == group) return;
  }
  faults.push_back({group, std::move(reason)});
}

// Rows whose inputs no step can train on: a reward that is not a finite
// float (1e300 arrives as a finite double), or, when they are required,
// missing or non-finite behavior log-probs on response tokens. Checked per
// row before anything mixes rows (group or batch normalisation), so one bad
// group is blamed alone.
std::vector<Trainer::StepFault> input_faults(const TrainBatch& b, bool require_behavior) {
  std::vector<Trainer::StepFault> out;
  at::Tensor bad_reward = b.rewards.isfinite().logical_not();
  at::Tensor bad_behavior =
      b.behavior_logprobs.isfinite().logical_not().logical_and(b.response_mask);
  at::Tensor bad_rows = require_behavior ? bad_reward.logical_or(bad_behavior.any(1)) : bad_reward;
  at::Tensor rows = bad_rows.nonzero().view(-1);
  for (int64_t i = 0; i < rows.numel(); ++i) {
    const int64_t r = rows[i].item<int64_t>();
    if (bad_reward[r].item<bool>()) {
      add_fault(out, row_group(b, r),
                absl::StrCat("batch row ", r, ": reward ", b.rewards[r].item<float>(),
                             " is not a finite float"));
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

std::string describe(const std::vector<Trainer::StepFault>& faults) {
  std::string out;
  for (const Trainer::StepFault& f : faults) {
    absl::StrAppend(&out, out.empty() ? "" : "; ", "group '", f.group_id, "' (", f.reason, ")");
  }
  return out;
}

// A LibTorch message that says memory ran out (CPU or CUDA allocators).
bool is_out_of_memory(const std::string& what) {
  return what.find("out of memory") != std::string::npos || what.find("alloc") != std::string::npos;
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

// The sampler-vs-trainer diagnostics: the raw token ratios pi_old / pi_behav
// over `valid`, and the mismatch split by source (rollout_correction.h).
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

bool corrects(const RolloutCorrectionOptions& rc) {
  return !rc.bypass && (rc.is_level != CorrectionLevel::kNone ||
                        rc.rs_level != CorrectionLevel::kNone || rc.veto_threshold > 0);
}

double masked_mean(const at::Tensor& x, const at::Tensor& mask) { return summarize(x, mask).mean; }

c10::DeviceType device_type_of(const model::Policy& policy) {
  return policy->parameters().front().device().type();
}

at::Tensor index_of(const std::vector<int64_t>& rows) { return torch::tensor(rows, torch::kInt64); }

// [rows, w] -> the rows' places in a [B, L] host tensor.
void scatter_rows(at::Tensor& out, const std::vector<int64_t>& rows, const at::Tensor& part) {
  const int64_t pad = out.size(1) - part.size(1);
  out.index_copy_(0, index_of(rows),
                  torch::nn::functional::pad(part.detach().to(torch::kCPU, torch::kFloat32),
                                             torch::nn::functional::PadFuncOptions({0, pad})));
}

}  // namespace

// The pre-update pass's outputs, [B, L] on the host.
struct Trainer::Scores {
  at::Tensor logprobs;  // the trainer's policy at this version (pi_old)
  at::Tensor entropy;
  at::Tensor reference;  // undefined without a reference policy
  // MoE batches with routing: response tokens (under the mask) whose
  // distribution came through other experts in some layer than the engine
  // used, and (token, layer) pairs that differ, with their counts.
  double routed_tokens = 0, differing_tokens = 0, differing_layers = 0, routed_layers = 0;
};

model::ScoreOptions Trainer::score_options(const TrainBatch& mb, model::MoeRouting* routing) const {
  model::ScoreOptions so;
  so.temperature = options_.temperature;
  so.vocab_limit = options_.vocab_limit;
  if (routing != nullptr && mb.routed_experts.defined()) {
    const at::Tensor& r = mb.routed_experts;
    routing->recorded = r.reshape({r.size(0) * r.size(1), r.size(2), r.size(3)});
    routing->replay = options_.router_replay == RouterReplay::kReplay;
    so.routing = routing;
  }
  return so;
}

Trainer::Trainer(model::Policy policy, TrainerOptions options, int64_t version,
                 model::Policy reference, DataParallel data_parallel)
    : policy_(std::move(policy)),
      options_(std::move(options)),
      dp_(std::move(data_parallel)),
      version_(version) {
  const OptimizerOptions& o = options_.optimizer;
  for (const at::Tensor& p : policy_->parameters()) {
    if (o.fp32_master_weights && p.scalar_type() != torch::kFloat32) {
      master_.push_back(p.detach().to(torch::kFloat32).clone().set_requires_grad(true));
    }
  }
  params_ = master_.empty() ? policy_->parameters() : master_;
  if (!master_.empty() && master_.size() != policy_->parameters().size()) {
    // Mixed fp32 / low-precision parameters: fp32 ones get a master copy too,
    // so that one list of tensors lines up with the parameters.
    master_.clear();
    for (const at::Tensor& p : policy_->parameters()) {
      master_.push_back(p.detach().to(torch::kFloat32).clone().set_requires_grad(true));
    }
    params_ = master_;
  }
  optimizer_ = std::make_unique<torch::optim::AdamW>(params_, torch::optim::AdamWOptions(o.lr)
                                                                  .betas({o.beta1, o.beta2})
                                                                  .eps(o.eps)
                                                                  .weight_decay(o.weight_decay));
  if (options_.needs_reference()) {
    // The reference is the given policy or the policy as it is now, frozen,
    // in the compute dtype: under autocast its products run in that
    // precision anyway, so an fp32 copy would only double its memory.
    reference_ = reference ? reference : model::clone_policy(*policy_);
    if (options_.autocast) reference_->to(*options_.autocast);
    for (auto& p : reference_->parameters()) p.set_requires_grad(false);
    reference_->eval();
  }
  policy_->set_activation_checkpointing(options_.activation_checkpointing);
  reward_kl_ = std::make_unique<KlController>(options_.reward_kl.controller);
  entropy_ = std::make_unique<EntropyController>(options_.entropy);
}

Trainer::~Trainer() = default;

namespace {
at::Tensor scalar_tensor(double x) { return torch::tensor({x}, torch::kFloat64); }
}  // namespace

StatusOr<std::string> Trainer::save_state() const {
  std::ostringstream out;
  try {
    torch::serialize::OutputArchive archive;
    archive.write("format", scalar_tensor(1));
    archive.write("version", torch::tensor({version_}, torch::kInt64));
    archive.write("optimizer_steps", torch::tensor({optimizer_steps_}, torch::kInt64));
    archive.write("reward_kl_coef", scalar_tensor(reward_kl_->value()));
    archive.write("entropy_coef", scalar_tensor(entropy_->value()));
    archive.write("num_master", torch::tensor({static_cast<int64_t>(master_.size())}));
    for (size_t i = 0; i < master_.size(); ++i) {
      archive.write("master/" + std::to_string(i), master_[i].detach().cpu());
    }
    torch::serialize::OutputArchive opt;
    optimizer_->save(opt);
    archive.write("optimizer", opt);
    archive.save_to(out);
  } catch (const std::exception& e) {
    return InternalError(
        absl::StrCat("cannot serialize the trainer state: ", model::exception_message(e)));
  }
  return out.str();
}

Status Trainer::restore_state(const std::string& bytes, const std::string& path) {
  torch::serialize::InputArchive archive;
  double format = 0, kl_coef = 0, entropy_coef = 0;
  int64_t version = 0, steps = 0;
  std::vector<at::Tensor> master;
  if (bytes.empty()) {
    return DataLossError(absl::StrCat(path, ": empty file (0 bytes), not a trainer state"));
  }
  // A file cut short (a full disk, a copy interrupted) loses the archive's
  // central directory at its end, so it fails here; that is said in words,
  // with LibTorch's message (not its stack trace) for the detail.
  try {
    std::istringstream in(bytes);
    archive.load_from(in);
  } catch (const std::exception& e) {
    return DataLossError(absl::StrCat(
        path, ": truncated or corrupt (", bytes.size(),
        " bytes are not a readable torch archive: ", model::exception_message(e), ")"));
  }
  // Scalars are taken out here too: item() of a damaged entry throws.
  try {
    auto scalar = [&](const char* key) {
      at::Tensor t;
      archive.read(key, t);
      return t;
    };
    format = scalar("format").item<double>();
    version = scalar("version").item<int64_t>();
    steps = scalar("optimizer_steps").item<int64_t>();
    kl_coef = scalar("reward_kl_coef").item<double>();
    entropy_coef = scalar("entropy_coef").item<double>();
    const int64_t num_master = scalar("num_master").item<int64_t>();
    for (int64_t i = 0; i < num_master; ++i) {
      at::Tensor t;
      archive.read("master/" + std::to_string(i), t);
      master.push_back(t);
    }
  } catch (const std::exception& e) {
    return DataLossError(absl::StrCat(
        path, ": not a relay trainer state, or a corrupt one: ", model::exception_message(e)));
  }
  if (format != 1) {
    return DataLossError(absl::StrCat(path, ": unknown trainer state format ", format));
  }
  if (master.size() != master_.size()) {
    return InvalidArgumentError(absl::StrCat(
        path, ": holds ", master.size(), " fp32 master weights, this trainer has ", master_.size(),
        " (optimizer.fp32_master_weights or the model's dtype changed)"));
  }
  for (size_t i = 0; i < master.size(); ++i) {
    if (!master[i].sizes().equals(master_[i].sizes())) {
      return InvalidArgumentError(absl::StrCat(path, ": master weight ", i, " has shape ",
                                               torch::str(master[i].sizes()), ", expected ",
                                               torch::str(master_[i].sizes())));
    }
  }
  // The optimizer's state is read into a scratch optimizer over copies first,
  // so a mismatch leaves this trainer untouched.
  std::vector<at::Tensor> scratch;
  for (const at::Tensor& p : params_) scratch.push_back(p.detach().clone());
  const OptimizerOptions& o = options_.optimizer;
  torch::optim::AdamW probe(scratch, torch::optim::AdamWOptions(o.lr));
  try {
    torch::serialize::InputArchive opt;
    archive.read("optimizer", opt);
    probe.load(opt);
    torch::serialize::InputArchive again;
    archive.read("optimizer", again);
    optimizer_->load(again);
  } catch (const std::exception& e) {
    return InvalidArgumentError(absl::StrCat(
        path, ": optimizer state does not fit this model: ", model::exception_message(e)));
  }
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < master.size(); ++i) master_[i].copy_(master[i]);
  version_ = version;
  optimizer_steps_ = steps;
  reward_kl_->set_value(kl_coef);
  entropy_->set_value(entropy_coef);
  return OkStatus();
}

StatusOr<std::unique_ptr<Trainer>> Trainer::create(model::Policy policy, TrainerOptions options,
                                                   int64_t version, model::Policy reference,
                                                   DataParallel data_parallel) {
  if (!policy) return InvalidArgumentError("Trainer: policy is null");
  RELAY_RETURN_IF_ERROR(validate(options));
  if (data_parallel.bucket_bytes < 1) {
    return InvalidArgumentError(absl::StrCat("trainer.allreduce_bucket_mb: must be > 0, got ",
                                             data_parallel.bucket_bytes, " bytes"));
  }
  if (reference && options.needs_reference()) {
    auto theirs = reference->named_parameters();
    for (const auto& item : policy->named_parameters()) {
      const at::Tensor* r = theirs.find(item.key());
      if (r == nullptr || r->sizes() != item.value().sizes()) {
        return InvalidArgumentError(
            absl::StrCat("trainer.reference: the reference policy has no parameter '", item.key(),
                         "' of shape [", absl::StrJoin(item.value().sizes(), ", "),
                         "]; it must have the policy's architecture"));
      }
    }
  }
  return std::unique_ptr<Trainer>(new Trainer(std::move(policy), std::move(options), version,
                                              std::move(reference), std::move(data_parallel)));
}

double Trainer::reward_kl_coef() const { return reward_kl_->value(); }
double Trainer::entropy_coef() const { return entropy_->value(); }

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
  m["frac_old_logprobs_valid"] = frac_behavior_logprobs_valid(batch);
  if (std::vector<StepFault> f = input_faults(batch, !o.allow_missing_logprobs); !f.empty()) {
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
  if (o.mask_truncated) {
    RELAY_ASSIGN_OR_RETURN(batch.response_mask,
                           overlong_mask(batch.response_mask, batch.truncated));
  }
  return batch;
}

StatusOr<Trainer::Scores> Trainer::score_before_update(const TrainBatch& batch) {
  torch::NoGradGuard no_grad;
  const int64_t B = batch.size(), L = batch.response_mask.size(1);
  Scores s;
  s.logprobs = torch::zeros({B, L}, torch::kFloat32);
  s.entropy = torch::zeros({B, L}, torch::kFloat32);
  if (reference_) s.reference = torch::zeros({B, L}, torch::kFloat32);
  std::vector<int64_t> all(static_cast<size_t>(B));
  std::iota(all.begin(), all.end(), 0);
  for (const auto& rows : my_micro_batches(batch, all)) {
    TrainBatch mb = select_rows(batch, rows);
    const model::AutocastGuard autocast(device_type_of(policy_), options_.autocast);
    model::MoeRouting routing;
    const model::ScoreOptions so = score_options(mb, &routing);
    model::ScoreOutput out = policy_->score_with_entropy(mb.input_ids, mb.lengths, so);
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
      scatter_rows(s.reference, rows,
                   gather_response(reference_->score(mb.input_ids, mb.lengths, ref), mb));
    }
  }
  if (dp_.active()) {
    // Each row was scored on one rank and is zero on the others.
    for (at::Tensor* t : {&s.logprobs, &s.entropy, &s.reference}) {
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
  for (const auto& local :
       split_by_token_budget(select_rows(batch, shard), options_.micro_batch_tokens)) {
    std::vector<int64_t> part;
    for (int64_t r : local) part.push_back(shard[static_cast<size_t>(r)]);
    parts.push_back(std::move(part));
  }
  return parts;
}

// Whether the step can go without the pre-update pass: rollout correction's
// bypass mode, when nothing else needs pi_old for the whole batch first.
bool Trainer::can_skip_pass(const TrainBatch& batch) const {
  const TrainerOptions& o = options_;
  return o.rollout_correction.bypass && !reference_ &&
         o.loss.kind != PolicyLossKind::kDecoupledPpo &&
         !batch.behavior_logprobs.isnan().logical_and(batch.response_mask).any().item<bool>();
}

void Trainer::memory_metrics(StepMetrics& m, int64_t rss_at_start) const {
  constexpr double kGiB = 1ull << 30;
  auto bytes = [](const std::vector<at::Tensor>& tensors) {
    double total = 0;
    for (const at::Tensor& t : tensors) total += static_cast<double>(t.numel() * t.element_size());
    return total;
  };
  m["memory/weights_gb"] = bytes(policy_->parameters()) / kGiB;
  m["memory/master_weights_gb"] = bytes(master_) / kGiB;
  // What backward allocates: one gradient like each stepped tensor (the
  // fp32 master copies when there are any), freed after the update.
  m["memory/gradients_gb"] = bytes(params_) / kGiB;
  double optimizer = 0;
  for (const auto& item : optimizer_->state()) {
    const auto& st = static_cast<const torch::optim::AdamWParamState&>(*item.second);
    optimizer += bytes({st.exp_avg(), st.exp_avg_sq()});
    if (st.max_exp_avg_sq().defined()) optimizer += bytes({st.max_exp_avg_sq()});
  }
  m["memory/optimizer_gb"] = optimizer / kGiB;
  m["memory/reference_gb"] = reference_ ? bytes(reference_->parameters()) / kGiB : 0.0;
  // The process as the kernel sees it: resident after the step, its peak
  // during the step, and how far the step rose above where it started
  // (activations, gradients, LM-head chunks and other temporaries).
  const int64_t rss = model::current_rss_bytes(), peak = model::peak_rss_bytes();
  if (rss >= 0) m["memory/rss_gb"] = static_cast<double>(rss) / kGiB;
  if (peak >= 0) m["memory/rss_peak_gb"] = static_cast<double>(peak) / kGiB;
  if (peak >= 0 && rss_at_start >= 0) {
    m["memory/step_peak_growth_gb"] =
        static_cast<double>(std::max<int64_t>(0, peak - rss_at_start)) / kGiB;
  }
  const int64_t device_peak = model::device_peak_bytes(policy_->parameters().front().device());
  if (device_peak >= 0) m["memory/device_peak_gb"] = static_cast<double>(device_peak) / kGiB;
}

Status Trainer::step_exception(const std::string& what, bool out_of_memory) {
  // Gradients of the micro-batches before the throw must not leak into the
  // next step.
  optimizer_->zero_grad();
  for (at::Tensor& p : policy_->parameters()) p.mutable_grad().reset();
  const std::string where = absl::StrCat("trainer step at version ", version_, ": ");
  if (out_of_memory || is_out_of_memory(what)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        where, "out of memory (", what,
        "); lower trainer.micro_batch_tokens, turn on trainer.activation_checkpointing, or "
        "bound rollout.max_new_tokens"));
  }
  return InternalError(absl::StrCat(where, what));
}

namespace {

// Runs a step body; an exception out of it (c10::Error, std::bad_alloc, ...)
// goes to `on_exception` as its message and whether memory ran out.
StatusOr<StepMetrics> catching(
    const std::function<StatusOr<StepMetrics>()>& body,
    const std::function<Status(const std::string&, bool)>& on_exception) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return on_exception("std::bad_alloc", true);
  } catch (const std::exception& e) {
    return on_exception(model::exception_message(e), false);
  }
}

}  // namespace

StatusOr<StepMetrics> Trainer::step(const std::vector<rollout::TrajectoryGroup>& groups) {
  step_faults_.clear();
  return catching([&] { return step_unguarded(groups); },
                  [this](const std::string& what, bool oom) { return step_exception(what, oom); });
}

StatusOr<StepMetrics> Trainer::sft_step(const std::vector<rollout::TrajectoryGroup>& groups) {
  step_faults_.clear();
  return catching([&] { return sft_step_unguarded(groups); },
                  [this](const std::string& what, bool oom) { return step_exception(what, oom); });
}

StatusOr<StepMetrics> Trainer::step_unguarded(const std::vector<rollout::TrajectoryGroup>& groups) {
  if (dp_.lead) RELAY_RETURN_IF_ERROR(dp_.lead("step", groups));
  const TrainerOptions& o = options_;
  StepMetrics m;
  const int64_t rss_at_start = model::current_rss_bytes();
  model::reset_peak_rss();
  model::reset_device_peak(policy_->parameters().front().device());
  std::vector<uint64_t> keys;
  RELAY_ASSIGN_OR_RETURN(TrainBatch batch, prepare_batch(groups, m, &keys, &step_faults_));
  const int64_t B = batch.size();
  const at::Tensor mask = batch.response_mask;

  // The trainer's log-probs before the update (and the reference's). In
  // bypass mode without other needs, the first mini-batch's own forward pass
  // (still under these weights) stands in for it, for the diagnostics only.
  const bool skip_pass = can_skip_pass(batch);
  m["pass/skipped"] = skip_pass ? 1 : 0;
  Scores before;
  if (!skip_pass) {
    RELAY_ASSIGN_OR_RETURN(before, score_before_update(batch));
  }

  // Behavior log-probs; missing ones (allowed only by config) become the
  // trainer's own: ratio 1, the on-policy fallback, and counted above.
  at::Tensor behavior = batch.behavior_logprobs;
  at::Tensor valid = mask;
  if (!skip_pass) {
    at::Tensor missing = behavior.isnan().logical_and(mask);
    behavior = torch::where(missing, before.logprobs, behavior);
    valid = mask.logical_and(missing.logical_not());
  }

  // Rollout correction: IS weights and rejection for pi_old vs pi_behav, and
  // the mismatch diagnostics. Without it (or in bypass) the PPO anchor is the
  // behavior policy itself.
  const bool correcting = corrects(o.rollout_correction);
  at::Tensor anchor = behavior, is_weights, train_mask = mask;
  auto diagnose = [&](const at::Tensor& old_logp, const at::Tensor& entropy,
                      const at::Tensor& rows_mask) -> Status {
    RolloutCorrectionInputs rci;
    rci.old_logprobs = old_logp;
    rci.behavior_logprobs = behavior;
    rci.response_mask = rows_mask;
    rci.token_versions = batch.token_versions;
    rci.trainer_version = version_;
    RolloutCorrectionOptions rco = o.rollout_correction;
    rco.bypass = !correcting;
    RELAY_ASSIGN_OR_RETURN(RolloutCorrectionResult rc, rollout_correction(rci, rco));
    mismatch_metrics(old_logp, behavior, rows_mask.logical_and(valid), rc.metrics, m);
    m["entropy"] = masked_mean(entropy, rows_mask);
    if (correcting) {
      append_metrics(rc.metrics, m);
      anchor = rc.anchor_logprobs;
      is_weights = rc.weights;
      train_mask = rc.response_mask;
    }
    return OkStatus();
  };
  if (!skip_pass) RELAY_RETURN_IF_ERROR(diagnose(before.logprobs, before.entropy, mask));
  if (before.routed_tokens > 0) {
    // Router replay's diagnostic: where the trainer's own routers would take
    // other experts than the engine's did (with replay they do not).
    m["router/mismatch_token_fraction"] = before.differing_tokens / before.routed_tokens;
    m["router/mismatch_layer_fraction"] = before.differing_layers / before.routed_layers;
    m["router/replay"] = o.router_replay == RouterReplay::kReplay ? 1 : 0;
  }

  // KL in the reward: r_t -= beta kl_t before the advantages.
  AdvantageInputs ai;
  ai.rewards = batch.rewards;
  ai.group_index = batch.group_index;
  ai.response_mask = mask;
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
  const double reward_beta = reward_kl_->value();
  double reward_kl_mean = 0;
  if (reference_ && reward_beta > 0) {
    at::Tensor kl = kl_penalty(before.logprobs, before.reference, o.reward_kl.estimator)
                        .masked_fill(mask.logical_not(), 0);
    at::Tensor seq_tokens = mask.sum(-1).to(torch::kFloat32).clamp_min(1);
    reward_kl_mean = (kl.sum(-1) / seq_tokens).mean().item<double>();
    ai.rewards = batch.rewards - reward_beta * kl.sum(-1);
    ai.token_rewards = outcome_to_token_rewards(batch.rewards, mask) - reward_beta * kl;
    m["reward_kl/coef"] = reward_beta;
    m["reward_kl/kl"] = reward_kl_mean;
  }
  RELAY_ASSIGN_OR_RETURN(AdvantageOutputs adv, compute_advantages(ai, o.advantage));

  // The proximal policy for the decoupled loss.
  at::Tensor proximal;
  if (o.loss.kind == PolicyLossKind::kDecoupledPpo) {
    switch (o.proximal) {
      case ProximalSource::kRecorded: {
        at::Tensor usable =
            batch.proximal_versions.eq(version_).logical_and(batch.proximal_logprobs.isfinite());
        proximal = torch::where(usable, batch.proximal_logprobs, before.logprobs);
        m["proximal/recorded_fraction"] =
            usable.logical_and(mask).sum().item<double>() / std::max<double>(1, batch.num_tokens());
        break;
      }
      case ProximalSource::kRecompute:
        proximal = before.logprobs;
        break;
      case ProximalSource::kLoglinear:
        proximal =
            loglinear_proximal_logprobs(behavior, before.logprobs, batch.token_versions, version_);
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

  // Entropy bonus coefficient for this step: 0 while an adaptive controller
  // sees enough entropy (without the pass: the last step's entropy).
  const double entropy_coef = entropy_->coef_for(skip_pass ? last_entropy_ : m.at("entropy"));
  m["entropy/coef"] = entropy_coef;

  // Nothing has changed yet: a row whose derived values are not finite
  // fails the step here, naming its group, rather than as a NaN gradient
  // norm after earlier mini-batches' updates.
  {
    const at::Tensor cpu_mask = mask.to(torch::kCPU);
    std::vector<StepFault> f;
    if (!skip_pass) derived_faults(batch, cpu_mask, "trainer log-probs", before.logprobs, f);
    derived_faults(batch, cpu_mask, "advantages", adv.advantages, f);
    derived_faults(batch, cpu_mask, "PPO anchor log-probs", anchor, f);
    derived_faults(batch, cpu_mask, "proximal log-probs", proximal, f);
    derived_faults(batch, train_mask.to(torch::kCPU), "IS weights", is_weights, f);
    if (!f.empty()) {
      step_faults_ = f;
      return FailedPreconditionError(absl::StrCat("trainer step at version ", version_, ": ",
                                                  f.size(),
                                                  " group(s) give non-finite values before the "
                                                  "update: ",
                                                  describe(f)));
    }
  }

  // Rejected tokens leave the mask the loss and its normalizers see.
  batch.response_mask = train_mask;

  // Epochs x mini-batches x micro-batches.
  std::vector<int64_t> order(B);
  std::iota(order.begin(), order.end(), 0);
  const int n_mini = std::min<int>(o.mini_batches, static_cast<int>(B));
  double loss_sum = 0, pg_sum = 0, kl_sum = 0, grad_norm_sum = 0, lr_last = 0;
  StepMetrics extra_sum;
  PolicyLossMetrics acc;
  double acc_tokens = 0;
  int updates = 0;
  policy_->train();
  for (int epoch = 0; epoch < o.ppo_epochs; ++epoch) {
    for (int mb_i = 0; mb_i < n_mini; ++mb_i) {
      // Without the pre-update pass, the first mini-batch records pi_old and
      // its entropy for the diagnostics (its forward passes all run before
      // the first optimizer step).
      const bool record = skip_pass && epoch == 0 && mb_i == 0;
      at::Tensor seen_logp, seen_entropy, seen_rows;
      if (record) {
        seen_logp = torch::zeros(mask.sizes(), torch::kFloat32);
        seen_entropy = torch::zeros(mask.sizes(), torch::kFloat32);
        seen_rows = torch::zeros({B}, torch::kBool);
      }
      std::vector<int64_t> mini(order.begin() + (B * mb_i) / n_mini,
                                order.begin() + (B * (mb_i + 1)) / n_mini);
      // One normalizer for the whole mini-batch, counted over the
      // micro-batches a single rank would make: neither the split into
      // micro-batches nor the one across ranks changes the update.
      std::vector<at::Tensor> masks, forced_masks;
      for (const auto& local :
           split_by_token_budget(select_rows(batch, mini), o.micro_batch_tokens)) {
        std::vector<int64_t> rows;
        for (int64_t r : local) rows.push_back(mini[r]);
        TrainBatch part = select_rows(batch, rows);
        masks.push_back(part.response_mask);
        forced_masks.push_back(part.offpolicy_mask.logical_and(part.response_mask));
      }
      const GlobalNormalizer norm = make_global_normalizer(masks, o.loss_scale_factor);
      const GlobalNormalizer forced_norm = make_global_normalizer(forced_masks);
      const std::vector<std::vector<int64_t>> parts = my_micro_batches(batch, mini);
      optimizer_->zero_grad();
      for (const auto& rows : parts) {
        TrainBatch mb = select_rows(batch, rows);
        at::Tensor index = index_of(rows);
        PolicyLossInputs in;
        at::Tensor entropy;
        // The forward pass only: backward replays its casts by itself.
        std::optional<model::AutocastGuard> autocast;
        autocast.emplace(device_type_of(policy_), o.autocast);
        model::MoeRouting routing;
        const model::ScoreOptions so = score_options(mb, o.router_replay == RouterReplay::kReplay ? &routing : nullptr);
        if (entropy_coef > 0 || record) {
          model::ScoreOutput out = policy_->score_with_entropy(mb.input_ids, mb.lengths, so);
          in.logprobs = gather_response(out.logprobs, mb);
          entropy = gather_response(out.entropy, mb);
        } else {
          in.logprobs = gather_response(policy_->score(mb.input_ids, mb.lengths, so), mb);
        }
        autocast.reset();
        if (record) {
          scatter_rows(seen_logp, rows, in.logprobs);
          scatter_rows(seen_entropy, rows, entropy);
          seen_rows.index_fill_(0, index, true);
        }
        const int64_t width = in.logprobs.size(1);
        const c10::Device dev = in.logprobs.device();
        auto take = [&](const at::Tensor& t) {
          return t.index_select(0, index).narrow(1, 0, width).to(dev);
        };
        in.old_logprobs = take(anchor);
        in.advantages = take(adv.advantages);
        in.response_mask = mb.response_mask.to(dev);
        if (proximal.defined()) in.proximal_logprobs = take(proximal);
        if (is_weights.defined()) in.is_weights = take(is_weights);
        const at::Tensor forced = mb.offpolicy_mask.to(dev).logical_and(in.response_mask);
        StepMetrics extra;
        PolicyLossResult r = compute_policy_loss(in, forced, o.loss, norm, forced_norm, &extra);
        const double tokens = mb.response_mask.sum().item<double>();
        for (const auto& [k, v] : extra) extra_sum[k] += v * tokens;
        at::Tensor loss = r.loss;
        pg_sum += r.loss.item<double>();
        if (reference_ && o.kl_coef > 0) {
          at::Tensor kl =
              aggregate_loss(kl_penalty(in.logprobs, take(before.reference), o.kl_estimator),
                             in.response_mask, o.loss.ppo.agg_mode, norm);
          kl_sum += kl.item<double>();
          loss = loss + o.kl_coef * kl;
        }
        if (o.sft_coef > 0) {
          loss = loss +
                 o.sft_coef * sft_loss(in.logprobs, forced, LossAggMode::kTokenMean, forced_norm);
        }
        if (entropy_coef > 0) {
          loss = loss + entropy_bonus_loss(entropy, in.response_mask, entropy_coef,
                                           o.loss.ppo.agg_mode, norm);
        }
        loss.backward();
        loss_sum += loss.item<double>();
        acc.clip_fraction += r.metrics.clip_fraction * tokens;
        acc.clip_fraction_low += r.metrics.clip_fraction_low * tokens;
        acc.clip_fraction_high += r.metrics.clip_fraction_high * tokens;
        acc.dual_clip_fraction += r.metrics.dual_clip_fraction * tokens;
        acc.ppo_kl += r.metrics.ppo_kl * tokens;
        acc.mean_ratio += r.metrics.mean_ratio * tokens;
        acc.behav_imp_weight += r.metrics.behav_imp_weight * tokens;
        acc.behav_capped_fraction += r.metrics.behav_capped_fraction * tokens;
        acc_tokens += tokens;
      }
      if (record) {
        Status s = OkStatus();
        if (dp_.active()) {
          // Every rank diagnoses the whole mini-batch.
          at::Tensor seen = seen_rows.to(torch::kFloat32);
          for (at::Tensor* t : {&seen_logp, &seen_entropy, &seen}) {
            if (s.ok()) s = dp_.group->all_reduce_sum(*t);
          }
          seen_rows = seen.gt(0);
        }
        const at::Tensor rows_mask = mask.logical_and(seen_rows.unsqueeze(1));
        if (s.ok()) s = diagnose(seen_logp, seen_entropy, rows_mask);
        if (!s.ok()) {
          optimizer_->zero_grad();
          for (auto& p : policy_->parameters()) p.mutable_grad().reset();
          policy_->eval();
          return s;
        }
      }
      RELAY_ASSIGN_OR_RETURN(const double grad_norm, apply_gradients());
      grad_norm_sum += grad_norm;
      lr_last = lr_at(o.optimizer, optimizer_steps_ - 1);
      ++updates;
    }
  }
  policy_->eval();

  if (dp_.active()) {
    // Each rank accumulated its own micro-batches: sum them, by name.
    const std::pair<const char*, double*> summed[] = {{"loss", &loss_sum},
                                                      {"pg", &pg_sum},
                                                      {"kl", &kl_sum},
                                                      {"tokens", &acc_tokens},
                                                      {"clip", &acc.clip_fraction},
                                                      {"clip_low", &acc.clip_fraction_low},
                                                      {"clip_high", &acc.clip_fraction_high},
                                                      {"dual_clip", &acc.dual_clip_fraction},
                                                      {"ppo_kl", &acc.ppo_kl},
                                                      {"ratio", &acc.mean_ratio},
                                                      {"behav_w", &acc.behav_imp_weight},
                                                      {"behav_capped", &acc.behav_capped_fraction}};
    std::map<std::string, double> sums;
    for (const auto& [k, v] : extra_sum) sums["extra:" + k] = v;
    for (const auto& [k, p] : summed) sums[k] = *p;
    RELAY_RETURN_IF_ERROR(all_reduce_named_sums(*dp_.group, sums));
    extra_sum.clear();
    for (const auto& [k, v] : sums) {
      if (k.rfind("extra:", 0) == 0) extra_sum[k.substr(6)] = v;
    }
    for (const auto& [k, p] : summed) *p = sums.at(k);
  }
  const double t = std::max(1.0, acc_tokens);
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
  for (const auto& [k, v] : extra_sum) m[k] = v / t;
  m["pg_loss"] = pg_sum / updates;
  m["loss"] = loss_sum / updates;
  if (reference_) {
    if (o.kl_coef > 0) m["kl_ref"] = kl_sum / updates;
    for (KlEstimator k : {KlEstimator::kK1, KlEstimator::kK2, KlEstimator::kK3}) {
      m[absl::StrCat("kl_ref/", kKlEstimatorNames.name(k))] =
          summarize(kl_penalty(before.logprobs, before.reference, k), mask).mean;
    }
  }
  m["grad_norm"] = grad_norm_sum / updates;
  m["lr"] = lr_last;
  m["optimizer_steps"] = static_cast<double>(updates);

  // The step happened: controllers and the reuse counter move on.
  if (reference_ && reward_beta > 0) reward_kl_->update(reward_kl_mean, B);
  last_entropy_ = m.at("entropy");
  entropy_->update(last_entropy_);
  reuse_.record(keys, version_);
  if (o.max_staleness >= 0) reuse_.forget_before(version_ - o.max_staleness);
  ++version_;
  m["version"] = static_cast<double>(version_);
  memory_metrics(m, rss_at_start);
  return m;
}

StatusOr<double> Trainer::apply_gradients() {
  const OptimizerOptions& o = options_.optimizer;
  std::vector<at::Tensor> params = policy_->parameters();
  if (!master_.empty()) {
    // Gradients move to the fp32 master copies; the low-precision ones go.
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].grad().defined()) {
        master_[i].mutable_grad() = params[i].grad().detach().to(torch::kFloat32);
      }
      params[i].mutable_grad().reset();
    }
  }
  if (dp_.active()) {
    // Summed in fp32 (the master copies' gradients when there are any).
    if (Status s = all_reduce_gradients(*dp_.group, params_, dp_.bucket_bytes); !s.ok()) {
      optimizer_->zero_grad();
      return s;
    }
  }
  const double max_norm =
      o.max_grad_norm > 0 ? o.max_grad_norm : std::numeric_limits<double>::infinity();
  const double grad_norm = torch::nn::utils::clip_grad_norm_(params_, max_norm);
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
  if (!master_.empty()) {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) params[i].copy_(master_[i]);
  }
  // The gradients are spent: free them now rather than at the next
  // zero_grad(), so they do not sit in memory through the next pre-update
  // pass and the wait for rollouts.
  for (at::Tensor& p : params_) p.mutable_grad().reset();
  for (at::Tensor& p : params) p.mutable_grad().reset();
  ++optimizer_steps_;
  return grad_norm;
}

StatusOr<StepMetrics> Trainer::sft_step_unguarded(
    const std::vector<rollout::TrajectoryGroup>& groups) {
  if (dp_.lead) RELAY_RETURN_IF_ERROR(dp_.lead("sft_step", groups));
  BatchOptions bo;
  bo.trainer_version = version_;
  bo.pad_token_id = options_.pad_token_id;
  RELAY_ASSIGN_OR_RETURN(TrainBatch batch, build_batch(groups, bo));
  std::vector<at::Tensor> masks;
  for (const auto& rows : split_by_token_budget(batch, options_.micro_batch_tokens)) {
    masks.push_back(select_rows(batch, rows).response_mask);
  }
  const GlobalNormalizer norm = make_global_normalizer(masks);
  std::vector<int64_t> all(static_cast<size_t>(batch.size()));
  std::iota(all.begin(), all.end(), 0);
  std::vector<TrainBatch> micro;
  for (const auto& rows : my_micro_batches(batch, all)) micro.push_back(select_rows(batch, rows));
  policy_->train();
  optimizer_->zero_grad();
  double loss_sum = 0;
  for (const TrainBatch& mb : micro) {
    std::optional<model::AutocastGuard> autocast;
    autocast.emplace(device_type_of(policy_), options_.autocast);
    at::Tensor logp =
        gather_response(policy_->score(mb.input_ids, mb.lengths, score_options(mb, nullptr)), mb);
    autocast.reset();
    at::Tensor loss =
        sft_loss(logp, mb.response_mask.to(logp.device()), LossAggMode::kTokenMean, norm);
    loss.backward();
    loss_sum += loss.item<double>();
  }
  StatusOr<double> grad_norm = apply_gradients();
  policy_->eval();
  RELAY_RETURN_IF_ERROR(grad_norm.status());
  if (dp_.active()) {
    std::map<std::string, double> sums{{"loss", loss_sum}};
    RELAY_RETURN_IF_ERROR(all_reduce_named_sums(*dp_.group, sums));
    loss_sum = sums["loss"];
  }
  ++version_;
  return StepMetrics{{"sft_loss", loss_sum},
                     {"grad_norm", *grad_norm},
                     {"lr", lr_at(options_.optimizer, optimizer_steps_ - 1)},
                     {"batch/tokens", static_cast<double>(batch.num_tokens())},
                     {"version", static_cast<double>(version_)}};
}

}  // namespace relay::trainer
