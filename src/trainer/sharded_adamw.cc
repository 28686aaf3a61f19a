// trainer.sharding: optimizer (ZeRO-1, with stage 2's fp32 gradients).
//
// The parameters, flattened and laid end to end in their order, form one
// index space of N elements, cut into world_size ranges of S = ceil(N / W)
// (the last one shorter). Rank r owns [r*S, r*S + S): for each parameter
// that overlaps it (a segment), the fp32 master copy of that slice (when
// master weights are on), both AdamW moments, and, during an update, the
// slice of the summed fp32 gradient. A step:
//   1. which parameters have a gradient on any rank (one small all-reduce;
//      one without is skipped by AdamW, as torch's AdamW skips it);
//   2. reduce-scatter of the local gradients, in buckets: bucket k holds,
//      for every rank q, the q-th range's elements [c0, c1), so each rank
//      gets the sums of its own range's [c0, c1); then the full-size local
//      gradients are freed;
//   3. the global L2 norm from the ranks' sums of squares, the clip;
//   4. AdamW on each segment, op for op as on the whole tensor;
//   5. all-gather of the updated ranges, in buckets, into every rank's
//      parameters.
// The AdamW update is elementwise, so a slice updated alone is the slice of
// the tensor updated whole; what can differ from the replicated optimizer is
// the order of the gradient sums (a reduce-scatter adds in another order than
// an all-reduce over other bucket boundaries) and of the norm's sum.

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "trainer/adamw_internal.h"

namespace relay::trainer {
namespace {

// The part of parameter `param` that lies in a flat range.
struct Piece {
  size_t param = 0;
  int64_t param_offset = 0;  // in the flattened parameter
  int64_t length = 0;
  int64_t range_offset = 0;  // from the start of the range
};

// A parameter's slice in this rank's range, and its optimizer state.
struct Segment {
  Piece piece;        // range_offset: from the start of this rank's range
  at::Tensor master;  // fp32; undefined without master weights
  at::Tensor exp_avg, exp_avg_sq;
};

class ShardedAdamW final : public Optimizer {
 public:
  ShardedAdamW(const std::vector<at::Tensor>& params, const OptimizerOptions& options,
               const DataParallel& dp)
      : params_(params), options_(options), dp_(dp), lr_(options.lr) {
    int64_t total = 0;
    for (const at::Tensor& p : params_) {
      offsets_.push_back(total);
      total += p.numel();
      if (options.fp32_master_weights && p.scalar_type() != torch::kFloat32) use_master_ = true;
    }
    total_ = total;
    const int64_t world = dp_.world_size();
    shard_ = (total_ + world - 1) / world;
    begin_ = std::min(total_, shard_ * dp_.rank());
    torch::NoGradGuard no_grad;
    for (const Piece& p : pieces(begin_, shard_)) {
      Segment s;
      s.piece = p;
      at::Tensor slice = flat_slice(p);
      if (use_master_) s.master = slice.to(torch::kFloat32).clone();
      const at::Tensor& work = use_master_ ? s.master : slice;
      s.exp_avg = torch::zeros_like(work);
      s.exp_avg_sq = torch::zeros_like(work);
      segments_.push_back(std::move(s));
    }
    steps_.assign(params_.size(), 0);
    // What travels in the all-gather: the parameters' own dtype when they
    // share one the backend carries (Gloo has no bfloat16 in LibTorch 1.13),
    // else fp32.
    gather_dtype_ = params_.front().scalar_type();
    for (const at::Tensor& p : params_) {
      if (p.scalar_type() != gather_dtype_) gather_dtype_ = torch::kFloat32;
    }
    if (!params_.front().is_cuda() && gather_dtype_ != torch::kFloat64) {
      gather_dtype_ = torch::kFloat32;
    }
  }

  void zero_grad() override {
    for (at::Tensor& p : params_) p.mutable_grad().reset();
  }

