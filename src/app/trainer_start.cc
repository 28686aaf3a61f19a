// relay-trainer's resume or fresh start, and its checkpoints.

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "app/trainer_context.h"
#include "relay/app/warm_start.h"
#include "relay/common/file_io.h"
#include "relay/common/progress.h"
#include "relay/model/checkpoint.h"

namespace relay::app::internal {
namespace {

// The other ranks build the same RL trainer: rank 0's weights at
// `version`, reference and trainer state (`state`: the checkpoint's after a
// resume, empty for a fresh trainer). Not rank 0's save_state(): with
// sharding that is a collective the others cannot join before they have a
// trainer. Called before rank 0 builds its own trainer: with
// trainer.sharding: full that keeps only this rank's shards of the policy
// and the reference.
Status start_followers(TrainerContext& c, int64_t version, const model::Policy& ref,
                       const std::string& state, const model::ValueModel& critic) {
  if (!c.leader) return OkStatus();
  return c.leader->start("rl", *c.s.policy, version, ref, state, critic);
}

// PPO's critic (advantage.estimator gae), before the trainer (and the
// followers) take it: a resumed run's from its checkpoint, else
// trainer.critic.path, else one over the policy's weights as RL starts.
StatusOr<model::ValueModel> load_critic(const TrainerContext& c, const std::string& checkpoint) {
  if (c.options.advantage.estimator != trainer::AdvantageEstimator::kGae) {
    return model::ValueModel{nullptr};
  }
  model::LoadOptions lo;
  lo.dtype = c.s.policy->parameters()[0].scalar_type();
  lo.device = c.s.policy->parameters()[0].device();
  if (!checkpoint.empty()) {
    const std::string dir = (std::filesystem::path(checkpoint) / trainer::kCriticDir).string();
    if (!std::filesystem::exists(dir)) {
      return FailedPreconditionError(
          absl::StrCat(checkpoint, " has no ", trainer::kCriticDir,
                       "/ directory: it was written by a run without a critic, and "
                       "trainer.advantage.estimator gae resumes one"));
    }
    return model::load_value_model(dir, lo, c.s.config.run.seed);
  }
  const std::string& path = c.s.config.trainer.critic.path;
  if (!path.empty()) return model::load_value_model(path, lo, c.s.config.run.seed);
  return model::value_model_from_policy(*c.s.policy, c.s.config.run.seed);
}

// The KL reference: trainer.reference, else the one a resumed run saved
// when RL began; none (the trainer's frozen copy) on a fresh start.
StatusOr<model::Policy> load_reference(const TrainerContext& c, bool resuming) {
  if (!c.options.needs_reference()) return model::Policy{nullptr};
  const std::string& configured = c.s.config.trainer.reference;
  // LoRA: the base is the reference, the policy itself with adapters off.
  if (configured.empty() && c.options.lora.enabled()) return model::Policy{nullptr};
  const std::string dir = !configured.empty() ? configured : resuming ? c.run.reference : "";
  if (dir.empty()) return model::Policy{nullptr};
  return model::load_policy(dir, {c.s.policy->parameters()[0].scalar_type()});
}

StatusOr<Started> resume(TrainerContext& c, const trainer::CheckpointInfo& info,
                         const model::Policy& reference) {
  const ExperimentConfig& config = c.s.config;
  if (info.seed != config.run.seed) {
    std::printf("note: run.seed is %llu; the checkpoint was written with %llu\n",
                static_cast<unsigned long long>(config.run.seed),
                static_cast<unsigned long long>(info.seed));
  }
  model::LoadOptions lo;
  lo.dtype = c.s.policy->parameters()[0].scalar_type();
  RELAY_ASSIGN_OR_RETURN(c.s.policy, model::load_policy(info.dir, lo));
  RELAY_ASSIGN_OR_RETURN(model::ValueModel critic, load_critic(c, info.dir));
  if (c.leader) {
    RELAY_ASSIGN_OR_RETURN(
        const std::string state,
        read_file((std::filesystem::path(info.dir) / trainer::kTrainerStateFile).string()));
    RELAY_RETURN_IF_ERROR(start_followers(c, info.version, reference, state, critic));
  }
  Started r;
  RELAY_ASSIGN_OR_RETURN(r.trainer, trainer::Trainer::create(c.s.policy, c.options, info.version,
                                                             reference, c.data_parallel(), critic));
  RELAY_RETURN_IF_ERROR(trainer::restore_checkpoint(info, *r.trainer));
  r.rl_start_version = info.rl_start_version;
  r.state.rl_step = info.rl_step;
  // The store goes back to where it stood at the checkpoint: groups that
  // arrived later came from weights that died with the previous process,
  // and groups trained on later are trained on again, so the resumed run
  // sees what an uninterrupted one would have.
  store::StorePosition pos;
  pos.next_seq = std::max<uint64_t>(1, info.store_next_seq);
  pos.side_record = info.dispenser_state;
  RELAY_ASSIGN_OR_RETURN(store::RewindStats rw, c.store->rewind(pos, info.version));
  RELAY_ASSIGN_OR_RETURN(std::optional<trainer::CheckpointInfo> best,
                         trainer::best_checkpoint(c.run.checkpoints));
  if (best) r.state.best_accuracy = *best->eval_accuracy;
  std::printf(
      "resumed from %s: version %lld, step %lld of %d (store rewound: %lld groups trained on "
      "again, %lld later arrivals dropped)\n",
      info.dir.c_str(), static_cast<long long>(info.version), static_cast<long long>(info.rl_step),
      config.experiment.steps, static_cast<long long>(rw.restored),
      static_cast<long long>(rw.dropped));
  return r;
}

// The supervised warm start (experiment.warm_start), on every rank.
StatusOr<int64_t> run_warm_start(TrainerContext& c) {
  const WarmStartConfig& w = c.s.config.experiment.warm_start;
  const WarmStart ws{w.sft_steps, w.sft_lr, w.batch};
  const int64_t version = 0;
  if (c.leader) RELAY_RETURN_IF_ERROR(c.leader->start("sft", *c.s.policy, version, nullptr, ""));
  Progress progress("warm start", ws.steps);
  RELAY_ASSIGN_OR_RETURN(
      int64_t after, warm_start(
                         c.s, c.options, c.split, version, ws,
                         [&](int64_t k, const trainer::StepMetrics& m) {
                           c.metrics.record("sft", k, m);
                           progress.update(k, absl::StrFormat("sft_loss %.4f", m.at("sft_loss")));
                         },
                         c.data_parallel()));
  progress.finish();
  return after;
}

StatusOr<Started> start_fresh(TrainerContext& c, const model::Policy& reference) {
  if (c.store->appended() > 0) {
    return FailedPreconditionError(absl::StrCat(
        c.run.store, " holds ", c.store->appended(), " groups but ", c.run.checkpoints,
        " no checkpoint to go with them: use a new experiment.name or remove ", c.run.store));
  }
  Started r;
  std::function<StatusOr<int64_t>()> warm;
  if (c.s.config.experiment.warm_start.sft_steps > 0) warm = [&c] { return run_warm_start(c); };
  RELAY_ASSIGN_OR_RETURN(r.rl_start_version, before_rl(*c.evaluator, c.s.policy, warm, r.state));
  RELAY_ASSIGN_OR_RETURN(model::ValueModel critic, load_critic(c, ""));
  RELAY_RETURN_IF_ERROR(start_followers(c, r.rl_start_version, reference, "", critic));
  if (c.options.needs_reference() && c.s.config.trainer.reference.empty() &&
      !c.options.lora.enabled()) {
    // The KL reference is the policy RL starts from; a resumed run needs it.
    RELAY_RETURN_IF_ERROR(model::save_policy(*c.s.policy, c.run.reference, c.save_options));
  }
  RELAY_ASSIGN_OR_RETURN(
      r.trainer, trainer::Trainer::create(c.s.policy, c.options, r.rl_start_version, reference,
                                          c.data_parallel(), critic));
  RunCheckpointer zero(&c, r.rl_start_version);
  RELAY_RETURN_IF_ERROR(zero.write(*r.trainer, 0, r.state.accuracy_at(0)));
  return r;
}

}  // namespace

Status RunCheckpointer::write(const trainer::Trainer& trainer, int64_t rl_step,
                              std::optional<double> eval_accuracy) {
  RELAY_ASSIGN_OR_RETURN(store::StorePosition pos, c_->store->position());
  trainer::CheckpointInfo meta;
  meta.rl_step = rl_step;
  meta.rl_start_version = rl_start_version_;
  meta.seed = c_->s.config.run.seed;
  meta.eval_accuracy = eval_accuracy;
  meta.store_next_seq = pos.next_seq;
  meta.dispenser_state = pos.side_record;
  const ExperimentSection& ex = c_->s.config.experiment;
  const trainer::CheckpointRetention retention{ex.keep_checkpoints, ex.keep_best_checkpoint};
  Progress progress(absl::StrCat("checkpoint ", trainer::checkpoint_dir_name(rl_step)), 1);
  RELAY_ASSIGN_OR_RETURN(
      trainer::CheckpointInfo info,
      trainer::write_checkpoint(c_->run.checkpoints, trainer, meta, c_->save_options, retention));
  progress.update(1);
  if (on_written_) on_written_(info.version);
  return OkStatus();
}

StatusOr<Started> resume_or_start(TrainerContext& c,
                                  const std::optional<trainer::CheckpointInfo>& checkpoint) {
  StatusOr<model::Policy> reference = load_reference(c, checkpoint.has_value());
  if (!reference.ok()) return reference.status();
  if (checkpoint) return resume(c, *checkpoint, *reference);
  return start_fresh(c, *reference);
}

}  // namespace relay::app::internal
