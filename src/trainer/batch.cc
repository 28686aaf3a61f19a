#include "relay/trainer/batch.h"

#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace relay::trainer {

namespace {

struct Row {
  int64_t group = 0;
  int64_t source = 0;  // index across all trajectories of all groups
  const rollout::Trajectory* t = nullptr;
};

std::string where(const rollout::TrajectoryGroup& g, size_t j) {
  return absl::StrCat("group '", g.group_id, "' trajectory ", j);
}

// The trajectories build_batch keeps, in input order, and the groups they
// belong to. Rows point into the caller's groups, which outlive the build.
struct Selection {
  std::vector<Row> rows;
  std::vector<std::string> group_ids;  // per kept group
  std::vector<double> baselines;       // per kept group
  int64_t seen = 0;                    // trajectories looked at
};

// Rejects what would make a batch row meaningless (invariant 1: every token
// has its version and behaviour log-prob) before any staleness decision, so a
// malformed trajectory fails the build even when it is stale.
Status check_row(const rollout::TrajectoryGroup& g, size_t j) {
  const rollout::Trajectory& t = g.trajectories[j];
  if (Status s = rollout::check_trajectory(t); !s.ok()) {
    return InvalidArgumentError(absl::StrCat(where(g, j), ": ", s.message()));
  }
  if (std::isnan(t.reward) || std::isinf(t.reward)) {
    return InvalidArgumentError(
        absl::StrCat(where(g, j), ": reward: ", t.reward, " (the trajectory was not scored)"));
  }
  if (t.response_tokens.empty()) {
    return InvalidArgumentError(absl::StrCat(where(g, j), ": response_tokens: empty"));
  }
  if (t.prompt_tokens.empty()) {
    return InvalidArgumentError(absl::StrCat(where(g, j), ": prompt_tokens: empty"));
  }
  if (t.prompt_tokens != g.trajectories[0].prompt_tokens) {
    return InvalidArgumentError(absl::StrCat(
        where(g, j), ": prompt_tokens: differ from trajectory 0's; a group shares one prompt"));
  }
  return OkStatus();
}

// Checks every trajectory and keeps those whose oldest token is at least
// `oldest`; a group with none kept is dropped whole. Counts into `st`.
StatusOr<Selection> select_fresh(const std::vector<rollout::TrajectoryGroup>& groups,
                                 int64_t oldest, BatchStats& st) {
  Selection sel;
  for (const rollout::TrajectoryGroup& g : groups) {
    ++st.groups;
    size_t kept_here = 0;
    for (size_t j = 0; j < g.trajectories.size(); ++j, ++sel.seen) {
      RELAY_RETURN_IF_ERROR(check_row(g, j));
      const rollout::Trajectory& t = g.trajectories[j];
      if (*std::min_element(t.token_versions.begin(), t.token_versions.end()) < oldest) {
        ++st.dropped_stale;
        continue;
      }
      sel.rows.push_back({static_cast<int64_t>(sel.group_ids.size()), sel.seen, &t});
      ++kept_here;
    }
    if (kept_here > 0) {
      sel.group_ids.push_back(g.group_id);
      sel.baselines.push_back(g.baseline ? g.baseline->reward : NAN);
    } else {
      ++st.dropped_groups;
    }
  }
  return sel;
}

// Padded sizes of the batch tensors. Routing (MoE expert ids) is optional per
// row, but the rows that carry it must agree on its shape to share a tensor.
struct Shape {
  int64_t B = 0, T = 0, L = 0;
  int32_t layers = 0, top_k = 0;  // 0 when no row carries routing
};

StatusOr<Shape> batch_shape(const std::vector<Row>& rows) {
  Shape s;
  s.B = static_cast<int64_t>(rows.size());
  for (const Row& r : rows) {
    s.T = std::max<int64_t>(s.T, r.t->prompt_tokens.size() + r.t->response_tokens.size());
    s.L = std::max<int64_t>(s.L, r.t->response_tokens.size());
    if (r.t->routed_experts.empty()) continue;
    if (s.layers == 0) {
      s.layers = r.t->routing_layers;
      s.top_k = r.t->routing_top_k;
    } else if (r.t->routing_layers != s.layers || r.t->routing_top_k != s.top_k) {
      return InvalidArgumentError(absl::StrCat(
          "trajectory ", r.source, ": routed_experts: ", r.t->routing_layers, " layers x ",
          r.t->routing_top_k, " experts, where the batch has ", s.layers, " x ", s.top_k));
    }
  }
  return s;
}

// Fills the tensors with their padding values: padded response positions stay
// masked out, with version -1 and log-prob 0.
void allocate(TrainBatch& batch, const Shape& s, int64_t pad_token_id) {
  const int64_t B = s.B, T = s.T, L = s.L;
  if (s.layers > 0) {
    batch.routed_experts = torch::full({B, T, s.layers, s.top_k}, -1, torch::kInt64);
  }
  batch.input_ids = torch::full({B, T}, pad_token_id, torch::kInt64);
  batch.lengths = torch::empty({B}, torch::kInt64);
  batch.prompt_lengths = torch::empty({B}, torch::kInt64);
  batch.response_lengths = torch::empty({B}, torch::kInt64);
  batch.response_mask = torch::zeros({B, L}, torch::kBool);
  batch.behavior_logprobs = torch::zeros({B, L}, torch::kFloat32);
  batch.proximal_logprobs = torch::zeros({B, L}, torch::kFloat32);
  batch.teacher_logprobs = torch::zeros({B, L}, torch::kFloat32);
  batch.proximal_versions = torch::full({B, L}, -1, torch::kInt64);
  batch.token_versions = torch::full({B, L}, -1, torch::kInt64);
  batch.offpolicy_mask = torch::zeros({B, L}, torch::kBool);
  batch.env_mask = torch::zeros({B, L}, torch::kBool);
  batch.rewards = torch::empty({B}, torch::kFloat32);
  batch.group_index = torch::empty({B}, torch::kInt64);
  batch.truncated = torch::zeros({B}, torch::kBool);
  batch.has_offpolicy = torch::zeros({B}, torch::kBool);
  batch.baseline_rewards = torch::full({B}, NAN, torch::kFloat32);
}

// Writes rows into an allocated batch through CPU accessors, made once rather
// than per row.
class RowWriter {
 public:
  RowWriter(TrainBatch& batch, const Shape& shape)
      : batch_(batch),
        shape_(shape),
        ids_(batch.input_ids.accessor<int64_t, 2>()),
        mask_(batch.response_mask.accessor<bool, 2>()),
        behav_(batch.behavior_logprobs.accessor<float, 2>()),
        prox_(batch.proximal_logprobs.accessor<float, 2>()),
        teacher_(batch.teacher_logprobs.accessor<float, 2>()),
        prox_v_(batch.proximal_versions.accessor<int64_t, 2>()),
        vers_(batch.token_versions.accessor<int64_t, 2>()),
        off_(batch.offpolicy_mask.accessor<bool, 2>()),
        env_(batch.env_mask.accessor<bool, 2>()),
        lengths_(batch.lengths.accessor<int64_t, 1>()),
        prompt_lengths_(batch.prompt_lengths.accessor<int64_t, 1>()),
        response_lengths_(batch.response_lengths.accessor<int64_t, 1>()),
        rewards_(batch.rewards.accessor<float, 1>()),
        group_index_(batch.group_index.accessor<int64_t, 1>()),
        truncated_(batch.truncated.accessor<bool, 1>()),
        has_offpolicy_(batch.has_offpolicy.accessor<bool, 1>()),
        baseline_(batch.baseline_rewards.accessor<float, 1>()) {}