  StatusOr<double> step(double lr, double max_norm,
                        const std::function<void()>& on_apply) override {
    torch::NoGradGuard no_grad;
    Collectives& group = *dp_.group;
    // 1. Which parameters have a gradient anywhere.
    at::Tensor defined = torch::zeros({static_cast<int64_t>(params_.size())}, torch::kFloat32);
    for (size_t i = 0; i < params_.size(); ++i) {
      if (params_[i].grad().defined()) defined[static_cast<int64_t>(i)] = 1.0f;
    }
    if (Status s = group.all_reduce_sum(defined); !s.ok()) {
      zero_grad();
      return s;
    }
    std::vector<bool> stepped(params_.size());
    for (size_t i = 0; i < params_.size(); ++i) {
      stepped[i] = defined[static_cast<int64_t>(i)].item<float>() > 0;
    }
    // 2. This rank's range of the summed gradient.
    StatusOr<at::Tensor> grad = reduce_scatter_gradients(group);
    zero_grad();
    if (!grad.ok()) return grad.status();
    // 3. The global norm and the clip.
    at::Tensor sum_sq = torch::zeros({1}, torch::kFloat64);
    {
      const double norm = grad->norm().item<double>();
      sum_sq[0] = norm * norm;
    }
    RELAY_RETURN_IF_ERROR(group.all_reduce_sum(sum_sq));
    const double grad_norm = std::sqrt(sum_sq[0].item<double>());
    if (!std::isfinite(grad_norm)) {
      return InternalError(
          absl::StrCat("gradient norm is ", grad_norm, "; the update was not applied"));
    }
    // As torch's clip_grad_norm_: the coefficient in fp32, applied below 1.
    const float clip = static_cast<float>(max_norm) / static_cast<float>(grad_norm + 1e-6);
    if (clip < 1.0f) grad->mul_(clip);
    // 4. AdamW on this rank's segments.
    on_apply();
    lr_ = lr;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (stepped[i]) ++steps_[i];
    }
    for (Segment& s : segments_) {
      const size_t i = s.piece.param;
      if (!stepped[i]) continue;
      at::Tensor slice = flat_slice(s.piece);
      at::Tensor work = use_master_ ? s.master : slice;
      at::Tensor g = grad->narrow(0, s.piece.range_offset, s.piece.length);
      if (g.scalar_type() != work.scalar_type()) g = g.to(work.scalar_type());
      adamw_update(work, g, s.exp_avg, s.exp_avg_sq, steps_[i], options_, lr);
      if (use_master_) slice.copy_(s.master);
    }
    grad = at::Tensor();  // spent: freed before the gather
    // 5. Every rank's range into every rank's parameters.
    RELAY_RETURN_IF_ERROR(all_gather_parameters(group));
    return grad_norm;
  }

  Status save(torch::serialize::OutputArchive& archive) const override {
    torch::NoGradGuard no_grad;
    Collectives& group = *dp_.group;
    std::vector<at::Tensor> master, exp_avg, exp_avg_sq;
    if (use_master_) {
      RELAY_ASSIGN_OR_RETURN(master, gather_state(group, &Segment::master));
    }
    RELAY_ASSIGN_OR_RETURN(exp_avg, gather_state(group, &Segment::exp_avg));
    RELAY_ASSIGN_OR_RETURN(exp_avg_sq, gather_state(group, &Segment::exp_avg_sq));
    if (dp_.rank() != 0) return OkStatus();
    // The layout of a replicated optimizer: torch's AdamW over the stepped
    // tensors (the master copies, or the parameters), with their state.
    WholeAdamWState whole{std::move(master), steps_, std::move(exp_avg), std::move(exp_avg_sq)};
    write_whole_adamw(archive, whole, shapes(), stepped_dtypes(), options_, lr_);
    return OkStatus();
  }

  bool save_is_collective() const override { return true; }

  StatusOr<std::function<void()>> read_state(torch::serialize::InputArchive& archive,
                                             const std::string& path) override {
    RELAY_ASSIGN_OR_RETURN(WholeAdamWState whole, read_whole_adamw(archive, path, shapes(),
                                                                   stepped_dtypes(), use_master_));
    // Everything fits: installing is taking this rank's slices of it.
    return std::function<void()>([this, whole = std::move(whole)] {
      steps_ = whole.steps;
      for (Segment& s : segments_) {
        take_state_slice(whole, s.piece.param, s.piece.param_offset, s.piece.length, s.exp_avg,
                         s.exp_avg_sq, s.master);
      }
    });
  }

