#pragma once

// What the trainer's optimizer update runs on (trainer.sharding). Private to
// src/trainer.
//
// Both kinds run AdamW as torch::optim::AdamW defines it (decoupled weight
// decay, bias-corrected moments, amsgrad off) over the policy's parameters,
// with optional fp32 master copies of low-precision ones, after summing the
// ranks' gradients and clipping their global L2 norm:
//   * ReplicatedAdamW (sharding: none): every rank holds every master weight
//     and both moments of every parameter; gradients are all-reduced.
//   * ShardedAdamW (sharding: optimizer; ZeRO stage 1, with the fp32
//     gradients of stage 2): the parameters, laid end to end, are cut into
//     world_size equal ranges; a rank holds the master weights, the moments
//     and the summed fp32 gradient of its range only. Gradients are
//     reduce-scattered, each rank updates its range, and the ranges are
//     all-gathered back into every rank's parameters.
// Either saves and restores its state in one layout (the single-rank
// layout: torch's AdamW archive plus the master copies), so a checkpoint
// resumes under the other kind and under another world size.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "relay/common/status.h"
#include "relay/trainer/data_parallel.h"
#include "relay/trainer/options.h"

namespace torch::serialize {
class InputArchive;
class OutputArchive;
}  // namespace torch::serialize

namespace relay::trainer {

// Bytes an optimizer holds on this rank.
struct OptimizerMemory {
  int64_t master = 0;     // fp32 master copies
  int64_t moments = 0;    // AdamW's exp_avg and exp_avg_sq
  int64_t gradients = 0;  // what backward and the update allocate at their peak
};

// A tensor's bytes; 0 for an undefined one (a state not yet created).
inline int64_t bytes_of(const at::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // Frees every gradient: the parameters' and the optimizer's own.
  virtual void zero_grad() = 0;

  // The parameters' gradients (this rank's sums) are summed across the
  // ranks, clipped to a global L2 norm of `max_norm` (infinity = no clip) and
  // stepped at `lr`; the gradients are freed. Returns the norm before
  // clipping. A non-finite norm or a failed collective before the update
  // returns an error with the weights untouched; `on_apply` runs just before
  // the weights start to change (after it, a failure leaves them
  // half-updated).
  virtual StatusOr<double> step(double lr, double max_norm,
                                const std::function<void()>& on_apply) = 0;

  // Writes "num_master", "master/<i>" and "optimizer" (a torch AdamW
  // archive over the parameters) into `archive`: the whole state as one rank
  // would hold it. ShardedAdamW gathers it (a collective: every rank calls
  // save, and only rank 0's archive is complete; the others' are left empty).
  virtual Status save(torch::serialize::OutputArchive& archive) const = 0;
  // True when save() is a collective.
  virtual bool save_is_collective() const = 0;

  // Reads what save() wrote and checks it against this optimizer, changing
  // nothing: a mismatch (another model, master copies on or off) is an error
  // naming `path`. The function returned installs the state read and cannot
  // fail, so a caller restoring several optimizers (the policy's and the
  // critic's) reads them all before it changes any.
  virtual StatusOr<std::function<void()>> read_state(torch::serialize::InputArchive& archive,
                                                     const std::string& path) = 0;

  virtual OptimizerMemory memory() const = 0;
};

// The optimizer `sharding` asks for over `params` (the policy's, in order).
// Sharding over a single rank is the replicated optimizer.
StatusOr<std::unique_ptr<Optimizer>> make_optimizer(const std::vector<at::Tensor>& params,
                                                    const OptimizerOptions& options,
                                                    Sharding sharding, const DataParallel& dp);

}  // namespace relay::trainer
