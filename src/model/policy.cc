#include "relay/model/policy.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "model/extend_plan.h"
#include "model/row_linear.h"
#include "relay/model/core_share.h"
#include "relay/model/device.h"
#include "relay/model/kv_cache.h"
#include "relay/model/lm_head.h"
#include "relay/model/lora.h"
#include "relay/model/rope.h"

namespace relay::model {
namespace {

// [B, T - 1] bool: the positions score() runs through the LM head (neither
// padding, nor a packed sequence's last position, nor left out of
// options.scored); undefined when nothing restricts them.
at::Tensor scored_positions(int64_t B, int64_t T, const at::Tensor& lengths,
                            const ScoreOptions& options, c10::Device device) {
  at::Tensor keep;
  auto also = [&](const at::Tensor& m) { keep = keep.defined() ? keep.logical_and(m) : m; };
  if (options.scored.defined()) also(options.scored.to(device, torch::kBool));
  if (lengths.defined()) {
    at::Tensor len = lengths.to(device, torch::kInt64).view({B, 1});
    also(torch::arange(T - 1, len.options()).view({1, T - 1}).lt(len - 1));
  }
  if (options.sequence_starts.defined()) {
    // A sequence's last position would predict the next sequence's first token.
    at::Tensor starts = options.sequence_starts.to(device, torch::kInt64);
    also(starts.narrow(1, 1, T - 1).eq(starts.narrow(1, 0, T - 1)));
  }
  return keep;
}

// mask[b, 0, t, s]: query t of row b sits at absolute position past[b] + t and
// may attend key s when s <= past[b] + t (causal) and s < past[b] + len[b]
// (no padding keys). Every row sees at least key 0, so softmax never meets an
// all-masked row, padding queries included.
at::Tensor attention_mask(const at::Tensor& past, const at::Tensor& len, int64_t T, int64_t S) {
  auto opts = torch::TensorOptions().dtype(torch::kInt64).device(past.device());
  at::Tensor key = torch::arange(S, opts).view({1, 1, 1, S});
  at::Tensor query_pos =
      (past.view({-1, 1}) + torch::arange(T, opts).view({1, T})).view({-1, 1, T, 1});
  at::Tensor end = (past + len).view({-1, 1, 1, 1});
  return key.le(query_pos).logical_and(key.lt(end));
}

// Packed rows: query t may attend key s when both lie in the same sequence
// (the same start) and s <= t. Every query sees at least itself.
at::Tensor packed_attention_mask(const at::Tensor& starts) {
  const int64_t T = starts.size(1);
  auto opts = torch::TensorOptions().dtype(torch::kInt64).device(starts.device());
  at::Tensor t = torch::arange(T, opts);
  at::Tensor causal = t.view({1, T}).le(t.view({T, 1})).view({1, T, T});
  return starts.unsqueeze(2).eq(starts.unsqueeze(1)).logical_and(causal).unsqueeze(1);
}

// Activation checkpointing of one decoder layer (the reentrant form of
// torch.utils.checkpoint): the forward runs without autograd and keeps the
// layer's input; backward reruns the layer with autograd, under the autocast
// the forward had and with the MoE routing the forward chose, and
// backpropagates through it (parameter gradients accumulate as usual).
class CheckpointedLayer : public torch::autograd::Function<CheckpointedLayer> {
 public:
  // `hooks` (may be null): a sharded layer's weights are acquired for the
  // forward and for the recompute (LayerHooks).
  static at::Tensor forward(torch::autograd::AutogradContext* ac, const at::Tensor& x,
                            DecoderLayerImpl* layer, const ForwardContext* fctx, LayerHooks* hooks,
                            int64_t index) {
    ForwardContext run = *fctx;
    MoeRouting local;
    MoeRouting* outer = fctx->routing;
    const bool moe = layer->moe_index() >= 0;
    if (moe) {
      if (outer != nullptr) {
        local.recorded = outer->recorded;
        local.replay = outer->replay;
      }
      local.record = true;
      run.routing = &local;
    }
    at::Tensor y;
    {
      torch::NoGradGuard no_grad;
      if (hooks != nullptr) hooks->acquire(index);
      y = layer->forward(x, run);
      if (hooks != nullptr) hooks->release(index);
    }
    if (moe && outer != nullptr) {
      if (outer->record) outer->chosen.push_back(local.chosen.back());
      if (!local.differs.empty()) outer->differs.push_back(local.differs.back());
    }
    ac->save_for_backward({x});
    ac->saved_data["layer"] = reinterpret_cast<int64_t>(layer);
    ac->saved_data["hooks"] = reinterpret_cast<int64_t>(hooks);
    ac->saved_data["index"] = index;
    ac->saved_data["positions"] = run.positions;
    ac->saved_data["mask"] = run.mask;
    ac->saved_data["inv_freq"] = run.inv_freq;
    ac->saved_data["rope_scaling"] = run.rope_scaling;
    if (moe) ac->saved_data["chosen"] = local.chosen.back();
    const c10::DeviceType type = x.device().type();
    const std::optional<c10::ScalarType> autocast = current_autocast(type);
    ac->saved_data["autocast"] = autocast ? static_cast<int64_t>(*autocast) : int64_t{-1};
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ac,
                                                 torch::autograd::variable_list grads) {
    auto* layer = reinterpret_cast<DecoderLayerImpl*>(ac->saved_data["layer"].toInt());
    auto* hooks = reinterpret_cast<LayerHooks*>(ac->saved_data["hooks"].toInt());
    const int64_t index = ac->saved_data["index"].toInt();
    ForwardContext ctx;
    ctx.positions = ac->saved_data["positions"].toTensor();
    ctx.mask = ac->saved_data["mask"].toTensor();
    ctx.inv_freq = ac->saved_data["inv_freq"].toTensor();
    ctx.rope_scaling = ac->saved_data["rope_scaling"].toDouble();
    MoeRouting replay;
    if (layer->moe_index() >= 0) {
      // The recompute takes the experts the forward took, whatever the
      // router would say now.
      const at::Tensor chosen = ac->saved_data["chosen"].toTensor();
      replay.recorded = torch::full({chosen.size(0), layer->moe_index() + 1, chosen.size(1)}, -1,
                                    chosen.options());
      replay.recorded.select(1, layer->moe_index()).copy_(chosen);
      replay.replay = true;
      ctx.routing = &replay;
    }
    const at::Tensor x = ac->get_saved_variables()[0].detach().requires_grad_(true);
    const int64_t autocast = ac->saved_data["autocast"].toInt();
    if (hooks != nullptr) hooks->acquire(index);
    at::Tensor y;
    {
      torch::AutoGradMode enable(true);
      const AutocastGuard guard(
          x.device().type(),
          autocast >= 0 ? std::optional<c10::ScalarType>(static_cast<c10::ScalarType>(autocast))
                        : std::nullopt);
      y = layer->forward(x, ctx);
    }
    torch::autograd::backward({y}, {grads[0]});
    if (hooks != nullptr) hooks->gradients_ready(index);
    return {x.grad(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

DecoderImpl::DecoderImpl(const PolicyConfig& config) {
  embed_tokens =
      register_module("embed_tokens", torch::nn::Embedding(config.vocab_size, config.hidden_size));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) layers->push_back(DecoderLayer(config, i));
  norm = register_module("norm", RMSNorm(config.hidden_size, config.rms_norm_eps));
}

at::Tensor DecoderImpl::forward(const at::Tensor& input_ids, const ForwardContext& ctx,
                                bool checkpointing) {
  at::Tensor h = embed_tokens(input_ids);
  // Sharded layers are released after their forward, so backward needs
  // their recompute whatever `checkpointing` says.
  const bool recompute = (checkpointing || hooks_ != nullptr) && torch::GradMode::is_enabled();
  if (recompute && !h.requires_grad()) {
    // A frozen embedding (a LoRA base): a checkpointed layer whose input
    // needs no gradient would record no backward at all, and the adapters
    // inside it would get none. PEFT's enable_input_require_grads does the
    // same.
    h = h.detach().requires_grad_(true);
  }
  int64_t index = 0;
  for (const auto& layer : *layers) {
    auto* l = layer->as<DecoderLayerImpl>();
    // Safe points for a core share (core_share.h), in the forward and, by
    // a hook on each layer's output, in the backward: a trainer's
    // micro-batch can take many seconds, and the cores a worker frees
    // meanwhile are taken a layer later, not a micro-batch later.
    refresh_cores();
    if (recompute) {
      h = CheckpointedLayer::apply(h, l, &ctx, hooks_, index);
    } else {
      if (hooks_ != nullptr) hooks_->acquire(index);
      h = l->forward(h, ctx);
      if (hooks_ != nullptr) hooks_->release(index);
    }
    if (h.requires_grad() && installed_core_share() != nullptr) {
      h.register_hook([](const at::Tensor&) { refresh_cores(); });
    }
    ++index;
  }
  return norm(h);
}

PolicyImpl::PolicyImpl(const PolicyConfig& config) : config_(config) {
  RELAY_CHECK(validate(config).ok(), "PolicyImpl: invalid PolicyConfig (validate() it first)");
  model = register_module("model", Decoder(config));
  if (!config.tie_word_embeddings) {
    lm_head = register_module(
        "lm_head",
        torch::nn::Linear(
            torch::nn::LinearOptions(config.hidden_size, config.vocab_size).bias(false)));
  }
  const RopeFrequencies rope = rope_frequencies(config);
  inv_freq_ = rope.inv_freq;
  rope_scaling_ = rope.attention_scaling;
}

const at::Tensor& PolicyImpl::lm_head_weight() {
  return lm_head ? lm_head->weight : model->embed_tokens->weight;
}

at::Tensor PolicyImpl::head_rows(int64_t vocab_limit) {
  const at::Tensor& w = fp32_head_.defined() ? fp32_head_ : lm_head_weight();
  if (vocab_limit <= 0 || vocab_limit >= w.size(0)) return w;
  return w.narrow(0, 0, vocab_limit);
}

at::Tensor PolicyImpl::logits(const at::Tensor& hidden, int64_t vocab_limit) {
  if (fp32_head_.defined()) return row_linear(hidden.to(torch::kFloat32), head_rows(vocab_limit));
  return row_linear(hidden, head_rows(vocab_limit));
}

void PolicyImpl::set_fp32_lm_head(const at::Tensor& head) {
  torch::NoGradGuard no_grad;
  if (!head.defined()) {
    fp32_head_ = at::Tensor();
    return;
  }
  const at::Tensor& own = lm_head_weight();
  TORCH_CHECK(head.sizes() == own.sizes(), "set_fp32_lm_head: a head of shape ", head.sizes(),
              " for an LM head of shape ", own.sizes());
  if (fp32_head_.defined()) {
    fp32_head_.copy_(head);  // a new version: the same buffer
    return;
  }
  fp32_head_ = torch::empty(own.sizes(), own.options().dtype(torch::kFloat32));
  fp32_head_.copy_(head);
}

std::string PolicyImpl::lm_head_parameter_name() const {
  return lm_head ? "lm_head.weight" : "model.embed_tokens.weight";
}

void PolicyImpl::set_rope(ForwardContext& ctx, int64_t seq_len, c10::Device device) {
  ctx.rope_scaling = rope_scaling_;
  if (rope_depends_on_length(config_) && seq_len > config_.max_position_embeddings) {
    const RopeFrequencies rope = rope_frequencies(config_, seq_len);
    ctx.inv_freq = rope.inv_freq.to(device);
    ctx.rope_scaling = rope.attention_scaling;
    return;
  }
  if (inv_freq_.device() != device) inv_freq_ = inv_freq_.to(device);
  ctx.inv_freq = inv_freq_;
}

at::Tensor PolicyImpl::hidden_states(const at::Tensor& input_ids, const at::Tensor& lengths,
                                     MoeRouting* routing, const at::Tensor& sequence_starts) {
  TORCH_CHECK(input_ids.dim() == 2, "Policy: input_ids must be [B, T], got ", input_ids.sizes());
  const int64_t B = input_ids.size(0), T = input_ids.size(1);
  const c10::Device device = model->embed_tokens->weight.device();
  at::Tensor len = lengths.defined()
                       ? lengths.to(device, torch::kInt64)
                       : torch::full({B}, T, torch::dtype(torch::kInt64).device(device));
  TORCH_CHECK(len.numel() == B, "Policy: lengths has ", len.numel(), " entries for ", B, " rows");
  ForwardContext ctx;
  if (sequence_starts.defined()) {
    TORCH_CHECK(sequence_starts.sizes() == input_ids.sizes(),
                "Policy: sequence_starts must be [B, T] like input_ids, got ",
                sequence_starts.sizes());
    at::Tensor starts = sequence_starts.to(device, torch::kInt64);
    ctx.positions = torch::arange(T, len.options()).view({1, T}) - starts;
    ctx.mask = packed_attention_mask(starts);
  } else {
    at::Tensor past = torch::zeros({B}, len.options());
    ctx.positions = torch::arange(T, len.options()).view({1, T}).expand({B, T});
    ctx.mask = attention_mask(past, len, T, T);
  }
  ctx.routing = routing;
  set_rope(ctx, T, device);
  return model->forward(input_ids.to(device), ctx, checkpointing_);
}

at::Tensor PolicyImpl::forward(const at::Tensor& input_ids, const at::Tensor& lengths) {
  return logits(hidden_states(input_ids, lengths));
}

at::Tensor PolicyImpl::score(const at::Tensor& input_ids, const at::Tensor& lengths,
                             const ScoreOptions& options) {
  return score_impl(input_ids, lengths, options, /*with_entropy=*/false).logprobs;
}

ScoreOutput PolicyImpl::score_with_entropy(const at::Tensor& input_ids, const at::Tensor& lengths,
                                           const ScoreOptions& options) {
  return score_impl(input_ids, lengths, options, /*with_entropy=*/true);
}

ScoreOutput PolicyImpl::score_impl(const at::Tensor& input_ids, const at::Tensor& lengths,
                                   const ScoreOptions& options, bool with_entropy) {
  TORCH_CHECK(options.temperature > 0, "Policy::score: temperature must be > 0");
  TORCH_CHECK(options.chunk_tokens >= 0, "Policy::score: chunk_tokens must be >= 0");
  const int64_t B = input_ids.size(0), T = input_ids.size(1);
  // Checked before the forward pass, not after it.
  TORCH_CHECK(!options.scored.defined() || T < 2 ||
                  (options.scored.dim() == 2 && options.scored.size(0) == B &&
                   options.scored.size(1) == T - 1),
              "Policy::score: options.scored must be [B, T - 1] = [", B, ", ", T - 1, "], got ",
              options.scored.sizes());
  at::Tensor hidden = hidden_states(input_ids, lengths, options.routing, options.sequence_starts);
  ScoreOutput out;
  if (T < 2) {
    out.logprobs = torch::zeros({B, 0}, hidden.options().dtype(torch::kFloat32));
    if (with_entropy) out.entropy = out.logprobs.clone();
    return out;
  }
  const int64_t n = B * (T - 1);
  at::Tensor h = hidden.narrow(1, 0, T - 1).reshape({n, hidden.size(2)});
  at::Tensor targets =
      input_ids.to(hidden.device(), torch::kInt64).narrow(1, 1, T - 1).reshape({n});
  // Only the positions that will be read go through the head: padding, a
  // packed sequence's last position and whatever the caller left out of
  // options.scored score 0 without it.
  at::Tensor rows;  // undefined = every position
  if (at::Tensor keep = scored_positions(B, T, lengths, options, hidden.device()); keep.defined()) {
    rows = keep.reshape({n}).nonzero().reshape({-1});
    if (rows.numel() == n) rows = at::Tensor();
  }
  if (rows.defined()) {
    h = h.index_select(0, rows);
    targets = targets.index_select(0, rows);
  }
  const at::Tensor head = head_rows(options.vocab_limit);
  if (fp32_head_.defined()) h = h.to(torch::kFloat32);
  // A target outside the support (only a padding id could be) scores -inf.
  const int64_t support = head.size(0);
  at::Tensor outside = targets.ge(support);
  const int64_t chunk =
      options.chunk_tokens > 0 ? options.chunk_tokens : lm_head_chunk_tokens(support);
  TokenScores s = lm_head_token_scores(h, head, targets.clamp_max(support - 1), options.temperature,
                                       chunk, with_entropy, options.lm_head_keep_bytes);
  auto place = [&](const at::Tensor& scores) {
    if (!rows.defined()) return scores.view({B, T - 1});
    return torch::zeros({n}, scores.options()).index_copy(0, rows, scores).view({B, T - 1});
  };
  out.logprobs = place(s.logprobs.masked_fill(outside, -std::numeric_limits<float>::infinity()));
  if (with_entropy) out.entropy = place(s.entropy);
  return out;
}

at::Tensor PolicyImpl::extend(const at::Tensor& input_ids, const at::Tensor& new_lengths,
                              const at::Tensor& slots, KVCache& cache,
                              const ExtendOptions& options) {
  TORCH_CHECK(input_ids.dim() == 2, "Policy::extend: input_ids must be [B, T], got ",
              input_ids.sizes());
  const int64_t B = input_ids.size(0), T = input_ids.size(1);
  TORCH_CHECK(new_lengths.numel() == B && slots.numel() == B,
              "Policy::extend: new_lengths and slots need one entry per row");
  // A short append of several positions runs the few-row kernels as a
  // decode step does (row_linear.h).
  IncrementalRows incremental;
  at::Tensor len_cpu = new_lengths.to(torch::kCPU, torch::kInt64).contiguous();
  at::Tensor slot_cpu = slots.to(torch::kCPU, torch::kInt64).contiguous();
  const int64_t* len_p = len_cpu.data_ptr<int64_t>();
  const int64_t* slot_p = slot_cpu.data_ptr<int64_t>();

  // Host-side bookkeeping: room for every row's new positions first (so a
  // full cache fails before anything is computed), then where each valid
  // new token goes and where each row's keys are read from.
  int64_t kv_len = 0;
  const std::vector<int64_t> past = prepare_extend(cache, len_p, slot_p, B, T, &kv_len);
  at::Tensor read = torch::empty({B, kv_len}, torch::kInt64);
  std::vector<int64_t> rows, wrows;
  extend_rows(cache, past, len_p, slot_p, T, kv_len, read.data_ptr<int64_t>(), rows, wrows);

  const c10::Device device = model->embed_tokens->weight.device();
  auto to_dev = [&](const std::vector<int64_t>& v) {
    return torch::tensor(v, torch::kInt64).to(device);
  };
  at::Tensor past_t = to_dev(past);
  at::Tensor len_t = len_cpu.to(device);
  ForwardContext ctx;
  ctx.positions = past_t.view({B, 1}) + torch::arange(T, past_t.options()).view({1, T});
  ctx.mask = attention_mask(past_t, len_t, T, kv_len);
  ctx.cache = &cache;
  ctx.kv_len = kv_len;
  ctx.write_rows = to_dev(rows);
  ctx.write_index = to_dev(wrows);
  ctx.read_index = read.to(device);
  ctx.routing = options.routing;
  set_rope(ctx, kv_len, device);

  at::Tensor hidden = model->forward(input_ids.to(device), ctx);
  // Only now is the step complete: a throw above leaves every length as it was.
  for (int64_t b = 0; b < B; ++b) cache.advance(slot_p[b], len_p[b]);

  if (options.which == ExtendLogits::kNone) return at::Tensor();
  if (options.which == ExtendLogits::kAll) return logits(hidden, options.vocab_limit);
  at::Tensor last = (len_t - 1).view({B, 1, 1}).expand({B, 1, hidden.size(2)});
  return logits(hidden.gather(1, last).squeeze(1), options.vocab_limit);
}

at::Tensor PolicyImpl::decode_fixed(const at::Tensor& ids, const at::Tensor& positions,
                                    const at::Tensor& write_index, const at::Tensor& read_index,
                                    const at::Tensor& key_positions, KVCache& cache,
                                    int64_t vocab_limit) {
  const int64_t B = ids.size(0), S = read_index.size(1);
  ForwardContext ctx;
  ctx.positions = positions.view({B, 1});
  // attention_mask() for one new position: key s is seen when s <= position.
  ctx.mask = key_positions.narrow(0, 0, S).view({1, 1, 1, S}).le(positions.view({B, 1, 1, 1}));
  ctx.cache = &cache;
  ctx.kv_len = S;
  ctx.write_rows = key_positions.narrow(0, 0, B);  // 0 .. B-1: every row is a new position
  ctx.write_index = write_index;
  ctx.read_index = read_index;
  // The caller keeps S within max_position_embeddings when RoPE depends on
  // the length (decode_graphs.cc), so these are the frequencies extend() uses.
  set_rope(ctx, S, ids.device());
  at::Tensor hidden = model->forward(ids.view({B, 1}), ctx);
  return logits(hidden.squeeze(1), vocab_limit);
}

void init_weights(PolicyImpl& policy, uint64_t seed, double initializer_range) {
  torch::NoGradGuard no_grad;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (auto& item : policy.named_parameters()) {
    const std::string& name = item.key();
    at::Tensor& param = item.value();
    at::Tensor value;
    if (absl::EndsWith(name, "norm.weight")) {
      value = torch::ones(param.sizes(), torch::kFloat32);
    } else if (absl::EndsWith(name, ".bias")) {
      value = torch::zeros(param.sizes(), torch::kFloat32);
    } else {
      value = torch::empty(param.sizes(), torch::kFloat32).normal_(0.0, initializer_range, gen);
    }
    param.copy_(value);
  }
}

Policy clone_policy(const PolicyImpl& policy) {
  Policy copy(policy.config());
  if (const std::optional<LoraConfig> lora = lora_config(policy)) {
    // The same adapters (their values are copied below), placed as the
    // source's: attach_lora puts them on the weights' device and dtype.
    copy->to(policy.parameters().front().device(), policy.parameters().front().scalar_type());
    const Status st = attach_lora(*copy, *lora, /*seed=*/0);
    TORCH_CHECK(st.ok(), "clone_policy: ", std::string(st.message()));
  }
  torch::NoGradGuard no_grad;
  const auto src = policy.named_parameters();
  // Each parameter in its own dtype and device: a bf16 policy's copy is
  // bf16 (an fp32 one would compute differently and take twice the memory).
  for (auto& item : copy->named_parameters()) {
    const at::Tensor& from = src[item.key()];
    if (item.value().scalar_type() == from.scalar_type() &&
        item.value().device() == from.device()) {
      item.value().copy_(from);
    } else {
      item.value().set_data(from.detach().clone());
    }
    item.value().set_requires_grad(from.requires_grad());
  }
  copy->eval();
  return copy;
}

std::unordered_map<std::string, at::Tensor> parameter_tensors(const PolicyImpl& policy) {
  std::unordered_map<std::string, at::Tensor> out;
  for (const auto& item : policy.named_parameters()) {
    out[item.key()] = item.value().detach().clone();
  }
  return out;
}

}  // namespace relay::model