  OptimizerMemory memory() const override {
    OptimizerMemory m;
    for (const Segment& s : segments_) {
      m.master += bytes_of(s.master);
      m.moments += bytes_of(s.exp_avg) + bytes_of(s.exp_avg_sq);
    }
    // Backward's gradients are the parameters' own, whole; the update holds
    // this rank's range of their fp32 sum.
    for (const at::Tensor& p : params_) m.gradients += bytes_of(p);
    m.gradients += shard_ * 4;
    return m;
  }

 private:
  // The pieces of the flat range [start, start + n) that lie in [0, N).
  std::vector<Piece> pieces(int64_t start, int64_t n) const {
    std::vector<Piece> out;
    const int64_t end = std::min(total_, start + n);
    if (start >= end) return out;
    auto it = std::upper_bound(offsets_.begin(), offsets_.end(), start);
    size_t i = static_cast<size_t>(it - offsets_.begin()) - 1;
    for (int64_t pos = start; pos < end; ++i) {
      const int64_t param_end = offsets_[i] + params_[i].numel();
      if (params_[i].numel() == 0 || param_end <= pos) continue;
      Piece p;
      p.param = i;
      p.param_offset = pos - offsets_[i];
      p.length = std::min(end, param_end) - pos;
      p.range_offset = pos - start;
      out.push_back(p);
      pos += p.length;
    }
    return out;
  }

  // The parameter's elements `piece` names, as a view that writes through.
  at::Tensor flat_slice(const Piece& piece) const {
    return params_[piece.param].detach().view({-1}).narrow(0, piece.param_offset, piece.length);
  }

  int64_t bucket_elements() const {
    const int64_t per_rank = dp_.bucket_bytes / 4 / dp_.world_size();
    return std::max<int64_t>(1, per_rank);
  }

  StatusOr<at::Tensor> reduce_scatter_gradients(Collectives& group) const {
    const c10::Device device = params_.front().device();
    const auto fp32 = torch::TensorOptions().dtype(torch::kFloat32).device(device);
    at::Tensor mine = torch::zeros({shard_}, fp32);
    const int world = dp_.world_size();
    const int64_t chunk = bucket_elements();
    for (int64_t c0 = 0; c0 < shard_; c0 += chunk) {
      const int64_t n = std::min(chunk, shard_ - c0);
      at::Tensor full = torch::zeros({world * n}, fp32);
      for (int q = 0; q < world; ++q) {
        for (const Piece& p : pieces(q * shard_ + c0, n)) {
          const at::Tensor& g = params_[p.param].grad();
          if (!g.defined()) continue;  // no rows here touched it: zeros
          full.narrow(0, q * n + p.range_offset, p.length)
              .copy_(g.reshape({-1}).narrow(0, p.param_offset, p.length));
        }
      }
      at::Tensor out = mine.narrow(0, c0, n);
      RELAY_RETURN_IF_ERROR(group.reduce_scatter_sum(full, out));
    }
    return mine;
  }

  Status all_gather_parameters(Collectives& group) {
    const c10::Device device = params_.front().device();
    const auto options = torch::TensorOptions().dtype(gather_dtype_).device(device);
    const int world = dp_.world_size();
    const int64_t chunk = bucket_elements();
    for (int64_t c0 = 0; c0 < shard_; c0 += chunk) {
      const int64_t n = std::min(chunk, shard_ - c0);
      at::Tensor mine = torch::zeros({n}, options);
      for (const Piece& p : pieces(begin_ + c0, n)) {
        mine.narrow(0, p.range_offset, p.length).copy_(flat_slice(p));
      }
      at::Tensor all = torch::empty({world * n}, options);
      RELAY_RETURN_IF_ERROR(group.all_gather(mine, all));
      for (int q = 0; q < world; ++q) {
        if (q == dp_.rank()) continue;
        for (const Piece& p : pieces(q * shard_ + c0, n)) {
          flat_slice(p).copy_(all.narrow(0, q * n + p.range_offset, p.length));
        }
      }
    }
    return OkStatus();
  }

