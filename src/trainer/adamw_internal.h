#pragma once

// What the two optimizers of optimizer.h share: AdamW's update as torch
// defines it, access to a torch AdamW's per-parameter state, and the master
// copies' part of the saved layout. Private to src/trainer.

#include <torch/torch.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "relay/common/status.h"
#include "trainer/optimizer.h"

namespace relay::trainer {

// One AdamW update of `param` by `grad`, with the moments at optimizer step
// `step` (1 on the first update), as torch::optim::AdamW does it (amsgrad
// off): in one pass for fp32 CPU tensors (adamw_kernel.h), op for op with
// torch's tensor operations otherwise. Either way a tensor updated in
// slices comes out as the same tensor updated whole.
void adamw_update(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg,
                  at::Tensor& exp_avg_sq, int64_t step, const OptimizerOptions& options, double lr);

// `param`'s state in a torch AdamW that steps it; null before its first step.
torch::optim::AdamWParamState* adamw_state(torch::optim::AdamW& optimizer, const at::Tensor& param);
// Drops `param`'s state: as before its first step.
void clear_adamw_state(torch::optim::AdamW& optimizer, const at::Tensor& param);
// Sets `param`'s state (its step count and both moments).
void set_adamw_state(torch::optim::AdamW& optimizer, const at::Tensor& param, int64_t step,
                     const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq);

// AdamWOptions from relay's (lr as given; the trainer sets it every step).
torch::optim::AdamWOptions adamw_options(const OptimizerOptions& options);

// The master copies a state archive holds, checked against `expected` (the
// optimizer's own count and shapes): any mismatch is an error naming `path`.
StatusOr<std::vector<at::Tensor>> read_master(torch::serialize::InputArchive& archive,
                                              const std::string& path,
                                              const std::vector<at::IntArrayRef>& expected);
void write_master(torch::serialize::OutputArchive& archive, const std::vector<at::Tensor>& master);

// Reads the archive's "optimizer" entry into a torch AdamW over `params`
// (tensors of the optimizer's shapes, used as keys only), all or nothing:
// a state that does not fit is an error naming `path`.
Status read_adamw(torch::serialize::InputArchive& archive, const std::string& path,
                  torch::optim::AdamW& into);

// The whole state of an optimizer as a single rank holds it, per parameter
// in the parameters' order: what a sharded optimizer gathers to save and
// takes its slices of when it loads.
struct WholeAdamWState {
  std::vector<at::Tensor> master;               // fp32; empty without master copies
  std::vector<int64_t> steps;                   // AdamW's step count; 0 = never stepped
  std::vector<at::Tensor> exp_avg, exp_avg_sq;  // undefined where steps is 0
};

// Writes `state` in the single-rank layout: "num_master", "master/<i>" and
// "optimizer", torch's AdamW over tensors of `shapes` in `dtypes` (the
// master copies' fp32, or the parameters' own), at `lr`.
void write_whole_adamw(torch::serialize::OutputArchive& archive, const WholeAdamWState& state,
                       const std::vector<std::vector<int64_t>>& shapes,
                       const std::vector<at::ScalarType>& dtypes, const OptimizerOptions& options,
                       double lr);
// Reads what write_whole_adamw wrote (or a replicated optimizer's save),
// checked against `shapes` and master copies being on or off: a mismatch is
// an error naming `path`.
StatusOr<WholeAdamWState> read_whole_adamw(torch::serialize::InputArchive& archive,
                                           const std::string& path,
                                           const std::vector<std::vector<int64_t>>& shapes,
                                           const std::vector<at::ScalarType>& dtypes,
                                           bool use_master);

// A sharded optimizer's part of `whole`: elements [offset, offset + length)
// of parameter `param`'s flattened moments (zeros for a parameter never
// stepped) and, when `master` is defined, of its master copy, copied into
// the rank's tensors.
void take_state_slice(const WholeAdamWState& whole, size_t param, int64_t offset, int64_t length,
                      at::Tensor& exp_avg, at::Tensor& exp_avg_sq, at::Tensor& master);

std::unique_ptr<Optimizer> make_replicated_adamw(const std::vector<at::Tensor>& params,
                                                 const OptimizerOptions& options,
                                                 const DataParallel& dp);
StatusOr<std::unique_ptr<Optimizer>> make_sharded_adamw(const std::vector<at::Tensor>& params,
                                                        const OptimizerOptions& options,
                                                        const DataParallel& dp);

}  // namespace relay::trainer
