// trainer.sharding: full's optimizer (fully_sharded.h): AdamW over this
// rank's elements of each unit. By the time step() runs, backward has
// reduce-scattered every layer's gradients into its unit's accumulator; the
// root's are reduce-scattered first thing. Then, as ShardedAdamW does:
//   1. which parameters had a gradient on any rank (one small all-reduce);
//   2. the global L2 norm from the ranks' sums of squares, the clip;
//   3. AdamW on each segment (a parameter's slice in a rank's range), op for
//      op as on the whole tensor, into the rank's shard of the weights.
// No all-gather follows: the next pass gathers what it runs.

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "trainer/adamw_internal.h"
#include "trainer/fully_sharded.h"

namespace relay::trainer {
namespace {

class FullyShardedAdamW final : public Optimizer {
 public:
  FullyShardedAdamW(FullyShardedModel& model, const OptimizerOptions& options)
      : model_(model), options_(options), lr_(options.lr) {
    const DataParallel& dp = model_.data_parallel();
    size_t count = 0;
    for (const FullyShardedModel::Unit& u : model_.units()) {
      count += u.params.size();
      if (options.fp32_master_weights && u.dtype != torch::kFloat32) use_master_ = true;
    }
    shapes_.resize(count);
    dtypes_.resize(count);
    torch::NoGradGuard no_grad;
    for (size_t k = 0; k < model_.units().size(); ++k) {
      const FullyShardedModel::Unit& u = model_.units()[k];
      const int64_t begin = dp.rank() * u.shard, end = begin + u.shard;
      for (const FullyShardedModel::Param& p : u.params) {
        shapes_[p.index] = p.shape;
        dtypes_[p.index] = use_master_ ? torch::kFloat32 : u.dtype;
        const int64_t lo = std::max(begin, p.offset), hi = std::min(end, p.offset + p.numel);
        if (lo >= hi) continue;
        Segment s;
        s.unit = k;
        s.param = p.index;
        s.param_offset = lo - p.offset;
        s.length = hi - lo;
        s.range_offset = lo - begin;
        const at::Tensor slice = weights(s);
        if (use_master_) s.master = slice.to(torch::kFloat32).clone();
        const at::Tensor& work = use_master_ ? s.master : slice;
        s.exp_avg = torch::zeros_like(work);
        s.exp_avg_sq = torch::zeros_like(work);
        segments_.push_back(std::move(s));
      }
    }
    steps_.assign(count, 0);
  }

  void zero_grad() override { model_.drop_gradients(); }

  StatusOr<double> step(double lr, double max_norm,
                        const std::function<void()>& on_apply) override {
    torch::NoGradGuard no_grad;
    Collectives& group = *model_.data_parallel().group;
    auto fail = [&](Status s) {
      model_.drop_gradients();
      return s;
    };
    if (Status s = model_.reduce_root_gradients(); !s.ok()) return fail(s);
    // 1. Which parameters had a gradient anywhere.
    const std::vector<bool>& had = model_.had_gradient();
    at::Tensor defined = torch::zeros({static_cast<int64_t>(had.size())}, torch::kFloat32);
    for (size_t i = 0; i < had.size(); ++i) {
      if (had[i]) defined[static_cast<int64_t>(i)] = 1.0f;
    }
    if (Status s = group.all_reduce_sum(defined); !s.ok()) return fail(s);
    std::vector<bool> stepped(had.size());
    for (size_t i = 0; i < had.size(); ++i) {
      stepped[i] = defined[static_cast<int64_t>(i)].item<float>() > 0;
    }
    // 2. The global norm and the clip.
    double mine = 0;
    for (const FullyShardedModel::Unit& u : model_.units()) {
      if (!u.grad.defined()) continue;
      const double n = u.grad.norm().item<double>();
      mine += n * n;
    }
    at::Tensor sum_sq = torch::tensor({mine}, torch::kFloat64);
    if (Status s = group.all_reduce_sum(sum_sq); !s.ok()) return fail(s);
    const double grad_norm = std::sqrt(sum_sq[0].item<double>());
    if (!std::isfinite(grad_norm)) {
      return fail(InternalError(
          absl::StrCat("gradient norm is ", grad_norm, "; the update was not applied")));
    }
    // As torch's clip_grad_norm_: the coefficient in fp32, applied below 1.
    const float clip = static_cast<float>(max_norm) / static_cast<float>(grad_norm + 1e-6);
    // 3. AdamW on this rank's segments.
    on_apply();
    lr_ = lr;
    for (size_t i = 0; i < stepped.size(); ++i) {
      if (stepped[i]) ++steps_[i];
    }
    for (Segment& s : segments_) {
      if (!stepped[s.param]) continue;
      const at::Tensor& grad = model_.units()[s.unit].grad;
      if (!grad.defined()) continue;
      at::Tensor g = grad.narrow(0, s.range_offset, s.length);
      if (clip < 1.0f) g = g * clip;
      at::Tensor slice = weights(s);
      at::Tensor work = use_master_ ? s.master : slice;
      if (g.scalar_type() != work.scalar_type()) g = g.to(work.scalar_type());
      adamw_update(work, g, s.exp_avg, s.exp_avg_sq, steps_[s.param], options_, lr);
      if (use_master_) slice.copy_(s.master);
    }
    model_.drop_gradients();
    return grad_norm;
  }