  void write(int64_t b, const Row& row, double baseline) {
    const rollout::Trajectory& t = *row.t;
    const auto P = static_cast<int64_t>(t.prompt_tokens.size());
    const auto R = static_cast<int64_t>(t.response_tokens.size());
    for (int64_t i = 0; i < P; ++i) ids_[b][i] = t.prompt_tokens[i];
    for (int64_t j = 0; j < R; ++j) {
      ids_[b][P + j] = t.response_tokens[j];
      // An environment token is context, not an action: out of the loss.
      env_[b][j] = t.is_env_token(static_cast<size_t>(j));
      mask_[b][j] = !env_[b][j];
      behav_[b][j] = t.behavior_logprobs[j];  // NaN stays NaN
      prox_[b][j] = t.proximal_logprobs[j];
      teacher_[b][j] = t.teacher_logprobs.empty() ? NAN : t.teacher_logprobs[j];
      prox_v_[b][j] = t.proximal_versions[j];
      vers_[b][j] = t.token_versions[j];
      off_[b][j] = t.offpolicy_mask[j] != 0;
    }
    if (!t.routed_experts.empty()) {
      // Positions 0 .. P + R - 2, each layers x top_k ids.
      at::Tensor r = torch::tensor(t.routed_experts, torch::kInt32)
                         .view({P + R - 1, shape_.layers, shape_.top_k})
                         .to(torch::kInt64);
      batch_.routed_experts[b].narrow(0, 0, P + R - 1).copy_(r);
    }
    lengths_[b] = P + R;
    prompt_lengths_[b] = P;
    response_lengths_[b] = R;
    rewards_[b] = static_cast<float>(t.reward);
    group_index_[b] = row.group;
    truncated_[b] = t.finish_reason == rollout::FinishReason::kLength;
    has_offpolicy_[b] = t.num_forced() > 0;
    baseline_[b] = static_cast<float>(baseline);
    batch_.source_rows.push_back(row.source);
  }

