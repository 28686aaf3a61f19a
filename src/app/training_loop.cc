#include "relay/app/training_loop.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace relay::app {
namespace {

// Runs an evaluation and keeps its accuracy in `state` (an evaluation with
// nothing to evaluate leaves it as it was).
Status evaluate_into(Evaluator& evaluator, int64_t step, const std::string& label,
                     const model::Policy& policy, LoopState& state) {
  RELAY_ASSIGN_OR_RETURN(double accuracy, evaluator.evaluate(step, label, policy));
  if (!std::isnan(accuracy)) {
    state.last_accuracy = accuracy;
    state.last_eval_step = step;
  }
  return OkStatus();
}

}  // namespace

std::optional<double> LoopState::accuracy_at(int64_t step) const {
  if (last_eval_step != step || std::isnan(last_accuracy)) return std::nullopt;
  return last_accuracy;
}

StatusOr<int64_t> before_rl(Evaluator& evaluator, const model::Policy& policy,
                            const std::function<StatusOr<int64_t>()>& warm_start,
                            LoopState& state) {
  RELAY_RETURN_IF_ERROR(evaluate_into(evaluator, 0, "before", policy, state));
  int64_t version = 0;
  if (warm_start) {
    RELAY_ASSIGN_OR_RETURN(version, warm_start());
    RELAY_RETURN_IF_ERROR(evaluate_into(evaluator, 0, "after warm start", policy, state));
  }
  if (state.last_eval_step == 0) state.best_accuracy = state.last_accuracy;
  return version;
}

TrainingLoop::TrainingLoop(LoopOptions options, LoopParts parts)
    : options_(options), parts_(std::move(parts)) {}

LoopEnd TrainingLoop::run(trainer::Trainer& trainer, LoopState& state) {
  LoopEnd end;
  while (state.rl_step < options_.steps && !stop_asked()) {
    if (!step(trainer, state, end)) break;
  }
  wind_up(trainer, state, end);
  return end;
}

bool TrainingLoop::step(trainer::Trainer& trainer, LoopState& state, LoopEnd& end) {
  StatusOr<std::optional<trainer::StepMetrics>> m =
      parts_.source->train_step(trainer, state.rl_step + 1);
  if (!m.ok()) {
    // A stop asked for while waiting for groups is a clean stop, not a failure.
    if (!(stop_asked() && m.status().code() == absl::StatusCode::kCancelled))
      end.status = m.status();
    return false;
  }
  ++state.rl_step;
  if (!m->has_value()) return true;  // nothing to train on: the source said why
  const trainer::StepMetrics& metrics = **m;
  parts_.metrics->record("rl", state.rl_step, metrics);
  const bool last = state.rl_step >= options_.steps;
  bool new_best = false;
  if (options_.eval_every > 0 && state.rl_step % options_.eval_every == 0 && !last) {
    end.status = evaluate_into(*parts_.evaluator, state.rl_step,
                               absl::StrCat("at step ", state.rl_step), trainer.policy(), state);
    if (!end.status.ok()) return false;
    new_best = std::isnan(state.best_accuracy) || state.last_accuracy > state.best_accuracy;
    if (new_best) state.best_accuracy = state.last_accuracy;
  }
  if (parts_.on_step) {
    parts_.on_step(
        {state.rl_step, &trainer, &metrics, &parts_.source->last_groups(), state.last_accuracy});
  }
  // Periodic checkpoints, and the step of a new best eval accuracy (so that
  // the best model is kept); the last step's is the final checkpoint.
  const bool periodic =
      options_.checkpoint_every > 0 && state.rl_step % options_.checkpoint_every == 0;
  if (parts_.checkpointer != nullptr && (periodic || (new_best && options_.checkpoint_best)) &&
      !last) {
    end.status =
        parts_.checkpointer->write(trainer, state.rl_step, state.accuracy_at(state.rl_step));
    if (!end.status.ok()) return false;
  }
  return true;
}

void TrainingLoop::wind_up(trainer::Trainer& trainer, LoopState& state, LoopEnd& end) {
  end.finished = end.status.ok() && state.rl_step >= options_.steps;
  if (end.finished) {
    end.status = evaluate_into(*parts_.evaluator, state.rl_step, "after", trainer.policy(), state);
  }
  end.stopped = stop_asked();
  parts_.source->finish(end.finished);
  // A drained stop (SIGTERM) checkpoints too, so a restart loses nothing;
  // so does a source whose failure left the trainer sound. A failed step
  // does not: its trainer may be half-updated.
  const bool sound =
      end.status.ok() || end.stopped || parts_.source->trainer_sound_after(end.status);
  if (parts_.checkpointer != nullptr && sound) {
    Status st =
        parts_.checkpointer->write(trainer, state.rl_step, state.accuracy_at(state.rl_step));
    if (!st.ok() && end.status.ok()) end.status = st;
  }
  if (end.status.ok() && end.finished && parts_.final_save) end.status = parts_.final_save(trainer);
}

}  // namespace relay::app
