#include "relay/model/policy.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "relay/model/kv_cache.h"

namespace relay::model {
namespace {

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

}  // namespace

DecoderImpl::DecoderImpl(const PolicyConfig& config) {
  embed_tokens =
      register_module("embed_tokens", torch::nn::Embedding(config.vocab_size, config.hidden_size));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) layers->push_back(DecoderLayer(config, i));
  norm = register_module("norm", RMSNorm(config.hidden_size, config.rms_norm_eps));
}

at::Tensor DecoderImpl::forward(const at::Tensor& input_ids, const AttentionContext& ctx,
                                const at::Tensor& inv_freq) {
  at::Tensor h = embed_tokens(input_ids);
  for (const auto& layer : *layers) h = layer->as<DecoderLayerImpl>()->forward(h, ctx, inv_freq);
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
  // Kept out of the registered buffers on purpose: module.to(kBFloat16) would
  // round the frequencies, and they must stay fp32 as in transformers.
  inv_freq_ = rope_inv_freq(config.resolved_head_dim(), config.rope_theta);
}

const at::Tensor& PolicyImpl::lm_head_weight() {
  return lm_head ? lm_head->weight : model->embed_tokens->weight;
}

at::Tensor PolicyImpl::logits(const at::Tensor& hidden) {
  return torch::nn::functional::linear(hidden, lm_head_weight());
}

at::Tensor PolicyImpl::hidden_states(const at::Tensor& input_ids, const at::Tensor& lengths) {
  TORCH_CHECK(input_ids.dim() == 2, "Policy: input_ids must be [B, T], got ", input_ids.sizes());
  const int64_t B = input_ids.size(0), T = input_ids.size(1);
  const c10::Device device = model->embed_tokens->weight.device();
  if (inv_freq_.device() != device) inv_freq_ = inv_freq_.to(device);
  at::Tensor len = lengths.defined()
                       ? lengths.to(device, torch::kInt64)
                       : torch::full({B}, T, torch::dtype(torch::kInt64).device(device));
  TORCH_CHECK(len.numel() == B, "Policy: lengths has ", len.numel(), " entries for ", B, " rows");
  AttentionContext ctx;
  at::Tensor past = torch::zeros({B}, len.options());
  ctx.positions = torch::arange(T, len.options()).view({1, T}).expand({B, T});
  ctx.mask = attention_mask(past, len, T, T);
  return model->forward(input_ids.to(device), ctx, inv_freq_);
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
  TORCH_CHECK(options.chunk_tokens >= 1, "Policy::score: chunk_tokens must be >= 1");
  const int64_t B = input_ids.size(0), T = input_ids.size(1);
  at::Tensor hidden = hidden_states(input_ids, lengths);
  ScoreOutput out;
  if (T < 2) {
    out.logprobs = torch::zeros({B, 0}, hidden.options().dtype(torch::kFloat32));
    if (with_entropy) out.entropy = out.logprobs.clone();
    return out;
  }
  const int64_t n = B * (T - 1);
  at::Tensor h = hidden.narrow(1, 0, T - 1).reshape({n, hidden.size(2)});
  at::Tensor targets = input_ids.to(hidden.device()).narrow(1, 1, T - 1).reshape({n, 1});
  std::vector<at::Tensor> parts, entropies;
  for (int64_t start = 0; start < n; start += options.chunk_tokens) {
    const int64_t len = std::min(options.chunk_tokens, n - start);
    at::Tensor z = logits(h.narrow(0, start, len)).to(torch::kFloat32);
    if (options.temperature != 1.0) z = z / options.temperature;
    at::Tensor lse = z.logsumexp(-1);
    parts.push_back(z.gather(1, targets.narrow(0, start, len)).squeeze(1) - lse);
    if (with_entropy) {
      // H = lse - E_p[z]: one softmax, no [chunk, V] log-softmax kept.
      entropies.push_back(lse - (torch::softmax(z, -1) * z).sum(-1));
    }
  }
  out.logprobs = torch::cat(parts).view({B, T - 1});
  if (with_entropy) out.entropy = torch::cat(entropies).view({B, T - 1});
  if (lengths.defined()) {
    at::Tensor len = lengths.to(out.logprobs.device(), torch::kInt64).view({B, 1});
    at::Tensor pad = torch::arange(T - 1, len.options()).view({1, T - 1}).ge(len - 1);
    out.logprobs = out.logprobs.masked_fill(pad, 0.0);
    if (with_entropy) out.entropy = out.entropy.masked_fill(pad, 0.0);
  }
  return out;
}