 private:
  TrainBatch& batch_;
  Shape shape_;
  at::TensorAccessor<int64_t, 2> ids_;
  at::TensorAccessor<bool, 2> mask_;
  at::TensorAccessor<float, 2> behav_, prox_, teacher_;
  at::TensorAccessor<int64_t, 2> prox_v_, vers_;
  at::TensorAccessor<bool, 2> off_, env_;
  at::TensorAccessor<int64_t, 1> lengths_, prompt_lengths_, response_lengths_;
  at::TensorAccessor<float, 1> rewards_;
  at::TensorAccessor<int64_t, 1> group_index_;
  at::TensorAccessor<bool, 1> truncated_, has_offpolicy_;
  at::TensorAccessor<float, 1> baseline_;
};

}  // namespace

int64_t TrainBatch::num_tokens() const {
  return response_mask.defined() ? response_mask.sum().item<int64_t>() : 0;
}

StatusOr<TrainBatch> build_batch(const std::vector<rollout::TrajectoryGroup>& groups,
                                 const BatchOptions& options, BatchStats* stats) {
  BatchStats local;
  BatchStats& st = stats ? *stats : local;
  st = BatchStats{};
  const int64_t oldest =
      options.max_staleness < 0 ? INT64_MIN : options.trainer_version - options.max_staleness;

  RELAY_ASSIGN_OR_RETURN(Selection sel, select_fresh(groups, oldest, st));
  st.trajectories = static_cast<int64_t>(sel.rows.size());
  if (sel.rows.empty()) {
    return FailedPreconditionError(
        absl::StrCat("build_batch: no trajectory left of ", sel.seen, " (", st.dropped_stale,
                     " dropped as older than version ", oldest, " for trainer version ",
                     options.trainer_version, " with max_staleness ", options.max_staleness, ")"));
  }
  RELAY_ASSIGN_OR_RETURN(const Shape shape, batch_shape(sel.rows));

  TrainBatch batch;
  batch.group_ids = std::move(sel.group_ids);
  allocate(batch, shape, options.pad_token_id);
  RowWriter writer(batch, shape);
  for (int64_t b = 0; b < shape.B; ++b) {
    writer.write(b, sel.rows[b], sel.baselines[sel.rows[b].group]);
  }
  return batch;
}