  Status save(torch::serialize::OutputArchive& archive) const override {
    torch::NoGradGuard no_grad;
    WholeAdamWState whole;
    if (use_master_) {
      RELAY_ASSIGN_OR_RETURN(whole.master, gather_state(&Segment::master));
    }
    RELAY_ASSIGN_OR_RETURN(whole.exp_avg, gather_state(&Segment::exp_avg));
    RELAY_ASSIGN_OR_RETURN(whole.exp_avg_sq, gather_state(&Segment::exp_avg_sq));
    if (model_.data_parallel().rank() != 0) return OkStatus();
    whole.steps = steps_;
    write_whole_adamw(archive, whole, shapes_, dtypes_, options_, lr_);
    return OkStatus();
  }

  bool save_is_collective() const override { return true; }

  StatusOr<std::function<void()>> read_state(torch::serialize::InputArchive& archive,
                                             const std::string& path) override {
    RELAY_ASSIGN_OR_RETURN(WholeAdamWState whole,
                           read_whole_adamw(archive, path, shapes_, dtypes_, use_master_));
    // Everything fits: installing is taking this rank's slices of it.
    return std::function<void()>([this, whole = std::move(whole)] {
      steps_ = whole.steps;
      for (Segment& s : segments_) {
        take_state_slice(whole, s.param, s.param_offset, s.length, s.exp_avg, s.exp_avg_sq,
                         s.master);
      }
    });
  }

  OptimizerMemory memory() const override {
    OptimizerMemory m;
    for (const Segment& s : segments_) {
      m.master += bytes_of(s.master);
      m.moments += bytes_of(s.exp_avg) + bytes_of(s.exp_avg_sq);
    }
    // Each unit's fp32 accumulator of this rank's range; the root's
    // gradients whole through the micro-batches; one layer's whole while it
    // is reduce-scattered (the largest).
    int64_t largest_layer = 0;
    const auto& units = model_.units();
    for (size_t k = 0; k < units.size(); ++k) {
      m.gradients += units[k].shard * 4;
      const int64_t whole = units[k].numel * static_cast<int64_t>(c10::elementSize(units[k].dtype));
      if (k == 0) {
        m.gradients += whole;
      } else {
        largest_layer = std::max(largest_layer, whole);
      }
    }
    m.gradients += largest_layer;
    return m;
  }

 private:
  // A parameter's elements in this rank's range of its unit.
  struct Segment {
    size_t unit = 0;
    size_t param = 0;          // index in the policy's parameters()
    int64_t param_offset = 0;  // in the flattened parameter
    int64_t length = 0;
    int64_t range_offset = 0;  // in the rank's shard of the unit
    at::Tensor master;         // fp32; undefined without master weights
    at::Tensor exp_avg, exp_avg_sq;
  };

  // The segment's weights: a view into the unit's shard that writes through.
  at::Tensor weights(const Segment& s) const {
    return model_.units()[s.unit].local.narrow(0, s.range_offset, s.length);
  }

  // One state tensor of every segment, gathered unit by unit into rank 0 as
  // a tensor per parameter in the parameter's shape (fp32, on the host); the
  // other ranks get an empty list.
  StatusOr<std::vector<at::Tensor>> gather_state(at::Tensor Segment::*field) const {
    const DataParallel& dp = model_.data_parallel();
    const bool root = dp.rank() == 0;
    const auto fp32 = torch::TensorOptions().dtype(torch::kFloat32);
    std::vector<at::Tensor> out(root ? shapes_.size() : 0);
    const auto& units = model_.units();
    for (size_t k = 0; k < units.size(); ++k) {
      const FullyShardedModel::Unit& u = units[k];
      at::Tensor mine = torch::zeros({u.shard}, fp32);
      for (const Segment& s : segments_) {
        if (s.unit != k) continue;
        mine.narrow(0, s.range_offset, s.length).copy_((s.*field).reshape({-1}));
      }
      at::Tensor all = torch::empty({dp.world_size() * u.shard}, fp32);
      RELAY_RETURN_IF_ERROR(dp.group->all_gather(mine, all));
      if (!root) continue;
      for (const FullyShardedModel::Param& p : u.params) {
        out[p.index] = all.narrow(0, p.offset, p.numel).view(p.shape).clone();
      }
    }
    return out;
  }

  FullyShardedModel& model_;
  OptimizerOptions options_;
  double lr_;  // the last step's, saved with the state as torch's AdamW saves it
  bool use_master_ = false;
  std::vector<std::vector<int64_t>> shapes_;  // per parameter of the policy
  std::vector<at::ScalarType> dtypes_;        // what AdamW steps, per parameter
  std::vector<Segment> segments_;
  std::vector<int64_t> steps_;  // AdamW's step count per parameter (the same on every rank)
};

}  // namespace

StatusOr<std::unique_ptr<Optimizer>> make_fully_sharded_adamw(FullyShardedModel& model,
                                                              const OptimizerOptions& options) {
  return std::unique_ptr<Optimizer>(std::make_unique<FullyShardedAdamW>(model, options));
}

}  // namespace relay::trainer