at::Tensor PolicyImpl::extend(const at::Tensor& input_ids, const at::Tensor& new_lengths,
                              const at::Tensor& slots, KVCache& cache, ExtendLogits which) {
  TORCH_CHECK(input_ids.dim() == 2, "Policy::extend: input_ids must be [B, T], got ",
              input_ids.sizes());
  const int64_t B = input_ids.size(0), T = input_ids.size(1);
  TORCH_CHECK(new_lengths.numel() == B && slots.numel() == B,
              "Policy::extend: new_lengths and slots need one entry per row");
  at::Tensor len_cpu = new_lengths.to(torch::kCPU, torch::kInt64).contiguous();
  at::Tensor slot_cpu = slots.to(torch::kCPU, torch::kInt64).contiguous();
  const int64_t* len_p = len_cpu.data_ptr<int64_t>();
  const int64_t* slot_p = slot_cpu.data_ptr<int64_t>();

  // Host-side bookkeeping: where each valid new token goes in the cache.
  std::vector<int64_t> past(B), rows, wslots, wpos;
  std::vector<bool> seen(cache.num_slots(), false);
  int64_t kv_len = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t slot = slot_p[b], n = len_p[b];
    TORCH_CHECK(slot >= 0 && slot < cache.num_slots(), "Policy::extend: slot ", slot,
                " out of range");
    TORCH_CHECK(!seen[slot], "Policy::extend: slot ", slot, " appears twice in one batch");
    seen[slot] = true;
    TORCH_CHECK(n >= 1 && n <= T, "Policy::extend: new_lengths[", b, "] = ", n, " must be in [1, ",
                T, "]");
    past[b] = cache.length(slot);
    TORCH_CHECK(past[b] + n <= cache.max_seq_len(), "Policy::extend: slot ", slot, " holds ",
                past[b], " positions; ", n, " more exceed the cache's max_seq_len ",
                cache.max_seq_len());
    kv_len = std::max(kv_len, past[b] + n);
    for (int64_t t = 0; t < n; ++t) {
      rows.push_back(b * T + t);
      wslots.push_back(slot);
      wpos.push_back(past[b] + t);
    }
  }

  const c10::Device device = model->embed_tokens->weight.device();
  if (inv_freq_.device() != device) inv_freq_ = inv_freq_.to(device);
  auto to_dev = [&](const std::vector<int64_t>& v) {
    return torch::tensor(v, torch::kInt64).to(device);
  };
  at::Tensor past_t = to_dev(past);
  at::Tensor len_t = len_cpu.to(device);
  AttentionContext ctx;
  ctx.positions = past_t.view({B, 1}) + torch::arange(T, past_t.options()).view({1, T});
  ctx.mask = attention_mask(past_t, len_t, T, kv_len);
  ctx.cache = &cache;
  ctx.slots = slot_cpu.to(device);
  ctx.kv_len = kv_len;
  ctx.write_rows = to_dev(rows);
  ctx.write_slots = to_dev(wslots);
  ctx.write_pos = to_dev(wpos);

  at::Tensor hidden = model->forward(input_ids.to(device), ctx, inv_freq_);
  // Only now is the step complete: a throw above leaves every length as it was.
  for (int64_t b = 0; b < B; ++b) cache.advance(slot_p[b], len_p[b]);

  if (which == ExtendLogits::kNone) return at::Tensor();
  if (which == ExtendLogits::kAll) return logits(hidden);
  at::Tensor last = (len_t - 1).view({B, 1, 1}).expand({B, 1, hidden.size(2)});
  return logits(hidden.gather(1, last).squeeze(1));
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
  torch::NoGradGuard no_grad;
  const auto src = policy.named_parameters();
  copy->to(src.begin()->value().device());
  for (auto& item : copy->named_parameters()) item.value().copy_(src[item.key()]);
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
