#include "relay/app/in_process_source.h"

#include <cstdio>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "relay/model/lora.h"
#include "relay/model/weight_manifest.h"

namespace relay::app {

std::string format_metrics(const trainer::StepMetrics& m, const std::vector<std::string>& keys) {
  std::string out;
  for (const std::string& k : keys) {
    auto it = m.find(k);
    if (it != m.end()) absl::StrAppend(&out, " ", k, "=", absl::StrFormat("%.4g", it->second));
  }
  return out;
}

namespace {

trainer::BatchFillerOptions filler_options(const InProcessSourceOptions& o) {
  trainer::BatchFillerOptions fo;
  fo.groups_per_batch = o.groups_per_step;
  fo.drop_equal_reward_groups = o.drop_equal_reward_groups;
  fo.max_extra_batches = o.max_extra_batches;
  return fo;
}

}  // namespace

StatusOr<std::unique_ptr<InProcessGroupSource>> InProcessGroupSource::create(
    const RolloutSetup& s, const PromptSplit& split, rollout::SafeVerifier* verifier,
    const trainer::Trainer& trainer, const InProcessSourceOptions& options) {
  // The engine holds its own copy of the weights, as a worker would.
  RELAY_ASSIGN_OR_RETURN(uint64_t digest, weights_digest(*trainer.policy()));
  RELAY_ASSIGN_OR_RETURN(std::unique_ptr<rollout::Engine> engine,
                         rollout::Engine::create(model::clone_policy(*trainer.policy()), s.engine,
                                                 trainer.version(), digest));
  RELAY_ASSIGN_OR_RETURN(std::unique_ptr<rollout::Teacher> teacher, load_teacher(s));
  return std::unique_ptr<InProcessGroupSource>(
      new InProcessGroupSource(s, split, verifier, std::move(engine), std::move(teacher), options));
}

InProcessGroupSource::InProcessGroupSource(const RolloutSetup& s, const PromptSplit& split,
                                           rollout::SafeVerifier* verifier,
                                           std::unique_ptr<rollout::Engine> engine,
                                           std::unique_ptr<rollout::Teacher> teacher,
                                           const InProcessSourceOptions& options)
    : s_(s),
      split_(split),
      verifier_(verifier),
      engine_(std::move(engine)),
      teacher_(std::move(teacher)),
      options_(options),
      filler_(filler_options(options)),
      episodes_(episode_driver(s, *engine_)) {}

StatusOr<std::vector<rollout::TrajectoryGroup>> InProcessGroupSource::generate_batch() {
  std::map<std::string, rollout::TaskPrompt> prompts;
  for (int64_t i = 0; i < options_.groups_per_step; ++i) {
    const int64_t index = split_.train_index(generated_ * options_.groups_per_step + i);
    RELAY_ASSIGN_OR_RETURN(rollout::TaskPrompt p, s_.task->prompt(index));
    const std::string id = absl::StrCat(p.id, "@", generated_);
    RELAY_ASSIGN_OR_RETURN(
        rollout::PromptGroup g,
        prompt_group(s_, p, id,
                     rollout::sequence_seed(s_.config.run.seed,
                                            static_cast<uint64_t>(generated_ * 1000003 + i))));
    if (episodes_) episodes_->begin_group(id, episode_start(p));
    RELAY_RETURN_IF_ERROR(engine_->submit(std::move(g)));
    prompts.emplace(id, std::move(p));
  }
  ++generated_;
  RELAY_ASSIGN_OR_RETURN(std::vector<rollout::TrajectoryGroup> groups, engine_->run());
  for (rollout::TrajectoryGroup& g : groups) {
    if (episodes_) episodes_->end_group(g.group_id);
    RELAY_RETURN_IF_ERROR(score_group(s_, *verifier_, prompts.at(g.group_id), g));
  }
  if (teacher_) RELAY_RETURN_IF_ERROR(teacher_->score(groups));
  return groups;
}

StatusOr<std::optional<trainer::StepMetrics>> InProcessGroupSource::train_step(
    trainer::Trainer& trainer, int64_t rl_step) {
  do {
    RELAY_ASSIGN_OR_RETURN(std::vector<rollout::TrajectoryGroup> groups, generate_batch());
    filler_.add(std::move(groups));
  } while (filler_.wants_more());
  trainer::BatchFillerStats fill;
  std::vector<rollout::TrajectoryGroup> batch = filler_.take(&fill);
  if (batch.empty()) {
    std::printf(
        "step %lld: skipped: no group with a learning signal in %lld generation "
        "batches\n",
        static_cast<long long>(rl_step), static_cast<long long>(fill.generated_batches));
    return std::optional<trainer::StepMetrics>();
  }
  RELAY_ASSIGN_OR_RETURN(trainer::StepMetrics m, trainer.step(batch));
  m["batch/generated_batches"] = static_cast<double>(fill.generated_batches);
  m["batch/filled_fraction"] =
      static_cast<double>(batch.size()) / static_cast<double>(options_.groups_per_step);
  RELAY_ASSIGN_OR_RETURN(auto weights, model::published_weights(*trainer.policy(), &base_digest_));
  RELAY_ASSIGN_OR_RETURN(model::WeightManifest manifest,
                         model::weight_manifest(weights, trainer.version()));
  RELAY_RETURN_IF_ERROR(engine_->update_weights(trainer.version(), manifest.digest, weights));
  std::printf("step %lld:%s\n", static_cast<long long>(rl_step),
              format_metrics(m, {"reward/mean", "response_length/mean", "clip_fraction",
                                 "mismatch/k3", "pg_loss", "grad_norm"})
                  .c_str());
  last_ = std::move(batch);
  return std::optional<trainer::StepMetrics>(std::move(m));
}

}  // namespace relay::app