at::Tensor gather_response(const at::Tensor& per_position, const TrainBatch& batch) {
  const int64_t B = batch.size();
  const int64_t L = batch.response_mask.size(1);
  TORCH_CHECK(per_position.dim() == 2 && per_position.size(0) == B,
              "gather_response: per_position must be [B, T - 1], got ", per_position.sizes());
  // Response token j of row b is scored at position P_b - 1 + j.
  at::Tensor mask = batch.response_mask.to(per_position.device());
  at::Tensor index = batch.prompt_lengths.to(per_position.device()).view({B, 1}) - 1 +
                     torch::arange(L, per_position.options().dtype(torch::kInt64)).view({1, L});
  index = index.clamp_max(per_position.size(1) - 1).masked_fill(mask.logical_not(), 0);
  return per_position.gather(1, index).masked_fill(mask.logical_not(), 0.0);
}

at::Tensor response_positions(const TrainBatch& batch) {
  const int64_t B = batch.size(), T = batch.input_ids.size(1);
  const int64_t L = batch.response_mask.size(1);
  if (T < 2) return torch::zeros({B, 0}, torch::kBool);
  // gather_response's index, each masked response token adding 1 at its
  // position (a masked-out one adds 0 at position 0).
  at::Tensor mask = batch.response_mask.to(torch::kCPU);
  at::Tensor index = batch.prompt_lengths.to(torch::kCPU, torch::kInt64).view({B, 1}) - 1 +
                     torch::arange(L, torch::kInt64).view({1, L});
  index = index.clamp(0, T - 2).masked_fill(mask.logical_not(), 0);
  return torch::zeros({B, T - 1}, torch::kInt32)
      .scatter_add_(1, index, mask.to(torch::kInt32))
      .gt(0);
}

TrainBatch select_rows(const TrainBatch& batch, const std::vector<int64_t>& rows) {
  at::Tensor index = torch::tensor(rows, torch::kInt64);
  TrainBatch out;
  out.lengths = batch.lengths.index_select(0, index);
  out.response_lengths = batch.response_lengths.index_select(0, index);
  const int64_t T = out.lengths.max().item<int64_t>();
  const int64_t L = out.response_lengths.max().item<int64_t>();
  auto rows_of = [&](const at::Tensor& t, int64_t width) {
    return t.index_select(0, index).narrow(1, 0, width).contiguous();
  };
  out.input_ids = rows_of(batch.input_ids, T);
  out.prompt_lengths = batch.prompt_lengths.index_select(0, index);
  out.response_mask = rows_of(batch.response_mask, L);
  out.behavior_logprobs = rows_of(batch.behavior_logprobs, L);
  out.proximal_logprobs = rows_of(batch.proximal_logprobs, L);
  out.teacher_logprobs = rows_of(batch.teacher_logprobs, L);
  out.proximal_versions = rows_of(batch.proximal_versions, L);
  out.token_versions = rows_of(batch.token_versions, L);
  out.offpolicy_mask = rows_of(batch.offpolicy_mask, L);
  out.env_mask = rows_of(batch.env_mask, L);
  out.rewards = batch.rewards.index_select(0, index);
  out.group_index = batch.group_index.index_select(0, index);
  out.truncated = batch.truncated.index_select(0, index);
  out.has_offpolicy = batch.has_offpolicy.index_select(0, index);
  out.baseline_rewards = batch.baseline_rewards.index_select(0, index);
  if (batch.routed_experts.defined()) out.routed_experts = rows_of(batch.routed_experts, T);
  out.group_ids = batch.group_ids;  // group_index still points into it
  for (int64_t r : rows) out.source_rows.push_back(batch.source_rows.at(r));
  return out;
}

std::vector<std::vector<int64_t>> split_by_token_budget(const TrainBatch& batch, int64_t max_tokens,
                                                        TokenBudget budget) {
  const int64_t B = batch.size();
  std::vector<int64_t> order(B);
  std::iota(order.begin(), order.end(), 0);
  at::Tensor lengths = batch.lengths.to(torch::kCPU).contiguous();
  const int64_t* len = lengths.data_ptr<int64_t>();
  // Longest first: each micro-batch's padded width is its first row's length.
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return len[a] > len[b]; });
  std::vector<std::vector<int64_t>> out;
  int64_t width = 0, tokens = 0;
  for (int64_t row : order) {
    const bool fits =
        !out.empty() && (budget == TokenBudget::kReal
                             ? tokens + len[row] <= max_tokens
                             : static_cast<int64_t>(out.back().size() + 1) * width <= max_tokens);
    if (!fits) {
      out.emplace_back();
      width = len[row];
      tokens = 0;
    }
    out.back().push_back(row);
    tokens += len[row];
  }
  return out;
}