  // One state tensor of every segment (`field`), gathered into rank 0 as a
  // tensor per parameter in the parameter's shape (fp32); the other ranks
  // get an empty list. In buckets, so that they hold no more than one.
  StatusOr<std::vector<at::Tensor>> gather_state(Collectives& group,
                                                 at::Tensor Segment::*field) const {
    const auto fp32 = torch::TensorOptions().dtype(torch::kFloat32);
    at::Tensor mine = torch::zeros({shard_}, fp32);
    for (const Segment& s : segments_) {
      mine.narrow(0, s.piece.range_offset, s.piece.length).copy_((s.*field).reshape({-1}));
    }
    const int world = dp_.world_size();
    const bool root = dp_.rank() == 0;
    at::Tensor flat = root ? torch::zeros({world * shard_}, fp32) : at::Tensor();
    const int64_t chunk = bucket_elements();
    for (int64_t c0 = 0; c0 < shard_; c0 += chunk) {
      const int64_t n = std::min(chunk, shard_ - c0);
      at::Tensor all = torch::empty({world * n}, fp32);
      RELAY_RETURN_IF_ERROR(group.all_gather(mine.narrow(0, c0, n).contiguous(), all));
      if (!root) continue;
      for (int q = 0; q < world; ++q) {
        flat.narrow(0, q * shard_ + c0, n).copy_(all.narrow(0, q * n, n));
      }
    }
    std::vector<at::Tensor> out;
    if (!root) return out;
    for (size_t i = 0; i < params_.size(); ++i) {
      out.push_back(flat.narrow(0, offsets_[i], params_[i].numel()).view(params_[i].sizes()));
    }
    return out;
  }

  std::vector<std::vector<int64_t>> shapes() const {
    std::vector<std::vector<int64_t>> out;
    for (const at::Tensor& p : params_) out.push_back(p.sizes().vec());
    return out;
  }

  // The dtypes torch's AdamW would step: the master copies' or the
  // parameters' own.
  std::vector<at::ScalarType> stepped_dtypes() const {
    std::vector<at::ScalarType> out;
    for (const at::Tensor& p : params_)
      out.push_back(use_master_ ? torch::kFloat32 : p.scalar_type());
    return out;
  }

  std::vector<at::Tensor> params_;
  OptimizerOptions options_;
  DataParallel dp_;
  double lr_;  // the last step's, saved with the state as torch's AdamW saves it
  bool use_master_ = false;
  std::vector<int64_t> offsets_;  // each parameter's first flat index
  int64_t total_ = 0;             // N
  int64_t shard_ = 0;             // S: the elements of a rank's range
  int64_t begin_ = 0;             // this rank's first flat index
  std::vector<Segment> segments_;
  std::vector<int64_t> steps_;  // AdamW's step count per parameter (the same on every rank)
  at::ScalarType gather_dtype_ = torch::kFloat32;
};

}  // namespace

StatusOr<std::unique_ptr<Optimizer>> make_sharded_adamw(const std::vector<at::Tensor>& params,
                                                        const OptimizerOptions& options,
                                                        const DataParallel& dp) {
  const c10::Device device = params.front().device();
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].is_contiguous()) {
      return InvalidArgumentError(absl::StrCat("trainer.sharding: optimizer: parameter ", i,
                                               " is not contiguous in memory"));
    }
    if (params[i].device() != device) {
      return InvalidArgumentError(
          absl::StrCat("trainer.sharding: optimizer: parameters on more than one device (",
                       device.str(), " and ", params[i].device().str(), ")"));
    }
  }
  return std::unique_ptr<Optimizer>(std::make_unique<ShardedAdamW>(params, options, dp));
}

}  // namespace relay::trainer
