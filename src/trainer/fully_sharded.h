#pragma once

// trainer.sharding: full (ZeRO-3, FSDP-style): the ranks shard the weights
// themselves, and a rank holds a layer's whole weights only while it runs.
// Private to src/trainer.
//
// The model's parameters are cut into units: one per decoder layer
// ("model.layers.<i>.*") and the root (everything else: the embedding, the
// final norm, the LM head). A unit's parameters, flattened and laid end to
// end, form one index space of N elements padded to world_size * S
// (S = ceil(N / W)); rank r holds [r*S, r*S + S) of it, in the parameters'
// dtype, and the parameters themselves are empty tensors.
//   * A layer unit is gathered (all-gather) just before the layer runs and
//     released just after, through model::LayerHooks. With gradients the
//     layer runs without autograd and is recomputed in backward (activation
//     checkpointing, always on for sharded layers), gathered again for it;
//     then its gradients are reduce-scattered into this rank's fp32
//     accumulator and the unit is released.
//   * The root unit is gathered for a whole phase (a pre-update pass, or an
//     update's micro-batches); its gradients accumulate whole across the
//     micro-batches and are reduce-scattered once, at the update.
//   * Prefetch: while a layer runs, the next one's gather runs on a thread
//     of its own (layer i + 1 in a forward, i - 1 in backward, told apart
//     by the order the decoder acquires them), so at most two layers are
//     whole at once. One collective at a time: every other collective of
//     this class first waits for a pending prefetch, and a pass ends with
//     none pending (the last layer of a forward and layer 0 of a backward
//     prefetch nothing), so the trainer's own collectives never run beside
//     one.
// How it differs from FSDP: FSDP keeps a layer's activations for backward
// and re-gathers the weights autograd saved; here the sharded layers always
// recompute (the reentrant checkpoint in policy.cc), so no saved tensor
// points into a released buffer.
//
// Every rank must run the same passes: a gather or a reduce-scatter is a
// collective. The trainer pads a rank that has fewer micro-batches with
// empty passes (Trainer::empty_pass).

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <ATen/core/Tensor.h>

#include "relay/common/status.h"
#include "relay/model/policy.h"
#include "relay/trainer/data_parallel.h"
#include "trainer/optimizer.h"

namespace relay::trainer {

class FullyShardedModel final : public model::LayerHooks {
 public:
  struct Param {
    std::string name;
    size_t index = 0;  // in the module's parameters()
    at::Tensor param;  // the module's parameter (empty while released)
    std::vector<int64_t> shape;
    int64_t offset = 0;  // in the unit's flat index space
    int64_t numel = 0;
  };
  struct Unit {
    std::string name;  // "model.layers.<i>" or "root"
    std::vector<Param> params;
    int64_t numel = 0;  // N
    int64_t shard = 0;  // S
    at::ScalarType dtype = at::kFloat;
    at::Tensor local;  // [S], the parameters' dtype: this rank's elements
    at::Tensor grad;   // [S] fp32: the ranks' summed gradients (undefined = none yet)
    bool whole = false;
  };

  // Shards `module` (whole, and the same on every rank) over `dp`'s ranks and
  // sets itself as `decoder`'s layer hooks; the whole weights are freed.
  // `decoder` runs the module's num_layers layers, whose parameters are
  // named "model.layers.<i>.*" (a policy, or PPO's value model over the
  // same decoder); every other parameter is the root's. `trainable`:
  // gradients are reduced (a frozen reference takes none). Each unit must
  // hold one dtype on one device.
  static StatusOr<std::unique_ptr<FullyShardedModel>> create(
      std::shared_ptr<torch::nn::Module> module, model::Decoder decoder, int64_t num_layers,
      const DataParallel& dp, bool trainable);
  // A policy: its decoder and layers.
  static StatusOr<std::unique_ptr<FullyShardedModel>> create(model::Policy policy,
                                                             const DataParallel& dp,
                                                             bool trainable);
  ~FullyShardedModel() override;

  // model::LayerHooks (layer i is unit i + 1). They throw on a failed
  // collective.
  void acquire(int64_t layer) override;
  void release(int64_t layer) override;
  void gradients_ready(int64_t layer) override;

  // The root unit, whole for a phase. acquire_root on a whole root does
  // nothing.
  Status acquire_root();
  void release_root();
  // The root's gradients (whole, accumulated by autograd) reduce-scattered
  // into its accumulator; then the root is released.
  Status reduce_root_gradients();