PackedRows pack_rows(const TrainBatch& batch, int64_t width, int64_t pad_token_id) {
  const int64_t B = batch.size();
  at::Tensor lengths = batch.lengths.to(torch::kCPU, torch::kInt64).contiguous();
  const int64_t* len = lengths.data_ptr<int64_t>();
  std::vector<int64_t> order(static_cast<size_t>(B));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return len[a] > len[b]; });
  for (int64_t b = 0; b < B; ++b) width = std::max(width, len[b]);
  // First fit, longest first.
  std::vector<int64_t> used, row_of(static_cast<size_t>(B)), offset_of(static_cast<size_t>(B));
  for (int64_t b : order) {
    size_t r = 0;
    while (r < used.size() && used[r] + len[b] > width) ++r;
    if (r == used.size()) used.push_back(0);
    row_of[static_cast<size_t>(b)] = static_cast<int64_t>(r);
    offset_of[static_cast<size_t>(b)] = used[r];
    used[r] += len[b];
  }
  const int64_t R = static_cast<int64_t>(used.size());
  PackedRows p;
  p.input_ids = torch::full({R, width}, pad_token_id, torch::kInt64);
  // A padding position is a sequence of its own: it starts where it is.
  p.sequence_starts = torch::arange(width, torch::kInt64).repeat({R, 1});
  const bool routed = batch.routed_experts.defined();
  if (routed) {
    const at::Tensor& r = batch.routed_experts;
    p.routed_experts = torch::full({R, width, r.size(2), r.size(3)}, -1, r.options());
  }
  for (int64_t b = 0; b < B; ++b) {
    const int64_t r = row_of[static_cast<size_t>(b)], o = offset_of[static_cast<size_t>(b)];
    p.input_ids[r].narrow(0, o, len[b]).copy_(batch.input_ids[b].narrow(0, 0, len[b]));
    p.sequence_starts[r].narrow(0, o, len[b]).fill_(o);
    if (routed) {
      p.routed_experts[r].narrow(0, o, len[b]).copy_(batch.routed_experts[b].narrow(0, 0, len[b]));
    }
  }
  p.lengths = torch::tensor(used, torch::kInt64);
  p.packed_row = torch::tensor(row_of, torch::kInt64);
  p.offset = torch::tensor(offset_of, torch::kInt64);
  return p;
}

namespace {

// Where position t of batch row b lies in the packed rows, flattened
// ([R * Wp], Wp = the packed width less `shift`), and whether row b reaches
// position t: [B, T - shift] each, on `device`.
struct PackedIndex {
  at::Tensor index;  // int64
  at::Tensor valid;  // bool
};

PackedIndex packed_index(const PackedRows& packed, const TrainBatch& batch, int64_t shift,
                         c10::Device device) {
  const int64_t B = batch.size(), Tp = batch.input_ids.size(1) - shift;
  const int64_t Wp = packed.input_ids.size(1) - shift;
  const auto opts = torch::TensorOptions().dtype(torch::kInt64).device(device);
  at::Tensor t = torch::arange(Tp, opts).view({1, Tp});
  PackedIndex p;
  p.valid = t.lt((batch.lengths.to(opts) - shift).view({B, 1}));
  p.index = (packed.packed_row.to(opts) * Wp + packed.offset.to(opts)).view({B, 1}) + t;
  return p;
}

}  // namespace

at::Tensor unpack_positions(const at::Tensor& per_position, const PackedRows& packed,
                            const TrainBatch& batch) {
  const int64_t W = packed.input_ids.size(1);
  const int64_t Wp = per_position.size(1);
  TORCH_CHECK(per_position.dim() == 2 && per_position.size(0) == packed.input_ids.size(0) &&
                  (Wp == W || Wp == W - 1),
              "unpack_positions: per_position must be [R, W] or [R, W - 1] of the packed rows, "
              "got ",
              per_position.sizes());
  const PackedIndex p = packed_index(packed, batch, W - Wp, per_position.device());
  const at::Tensor invalid = p.valid.logical_not();
  const at::Tensor index = p.index.masked_fill(invalid, 0);
  at::Tensor out =
      per_position.reshape({-1}).index_select(0, index.reshape({-1})).view(index.sizes());
  return out.masked_fill(invalid, 0);
}

