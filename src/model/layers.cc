#include "relay/model/layers.h"

#include <cmath>
#include <limits>

#include <torch/torch.h>

#include "relay/model/kv_cache.h"

namespace relay::model {

RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({dim}));
}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) {
  at::Tensor xf = x.to(torch::kFloat32);
  at::Tensor variance = xf.pow(2).mean(-1, /*keepdim=*/true);
  xf = xf * torch::rsqrt(variance + eps_);
  return weight * xf.to(x.scalar_type());
}

at::Tensor rope_inv_freq(int64_t head_dim, double theta) {
  // transformers: 1 / theta ** (arange(0, dim, 2).float() / dim), in fp32.
  at::Tensor exponent = torch::arange(0, head_dim, 2, torch::kInt64).to(torch::kFloat32) /
                        static_cast<float>(head_dim);
  return 1.0 / torch::pow(torch::scalar_tensor(theta, torch::kFloat32), exponent);
}

at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& positions,
                      const at::Tensor& inv_freq) {
  // freqs [B, T, D/2] -> emb [B, T, D] = cat(freqs, freqs); cos/sin in fp32.
  at::Tensor freqs = positions.to(torch::kFloat32).unsqueeze(-1) * inv_freq;
  at::Tensor emb = torch::cat({freqs, freqs}, -1);
  at::Tensor cos = emb.cos().unsqueeze(1).to(x.scalar_type());
  at::Tensor sin = emb.sin().unsqueeze(1).to(x.scalar_type());
  const int64_t half = x.size(-1) / 2;
  at::Tensor rotated = torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

at::Tensor grouped_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const at::Tensor& mask) {
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3);
  const int64_t KVH = k.size(1), S = k.size(2);
  const int64_t rep = H / KVH;
  // Heads h = g * rep + r share kv head g: fold r into the query axis.
  at::Tensor qg = q.reshape({B, KVH, rep * T, D});
  at::Tensor scores = torch::matmul(qg, k.transpose(-1, -2)).to(torch::kFloat32);
  scores = scores.mul(1.0 / std::sqrt(static_cast<double>(D))).view({B, KVH, rep, T, S});
  scores = scores.masked_fill(mask.view({B, 1, 1, T, S}).logical_not(),
                              -std::numeric_limits<float>::infinity());
  at::Tensor probs = torch::softmax(scores, -1).to(v.scalar_type()).view({B, KVH, rep * T, S});
  return torch::matmul(probs, v).view({B, H, T, D});
}

AttentionImpl::AttentionImpl(const PolicyConfig& config, int64_t layer_index)
    : layer_index_(layer_index),
      num_heads_(config.num_attention_heads),
      num_kv_heads_(config.num_key_value_heads),
      head_dim_(config.resolved_head_dim()) {
  const int64_t hidden = config.hidden_size;
  const bool bias = config.attention_bias || config.model_type == "qwen2";
  using torch::nn::LinearOptions;
  q_proj = register_module(
      "q_proj", torch::nn::Linear(LinearOptions(hidden, num_heads_ * head_dim_).bias(bias)));
  k_proj = register_module(
      "k_proj", torch::nn::Linear(LinearOptions(hidden, num_kv_heads_ * head_dim_).bias(bias)));
  v_proj = register_module(
      "v_proj", torch::nn::Linear(LinearOptions(hidden, num_kv_heads_ * head_dim_).bias(bias)));
  o_proj = register_module(
      "o_proj", torch::nn::Linear(LinearOptions(num_heads_ * head_dim_, hidden).bias(false)));
}

at::Tensor AttentionImpl::forward(const at::Tensor& x, const AttentionContext& ctx,
                                  const at::Tensor& inv_freq) {
  const int64_t B = x.size(0), T = x.size(1);
  at::Tensor q = q_proj(x).view({B, T, num_heads_, head_dim_}).transpose(1, 2);
  at::Tensor k = k_proj(x).view({B, T, num_kv_heads_, head_dim_}).transpose(1, 2);
  at::Tensor v = v_proj(x).view({B, T, num_kv_heads_, head_dim_}).transpose(1, 2);
  q = apply_rope(q, ctx.positions, inv_freq);
  k = apply_rope(k, ctx.positions, inv_freq);

  if (ctx.cache != nullptr) {
    // Write the valid new keys/values at their absolute positions, then read
    // every slot's first kv_len positions back.
    at::Tensor& cache_k = ctx.cache->keys(layer_index_);
    at::Tensor& cache_v = ctx.cache->values(layer_index_);
    auto flat = [&](const at::Tensor& t) {
      return t.transpose(1, 2)
          .reshape({B * T, num_kv_heads_, head_dim_})
          .index_select(0, ctx.write_rows);
    };
    cache_k.index_put_({ctx.write_slots, ctx.write_pos}, flat(k).to(cache_k.scalar_type()));
    cache_v.index_put_({ctx.write_slots, ctx.write_pos}, flat(v).to(cache_v.scalar_type()));
    k = cache_k.narrow(1, 0, ctx.kv_len)
            .index_select(0, ctx.slots)
            .transpose(1, 2)
            .to(q.scalar_type());
    v = cache_v.narrow(1, 0, ctx.kv_len)
            .index_select(0, ctx.slots)
            .transpose(1, 2)
            .to(q.scalar_type());
  }

  at::Tensor out = grouped_attention(q, k, v, ctx.mask);
  return o_proj(out.transpose(1, 2).reshape({B, T, num_heads_ * head_dim_}));
}

MlpImpl::MlpImpl(const PolicyConfig& config) {
  using torch::nn::LinearOptions;
  const int64_t h = config.hidden_size, f = config.intermediate_size;
  gate_proj = register_module("gate_proj", torch::nn::Linear(LinearOptions(h, f).bias(false)));
  up_proj = register_module("up_proj", torch::nn::Linear(LinearOptions(h, f).bias(false)));
  down_proj = register_module("down_proj", torch::nn::Linear(LinearOptions(f, h).bias(false)));
}

at::Tensor MlpImpl::forward(const at::Tensor& x) {
  return down_proj(torch::silu(gate_proj(x)) * up_proj(x));
}

DecoderLayerImpl::DecoderLayerImpl(const PolicyConfig& config, int64_t layer_index) {
  input_layernorm =
      register_module("input_layernorm", RMSNorm(config.hidden_size, config.rms_norm_eps));
  self_attn = register_module("self_attn", Attention(config, layer_index));
  post_attention_layernorm =
      register_module("post_attention_layernorm", RMSNorm(config.hidden_size, config.rms_norm_eps));
  mlp = register_module("mlp", Mlp(config));
}

at::Tensor DecoderLayerImpl::forward(const at::Tensor& x, const AttentionContext& ctx,
                                     const at::Tensor& inv_freq) {
  at::Tensor h = x + self_attn(input_layernorm(x), ctx, inv_freq);
  return h + mlp(post_attention_layernorm(h));
}

}  // namespace relay::model
