#include "relay/app/train_local.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "relay/app/evaluation.h"
#include "relay/app/in_process_source.h"
#include "relay/app/setup.h"
#include "relay/app/training_loop.h"
#include "relay/app/warm_start.h"
#include "relay/common/metrics.h"
#include "relay/model/checkpoint.h"
#include "relay/model/lora.h"
#include "relay/model/tokenizer.h"

namespace relay::app {
namespace {

int fail(const Status& status) {
  std::fprintf(stderr, "relay train-local: %s\n", std::string(status.message()).c_str());
  return 1;
}

Status check_args(const TrainLocalArgs& args, const RolloutSetup& s, const PromptSplit& split) {
  if (s.config.trainer.data_parallel.world_size != 1) {
    return InvalidArgumentError(
        absl::StrCat("trainer.world_size is ", s.config.trainer.data_parallel.world_size,
                     ": train-local is one process; data-parallel training runs under relay run "
                     "or relay-trainer"));
  }
  if (args.steps < 0 || args.groups_per_step < 1 || args.sft_steps < 0 || args.eval_prompts < 0) {
    return InvalidArgumentError(
        "--steps, --sft-steps and --eval-prompts must be >= 0 and --groups-per-step >= 1");
  }
  if (split.size >= 0 && split.size - split.eval < args.groups_per_step) {
    return InvalidArgumentError(absl::StrCat("--eval-prompts: task '", s.task->name(), "' has ",
                                             split.size, " prompts; keeping ", split.eval,
                                             " for evaluation leaves too few to train"));
  }
  return OkStatus();
}

// The warm start has its own optimizer (and learning rate): Adam's moments
// from supervised steps are no guide for the RL objective.
StatusOr<int64_t> local_warm_start(const TrainLocalArgs& args, const RolloutSetup& s,
                                   const trainer::TrainerOptions& options, const PromptSplit& split,
                                   MetricsSink& metrics) {
  WarmStart ws;
  ws.steps = args.sft_steps;
  ws.lr = args.sft_lr > 0 ? args.sft_lr : options.optimizer.lr;
  ws.batch = args.groups_per_step * s.config.rollout.n;
  return warm_start(s, options, split, 0, ws, [&](int64_t k, const trainer::StepMetrics& m) {
    std::printf("sft %lld:%s\n", static_cast<long long>(k),
                format_metrics(m, {"sft_loss", "grad_norm"}).c_str());
    metrics.record("sft", k, m);
  });
}

StatusOr<model::Policy> load_reference(const RolloutSetup& s,
                                       const trainer::TrainerOptions& options) {
  if (s.config.trainer.reference.empty() || !options.needs_reference()) {
    return model::Policy{nullptr};
  }
  StatusOr<model::Policy> ref = model::load_policy(s.config.trainer.reference);
  if (!ref.ok()) {
    return Status(ref.status().code(),
                  absl::StrCat("trainer.reference: ", std::string(ref.status().message())));
  }
  return ref;
}

// The trained model with its tokenizer files (model_save_options). With LoRA
// adapters it is a PEFT adapter directory naming its base: the model
// directory, or for a fresh model.init model the base written beside it as
// `dir`-base.
Status save_model(const RolloutSetup& s, const trainer::Trainer& t, const std::string& dir) {
  RELAY_ASSIGN_OR_RETURN(model::SaveOptions save, model_save_options(s));
  if (model::has_lora(*t.policy()) && save.lora_base.empty()) {
    const std::string base = std::filesystem::absolute(dir + "-base").lexically_normal().string();
    RELAY_RETURN_IF_ERROR(model::save_policy(*model::base_policy(*t.policy()), base, save));
    std::printf("wrote %s (the LoRA base)\n", base.c_str());
    save.lora_base = base;
  }
  RELAY_RETURN_IF_ERROR(model::save_policy(*t.policy(), dir, save));
  std::printf("wrote %s\n", dir.c_str());
  return OkStatus();
}

// metrics.jsonl when asked for, else nowhere.
StatusOr<std::unique_ptr<MetricsSink>> open_metrics(const std::string& path) {
  if (path.empty()) return std::unique_ptr<MetricsSink>(std::make_unique<NullMetricsSink>());
  RELAY_ASSIGN_OR_RETURN(std::unique_ptr<JsonlMetricsSink> sink,
                         JsonlMetricsSink::open(path, JsonlMetricsSink::Mode::kReplace));
  return std::unique_ptr<MetricsSink>(std::move(sink));
}

}  // namespace

int train_local(const TrainLocalArgs& args) {
  SetupArgs sa;
  sa.config_file = args.config_file;
  sa.overrides = args.overrides;
  sa.model_dir = args.model_dir;
  StatusOr<RolloutSetup> setup = setup_rollout(sa);
  if (!setup.ok()) return fail(setup.status());
  const RolloutSetup& s = *setup;
  const PromptSplit split{s.task->size(), args.eval_prompts};
  if (Status st = check_args(args, s, split); !st.ok()) return fail(st);
  StatusOr<trainer::TrainerOptions> options = trainer_options(s);
  if (!options.ok()) return fail(options.status());
  StatusOr<std::unique_ptr<MetricsSink>> metrics = open_metrics(args.metrics_out);
  if (!metrics.ok()) return fail(metrics.status());
  rollout::SafeVerifier verifier(s.task, std::chrono::milliseconds(static_cast<int64_t>(
                                             std::ceil(s.config.task.verifier_timeout_s * 1000))));
  HeldOutEvaluator evaluator(s, split, &verifier, metrics->get(), EvalReport::kLocal);
  LoopState state;
  std::function<StatusOr<int64_t>()> warm;
  if (args.sft_steps > 0) {
    warm = [&] { return local_warm_start(args, s, *options, split, **metrics); };
  }
  StatusOr<int64_t> version = before_rl(evaluator, s.policy, warm, state);
  if (!version.ok()) return fail(version.status());
  StatusOr<model::Policy> reference = load_reference(s, *options);
  if (!reference.ok()) return fail(reference.status());
  // PPO's critic: trainer.critic.path, else the policy as RL starts (as relay run).
  model::ValueModel critic{nullptr};
  if (options->advantage.estimator == trainer::AdvantageEstimator::kGae) {
    const std::string& path = s.config.trainer.critic.path;
    model::LoadOptions lo;
    lo.dtype = s.policy->parameters()[0].scalar_type();
    lo.device = s.policy->parameters()[0].device();
    if (path.empty()) {
      critic = model::value_model_from_policy(*s.policy, s.config.run.seed);
    } else {
      StatusOr<model::ValueModel> loaded = model::load_value_model(path, lo, s.config.run.seed);
      if (!loaded.ok()) return fail(loaded.status());
      critic = *loaded;
    }
  }
  StatusOr<std::unique_ptr<trainer::Trainer>> tr =
      trainer::Trainer::create(s.policy, *options, *version, *reference, {}, critic);
  if (!tr.ok()) return fail(tr.status());
  const InProcessSourceOptions so{args.groups_per_step, options->drop_equal_reward_groups,
                                  s.config.trainer.max_extra_batches};
  StatusOr<std::unique_ptr<InProcessGroupSource>> source =
      InProcessGroupSource::create(s, split, &verifier, **tr, so);
  if (!source.ok()) return fail(source.status());
  LoopParts parts;
  parts.source = source->get();
  parts.evaluator = &evaluator;
  parts.metrics = metrics->get();
  if (!args.save.empty()) {
    parts.final_save = [&](const trainer::Trainer& t) { return save_model(s, t, args.save); };
  }
  const LoopEnd end =
      TrainingLoop({args.steps, args.eval_every, 0, false}, std::move(parts)).run(**tr, state);
  if (!end.status.ok()) return fail(end.status);
  return 0;
}

}  // namespace relay::app