at::Tensor pack_positions(const at::Tensor& per_position, const PackedRows& packed,
                          const TrainBatch& batch) {
  const int64_t B = batch.size(), T = batch.input_ids.size(1);
  const int64_t R = packed.input_ids.size(0), W = packed.input_ids.size(1);
  const int64_t Tp = per_position.size(1);
  TORCH_CHECK(per_position.dim() == 2 && per_position.size(0) == B && (Tp == T || Tp == T - 1),
              "pack_positions: per_position must be [B, T] or [B, T - 1] of the batch, got ",
              per_position.sizes());
  const PackedIndex p = packed_index(packed, batch, T - Tp, per_position.device());
  const int64_t Wp = W - (T - Tp);
  at::Tensor out = torch::zeros({R * Wp}, per_position.options());
  out.index_put_({p.index.masked_select(p.valid)}, per_position.masked_select(p.valid));
  return out.view({R, Wp});
}

double frac_behavior_logprobs_valid(const TrainBatch& batch) {
  const int64_t n = batch.num_tokens();
  if (n == 0) return 1.0;
  at::Tensor finite = batch.behavior_logprobs.isfinite().logical_and(batch.response_mask);
  return static_cast<double>(finite.sum().item<int64_t>()) / static_cast<double>(n);
}

Status check_behavior_logprobs(const TrainBatch& batch) {
  at::Tensor missing =
      batch.behavior_logprobs.isfinite().logical_not().logical_and(batch.response_mask);
  const int64_t count = missing.sum().item<int64_t>();
  if (count == 0) return OkStatus();
  at::Tensor first = missing.nonzero()[0];
  const int64_t b = first[0].item<int64_t>(), j = first[1].item<int64_t>();
  const std::string& group = batch.group_ids.at(batch.group_index[b].item<int64_t>());
  return FailedPreconditionError(absl::StrCat(
      "behavior log-probs missing for ", count, " of ", batch.num_tokens(),
      " response tokens (first: group '", group, "', batch row ", b, ", response token ", j,
      "). The rollout worker records them when it samples each token (DESIGN.md invariant 1); "
      "without them the importance ratio is meaningless. Fix the worker, or set "
      "trainer.allow_missing_logprobs to train those tokens on-policy (ratio 1)."));
}

namespace {

struct Fnv1a {
  uint64_t h = 1469598103934665603ull;
  void bytes(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) {
      h ^= p[i];
      h *= 1099511628211ull;
    }
  }
  template <typename T>
  void vec(const std::vector<T>& v) {
    const uint64_t n = v.size();
    bytes(&n, sizeof(n));
    if (!v.empty()) bytes(v.data(), v.size() * sizeof(T));
  }
};

}  // namespace

uint64_t trajectory_key(const std::string& group_id, size_t index, const rollout::Trajectory& t) {
  Fnv1a f;
  f.vec(std::vector<char>(group_id.begin(), group_id.end()));
  const uint64_t i = index;
  f.bytes(&i, sizeof(i));
  f.vec(t.prompt_tokens);
  f.vec(t.response_tokens);
  f.vec(t.token_versions);
  f.vec(t.behavior_logprobs);
  return f.h;
}

int ReuseCounter::uses(uint64_t key) const {
  auto it = entries_.find(key);
  return it == entries_.end() ? 0 : it->second.uses;
}

void ReuseCounter::record(const std::vector<uint64_t>& keys, int64_t version) {
  for (uint64_t key : keys) {
    Entry& e = entries_[key];
    ++e.uses;
    e.last_version = version;
  }
}

void ReuseCounter::forget_before(int64_t version) {
  for (auto it = entries_.begin(); it != entries_.end();) {
    it = it->second.last_version < version ? entries_.erase(it) : std::next(it);
  }
}

}  // namespace relay::trainer
