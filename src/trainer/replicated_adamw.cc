// trainer.sharding: none. Every rank holds the whole optimizer: torch's
// AdamW's state over the parameters or over their fp32 master copies,
// stepped by adamw_update: one pass per fp32 tensor (adamw_kernel.h) where
// AdamW::step makes eight, with its result bit for bit.

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "trainer/adamw_internal.h"

namespace relay::trainer {
namespace {

class ReplicatedAdamW final : public Optimizer {
 public:
  ReplicatedAdamW(const std::vector<at::Tensor>& params, const OptimizerOptions& options,
                  const DataParallel& dp)
      : params_(params), options_(options), dp_(dp) {
    for (const at::Tensor& p : params_) {
      if (options.fp32_master_weights && p.scalar_type() != torch::kFloat32) {
        // Mixed fp32 / low-precision parameters: fp32 ones get a master
        // copy too, so that one list of tensors lines up with the parameters.
        for (const at::Tensor& q : params_) {
          master_.push_back(q.detach().to(torch::kFloat32).clone().set_requires_grad(true));
        }
        break;
      }
    }
    stepped_ = master_.empty() ? params_ : master_;
    adamw_ = std::make_unique<torch::optim::AdamW>(stepped_, adamw_options(options));
  }

  void zero_grad() override {
    adamw_->zero_grad();
    for (at::Tensor& p : params_) p.mutable_grad().reset();
  }

  StatusOr<double> step(double lr, double max_norm,
                        const std::function<void()>& on_apply) override {
    if (!master_.empty()) {
      // Gradients move to the fp32 master copies; the low-precision ones go.
      for (size_t i = 0; i < params_.size(); ++i) {
        if (params_[i].grad().defined()) {
          master_[i].mutable_grad() = params_[i].grad().detach().to(torch::kFloat32);
        }
        params_[i].mutable_grad().reset();
      }
    }
    if (dp_.active()) {
      // Summed in fp32 (the master copies' gradients when there are any).
      if (Status s = all_reduce_gradients(*dp_.group, stepped_, dp_.bucket_bytes); !s.ok()) {
        zero_grad();
        return s;
      }
    }
    const double grad_norm = torch::nn::utils::clip_grad_norm_(stepped_, max_norm);
    if (!std::isfinite(grad_norm)) {
      zero_grad();
      return InternalError(
          absl::StrCat("gradient norm is ", grad_norm, "; the update was not applied"));
    }
    for (auto& group : adamw_->param_groups()) {
      static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
    }
    on_apply();
    apply_adamw(lr);
    if (!master_.empty()) {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < params_.size(); ++i) params_[i].copy_(master_[i]);
    }
    // The gradients are spent: free them now rather than at the next
    // zero_grad(), so they do not sit in memory through the next pre-update
    // pass and the wait for rollouts.
    zero_grad();
    return grad_norm;
  }

  Status save(torch::serialize::OutputArchive& archive) const override {
    write_master(archive, master_);
    torch::serialize::OutputArchive opt;
    adamw_->save(opt);
    archive.write("optimizer", opt);
    return OkStatus();
  }

  bool save_is_collective() const override { return false; }

  StatusOr<std::function<void()>> read_state(torch::serialize::InputArchive& archive,
                                             const std::string& path) override {
    std::vector<std::vector<int64_t>> shapes;
    std::vector<at::ScalarType> dtypes;
    for (const at::Tensor& p : stepped_) {
      shapes.push_back(p.sizes().vec());
      dtypes.push_back(p.scalar_type());
    }
    RELAY_ASSIGN_OR_RETURN(WholeAdamWState whole,
                           read_whole_adamw(archive, path, shapes, dtypes, !master_.empty()));
    return std::function<void()>([this, whole = std::move(whole)] {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < stepped_.size(); ++i) {
        const at::Tensor& p = stepped_[i];
        if (whole.steps[i] == 0) {
          clear_adamw_state(*adamw_, p);
        } else {
          set_adamw_state(*adamw_, p, whole.steps[i],
                          whole.exp_avg[i].to(p.device(), p.scalar_type()),
                          whole.exp_avg_sq[i].to(p.device(), p.scalar_type()));
        }
      }
      for (size_t i = 0; i < master_.size(); ++i) master_[i].copy_(whole.master[i]);
    });
  }

  OptimizerMemory memory() const override {
    OptimizerMemory m;
    for (const at::Tensor& t : master_) m.master += bytes_of(t);
    // What backward allocates: one gradient like each stepped tensor (the
    // fp32 master copies when there are any), freed after the update.
    for (const at::Tensor& t : stepped_) m.gradients += bytes_of(t);
    for (const at::Tensor& p : stepped_) {
      if (torch::optim::AdamWParamState* st = adamw_state(*adamw_, p)) {
        m.moments +=
            bytes_of(st->exp_avg()) + bytes_of(st->exp_avg_sq()) + bytes_of(st->max_exp_avg_sq());
      }
    }
    return m;
  }

 private:
  // AdamW::step's bookkeeping (a first step creates zero moments, tensors
  // without a gradient are skipped) around adamw_update.
  void apply_adamw(double lr) {
    torch::NoGradGuard no_grad;
    for (at::Tensor& p : stepped_) {
      if (!p.grad().defined()) continue;
      torch::optim::AdamWParamState* st = adamw_state(*adamw_, p);
      if (st == nullptr) {
        set_adamw_state(*adamw_, p, 0, torch::zeros_like(p, at::MemoryFormat::Preserve),
                        torch::zeros_like(p, at::MemoryFormat::Preserve));
        st = adamw_state(*adamw_, p);
      }
      st->step(st->step() + 1);
      at::Tensor exp_avg = st->exp_avg(), exp_avg_sq = st->exp_avg_sq();
      adamw_update(p, p.grad(), exp_avg, exp_avg_sq, st->step(), options_, lr);
    }
  }

  std::vector<at::Tensor> params_;   // the policy's
  std::vector<at::Tensor> master_;   // empty unless master weights are in use
  std::vector<at::Tensor> stepped_;  // what AdamW steps: params_ or master_
  std::unique_ptr<torch::optim::AdamW> adamw_;
  OptimizerOptions options_;
  DataParallel dp_;
};

}  // namespace

std::unique_ptr<Optimizer> make_replicated_adamw(const std::vector<at::Tensor>& params,
                                                 const OptimizerOptions& options,
                                                 const DataParallel& dp) {
  return std::make_unique<ReplicatedAdamW>(params, options, dp);
}

}  // namespace relay::trainer
