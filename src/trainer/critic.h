#pragma once

// The value model of PPO with a critic (trainer.critic, advantage.estimator
// gae), with its own optimizer and step count. The trainer runs its passes
// (which rows, micro-batches, packing) and calls it for the pieces that are
// the critic's own: values, the value loss, the update and the state.
// Private to src/trainer.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "relay/common/status.h"
#include "relay/model/value_model.h"
#include "relay/trainer/batch.h"
#include "relay/trainer/data_parallel.h"
#include "relay/trainer/options.h"
#include "relay/trainer/value_loss.h"
#include "trainer/fully_sharded.h"
#include "trainer/optimizer.h"

namespace torch::serialize {
class InputArchive;
class OutputArchive;
}  // namespace torch::serialize

namespace relay::trainer {

class Critic {
 public:
  // `model` is trained in place; AdamW over all its parameters under
  // `sharding`, as the policy's. Under sharding: full (over several ranks)
  // the critic is cut into units as the policy is (fully_sharded.h) and
  // `model` keeps empty parameters between passes, on every rank, for good:
  // the whole critic exists only as whole_model()'s copy.
  static StatusOr<std::unique_ptr<Critic>> create(model::ValueModel model,
                                                  const CriticOptions& options, Sharding sharding,
                                                  const DataParallel& dp);

  // The module the passes run.
  model::ValueModel model() const { return model_; }
  // The critic whole, for a checkpoint: model() itself, or under sharding:
  // full rank 0's host copy as of the last save() (null before the first
  // one, and on the other ranks).
  model::ValueModel whole_model() const { return sharded_ ? saved_ : model_; }
  const CriticOptions& options() const { return options_; }
  // Under sharding: full, the sharded critic (its root whole for a phase
  // through WholeRoot); else null.
  FullyShardedModel* sharded() const { return sharded_.get(); }

  // V at the positions that score `mb`'s response tokens, [rows, L] in the
  // response layout (0 outside the mask); packed as the policy's passes are
  // when `pack` (pack_sequences). Differentiable unless under NoGradGuard.
  at::Tensor response_values(const TrainBatch& mb, bool pack, int64_t pad_token_id);

  // The value loss of one micro-batch (verl's compute_value_loss over
  // `normalizer`, counted for the whole mini-batch), back-propagated into
  // the critic's gradients. The caller passes old values and returns [rows, L].
  ValueLossResult backward(const TrainBatch& mb, const at::Tensor& old_values,
                           const at::Tensor& returns, const GlobalNormalizer& normalizer, bool pack,
                           int64_t pad_token_id);

  // Under sharding: full, the pass a rank with fewer micro-batches than
  // another runs in its place (its gathers and reduce-scatters are
  // collectives): a two-token row, whose zero gradient counts for no
  // parameter. Nothing otherwise. The caller sets autocast as for a real one.
  void empty_pass(bool with_grad);

  void zero_grad() { optimizer_->zero_grad(); }
  // Sums the ranks' gradients, clips, steps AdamW at the scheduled rate;
  // the gradient norm before clipping.
  StatusOr<double> apply_gradients();
  int64_t optimizer_steps() const { return optimizer_steps_; }
  // RL steps the critic has trained in; while fewer than
  // options().warmup_steps, the step trains the critic alone.
  bool warming_up() const { return rl_steps_ < options_.warmup_steps; }
  void count_step() { ++rl_steps_; }
  double last_lr() const;

  // "optimizer_steps", "rl_steps" and the optimizer's state (Optimizer::save) into
  // `archive`. Under sharding: full a collective that also gathers the
  // weights into whole_model().
  Status save(torch::serialize::OutputArchive& archive) const;
  bool save_is_collective() const { return optimizer_->save_is_collective(); }
  // Reads what save() wrote, changing nothing (Optimizer::read_state): the
  // function returned installs it and cannot fail.
  StatusOr<std::function<void()>> read_state(torch::serialize::InputArchive& archive,
                                             const std::string& path);
  OptimizerMemory memory() const { return optimizer_->memory(); }
  // The weights this rank holds between passes (its shards, when sharded).
  int64_t weight_bytes() const;

 private:
  Critic(model::ValueModel model, CriticOptions options)
      : model_(std::move(model)), options_(std::move(options)) {}

  model::ValueModel model_;
  CriticOptions options_;
  std::unique_ptr<FullyShardedModel> sharded_;
  mutable model::ValueModel saved_{nullptr};  // sharding: full, rank 0: whole_model()
  std::unique_ptr<Optimizer> optimizer_;
  int64_t optimizer_steps_ = 0;
  int64_t rl_steps_ = 0;
};

}  // namespace relay::trainer