  // Off: the passes that follow (the trainer's empty ones) mark no parameter
  // as having had a gradient.
  void set_counting(bool on) { counting_ = on; }
  // Which parameters (by index in the module's parameters()) had a gradient
  // in a counted pass on this rank since the last drop_gradients().
  const std::vector<bool>& had_gradient() const { return had_gradient_; }
  // Frees every accumulator and parameter gradient and releases every unit
  // (after an update, or a failure partway through a pass).
  void drop_gradients();

  // Gathers every unit in turn and copies the whole weights into `into`
  // (same architecture, any device and dtype; null: this rank only takes
  // part). A collective.
  Status gather_weights(torch::nn::Module* into);

  // Makes the module whole again from `from` (the same architecture; any
  // device and dtype): each parameter gets a copy of its weights on its own
  // device and in its dtype. No collective; the shards stay as they are.
  void restore_whole(const torch::nn::Module& from);

  std::vector<Unit>& units() { return units_; }
  const std::vector<Unit>& units() const { return units_; }
  const DataParallel& data_parallel() const { return dp_; }
  // Bytes this rank holds between passes (its shards), and at most while a
  // phase runs (the root and two layers whole on top of them: the one
  // running and the next one, prefetched).
  int64_t shard_bytes() const;
  int64_t peak_whole_bytes() const;
  // Of the layers acquired so far, the share a prefetch had gathered
  // already (0 before any).
  double prefetched_fraction() const {
    return acquired_ > 0 ? static_cast<double>(prefetched_) / static_cast<double>(acquired_) : 0;
  }

 private:
  FullyShardedModel(std::shared_ptr<torch::nn::Module> module, model::Decoder decoder,
                    const DataParallel& dp, bool trainable)
      : module_(std::move(module)), decoder_(std::move(decoder)), dp_(dp), trainable_(trainable) {}
  Status gather(Unit& u);
  void release(Unit& u);
  Status reduce_gradients(Unit& u);
  // The prefetch thread: gathers `u` while the caller computes.
  void start_prefetch(Unit& u);
  // Waits for a pending prefetch; its gather's status.
  Status finish_prefetch();

  std::shared_ptr<torch::nn::Module> module_;
  model::Decoder decoder_;  // runs the layers: its hooks are this
  DataParallel dp_;
  bool trainable_ = true;
  bool counting_ = true;
  std::vector<Unit> units_;  // [0] = root, [i + 1] = layer i
  std::vector<bool> had_gradient_;
  std::thread prefetch_;
  Status prefetch_status_;
  int64_t last_acquired_ = -1;  // the layer acquire() last took
  bool backward_ = false;       // whether that acquire was a backward's
  int64_t acquired_ = 0, prefetched_ = 0;
};

// A fully sharded model's root unit whole for a phase: acquire() gathers
// it, the destructor releases it. Does nothing for a null model.
class WholeRoot {
 public:
  explicit WholeRoot(FullyShardedModel* model) : model_(model) {}
  ~WholeRoot() {
    if (model_ != nullptr) model_->release_root();
  }
  WholeRoot(const WholeRoot&) = delete;
  WholeRoot& operator=(const WholeRoot&) = delete;
  Status acquire() { return model_ != nullptr ? model_->acquire_root() : OkStatus(); }

 private:
  FullyShardedModel* model_;
};

// A fully sharded model's passes in its scope count for no parameter
// (set_counting(false), restored however the scope ends): the empty passes a
// rank with fewer micro-batches runs. Does nothing for a null model.
class UncountedPasses {
 public:
  explicit UncountedPasses(FullyShardedModel* model) : model_(model) {
    if (model_ != nullptr) model_->set_counting(false);
  }
  ~UncountedPasses() {
    if (model_ != nullptr) model_->set_counting(true);
  }
  UncountedPasses(const UncountedPasses&) = delete;
  UncountedPasses& operator=(const UncountedPasses&) = delete;

 private:
  FullyShardedModel* model_;
};

// AdamW over a fully sharded model's shards (optimizer.h): this rank's
// elements of each unit, with their master copies and moments; the
// gradients arrive reduce-scattered already. The state is saved in the
// single-rank layout, as ShardedAdamW saves it.
StatusOr<std::unique_ptr<Optimizer>> make_fully_sharded_adamw(FullyShardedModel& model,
                                                              const OptimizerOptions& options);

}  // namespace relay::trainer
